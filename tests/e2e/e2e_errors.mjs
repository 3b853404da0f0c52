// Bad requests against a coordinator with an API key: a corpus of
// malformed JSON, wrong types, huge and negative numbers, deep nesting,
// invalid UTF-8, bodies over the limit, unknown routes and methods and
// missing keys. Every one gets a 4xx with OpenAI's error body (never a
// 500), the official client raises the matching error class, and the
// server keeps serving throughout.
import net from 'node:net';
import { MODEL, Server, assert, eq, run, stopCleanly, until } from './harness.mjs';

const KEY = 'sk-e2e-secret';
const BODY_MAX = 65536;
// 1 MiB for all bodies being read: sixteen of BODY_MAX
const server = await Server.start(['--max-body-bytes', String(BODY_MAX), '--max-streams', '20',
  '--max-body-memory-mib', '1'],
  { SHOAL_API_KEY: KEY });
server.authHeaders = { Authorization: `Bearer ${KEY}` };
const client = server.client(KEY);
const AUTH = server.authHeaders;
const MSGS = [{ role: 'user', content: 'hi' }];

// An error answer: the status, a JSON body with error.message, and the
// param when one is named.
function isError(r, status, param, what) {
  eq(r.status, status, `${what}: status (${r.text.slice(0, 200)})`);
  assert(r.json && typeof r.json.error === 'object', `${what}: error body ${r.text.slice(0, 200)}`);
  assert(typeof r.json.error.message === 'string' && r.json.error.message.length > 0,
    `${what}: message`);
  assert('type' in r.json.error && 'param' in r.json.error && 'code' in r.json.error,
    `${what}: OpenAI's four keys`);
  if (param !== undefined) eq(r.json.error.param, param, `${what}: param`);
}

async function stillServes(s) {
  const r = await client.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 2,
    temperature: 0 });
  eq(r.choices.length, 1, 'a good request after the bad ones');
  eq((await s.request('GET', '/health')).status, 200, 'health');
  // every body's buffer went back to the budget (--max-body-memory-mib)
  await until(async () => (await s.metric('shoal_http_body_bytes')) === 0, 5000,
    'the bodies\' buffers given back');
}

const deep = (n) => '{"messages":' + '['.repeat(n) + ']'.repeat(n) + '}';
const chat = (extra) => JSON.stringify({ model: MODEL, messages: MSGS, ...extra });

// [name, path, body, status, param]
const corpus = [
  ['empty body', '/v1/chat/completions', '', 400],
  ['not JSON', '/v1/chat/completions', 'hello', 400],
  ['truncated JSON', '/v1/chat/completions', '{"messages":[{"role":"user"', 400],
  ['trailing garbage', '/v1/chat/completions', chat({}) + 'x', 400],
  ['single quotes', '/v1/chat/completions', "{'messages':[]}", 400],
  ['NaN', '/v1/chat/completions', chat({}).slice(0, -1) + ',"temperature":NaN}', 400],
  ['an array body', '/v1/chat/completions', '[1,2,3]', 400],
  ['a string body', '/v1/completions', '"prompt"', 400],
  ['messages wrong type', '/v1/chat/completions', '{"messages":"hi"}', 400, 'messages'],
  ['message not an object', '/v1/chat/completions', '{"messages":[1]}', 400, 'messages[0]'],
  ['role wrong type', '/v1/chat/completions', '{"messages":[{"role":5,"content":"x"}]}', 400,
    'messages[0].role'],
  ['unknown role', '/v1/chat/completions', '{"messages":[{"role":"god","content":"x"}]}', 400,
    'messages[0].role'],
  ['content a number', '/v1/chat/completions', '{"messages":[{"role":"user","content":1}]}',
    400, 'messages[0].content'],
  ['image part', '/v1/chat/completions', chat({ messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: 'http://x' } }] }] }), 400, 'messages[0].content[0]'],
  ['temperature a string', '/v1/chat/completions', chat({ temperature: 'hot' }), 400,
    'temperature'],
  ['temperature negative', '/v1/chat/completions', chat({ temperature: -1 }), 400,
    'temperature'],
  ['temperature 1e400', '/v1/chat/completions', chat({}).slice(0, -1) + ',"temperature":1e400}',
    400, 'temperature'],
  ['top_p 0', '/v1/chat/completions', chat({ top_p: 0 }), 400, 'top_p'],
  ['top_p 2', '/v1/chat/completions', chat({ top_p: 2 }), 400, 'top_p'],
  ['top_k -5', '/v1/chat/completions', chat({ top_k: -5 }), 400, 'top_k'],
  ['min_p 1.5', '/v1/chat/completions', chat({ min_p: 1.5 }), 400, 'min_p'],
  ['presence_penalty 3', '/v1/chat/completions', chat({ presence_penalty: 3 }), 400,
    'presence_penalty'],
  ['frequency_penalty -3', '/v1/chat/completions', chat({ frequency_penalty: -3 }), 400,
    'frequency_penalty'],
  ['repetition_penalty 0', '/v1/chat/completions', chat({ repetition_penalty: 0 }), 400,
    'repetition_penalty'],
  ['max_tokens 0', '/v1/chat/completions', chat({ max_tokens: 0 }), 400, 'max_tokens'],
  ['max_tokens negative', '/v1/chat/completions', chat({ max_tokens: -1 }), 400, 'max_tokens'],
  ['max_tokens fractional', '/v1/chat/completions', chat({ max_tokens: 2.5 }), 400,
    'max_tokens'],
  ['max_tokens huge', '/v1/chat/completions', chat({ max_tokens: 1e300 }), 400, 'max_tokens'],
  ['max_tokens past the context', '/v1/chat/completions', chat({ max_tokens: 5000 }), 400,
    'max_tokens'],
  ['max_completion_tokens a bool', '/v1/chat/completions',
    chat({ max_completion_tokens: true }), 400, 'max_completion_tokens'],
  ['n 0', '/v1/chat/completions', chat({ n: 0 }), 400, 'n'],
  ['n 1000', '/v1/chat/completions', chat({ n: 1000 }), 400, 'n'],
  ['seed a string', '/v1/chat/completions', chat({ seed: 'x' }), 400, 'seed'],
  ['seed 2^70', '/v1/chat/completions', chat({ seed: 2 ** 70 }), 400, 'seed'],
  ['stop a number', '/v1/chat/completions', chat({ stop: 5 }), 400, 'stop'],
  ['empty stop', '/v1/chat/completions', chat({ stop: [''] }), 400, 'stop'],
  ['too many stops', '/v1/chat/completions', chat({ stop: Array.from({ length: 17 },
    (_, i) => `s${i}`) }), 400, 'stop'],
  ['a stop too long', '/v1/chat/completions', chat({ stop: 'x'.repeat(300) }), 400, 'stop'],
  ['top_logprobs 50', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 50 }), 400,
    'top_logprobs'],
  ['top_logprobs without logprobs', '/v1/chat/completions', chat({ top_logprobs: 2 }), 400,
    'top_logprobs'],
  ['stream_options without stream', '/v1/chat/completions',
    chat({ stream_options: { include_usage: true } }), 400, 'stream_options'],
  ['stream a string', '/v1/chat/completions', chat({ stream: 'yes' }), 400, 'stream'],
  ['a tool without a name', '/v1/chat/completions', chat({ tools: [{ type: 'function',
    function: { description: 'f' } }] }), 400, 'tools[0].function.name'],
  ['tool_choice required', '/v1/chat/completions', chat({ tools: [{ type: 'function',
    function: { name: 'f' } }], tool_choice: 'required' }), 400, 'tool_choice'],
  ['json response_format', '/v1/chat/completions',
    chat({ response_format: { type: 'json_object' } }), 400, 'response_format'],
  ['empty cache_salt', '/v1/chat/completions', chat({ cache_salt: '' }), 400, 'cache_salt'],
  ['thinking a string', '/v1/chat/completions',
    chat({ chat_template_kwargs: { enable_thinking: 'no' } }), 400,
    'chat_template_kwargs.enable_thinking'],
  ['another model', '/v1/chat/completions', chat({ model: 'gpt-4o' }), 404, 'model'],
  ['deep nesting', '/v1/chat/completions', deep(10000), 400],
  ['nesting past the bound', '/v1/chat/completions', deep(40), 400],
  ['prompt missing', '/v1/completions', '{"max_tokens":3}', 400, 'prompt'],
  ['prompt an object', '/v1/completions', '{"prompt":{}}', 400, 'prompt'],
  ['prompt ids out of the vocabulary', '/v1/completions', '{"prompt":[1,2,99999999]}', 400,
    'prompt'],
  ['prompt ids negative', '/v1/completions', '{"prompt":[1,-2]}', 400, 'prompt'],
  ['prompt ids fractional', '/v1/completions', '{"prompt":[1.5]}', 400, 'prompt'],
  ['prompt ids past the context', '/v1/completions',
    JSON.stringify({ prompt: Array(5000).fill(7) }), 400, 'prompt'],
  ['prompt text past the context', '/v1/completions',
    JSON.stringify({ prompt: 'word '.repeat(6000) }), 400, 'prompt'],
  ['empty prompt', '/v1/completions', '{"prompt":""}', 400, 'prompt'],
  ['two prompts', '/v1/completions', '{"prompt":["a","b"]}', 400, 'prompt'],
  ['echo with logprobs', '/v1/completions', '{"prompt":"a","echo":true,"logprobs":1}', 400,
    'echo'],
  ['logprobs too many', '/v1/completions', '{"prompt":"a","logprobs":30}', 400, 'logprobs'],
  ['tokenize nothing', '/tokenize', '{}', 400, 'prompt'],
  ['detokenize strings', '/detokenize', '{"tokens":["a"]}', 400, 'tokens'],
  ['detokenize out of the vocabulary', '/detokenize', '{"tokens":[-1]}', 400, 'tokens'],
];

const tests = [
  ['every_bad_body_gets_a_4xx_error_body', async (s) => {
    for (const [name, path, body, status, param] of corpus) {
      let r;
      try {
        r = await s.request('POST', path, { body, headers: AUTH, timeoutMs: 20000 });
      } catch (e) {
        throw new Error(`${name}: ${e.message}`);
      }
      isError(r, status, param, name);
    }
    await stillServes(s);
  }],

  ['invalid_utf8_is_a_400', async (s) => {
    const bad = [Buffer.from([0x80]), Buffer.from([0xc0, 0xaf]), Buffer.from([0xed, 0xa0, 0x80]),
      Buffer.from([0xf4, 0x90, 0x80, 0x80]), Buffer.from([0xe2, 0x82])];
    for (const b of bad) {
      const body = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), b,
        Buffer.from('"}]}')]);
      isError(await s.request('POST', '/v1/chat/completions', { body, headers: AUTH }), 400,
        null, `bytes ${b.toString('hex')}`);
    }
    isError(await s.request('POST', '/v1/chat/completions', { headers: AUTH,
      body: '{"messages":[{"role":"user","content":"\\ud800"}]}' }), 400, null, 'lone surrogate');
    await stillServes(s);
  }],

  ['a_body_over_the_limit_is_a_413', async (s) => {
    // From its Content-Length, before a byte of it is read.
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}` +
      `\r\nContent-Type: application/json\r\nContent-Length: ${BODY_MAX + 1}\r\n\r\n`;
    const answer = await s.raw(head);
    assert(/^HTTP\/1\.1 413 /.test(answer), `413 from the length: ${answer.slice(0, 100)}`);
    assert(answer.includes('"error"'), 'an error body');
    // Chunked, with no length: refused once it passes the limit.
    const big = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(BODY_MAX) }] });
    const hex = big.length.toString(16);
    const chunked = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ` +
      `${KEY}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${hex}\r\n${big}\r\n0\r\n\r\n`;
    const answer2 = await s.raw(chunked);
    assert(/^HTTP\/1\.1 413 /.test(answer2), `413 chunked: ${answer2.slice(0, 100)}`);
    // Just under the limit is parsed (and refused for its prompt length).
    const under = JSON.stringify({ prompt: 'y'.repeat(BODY_MAX - 40) });
    isError(await s.request('POST', '/v1/completions', { body: under, headers: AUTH }), 400,
      'prompt', 'a body under the limit');
    await stillServes(s);
  }],

  ['bodies_past_the_memory_budget_are_a_503_until_they_go', async (s) => {
    // Seventeen clients each declare a body of BODY_MAX and send part of
    // it: sixteen hold the 1 MiB budget (--max-body-memory-mib 1), so the
    // next body, however small, is a 503 (which clients retry); /health
    // still answers; once they hang up the budget is free again. Without
    // the budget 4,096 such connections held 128 GiB.
    const holders = [];
    for (let i = 0; i < 17; i++) {
      const sock = net.connect(s.port, '127.0.0.1');
      sock.on('error', () => {});
      await new Promise((res) => sock.on('connect', res));
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}` +
        `\r\nContent-Type: application/json\r\nContent-Length: ${BODY_MAX}\r\n\r\n` +
        '{"prompt":"' + 'z'.repeat(1000));
      holders.push(sock);
    }
    try {
      await until(async () => {
        const r = await s.request('POST', '/v1/completions', { headers: AUTH,
          body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }) });
        if (r.status === 200) return false; // the holders' headers not all read yet
        isError(r, 503, undefined, 'a small body past the budget');
        eq(r.json.error.code, 'bodies_over_budget', 'its code');
        eq(r.headers['retry-after'], '5', 'Retry-After on the 503');
        assert(r.json.error.message.includes('--max-body-memory-mib'), 'the message names the flag');
        return true;
      }, 10000, 'the budget full');
      eq((await s.request('GET', '/health')).status, 200, 'health without a body');
    } finally {
      for (const h of holders) h.destroy();
    }
    await until(async () => (await s.request('POST', '/v1/completions', { headers: AUTH,
      body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }) })).status === 200, 10000,
    'the budget given back');
    await stillServes(s);
  }],

  ['two_content_lengths_that_differ_are_a_400_at_once', async (s) => {
    const head = (lengths) => 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: ' +
      `Bearer ${KEY}\r\nContent-Type: application/json\r\n` +
      lengths.map((n) => `Content-Length: ${n}\r\n`).join('') + 'Connection: close\r\n\r\n{}';
    const t0 = Date.now();
    const answer = await s.raw(head([2, 5]), 5000);
    assert(/^HTTP\/1\.1 400 /.test(answer), `2 and 5: ${answer.slice(0, 100)}`);
    assert(answer.includes('"invalid_content_length"'), `2 and 5: the error body ${answer}`);
    assert(Date.now() - t0 < 4000, 'answered at once');
    // the same length twice is one length: the body is read and judged
    const same = await s.raw(head([2, 2]), 5000);
    assert(/^HTTP\/1\.1 400 /.test(same) && same.includes("'prompt' is required"),
      `2 and 2: ${same.slice(0, 300)}`);
    await stillServes(s);
  }],

  ['a_body_in_a_coding_other_than_chunked_is_a_501_at_once', async (s) => {
    // libmicrohttpd alone would wait for the body until its timeout (60 s)
    const body = chat({ max_tokens: 2 });
    for (const te of ['identity', 'gzip, chunked', 'bogus']) {
      const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ` +
        `${KEY}\r\nTransfer-Encoding: ${te}\r\nContent-Length: ${body.length}\r\n\r\n`;
      const t0 = Date.now();
      const answer = await s.raw(head + body, 5000);
      assert(/^HTTP\/1\.1 501 /.test(answer), `${te}: ${answer.slice(0, 100)}`);
      assert(answer.includes('"not_implemented"'), `${te}: an error body`);
      assert(Date.now() - t0 < 4000, `${te}: answered at once`);
    }
    // an error found before the coding is the answer, still at once
    const t0 = Date.now();
    const denied = await s.raw('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n' +
      'Transfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}', 5000);
    assert(/^HTTP\/1\.1 401 /.test(denied), `no key first: ${denied.slice(0, 100)}`);
    assert(Date.now() - t0 < 4000, 'the 401 at once');
    await stillServes(s);
  }],

  ['cors_preflights_need_no_key_and_every_answer_allows_any_origin', async (s) => {
    // the default, as vLLM's: any origin
    const pre = await s.request('OPTIONS', '/v1/chat/completions', { headers: {
      Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST',
      'Access-Control-Request-Headers': 'authorization, content-type, x-stainless-os' } });
    eq(pre.status, 204, 'preflight without the key');
    eq(pre.headers['access-control-allow-origin'], '*', 'preflight origin');
    eq(pre.headers['access-control-allow-methods'], 'POST, OPTIONS', 'preflight methods');
    eq(pre.headers['access-control-allow-headers'], 'authorization, content-type, x-stainless-os',
      'the headers asked for');
    const models = await s.request('OPTIONS', '/v1/models', { headers: { Origin: 'https://a.b' } });
    eq(models.headers['access-control-allow-methods'], 'GET, HEAD, OPTIONS', 'models methods');
    eq(models.headers['access-control-allow-headers'], 'Authorization, Content-Type', 'default');
    // a preflight with a body: read and dropped, the connection serves on
    const body = 'x'.repeat(5000);
    const withBody = await s.raw('OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\n' +
      `Origin: https://a.b\r\nContent-Length: ${body.length}\r\n\r\n${body}` +
      'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    assert(/^HTTP\/1\.1 204 /.test(withBody), `a body: ${withBody.slice(0, 100)}`);
    assert(/HTTP\/1\.1 200 [^]*"ok"/.test(withBody), `then /health: ${withBody.slice(-200)}`);
    // counted under their own status, not as "other"
    const n204 = await s.metric(
      'shoal_http_requests_total{route="/v1/chat/completions",status="204"}');
    assert(n204 >= 1, `preflights counted as 204: ${n204}`);
    assert(!/status="other"/.test(await s.metrics()), 'none counted as "other"');
    // an unknown route is still a 404 (behind the key: a 401 first)
    isError(await s.request('OPTIONS', '/nowhere', { headers: AUTH }), 404, undefined, 'unknown');
    // answers a browser reads: an error, a whole answer, a stream
    const denied = await s.request('POST', '/v1/chat/completions', { body: chat({}) });
    eq(denied.status, 401, 'no key');
    eq(denied.headers['access-control-allow-origin'], '*', 'on an error');
    const ok = await s.request('POST', '/v1/chat/completions', { headers: AUTH,
      body: chat({ max_tokens: 2 }) });
    eq(ok.status, 200, 'with the key');
    eq(ok.headers['access-control-allow-origin'], '*', 'on an answer');
    eq(ok.headers['access-control-expose-headers'], 'X-Request-Id, Retry-After',
      'the request id and Retry-After are readable');
    const sse = await s.request('POST', '/v1/chat/completions', { headers: AUTH,
      body: chat({ max_tokens: 2, stream: true }) });
    eq(sse.headers['access-control-allow-origin'], '*', 'on a stream');
  }],

  ['the_api_key_guards_every_route_but_health', async (s) => {
    for (const [method, path] of [['GET', '/v1/models'], ['POST', '/v1/chat/completions'],
      ['POST', '/v1/completions'], ['POST', '/tokenize'], ['POST', '/detokenize'],
      ['GET', '/metrics'], ['GET', '/nowhere']]) {
      const body = method === 'POST' ? chat({}) : undefined;
      isError(await s.request(method, path, { body }), 401, undefined, `no key: ${path}`);
      isError(await s.request(method, path, { body, headers: { Authorization: 'Bearer wrong' } }),
        401, undefined, `wrong key: ${path}`);
      isError(await s.request(method, path, { body, headers: { Authorization: KEY } }), 401,
        undefined, `no Bearer: ${path}`);
    }
    eq((await s.request('GET', '/health')).status, 200, '/health needs no key');
    let err;
    try {
      await s.client('sk-wrong').chat.completions.create({ model: MODEL, messages: MSGS });
    } catch (e) { err = e; }
    eq(err?.status, 401, 'the client sees 401');
    eq(err?.constructor?.name, 'AuthenticationError', 'AuthenticationError');
    await stillServes(s);
  }],

  ['unknown_routes_are_404_and_wrong_methods_405', async (s) => {
    isError(await s.request('GET', '/v1/nothing', { headers: AUTH }), 404, undefined, 'route');
    isError(await s.request('POST', '/v2/chat/completions', { headers: AUTH, body: chat({}) }),
      404, undefined, 'v2');
    const m = await s.request('GET', '/v1/chat/completions', { headers: AUTH });
    isError(m, 405, undefined, 'GET on chat');
    eq(m.headers.allow, 'POST', 'Allow header');
    isError(await s.request('DELETE', '/v1/models', { headers: AUTH }), 405, undefined,
      'DELETE models');
    isError(await s.request('GET', '/v1/models/other-model', { headers: AUTH }), 404, 'model',
      'another model by name');
    await stillServes(s);
  }],

  ['the_client_raises_the_matching_errors', async () => {
    const tries = [
      [() => client.chat.completions.create({ model: MODEL, messages: MSGS, top_p: 5 }), 400,
        'BadRequestError', 'top_p'],
      [() => client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 100000 }), 400,
        'BadRequestError', 'max_tokens'],
      [() => client.chat.completions.create({ model: 'nope', messages: MSGS }), 404,
        'NotFoundError', 'model'],
      [() => client.chat.completions.create({ model: MODEL, messages: [] }), 400,
        'BadRequestError', 'messages'],
    ];
    for (const [fn, status, cls, param] of tries) {
      let err;
      try { await fn(); } catch (e) { err = e; }
      assert(err, `${cls}: no error`);
      eq(err.status, status, `${cls}: status`);
      eq(err.constructor.name, cls, 'class');
      eq(err.param, param, `${cls}: param`);
    }
  }],

  ['too_many_streams_in_flight_is_a_429', async (s) => {
    // --max-streams 20: a request of 16 choices in flight leaves room for
    // 4 more; another 16 are refused with 429 until it ends.
    const controller = new AbortController();
    const first = await client.chat.completions.create({ model: MODEL, messages: MSGS, n: 16,
      max_tokens: 400, ignore_eos: true, stream: true }, { signal: controller.signal });
    const it = first[Symbol.asyncIterator]();
    await it.next();
    let err;
    try {
      await client.chat.completions.create({ model: MODEL, messages: MSGS, n: 16, max_tokens: 2 });
    } catch (e) { err = e; }
    eq(err?.status, 429, 'the second request');
    eq(err?.headers?.get('retry-after'), '1', 'Retry-After on the 429');
    eq(err?.constructor?.name, 'RateLimitError', 'RateLimitError');
    const small = await client.chat.completions.create({ model: MODEL, messages: MSGS, n: 4,
      max_tokens: 2, temperature: 0 });
    eq(small.choices.length, 4, 'four fit beside it');
    controller.abort();
    // the aborted request's streams are given back
    await until(async () => {
      try {
        await client.chat.completions.create({ model: MODEL, messages: MSGS, n: 16,
          max_tokens: 1 });
        return true;
      } catch (e) {
        if (e.status !== 429) throw e;
        return false;
      }
    }, 10000, 'room for 16 again');
  }],

  ['n_past_max_streams_is_a_400_not_a_429', async () => {
    // more choices than the server ever runs at once can never fit: a 429
    // would have the client retry it for ever
    const small = await Server.start(['--max-streams', '4']);
    try {
      const r = await small.request('POST', '/v1/chat/completions',
        { body: chat({ n: 5, max_tokens: 1 }) });
      isError(r, 400, 'n', 'n 5 with --max-streams 4');
      const ok = await small.request('POST', '/v1/chat/completions',
        { body: chat({ n: 4, max_tokens: 1 }) });
      eq(ok.status, 200, `n 4 with --max-streams 4 (${ok.text.slice(0, 200)})`);
    } finally {
      await small.stop();
    }
  }],
];

await run(server, tests, stopCleanly);
