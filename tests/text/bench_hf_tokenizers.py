"""The peer of bench_text_encode: HF tokenizers (Rust) on the same text.

    python3 tests/text/bench_hf_tokenizers.py <tokenizer.json> <text file> [chunk_bytes] [repeats]

Same chunks (cut after the first newline at or after chunk_bytes), one
thread (RAYON_NUM_THREADS=1 is set before the import; encode, not
encode_batch), add_special_tokens=False, best of `repeats`. Prints MB/s,
the token count and the FNV-1a hash of all ids, comparable with
bench_text_encode's. Then, for reference, encode_batch over all cores.
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import tokenizers  # noqa: E402


def chunks(data, size):
    out, at = [], 0
    while at < len(data):
        end = min(at + size, len(data))
        while end < len(data) and data[end - 1] != 0x0A:
            end += 1
        out.append(data[at:end].decode("utf-8"))
        at = end
    return out


def main():
    path, text_path = sys.argv[1], sys.argv[2]
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(path)
    load = time.perf_counter() - t0
    data = open(text_path, "rb").read()
    parts = chunks(data, size)
    best, ids_all = 1e30, None
    for _ in range(repeats):
        start = time.perf_counter()
        ids_all = [tok.encode(p, add_special_tokens=False).ids for p in parts]
        best = min(best, time.perf_counter() - start)
    h, n = 0xCBF29CE484222325, 0
    for ids in ids_all:
        for i in ids:
            h = ((h ^ i) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        n += len(ids)
    print(f"hf tokenizers {tokenizers.__version__}: {len(data)} bytes in {len(parts)} chunks, "
          f"{n} tokens, load {load:.2f} s, best of {repeats}: {best:.3f} s, "
          f"{len(data) / best / 1e6:.1f} MB/s (1 thread), ids fnv {h:016x}")


if __name__ == "__main__":
    main()
