// Tool calling through the official `openai` client against a real
// cluster. The demo model's weights are random, so it writes noise and
// never a tool call of its own (greedy decoding, temperature 0, makes
// that noise the same on every run, not a call): the round trip is tested
// from the request side (tools, an assistant turn of tool calls and the
// tool's result are accepted and rendered into the prompt that /tokenize
// shows), a request with tools runs whole and streamed alike, the
// refusals name their field, and reading calls out of the output is
// tested in C (tests/api/test_api_toolcall.c, test_api_response.c). In a
// test build (-DSHOAL_TESTING=ON) a second coordinator's choices answer
// with a text of tool calls (SHOAL_TEST_OUTPUT_TEXT, four bytes a token),
// so calls go out whole and streamed to the client's stream helpers.
import { MODEL, Server, assert, collect, eq, run, stopCleanly } from './harness.mjs';

const server = await Server.start();
const client = server.client();

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city now',
    parameters: { type: 'object', properties: { city: { type: 'string' } },
      required: ['city'] } } },
  { type: 'function', function: { name: 'get_time' } },
];
const ASK = { role: 'user', content: 'What is the weather in Paris?' };
const HISTORY = [
  ASK,
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_abc', content: '18 C and sunny' },
];

// The client's error for a request it sent: status, param and message.
async function refused(req, param, fragment, what) {
  let err;
  try {
    await client.chat.completions.create({ model: MODEL, max_tokens: 2, ...req });
  } catch (e) {
    err = e;
  }
  assert(err, `${what}: accepted`);
  eq(err.status, 400, `${what}: status (${err.message})`);
  eq(err.param, param, `${what}: param (${err.message})`);
  if (fragment) assert(err.message.includes(fragment), `${what}: message '${err.message}'`);
}

const CALLS_TEXT = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": ' +
  '{"city": "Paris", "note": "a } in a string"}}\n</tool_call>\n<tool_call>\n' +
  '{"name": "get_time", "arguments": {}}\n</tool_call>';

const tests = [
  ['a_tool_call_history_is_accepted_and_answered', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: HISTORY,
      tools: TOOLS, max_tokens: 8, temperature: 0 });
    eq(r.choices.length, 1, 'one choice');
    eq(r.choices[0].message.role, 'assistant', 'role');
    // noise, not a call (see the top of this file)
    assert(['stop', 'length'].includes(r.choices[0].finish_reason),
      `finish_reason ${r.choices[0].finish_reason}`);
    assert(typeof r.choices[0].message.content === 'string', 'content');
  }],

  ['the_tools_calls_and_results_are_rendered_into_the_prompt', async () => {
    const tok = await server.request('POST', '/tokenize', { body: { model: MODEL,
      messages: HISTORY, tools: TOOLS } });
    eq(tok.status, 200, `/tokenize (${tok.text.slice(0, 200)})`);
    const det = await server.request('POST', '/detokenize', { body: { model: MODEL,
      tokens: tok.json.tokens, skip_special_tokens: false } });
    eq(det.status, 200, '/detokenize');
    const text = det.json.prompt;
    for (const want of ['# Tools', '"name": "get_weather", "description": "The weather in a city now"',
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
      '<tool_response>\n18 C and sunny\n</tool_response>'])
      assert(text.includes(want), `the prompt lacks ${JSON.stringify(want)}:\n${text}`);
    // the tools take room in the prompt: without them it is shorter
    const bare = await server.request('POST', '/tokenize', { body: { model: MODEL,
      messages: [ASK] } });
    const withTools = await server.request('POST', '/tokenize', { body: { model: MODEL,
      messages: [ASK], tools: TOOLS } });
    assert(withTools.json.count > bare.json.count + 50,
      `tools rendered: ${withTools.json.count} against ${bare.json.count}`);
  }],

  ['tool_choice_none_and_auto_run_whole_and_streamed_alike', async () => {
    for (const tool_choice of ['none', 'auto', undefined]) {
      const req = { model: MODEL, messages: [ASK], tools: TOOLS, tool_choice,
        parallel_tool_calls: false, max_tokens: 16, temperature: 0 };
      const a = await client.chat.completions.create(req);
      const s = await collect(await client.chat.completions.create({ ...req, stream: true }));
      eq(s.text[0], a.choices[0].message.content, `${tool_choice}: streamed text`);
      eq(s.finish[0], a.choices[0].finish_reason, `${tool_choice}: finish_reason`);
      // the client's stream helper accumulates the same message
      const helper = client.chat.completions.stream(req);
      const done = await helper.finalChatCompletion();
      eq(done.choices[0].message.content, a.choices[0].message.content,
        `${tool_choice}: the stream helper's message`);
    }
  }],

  ['calls_in_the_output_go_out_whole_and_streamed', async () => {
    const calling = await Server.start([], { SHOAL_TEST_OUTPUT_TEXT: CALLS_TEXT });
    try {
      const c = calling.client();
      const req = { model: MODEL, messages: [ASK], tools: TOOLS, max_tokens: 64,
        ignore_eos: true, temperature: 0 };
      const probe = await c.chat.completions.create({ ...req, tool_choice: 'none' });
      if (probe.choices[0].message.content !== CALLS_TEXT) {
        console.log('skip calls_in_the_output_go_out_whole_and_streamed: needs the test hooks ' +
          '(a build with -DSHOAL_TESTING=ON)');
        return;
      }
      // tool_choice none: the text as it is, no calls
      eq(probe.choices[0].finish_reason, 'length', 'none: finish_reason');
      assert(!probe.choices[0].message.tool_calls?.length, 'none: no tool_calls');
      const check = (msg, finish, what) => {
        eq(finish, 'tool_calls', `${what}: finish_reason`);
        eq(msg.tool_calls.length, 2, `${what}: two calls`);
        eq(msg.tool_calls.map((t) => [t.type, t.function.name, t.function.arguments]),
          [['function', 'get_weather', '{"city":"Paris","note":"a } in a string"}'],
            ['function', 'get_time', '{}']], `${what}: the calls`);
        for (const t of msg.tool_calls)
          assert(/^call_[A-Za-z0-9]{24}$/.test(t.id), `${what}: id ${t.id}`);
        assert(msg.tool_calls[0].id !== msg.tool_calls[1].id, `${what}: two ids`);
      };
      const whole = await c.chat.completions.create(req);
      eq(whole.choices[0].message.content, 'Let me check.', 'whole: content');
      check(whole.choices[0].message, whole.choices[0].finish_reason, 'whole');
      // the stream helper accumulates the deltas into the same message
      const helper = c.chat.completions.stream(req);
      const deltas = [];
      helper.on('chunk', (chunk) => {
        for (const ch of chunk.choices) if (ch.delta?.tool_calls) deltas.push(ch.delta.tool_calls);
      });
      const done = await helper.finalChatCompletion();
      check(done.choices[0].message, done.choices[0].finish_reason, 'stream helper');
      // the text before the calls was streamed as it came, untrimmed
      eq(done.choices[0].message.content, 'Let me check.\n', 'stream: content');
      eq(deltas.length, 2, 'one delta a call');
      // n = 2: each choice reads its own calls
      const two = await c.chat.completions.create({ ...req, n: 2 });
      for (const ch of two.choices) check(ch.message, ch.finish_reason, `choice ${ch.index}`);
    } finally {
      await calling.stop();
    }
  }],

  ['tool_choice_that_needs_constrained_decoding_is_refused', async () => {
    await refused({ messages: [ASK], tools: TOOLS, tool_choice: 'required' }, 'tool_choice',
      'needs constrained decoding, which this server does not do yet', 'required');
    await refused({ messages: [ASK], tools: TOOLS, tool_choice: { type: 'function',
      function: { name: 'get_weather' } } }, 'tool_choice',
    'needs constrained decoding, which this server does not do yet', 'a named function');
    await refused({ messages: [ASK], tools: TOOLS, tool_choice: { type: 'function',
      function: { name: 'get_stock' } } }, 'tool_choice.function.name', 'not in \'tools\'',
    'a function that is not among the tools');
  }],

  ['bad_tools_and_tool_calls_are_refused_by_field', async () => {
    await refused({ messages: [ASK], tools: [TOOLS[0], { type: 'function',
      function: { name: 'has space' } }] }, 'tools[1].function.name', 'a-z', 'a bad name');
    await refused({ messages: [ASK], tools: [{ type: 'function' }] }, 'tools[0].function',
      undefined, 'no function');
    await refused({ messages: [ASK], tools: [{ type: 'retrieval', function: { name: 'f' } }] },
      'tools[0].type', undefined, 'another type');
    await refused({ messages: [ASK], tools: [{ type: 'function', function: { name: 'f',
      parameters: 'object' } }] }, 'tools[0].function.parameters', undefined, 'parameters');
    await refused({ messages: [ASK], tools: Array(129).fill(TOOLS[1]) }, 'tools',
      'over the limit of 128', 'too many tools');
    const badArgs = structuredClone(HISTORY);
    badArgs[1].tool_calls[0].function.arguments = '{"city": ';
    await refused({ messages: badArgs }, 'messages[1].tool_calls[0].function.arguments',
      'not valid JSON', 'arguments that are not JSON');
    const noName = structuredClone(HISTORY);
    delete noName[1].tool_calls[0].function.name;
    await refused({ messages: noName }, 'messages[1].tool_calls[0].function.name', undefined,
      'a call without a name');
  }],
];

await run(server, tests, stopCleanly);
