// A client that goes away cancels its streams at once: while reading a
// stream, and while its request waits with nothing to send (queued behind
// other streams), where only the coordinator's hangup watcher can notice.
// SIGTERM drains: the listener closes at once, the stream in flight runs
// to its end, and the coordinator exits 0.
import { spawnSync } from 'node:child_process';
import net from 'node:net';
import { MODEL, Server, assert, eq, opts, run, until } from './harness.mjs';

// Two streams per worker: four blockers fill both workers, and a fifth
// request waits in a worker's queue, producing no events.
// The drain may take long under a sanitizer on a busy machine: the test
// wants the stream to end by itself, not by the drain's deadline.
// --allowed-origin none: no CORS (checked below).
const server = await Server.start(['--parallel', '2', '--drain-timeout-s', '600',
  '--allowed-origin', 'none']);
const LONG = 3000; // tokens: well over a minute on these CPU workers

async function startBlockers(s, count) {
  const controllers = [];
  for (let i = 0; i < count; i++) {
    const controller = new AbortController();
    const stream = await s.client().completions.create({ model: MODEL, prompt: `Blocker ${i}`,
      max_tokens: LONG, ignore_eos: true, stream: true }, { signal: controller.signal });
    // read it in the background until aborted
    (async () => { try { for await (const _ of stream); } catch { /* aborted */ } })();
    controllers.push(controller);
  }
  await until(async () => (await s.running()) === count, 10000, 'the blockers run');
  return () => controllers.forEach((c) => c.abort());
}

// Sends a request on a raw socket and returns the socket.
async function send(s, path, body) {
  const sock = net.connect(s.port, '127.0.0.1');
  sock.on('error', () => {});
  await new Promise((r) => sock.on('connect', r));
  const text = JSON.stringify(body);
  sock.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`);
  return sock;
}

const waiting = (s) => s.metric('shoal_streams_waiting');

const tests = [
  ['an_allowed_origin_that_cannot_be_a_header_is_refused_at_start', async () => {
    for (const bad of ['https://a b', 'https://a\r\nX-Evil: 1']) {
      const r = spawnSync(opts.coordinator, ['--allowed-origin', bad], { encoding: 'utf8' });
      eq(r.status, 2, `exit status for ${JSON.stringify(bad)}`);
      assert(r.stderr.includes('--allowed-origin'), `names the flag: ${r.stderr}`);
    }
  }],

  ['without_cors_options_is_a_405_and_answers_carry_no_cors_headers', async (s) => {
    const pre = await s.request('OPTIONS', '/v1/completions', { headers: { Origin: 'https://a.b',
      'Access-Control-Request-Method': 'POST' } });
    eq(pre.status, 405, 'OPTIONS');
    eq(pre.headers['access-control-allow-origin'], undefined, 'no CORS on the 405');
    const r = await s.request('GET', '/v1/models', { headers: { Origin: 'https://a.b' } });
    eq(r.status, 200, 'models');
    eq(r.headers['access-control-allow-origin'], undefined, 'no CORS on an answer');
  }],

  ['a_client_that_leaves_a_stream_cancels_it', async (s) => {
    const controller = new AbortController();
    const stream = await s.client().chat.completions.create({ model: MODEL, max_tokens: LONG,
      ignore_eos: true, stream: true, messages: [{ role: 'user', content: 'Go on forever.' }] },
    { signal: controller.signal });
    let chunks = 0;
    try {
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta?.content && ++chunks === 3) controller.abort();
      }
    } catch (e) {
      assert(e.name === 'APIUserAbortError' || e.name === 'AbortError', `aborted: ${e}`);
    }
    eq(chunks, 3, 'read three chunks');
    // Cancelled streams leave the workers within a step or two.
    await until(async () => (await s.running()) === 0, 3000, 'the stream stopped');
    await until(async () => (await s.metric(
      'shoal_http_requests_total{route="/v1/chat/completions",status="499"}')) === 1, 3000,
    'counted as 499');
  }],

  ['a_client_that_leaves_a_queued_whole_completion_cancels_it', async (s) => {
    const stopBlockers = await startBlockers(s, 4);
    try {
      const sock = await send(s, '/v1/completions', { model: MODEL, prompt: 'Queued.',
        max_tokens: LONG, ignore_eos: true });
      await until(async () => (await waiting(s)) === 1, 5000, 'the request waits');
      sock.destroy();
      await until(async () => (await waiting(s)) === 0, 3000, 'the queued stream was cancelled');
      eq(await s.running(), 4, 'the blockers run on');
      await until(async () => (await s.metric(
        'shoal_http_requests_total{route="/v1/completions",status="499"}')) === 1, 3000,
      'counted as 499');
    } finally {
      stopBlockers();
    }
    await until(async () => (await s.running()) === 0, 3000, 'the blockers stopped');
  }],

  ['a_client_that_half_closes_while_its_choices_wait_cancels_them_all', async (s) => {
    const stopBlockers = await startBlockers(s, 4);
    try {
      const sock = await send(s, '/v1/chat/completions', { model: MODEL, max_tokens: LONG,
        ignore_eos: true, n: 3, stream: true, messages: [{ role: 'user', content: 'Wait.' }] });
      await until(async () => (await waiting(s)) === 3, 5000, 'three choices wait');
      sock.end(); // half-close: nginx, and shoal, take it as the client leaving
      await until(async () => (await waiting(s)) === 0, 3000, 'every choice was cancelled');
      sock.destroy();
    } finally {
      stopBlockers();
    }
    await until(async () => (await s.running()) === 0, 3000, 'the blockers stopped');
  }],
];

// Last: SIGTERM while a stream runs. The listener must close while the
// stream is still running, and the stream must then run to its end.
async function drain(s) {
  const client = s.client();
  const TOKENS = 200;
  const stream = await client.completions.create({ model: MODEL, prompt: 'Drain me.',
    max_tokens: TOKENS, ignore_eos: true, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  const it = stream[Symbol.asyncIterator]();
  assert(!(await it.next()).done, 'a first chunk');
  let ended = false, usage = null, finish = null;
  const reading = (async () => {
    for (;;) {
      const { value, done } = await it.next();
      if (done) break;
      if (value.usage) usage = value.usage;
      if (value.choices[0]?.finish_reason) finish = value.choices[0].finish_reason;
    }
    ended = true;
  })();
  s.proc.kill('SIGTERM');
  await until(() => new Promise((resolve) => {
    const sock = net.connect(s.port, '127.0.0.1');
    sock.on('error', () => resolve(true));
    sock.on('connect', () => { sock.destroy(); resolve(false); });
  }), 5000, 'the listener closed');
  assert(!ended, 'the listener closed while the stream still ran');
  await reading;
  eq(finish, 'length', 'the stream finished');
  eq(usage?.completion_tokens, TOKENS, 'every token');
  const { code, sig } = await s.stop();
  eq([code, sig], [0, null], 'exit status after the drain');
  assert(!/ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:/.test(s.logText),
    'a sanitizer reported an error');
}

await run(server, tests, drain);
