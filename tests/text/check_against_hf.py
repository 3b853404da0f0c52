"""Checks shoal's text references against HF itself, where it is installed.

The tests run against @lenml/tokenizers and @huggingface/jinja under node
(the machines that run tools/test have no HF). Where `tokenizers` and
`transformers` exist (the GPU machine), this script confirms the node
references equal HF's own output:

    node tools/node/ref_tokenize.js qwen3 tests/text/corpus.json > q.jsonl
    node tools/node/ref_tokenize.js llama3 tests/text/corpus.json > l.jsonl
    node tools/node/ref_chat.js tests/text/chats.json > c.jsonl
    python3 tests/text/check_against_hf.py <qwen3 dir> <llama3 dir> q.jsonl l.jsonl c.jsonl

A model dir holds tokenizer.json and tokenizer_config.json. Prints the
number of texts and conversations compared and every difference.
"""
import json
import sys

import tokenizers
import transformers


def main():
    qdir, ldir, qref, lref, cref = sys.argv[1:6]
    bad = 0
    for d, ref in ((qdir, qref), (ldir, lref)):
        tok = tokenizers.Tokenizer.from_file(f"{d}/tokenizer.json")
        n = 0
        for line in open(ref):
            o = json.loads(line)
            text = bytes.fromhex(o["hex"]).decode("utf-8")
            ids = tok.encode(text, add_special_tokens=False).ids
            n += 1
            if ids != o["ids"]:
                bad += 1
                print(f"DIFF {d} text {n - 1}: {text[:80]!r}")
        print(f"{d}: {n} texts compared with tokenizers {tokenizers.__version__}")
        # Whitespace as Oniguruma sees it (pinned in test_text_tokenizer.c):
        # the split shoal makes must be HF's.
        for text, words in ((" \ufeffBOM", [" \ufeff", "BOM"]),
                            ("a \x85b", ["a", " ", "\x85b"]),
                            (" \u180eabc", [" \u180e", "abc"])):
            whole = tok.encode(text, add_special_tokens=False).ids
            parts = sum((tok.encode(w, add_special_tokens=False).ids for w in words), [])
            if whole != parts:
                bad += 1
                print(f"DIFF {d} whitespace case {text!r}: {whole} != {parts}")
    cases = json.load(open(sys.argv[6] if len(sys.argv) > 6 else "tests/text/chats.json"))["cases"]
    toks = {"qwen3": transformers.AutoTokenizer.from_pretrained(qdir),
            "llama3": transformers.AutoTokenizer.from_pretrained(ldir)}
    always = toks["llama3"].chat_template
    gen = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    meta = always[: -len(gen)] + "{% if add_generation_prompt %}" + gen + "{% endif %}"
    n = 0
    for c, line in zip(cases, open(cref)):
        want = bytes.fromhex(json.loads(line)["hex"]).decode("utf-8")
        tok = toks["qwen3" if c["model"] == "qwen3" else "llama3"]
        kw = {}
        if "enable_thinking" in c:
            kw["enable_thinking"] = c["enable_thinking"]
        if c["model"] == "llama3":
            kw["chat_template"] = meta
        got = tok.apply_chat_template(c["messages"], tokenize=False,
                                      add_generation_prompt=c["add_generation_prompt"], **kw)
        n += 1
        if got != want:
            bad += 1
            print(f"DIFF chat {n - 1} ({c['note']}): {got!r} != {want!r}")
    print(f"{n} conversations compared with transformers {transformers.__version__}")
    print(f"{bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
