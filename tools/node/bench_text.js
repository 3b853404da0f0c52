// Writes the "large mixed text" that shoal's tokenizer benchmark encodes
// (docs/BENCHMARKS.md): about 45% English prose, 35% source code and 20%
// other scripts and emoji, in paragraphs drawn by a seeded generator.
//
//   node tools/node/bench_text.js <out.txt> [MiB, default 8]
//
// Prose: the licence texts in /usr/share/common-licenses and the repo's
// Markdown. Code: the repo's C, CUDA, JavaScript, Python and CMake files.
// Other scripts: sentences of words and characters sampled from
// tests/text/corpus.json and Python's test/cjkencodings/*-utf8.txt (where
// present), so they do not simply repeat. The output depends on those
// files; the benchmark records its size and sha256.
"use strict";
const fs = require("fs");
const path = require("path");

const out = process.argv[2];
const target = (Number(process.argv[3]) || 8) * 1024 * 1024;
if (!out) {
  process.stderr.write("usage: bench_text.js <out.txt> [MiB]\n");
  process.exit(2);
}
const root = path.resolve(__dirname, "../..");

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
const r = rng(7);
const pick = (list) => list[Math.floor(r() * list.length)];

function walk(dir, found) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    if (["node_modules", "build", ".git", "fixtures", "corpus"].includes(e.name)) continue;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, found);
    else found.push(p);
  }
  return found;
}
const paragraphs = (text) => text.split(/\n\s*\n/).filter((p) => p.trim().length > 0);

const prose = [], code = [];
for (const f of walk(root, [])) {
  const text = fs.readFileSync(f, "utf8");
  if (f.endsWith(".md")) prose.push(...paragraphs(text));
  else if (/\.(c|h|cu|js|py)$|CMakeLists\.txt$/.test(f)) code.push(...paragraphs(text));
}
const lic = "/usr/share/common-licenses";
if (fs.existsSync(lic))
  for (const f of fs.readdirSync(lic).sort()) {
    const p = path.join(lic, f);
    if (fs.statSync(p).isFile()) prose.push(...paragraphs(fs.readFileSync(p, "utf8")));
  }

// Other scripts: excerpts of real text in them, and sentences of their
// words.
const corpus = JSON.parse(fs.readFileSync(path.join(root, "tests/text/corpus.json"), "utf8"));
const sources = corpus.strings.filter((s) => /[^\u0000-\u024f]/u.test(s));
for (const base of ["/root/.pyenv/versions", "/usr/lib", "/usr/local/lib"]) {
  if (!fs.existsSync(base)) continue;
  for (const v of fs.readdirSync(base).sort()) {
    for (const lib of [path.join(base, v), path.join(base, v, "lib")]) {
      if (!fs.existsSync(lib) || !fs.statSync(lib).isDirectory()) continue;
      for (const py of fs.readdirSync(lib).sort()) {
        const cjk = path.join(lib, py, "test/cjkencodings");
        if (!/^python3/.test(py) || !fs.existsSync(cjk)) continue;
        for (const f of fs.readdirSync(cjk).sort())
          if (f.endsWith("-utf8.txt")) sources.push(fs.readFileSync(path.join(cjk, f), "utf8"));
      }
    }
  }
}
const words = [];
for (const s of sources) for (const w of s.split(/\s+/u)) if (/[^\u0000-\u024f]/u.test(w)) words.push(w);
const texts = sources.map((s) => Array.from(s));
function otherParagraph() {
  if (r() < 0.5) {
    const cps = pick(texts);
    const a = Math.floor(r() * cps.length);
    return cps.slice(a, a + 20 + Math.floor(r() * 300)).join("");
  }
  let p = "";
  const n = 5 + Math.floor(r() * 30);
  for (let i = 0; i < n; i++) p += (i ? " " : "") + pick(words);
  return p + pick([". ", "。", "! ", "? ", "\n"]);
}

const parts = [];
let bytes = 0;
while (bytes < target) {
  const x = r();
  const p = x < 0.45 ? pick(prose) : x < 0.8 ? pick(code) : otherParagraph();
  parts.push(p);
  bytes += Buffer.byteLength(p, "utf8") + 2;
}
fs.writeFileSync(out, parts.join("\n\n") + "\n");
process.stderr.write(`bench_text.js: ${out}: ${bytes} bytes; ${prose.length} prose, ${code.length} code paragraphs, ${sources.length} texts and ${words.length} words of other scripts\n`);
