// The API through the official `openai` client against shoal-coordinator
// with two CPU workers: chat and completions, streamed and not, token-id
// prompts, return_token_ids, logprobs, stop strings, n and seeds, cached
// tokens and cache_salt, thinking, tokenize/detokenize, models, health
// (with workers stopped), a client's X-Request-Id, and metrics. The model's weights are random: outputs are checked for
// consistency (streamed == whole, greedy is deterministic, ids decode to
// the text, stop strings cut at their first occurrence), not for meaning.
import fs from 'node:fs';
import { MODEL, Server, assert, collect, eq, run, stopCleanly, until } from './harness.mjs';

const server = await Server.start();
const client = server.client();
const HELLO = [{ role: 'user', content: 'Hello! Tell me about the sea.' }];

const tests = [
  ['models_lists_the_served_model', async () => {
    const list = await client.models.list();
    eq(list.data.map((m) => m.id), [MODEL], 'models');
    eq(list.data[0].max_model_len, 4096, 'max_model_len');
    const one = await client.models.retrieve(MODEL);
    eq(one.id, MODEL, 'retrieve');
  }],

  ['health_is_200_and_metrics_list_both_workers', async (s) => {
    const h = await s.request('GET', '/health');
    eq(h.status, 200, '/health');
    const text = await s.metrics();
    for (const w of ['0', '1'])
      assert(text.includes(`shoal_worker_up{worker="${w}",device="cpu"} 1`), `worker ${w} up`);
    assert(text.includes('shoal_worker_kv_pages{worker="0",device="cpu",state="free"}'),
      'kv pages per worker');
    assert(text.includes('# TYPE shoal_time_to_first_token_seconds histogram'), 'ttft');
    // and under vLLM's names, for its dashboards
    assert(text.includes('# TYPE vllm:time_to_first_token_seconds histogram'), 'vllm ttft');
    for (const n of ['num_requests_running', 'num_requests_waiting', 'kv_cache_usage_perc',
      'prefix_cache_hits_total', 'prefix_cache_queries_total'])
      assert(new RegExp(`^vllm:${n}\\{model_name="${MODEL}"\\} [0-9.]+$`, 'm').test(text), n);
  }],

  ['health_counts_the_workers_serving_and_is_503_when_none_does', async () => {
    // A cluster of its own that takes a silent worker for dead soon: one
    // worker stopped leaves /health 200 ("degraded", one not serving),
    // both stopped make it a 503 a load balancer takes out of rotation.
    const small = await Server.start(['--dead-after-ms', '1000', '--heartbeat-ms', '50']);
    const workers = fs.readdirSync(`/proc/${small.proc.pid}/task`).flatMap((t) =>
      fs.readFileSync(`/proc/${small.proc.pid}/task/${t}/children`, 'utf8').trim().split(/\s+/))
      .filter(Boolean).map(Number);
    eq(workers.length, 2, `the coordinator's two workers (${workers})`);
    try {
      let h = await small.request('GET', '/health');
      eq(h.status, 200, 'all serving');
      eq(h.json, { status: 'ok', workers: 2, serving: 2, not_serving: 0 }, 'the body');
      h = await small.request('GET', '/health?all=1');
      eq(h.json.worker, [{ index: 0, health: 'serving' }, { index: 1, health: 'serving' }],
        '?all=1 names each worker');
      // A stopped worker falls silent; past --dead-after-ms the supervisor
      // kills and restarts it: silent, dead and starting all count as not
      // serving.
      const down = ['not answering', 'dead', 'starting'];
      process.kill(workers[1], 'SIGSTOP');
      let seen;
      await until(async () => {
        seen = await small.request('GET', '/health?all=1');
        return seen.json.serving === 1;
      }, 10000, 'the stopped worker not serving');
      eq(seen.status, 200, 'one of two serving is still 200');
      eq([seen.json.status, seen.json.not_serving], ['degraded', 1], 'degraded, one not serving');
      assert(seen.json.worker.some((w) => down.includes(w.health)), JSON.stringify(seen.json));
      process.kill(workers[0], 'SIGSTOP');
      await until(async () => {
        seen = await small.request('GET', '/health');
        return seen.status === 503;
      }, 10000, 'none serving');
      eq([seen.json.status, seen.json.serving, seen.json.not_serving], ['unavailable', 0, 2],
        'the body');
      eq(seen.headers['retry-after'], '5', 'Retry-After on the 503');
      for (const w of workers) try { process.kill(w, 'SIGCONT'); } catch { /* restarted */ }
      await until(async () => (await small.request('GET', '/health')).status === 200, 60000,
        'serving again');
    } finally {
      for (const w of workers) try { process.kill(w, 'SIGCONT'); } catch { /* gone */ }
      await small.stop();
    }
  }],

  ['a_client_request_id_is_kept_and_a_bad_one_refused', async (s) => {
    const body = JSON.stringify({ model: MODEL, messages: HELLO, max_tokens: 2 });
    const r = await s.request('POST', '/v1/chat/completions',
      { body, headers: { 'X-Request-Id': 'trace-42.a' } });
    eq(r.status, 200, r.text.slice(0, 200));
    eq(r.headers['x-request-id'], 'trace-42.a', 'echoed');
    eq(r.json.id, 'chatcmpl-trace-42.a', 'the body id names it');
    const st = await s.request('POST', '/v1/completions', { headers: { 'X-Request-Id': 'sse-1' },
      body: JSON.stringify({ model: MODEL, prompt: 'hi', max_tokens: 2, stream: true }) });
    eq(st.headers['x-request-id'], 'sse-1', 'echoed on a stream');
    assert(st.text.includes('"id":"cmpl-sse-1"'), st.text.slice(0, 300));
    const own = await s.request('POST', '/v1/chat/completions', { body });
    assert(/^chatcmpl-[0-9a-f]{16}$/.test(own.headers['x-request-id']), 'ours without one');
    for (const bad of ['x'.repeat(129), 'a"b']) {
      const e = await s.request('POST', '/v1/chat/completions',
        { body, headers: { 'X-Request-Id': bad } });
      eq(e.status, 400, `refused: ${bad.slice(0, 10)}`);
      eq(e.json.error.param, 'X-Request-Id', 'names the header');
    }
    const longest = await s.request('POST', '/v1/chat/completions',
      { body, headers: { 'X-Request-Id': 'y'.repeat(128) } });
    eq(longest.headers['x-request-id'], 'y'.repeat(128), 'the longest kept');
  }],

  ['greedy_chat_is_deterministic_and_equals_its_stream', async () => {
    const req = { model: MODEL, messages: HELLO, max_tokens: 24, temperature: 0 };
    const a = await client.chat.completions.create(req);
    const b = await client.chat.completions.create(req);
    eq(a.choices[0].message.content, b.choices[0].message.content, 'two greedy runs');
    assert(a.id.startsWith('chatcmpl-') && a.object === 'chat.completion', 'id and object');
    eq(a.choices[0].message.role, 'assistant', 'role');
    const s = await collect(await client.chat.completions.create({ ...req, stream: true,
      stream_options: { include_usage: true } }));
    eq(s.text[0], a.choices[0].message.content, 'streamed text');
    eq(s.role[0], 'assistant', 'first delta role');
    eq(s.finish[0], a.choices[0].finish_reason, 'finish_reason');
    eq(s.usage, a.usage, 'usage of the stream');
    eq(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens, 'total');
    assert(['stop', 'length'].includes(a.choices[0].finish_reason), 'finish reason');
  }],

  ['chat_prompt_is_the_template_tokenized_and_ids_decode_to_the_text', async (s) => {
    const r = await client.chat.completions.create({ model: MODEL, messages: HELLO,
      max_tokens: 16, temperature: 0, return_token_ids: true,
      chat_template_kwargs: { enable_thinking: false } });
    const tok = await s.request('POST', '/tokenize', { body: { model: MODEL, messages: HELLO,
      add_generation_prompt: true, chat_template_kwargs: { enable_thinking: false } } });
    eq(r.prompt_token_ids, tok.json.tokens, 'prompt_token_ids');
    eq(r.usage.prompt_tokens, tok.json.count, 'usage.prompt_tokens');
    const ids = r.choices[0].token_ids;
    eq(ids.length, r.usage.completion_tokens, 'token_ids vs completion_tokens');
    const de = await s.request('POST', '/detokenize', { body: { tokens: ids } });
    eq(de.json.prompt, r.choices[0].message.content, 'detokenized ids');
    // enable_thinking=false renders an empty think block after the header
    const think = await s.request('POST', '/tokenize', { body: { messages: HELLO,
      add_generation_prompt: true, chat_template_kwargs: { enable_thinking: true } } });
    assert(think.json.count < tok.json.count, 'thinking off adds <think></think>');
  }],

  ['text_and_token_id_prompts_give_the_same_completion', async (s) => {
    const text = 'The quick brown fox jumps over the lazy dog';
    const tok = await s.request('POST', '/tokenize', { body: { prompt: text } });
    const a = await client.completions.create({ model: MODEL, prompt: text, max_tokens: 12,
      temperature: 0, return_token_ids: true });
    const b = await client.completions.create({ model: MODEL, prompt: tok.json.tokens,
      max_tokens: 12, temperature: 0 });
    eq(b.choices[0].text, a.choices[0].text, 'completion of the ids');
    eq(a.choices[0].prompt_token_ids, tok.json.tokens, 'prompt_token_ids');
    assert(a.object === 'text_completion' && a.id.startsWith('cmpl-'), 'object and id');
    const st = await collect(await client.completions.create({ model: MODEL,
      prompt: tok.json.tokens, max_tokens: 12, temperature: 0, stream: true,
      return_token_ids: true }));
    eq(st.text[0], a.choices[0].text, 'streamed completion');
    eq(st.tokenIds[0], a.choices[0].token_ids, 'streamed token_ids');
    eq(st.promptTokenIds, tok.json.tokens, 'streamed prompt_token_ids');
  }],

  ['streamed_token_ids_add_up_to_the_whole', async () => {
    const req = { model: MODEL, messages: HELLO, max_tokens: 20, temperature: 0,
      return_token_ids: true };
    const whole = await client.chat.completions.create(req);
    const st = await collect(await client.chat.completions.create({ ...req, stream: true }));
    eq(st.tokenIds[0], whole.choices[0].token_ids, 'token_ids');
    eq(st.promptTokenIds, whole.prompt_token_ids, 'prompt_token_ids in the first chunk');
  }],

  ['logprobs_are_the_greedy_tokens_and_agree_streamed', async (s) => {
    const req = { model: MODEL, messages: HELLO, max_tokens: 10, temperature: 0,
      logprobs: true, top_logprobs: 3, return_token_ids: true };
    const r = await client.chat.completions.create(req);
    const content = r.choices[0].logprobs.content;
    eq(content.length, r.usage.completion_tokens, 'one entry per token');
    for (const [i, e] of content.entries()) {
      eq(e.top_logprobs.length, 3, 'top_logprobs');
      assert(e.logprob <= 0, 'a log-probability');
      // greedy: the chosen token is the most likely one
      eq(e.top_logprobs[0].logprob, e.logprob, `token ${i} is the top one`);
      assert(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob, 'ordered');
      const one = await s.request('POST', '/detokenize', { body: { tokens:
        [r.choices[0].token_ids[i]], skip_special_tokens: false } });
      eq(Buffer.from(e.bytes).toString('utf8'), one.json.prompt, `bytes of token ${i}`);
    }
    const st = await collect(await client.chat.completions.create({ ...req, stream: true }));
    eq(st.logprobs[0].map((e) => [e.token, Math.fround(e.logprob)]),
      content.map((e) => [e.token, Math.fround(e.logprob)]), 'streamed logprobs');
    const c = await client.completions.create({ model: MODEL, prompt: 'Once upon a time',
      max_tokens: 6, temperature: 0, logprobs: 2 });
    const lp = c.choices[0].logprobs;
    eq(lp.tokens.length, 6, 'completion logprobs tokens');
    eq(lp.token_logprobs.length, 6, 'token_logprobs');
    eq(Object.keys(lp.top_logprobs[0]).length > 0, true, 'top_logprobs');
    eq(lp.tokens.join(''), c.choices[0].text, 'tokens make the text');
  }],

  ['stop_strings_end_the_text_before_their_first_occurrence', async () => {
    const base = { model: MODEL, prompt: 'Write a long story about a lighthouse keeper.',
      max_tokens: 40, temperature: 0, ignore_eos: true };
    const full = (await client.completions.create(base)).choices[0].text;
    assert(full.length > 12, `output long enough: ${JSON.stringify(full)}`);
    // a stop string from the middle of the output, crossing into what follows
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 4);
    const want = full.slice(0, full.indexOf(stop));
    const r = await client.completions.create({ ...base, stop: [stop, 'never-seen-ZQX'] });
    eq(r.choices[0].text, want, `text before ${JSON.stringify(stop)}`);
    eq(r.choices[0].finish_reason, 'stop', 'finish_reason');
    assert(r.usage.completion_tokens < 40, 'generation stopped early');
    const st = await collect(await client.completions.create({ ...base, stop, stream: true }));
    eq(st.text[0], want, 'streamed text before the stop string');
    eq(st.finish[0], 'stop', 'streamed finish_reason');
    const chat = await client.chat.completions.create({ model: MODEL, messages: HELLO,
      max_tokens: 30, temperature: 0, ignore_eos: true });
    const ct = chat.choices[0].message.content;
    const cstop = ct.slice(5, 8);
    const c2 = await client.chat.completions.create({ model: MODEL, messages: HELLO,
      max_tokens: 30, temperature: 0, ignore_eos: true, stop: cstop });
    eq(c2.choices[0].message.content, ct.slice(0, ct.indexOf(cstop)), 'chat stop');
    // vLLM's stop_reason: the stop string, a stop id, or null
    eq(r.choices[0].stop_reason, stop, 'stop_reason names the stop string');
    eq((await client.completions.create(base)).choices[0].stop_reason, null, 'null at length');
    const ids = (await client.completions.create({ ...base, return_token_ids: true }))
      .choices[0].token_ids;
    const byId = await client.completions.create({ ...base, stop_token_ids: [ids[5]] });
    eq(byId.choices[0].stop_reason, ids[5], 'stop_reason names the stop id');
    eq(byId.choices[0].finish_reason, 'stop', 'finish_reason of a stop id');
    // include_stop_str_in_output keeps the match at the text's end
    const kept = await client.completions.create({ ...base, stop, include_stop_str_in_output: true });
    eq(kept.choices[0].text, want + stop, 'the stop string kept');
    const keptSt = await collect(await client.completions.create({ ...base, stop, stream: true,
      include_stop_str_in_output: true }));
    eq(keptSt.text[0], want + stop, 'streamed, the stop string kept');
    const raw = await server.request('POST', '/v1/completions', { body: JSON.stringify({ ...base,
      stop, stream: true }) });
    assert(raw.text.includes(`"finish_reason":"stop","stop_reason":${JSON.stringify(stop)}`),
      `the last chunk's stop_reason: ${raw.text.slice(-400)}`);
  }],

  ['echo_starts_each_choice_with_the_prompt', async (s) => {
    const base = { model: MODEL, prompt: 'The sea is', max_tokens: 6, temperature: 0 };
    const plain = (await client.completions.create(base)).choices[0].text;
    const r = await client.completions.create({ ...base, echo: true, n: 2 });
    for (const c of r.choices) eq(c.text, 'The sea is' + plain, 'prompt, then the output');
    eq(r.usage.completion_tokens, 12, 'two choices of 6: the echo is not counted as output');
    const st = await collect(await client.completions.create({ ...base, echo: true,
      stream: true }));
    eq(st.text[0], 'The sea is' + plain, 'streamed');
    // a token-id prompt is echoed decoded
    const ids = (await s.request('POST', '/tokenize', { body: JSON.stringify({ model: MODEL,
      prompt: 'The sea is' }) })).json.tokens;
    const byIds = await client.completions.create({ ...base, prompt: ids, echo: true });
    eq(byIds.choices[0].text, 'The sea is' + plain, 'token ids decoded');
    // a stop string inside the prompt does not end the choice
    const stopIn = await client.completions.create({ ...base, echo: true, stop: 'sea' });
    assert(stopIn.choices[0].text.startsWith('The sea is'), stopIn.choices[0].text);
  }],

  ['n_is_bounded_by_max_streams_only', async () => {
    // more choices than one worker runs at once (--parallel 64 each): the
    // rest wait in the queues like any stream
    const r = await client.completions.create({ model: MODEL, prompt: 'count', max_tokens: 2,
      n: 160, seed: 7 });
    eq(r.choices.length, 160, 'every choice');
    eq(r.choices.map((c) => c.index), [...Array(160).keys()], 'in order');
    assert(r.choices.every((c) => c.finish_reason === 'length'), 'each ran its two tokens');
  }],

  ['n_choices_with_a_seed_are_reproducible_and_differ', async () => {
    const req = { model: MODEL, messages: HELLO, max_tokens: 12, temperature: 1.0, seed: 1234,
      n: 3 };
    const a = await client.chat.completions.create(req);
    const b = await client.chat.completions.create(req);
    eq(a.choices.map((c) => c.index), [0, 1, 2], 'indexes');
    eq(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content),
      'the same seed');
    assert(new Set(a.choices.map((c) => c.message.content)).size > 1, 'choices differ');
    eq(a.usage.completion_tokens, a.choices.length * 12, 'completion tokens of all choices');
    const st = await collect(await client.chat.completions.create({ ...req, stream: true }));
    eq(st.text, a.choices.map((c) => c.message.content), 'streamed choices');
    const other = await client.chat.completions.create({ ...req, seed: 99 });
    assert(JSON.stringify(other.choices.map((c) => c.message.content)) !==
      JSON.stringify(a.choices.map((c) => c.message.content)), 'another seed');
  }],

  ['sampling_fields_reach_the_workers', async () => {
    const req = { model: MODEL, prompt: 'Sampling', max_tokens: 8, seed: 7, temperature: 0.8 };
    const plain = await client.completions.create(req);
    const topk1 = await client.completions.create({ ...req, top_k: 1 });
    const greedy = await client.completions.create({ ...req, temperature: 0 });
    eq(topk1.choices[0].text, greedy.choices[0].text, 'top_k 1 is greedy');
    const again = await client.completions.create(req);
    eq(again.choices[0].text, plain.choices[0].text, 'seeded sampling repeats');
    const pen = await client.completions.create({ ...req, temperature: 0,
      repetition_penalty: 1.9, frequency_penalty: 2, presence_penalty: 2 });
    assert(pen.choices[0].text !== greedy.choices[0].text, 'penalties change greedy output');
    const r = await client.completions.create({ ...req, top_p: 0.5, min_p: 0.1,
      max_tokens: 5 });
    eq(r.usage.completion_tokens, 5, 'max_tokens');
    eq(r.choices[0].finish_reason, 'length', 'finish_reason length');
  }],

  ['a_repeated_prompt_reports_cached_tokens_unless_salted', async () => {
    const long = 'The history of the lighthouse: ' + 'stone and light and sea. '.repeat(40);
    const req = { model: MODEL, prompt: long, max_tokens: 2, temperature: 0 };
    const first = await client.completions.create(req);
    const second = await client.completions.create(req);
    assert(first.usage.prompt_tokens > 100, 'a prompt of several pages');
    assert(second.usage.prompt_tokens_details.cached_tokens >= 64,
      `cached tokens: ${JSON.stringify(second.usage)}`);
    const salted = await client.completions.create({ ...req, cache_salt: 'tenant-b' });
    eq(salted.usage.prompt_tokens_details.cached_tokens, 0, 'another salt shares nothing');
    eq(salted.choices[0].text, first.choices[0].text, 'same output under a salt');
  }],

  ['tokenize_and_detokenize_round_trip', async (s) => {
    const text = 'Grüße, 世界! 🌊 <think>x</think>';
    const t = await s.request('POST', '/tokenize', { body: { prompt: text,
      return_token_strs: true } });
    eq(t.status, 200, 'tokenize');
    eq(t.json.count, t.json.tokens.length, 'count');
    eq(t.json.token_strs.length, t.json.count, 'token_strs');
    for (const [i, id] of t.json.tokens.entries()) {
      const one = await s.request('POST', '/detokenize', { body: { tokens: [id],
        skip_special_tokens: false } });
      eq(t.json.token_strs[i], one.json.prompt, `token_strs[${i}]`);
    }
    const d = await s.request('POST', '/detokenize', { body: { tokens: t.json.tokens } });
    eq(d.json.prompt, text, 'round trip');
    const llama = await s.request('POST', '/tokenize', { body: { content: text } });
    eq(llama.json.tokens, t.json.tokens, "llama.cpp's content");
  }],

  ['a_body_past_its_first_buffer_is_read_whole', async (s) => {
    // a Content-Length body of 150 KB (JSON padded with spaces before its
    // closing brace): the server takes 64 KiB at its headers and grows
    // the buffer as the bytes come
    const text = 'The sea, the sea.';
    const small = await s.request('POST', '/tokenize', { body: { prompt: text } });
    const body = JSON.stringify({ prompt: text }).slice(0, -1) + ' '.repeat(150000) + '}';
    const big = await s.request('POST', '/tokenize', { body });
    eq(big.status, 200, `tokenize (${big.text.slice(0, 200)})`);
    eq(big.json.tokens, small.json.tokens, 'the same tokens as the small body');
  }],

  ['unknown_fields_are_refused_by_name_unless_ignored_with_a_warning', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: HELLO,
      max_tokens: 3, temperature: 0, store: false, metadata: { a: 'b' }, user: 'someone',
      parallel_tool_calls: false, service_tier: null });
    eq(r.usage.completion_tokens <= 3, true, 'served');
    let err;
    try {
      await client.chat.completions.create({ model: MODEL, messages: HELLO, max_tokens: 3,
        some_field_from_the_future: { x: [1, 2] } });
    } catch (e) { err = e; }
    eq([err?.status, err?.param], [400, 'some_field_from_the_future'], 'refused by name');
    assert(err.message.includes('--ignore-unknown-fields'), err.message);
    try {
      err = undefined;
      await client.completions.create({ model: MODEL, prompt: 'hi', max_tokens: 3, min_tokens: 2 });
    } catch (e) { err = e; }
    eq([err?.status, err?.param], [400, 'min_tokens'], 'a vLLM field not done here');
    const lax = await Server.start(['--ignore-unknown-fields']);
    try {
      const c = lax.client();
      const ok = await c.chat.completions.create({ model: MODEL, messages: HELLO, max_tokens: 3,
        some_field_from_the_future: 1, another_one: 'x' });
      eq(ok.usage.completion_tokens <= 3, true, 'ignored');
      await until(async () => lax.logText.includes(
        "ignored unknown fields 'some_field_from_the_future', 'another_one'"), 5000,
      'the warning in the log');
      try {
        err = undefined;
        await c.chat.completions.create({ model: MODEL, messages: HELLO, guided_json: {} });
      } catch (e) { err = e; }
      eq([err?.status, err?.param], [400, 'guided_json'], 'still refused: it changes the output');
    } finally {
      await lax.stop();
    }
  }],

  ['requests_are_counted_by_status_and_tokens_in_metrics', async (s) => {
    const ok = await s.metric(
      'shoal_http_requests_total{route="/v1/chat/completions",status="200"}');
    assert(ok >= 10, `chat 200s: ${ok}`);
    assert(await s.metric('shoal_generation_tokens_total') > 100, 'generated tokens');
    assert(await s.metric('shoal_prefix_cache_hits_total') >= 64, 'prefix cache hits');
    assert(await s.metric('shoal_time_to_first_token_seconds_count') > 10, 'ttft samples');
    assert(await s.metric('shoal_inter_token_latency_seconds_count') > 100, 'itl samples');
    assert(await s.metric('shoal_stream_chunks_total') > 50, 'SSE events');
  }],

  ['tokens_of_a_request_the_client_left_are_counted', async (s) => {
    // computed all the same (vLLM counts them too); they went uncounted
    const before = await s.metric('shoal_generation_tokens_total');
    const left = await s.metric(
      'shoal_http_requests_total{route="/v1/chat/completions",status="499"}') || 0;
    const controller = new AbortController();
    const stream = await client.chat.completions.create({ model: MODEL, messages: HELLO,
      max_tokens: 400, ignore_eos: true, stream: true }, { signal: controller.signal });
    let got = 0;
    try {
      for await (const chunk of stream) {
        got += chunk.choices[0]?.delta?.content ? 1 : 0; /* a token at least */
        if (got === 20) controller.abort();
      }
    } catch (e) {
      if (e.name !== 'APIUserAbortError') throw e;
    }
    await until(async () => (await s.metric(
      'shoal_http_requests_total{route="/v1/chat/completions",status="499"}')) === left + 1,
    10000, 'the left request counted as a 499');
    const after = await s.metric('shoal_generation_tokens_total');
    assert(after - before >= got, `generation tokens rose by ${after - before}; ${got} were received`);
  }],
];

await run(server, tests, stopCleanly);
