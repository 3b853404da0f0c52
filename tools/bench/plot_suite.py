"""Plots of a tools/bench-suite run, for docs/BENCHMARKS.md:

  python3 tools/bench/plot_suite.py SUITE_DIR OUT_DIR

throughput.png: output tokens/s against concurrency (1, 16, 64, 256; 1k in,
256 out), with the batch bound where summary.txt has it; ttft.png: TTFT p50
and p99 against prompt length (512, 2k, 8k tokens, one stream). Needs
matplotlib (Debian: python3-matplotlib).
"""
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(d, name):
    try:
        return json.load(open(os.path.join(d, name + ".json")))
    except OSError:
        return None


def main():
    d, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    summary = open(os.path.join(d, "summary.txt")).read()
    machine = re.search(r"machine: (.*)", summary)
    title = machine.group(1) if machine else ""

    xs, ys = [], []
    for c, name in ((1, "single-stream"), (16, "c16-1k-256"), (64, "c64-1k-256"),
                    (256, "c256-1k-256")):
        r = load(d, name)
        if r and r["requests_ok"]:
            xs.append(c)
            ys.append(r["output_tokens_per_s"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, "o-", label="shoal, Qwen3-8B shape (dummy bf16)")
    b1 = re.search(r"single-stream decode bound ([0-9.]+)", summary)
    b64 = re.search(r"batch-64 bound .*?([0-9.]+) tokens/s", summary)
    if b1 and b64:
        ax.plot([1, 64], [float(b1.group(1)), float(b64.group(1))], "k--", marker="x",
                label="bound (weights + KV bytes / copy bandwidth)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams (1k in, 256 out)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"Throughput against concurrency\n{title}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=120)

    xs, p50, p99 = [], [], []
    for n in (512, 2048, 8192):
        r = load(d, f"ttft-{n}")
        if r and r["requests_ok"]:
            xs.append(n)
            p50.append(r["ttft_ms"]["p50"])
            p99.append(r["ttft_ms"]["p99"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, p50, "o-", label="TTFT p50")
    ax.plot(xs, p99, "s--", label="TTFT p99")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens (one stream)")
    ax.set_ylabel("time to first token, ms")
    ax.set_title(f"TTFT against prompt length\n{title}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ttft.png"), dpi=120)
    print(f"plots in {out}: throughput.png, ttft.png")


if __name__ == "__main__":
    main()
