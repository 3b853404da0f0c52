// The end-to-end tests' harness: starts a real shoal-coordinator with two
// CPU workers on the demo model (random weights, the real Qwen3 tokenizer),
// gives each test the official `openai` client and raw HTTP, and runs the
// tests one after another with a time bound each. Prints "ok <name>" or
// "FAIL <name>: why" per test and exits non-zero if any failed; the
// coordinator's log is printed when something failed.
//
// Arguments (CTest passes them): --coordinator BIN --worker BIN --model DIR
// --node-modules DIR. Everything listens on 127.0.0.1 on a port the kernel
// picks (--port 0 --port-file), so parallel runs never collide.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

export const opts = {};
for (let i = 2; i < process.argv.length; i += 2)
  opts[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['coordinator', 'worker', 'model', 'node-modules'])
  if (!opts[k]) {
    console.error(`harness: --${k} is required`);
    process.exit(2);
  }

export const MODEL = 'demo';
const { default: OpenAI } = await import(
  pathToFileURL(path.join(opts['node-modules'], 'openai', 'index.mjs')).href);
export { OpenAI };

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export class Server {
  // Starts shoal-coordinator with args added to the defaults; resolves
  // once it listens.
  static async start(extra = [], env = {}) {
    const s = new Server();
    s.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shoal-e2e-'));
    s.logText = '';
    const args = ['--model', opts.model, '--served-model-name', MODEL, '--workers', 'cpu,cpu',
      '--worker-path', opts.worker, '--threads', '1', '--port', '0',
      '--port-file', path.join(s.dir, 'port'), '--runtime-dir', path.join(s.dir, 'rt'),
      '--max-model-len', '4096', '--parallel', '64', '--kv-pages', '2048', ...extra];
    s.proc = spawn(opts.coordinator, args, { env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'] });
    s.proc.stdout.on('data', (d) => { s.logText += d; });
    s.proc.stderr.on('data', (d) => { s.logText += d; });
    s.exited = new Promise((resolve) => s.proc.on('exit', (code, sig) => resolve({ code, sig })));
    // However this script ends (a failed check, an exception nobody
    // caught), the coordinator does not outlive it; its workers die with it.
    process.on('exit', () => {
      if (s.proc.exitCode === null && s.proc.signalCode === null) s.proc.kill('SIGKILL');
    });
    const deadline = Date.now() + 180000;
    const portFile = path.join(s.dir, 'port');
    while (!fs.existsSync(portFile)) {
      if (s.proc.exitCode !== null || s.proc.signalCode !== null)
        throw new Error(`the coordinator exited while starting:\n${s.logText}`);
      if (Date.now() > deadline)
        throw new Error(`the coordinator did not listen within 180 s:\n${s.logText}`);
      await sleep(50);
    }
    s.port = Number(fs.readFileSync(portFile, 'utf8'));
    s.base = `http://127.0.0.1:${s.port}`;
    return s;
  }

  client(apiKey = 'unused', extra = {}) {
    return new OpenAI({ baseURL: `${this.base}/v1`, apiKey, maxRetries: 0, timeout: 120000,
      ...extra });
  }

  // SIGTERM, then the exit status (SIGKILL after the wait, which fails).
  async stop(waitMs = 60000) {
    if (this.proc.exitCode === null && this.proc.signalCode === null)
      this.proc.kill('SIGTERM');
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), waitMs);
    const r = await this.exited;
    clearTimeout(timer);
    fs.rmSync(this.dir, { recursive: true, force: true });
    return r;
  }

  // One HTTP request with node:http (no client library between):
  // { status, headers, text, json }.
  request(method, urlPath, { body, headers = {}, timeoutMs = 60000 } = {}) {
    return new Promise((resolve, reject) => {
      const data = body === undefined ? undefined
        : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body
          : JSON.stringify(body));
      const req = http.request({ host: '127.0.0.1', port: this.port, method, path: urlPath,
        agent: false, headers: { ...(data ? { 'Content-Type': 'application/json',
          'Content-Length': data.length } : {}), ...headers } }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json;
          try { json = JSON.parse(text); } catch { json = undefined; }
          resolve({ status: res.statusCode, headers: res.headers, text, json });
        });
        res.on('error', reject);
      });
      req.setTimeout(timeoutMs, () => req.destroy(new Error(`${method} ${urlPath}: timeout`)));
      req.on('error', reject);
      if (data) req.write(data);
      req.end();
    });
  }

  // Raw bytes on a socket; the whole answer until the server closes or
  // waitMs passes.
  raw(bytes, waitMs = 10000) {
    return new Promise((resolve, reject) => {
      const sock = net.connect(this.port, '127.0.0.1');
      const chunks = [];
      sock.on('data', (c) => chunks.push(c));
      const done = () => resolve(Buffer.concat(chunks).toString('utf8'));
      sock.on('end', done);
      sock.on('close', done);
      sock.on('error', reject);
      sock.setTimeout(waitMs, () => { sock.destroy(); done(); });
      sock.write(bytes);
    });
  }

  async metrics() {
    const r = await this.request('GET', '/metrics', { headers: this.authHeaders || {} });
    if (r.status !== 200) throw new Error(`/metrics: ${r.status} ${r.text}`);
    return r.text;
  }

  // The value of one series of /metrics (exact name and labels), or NaN.
  async metric(series) {
    const text = await this.metrics();
    for (const line of text.split('\n'))
      if (line.startsWith(series + ' ')) return Number(line.slice(series.length + 1));
    return NaN;
  }

  // Streams the workers are running now, summed.
  async running() {
    return this.metric('shoal_streams_running');
  }
}

export function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

export function eq(a, b, what) {
  const ja = JSON.stringify(a), jb = JSON.stringify(b);
  if (ja !== jb) throw new Error(`${what}: ${ja.slice(0, 400)} != ${jb.slice(0, 400)}`);
}

// Polls fn until it returns true or ms pass.
export async function until(fn, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(50);
  }
}

// Runs the named tests in order, each within its own time bound. The
// server is passed to each; `finish` runs after all of them (it stops the
// server) and may fail too.
export async function run(server, tests, finish, perTestMs = 120000) {
  let failed = 0;
  for (const [name, fn] of tests) {
    let timer;
    try {
      await Promise.race([fn(server), new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${perTestMs} ms`)), perTestMs);
      })]);
      console.log(`ok ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e.stack || e}`);
    } finally {
      clearTimeout(timer);
    }
  }
  try {
    if (finish) {
      await finish(server);
      console.log(`ok ${finish.name}`);
    }
  } catch (e) {
    failed++;
    console.log(`FAIL ${finish.name}: ${e.stack || e}`);
  }
  if (failed) {
    console.log(`--- coordinator log ---\n${server.logText}`);
    await server.stop(5000).catch(() => {});
    process.exit(1);
  }
  process.exit(0);
}

// The server stops on SIGTERM with exit status 0 and nothing on stderr
// that a sanitizer wrote.
export async function stopCleanly(server) {
  const { code, sig } = await server.stop();
  assert(code === 0, `the coordinator exited with ${code} (signal ${sig})`);
  assert(!/ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:/.test(server.logText),
    'a sanitizer reported an error');
}

// Concatenates a streamed chat or completion into what the same request
// returns whole: text per choice, token ids, finish reasons, usage.
export async function collect(stream) {
  const out = { text: [], tokenIds: [], finish: [], logprobs: [], chunks: 0, usage: null,
    promptTokenIds: null, role: [] };
  for await (const chunk of stream) {
    out.chunks++;
    if (chunk.usage) out.usage = chunk.usage;
    if (chunk.prompt_token_ids) out.promptTokenIds = chunk.prompt_token_ids;
    for (const c of chunk.choices) {
      const i = c.index;
      out.text[i] ??= '';
      out.tokenIds[i] ??= [];
      out.logprobs[i] ??= [];
      if (c.delta) {
        if (c.delta.role) out.role[i] = c.delta.role;
        out.text[i] += c.delta.content ?? '';
      } else {
        out.text[i] += c.text ?? '';
        if (c.prompt_token_ids) out.promptTokenIds = c.prompt_token_ids;
      }
      if (c.token_ids) out.tokenIds[i].push(...c.token_ids);
      if (c.logprobs?.content) out.logprobs[i].push(...c.logprobs.content);
      else if (c.logprobs?.tokens) out.logprobs[i].push(...c.logprobs.token_logprobs);
      if (c.finish_reason) out.finish[i] = c.finish_reason;
    }
  }
  return out;
}
