// 64 concurrent streaming clients (the official client, one connection
// each): every stream completes, and each one's text and token ids equal
// what the same request gives when it runs alone. Greedy decoding of a
// stream must not depend on what else is in the workers' batches.
import { MODEL, Server, assert, collect, eq, run, stopCleanly } from './harness.mjs';

const CLIENTS = 64;
// One allowed origin (checked below), not the default any.
const ORIGIN = 'https://app.example';
const server = await Server.start(['--allowed-origin', ORIGIN]);

const request = (i) => ({
  model: MODEL,
  messages: [{ role: 'user', content: `Client ${i}: count ${'to ten '.repeat(1 + (i % 5))}` }],
  max_tokens: 8 + (i % 7),
  temperature: 0,
  return_token_ids: true,
});

const tests = [
  ['sixty_four_concurrent_streams_equal_their_solo_runs', async (s) => {
    const client = s.client();
    // The reference: each request alone on its worker (two lanes, one per
    // worker: the router puts the second on the idle worker).
    const solo = [];
    for (let i = 0; i < CLIENTS; i += 2) {
      const pair = await Promise.all([client.chat.completions.create(request(i)),
        client.chat.completions.create(request(i + 1))]);
      solo.push(...pair);
    }
    // All at once, each with its own client (its own connection).
    const t0 = Date.now();
    const streams = await Promise.all(Array.from({ length: CLIENTS }, async (_, i) =>
      collect(await s.client().chat.completions.create({ ...request(i), stream: true,
        stream_options: { include_usage: true } }))));
    const seconds = (Date.now() - t0) / 1000;
    let tokens = 0;
    for (let i = 0; i < CLIENTS; i++) {
      const want = solo[i].choices[0];
      eq(streams[i].text[0], want.message.content, `client ${i}: text`);
      eq(streams[i].tokenIds[0], want.token_ids, `client ${i}: token ids`);
      eq(streams[i].finish[0], want.finish_reason, `client ${i}: finish_reason`);
      // (the solo runs left the prompts cached: cached_tokens may differ)
      eq([streams[i].usage.prompt_tokens, streams[i].usage.completion_tokens],
        [solo[i].usage.prompt_tokens, solo[i].usage.completion_tokens], `client ${i}: usage`);
      tokens += solo[i].usage.completion_tokens;
    }
    console.log(`  ${CLIENTS} streams, ${tokens} tokens in ${seconds.toFixed(2)} s`);
    // Nothing is left running, and every request was a 200.
    assert(await s.running() === 0, 'no streams left running');
    eq(await s.metric('shoal_http_requests_total{route="/v1/chat/completions",status="200"}'),
      2 * CLIENTS, 'requests answered 200');
  }],

  ['one_allowed_origin_is_named_and_varies_by_origin', async (s) => {
    const r = await s.request('GET', '/v1/models', { headers: { Origin: ORIGIN } });
    eq(r.headers['access-control-allow-origin'], ORIGIN, 'the origin');
    eq(r.headers.vary, 'Origin', 'caches keep answers apart by origin');
  }],

  ['concurrent_mixed_requests_all_complete', async (s) => {
    const client = s.client();
    // Every job is started before any is awaited, so each failure reaches
    // Promise.all.
    const jobs = Array.from({ length: 32 }, async (_, i) => {
      if (i % 4 === 0) {
        const r = await client.completions.create({ model: MODEL, prompt: `Job ${i}`,
          max_tokens: 8, temperature: 0.7, seed: i, n: 2 });
        eq(r.choices.length, 2, `job ${i}: choices`);
      } else if (i % 4 === 1) {
        const r = await collect(await client.completions.create({ model: MODEL,
          prompt: [1, 2, 3, i], max_tokens: 8, stream: true }));
        assert(r.finish[0], `job ${i}: finished`);
      } else if (i % 4 === 2) {
        const r = await s.request('POST', '/tokenize', { body: { prompt: `tokenize ${i}` } });
        eq(r.status, 200, `job ${i}: tokenize`);
      } else {
        const r = await client.chat.completions.create({ model: MODEL, max_tokens: 6,
          stop: ['\n'], messages: [{ role: 'user', content: `Job ${i}` }] });
        assert(r.choices[0].finish_reason, `job ${i}: finished`);
      }
    });
    await Promise.all(jobs);
  }],
];

await run(server, tests, stopCleanly, 500000);
