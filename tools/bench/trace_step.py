#!/usr/bin/env python3
"""One decode step's kernels from a libshoal-lab-trace file (kernels/lab/trace_kernels.c).

    trace_step.py TRACE.tsv [--step K] [--rows]

A step starts at the embedding kernel. For the K-th step from the end
(default 2: the last whole one before the process's own tail), prints each
op's total over the step: its kernels' count, their summed duration, and
their summed advance (how far each kernel's end moved the step's timeline
past the end of the kernel before it: a kernel that starts early, under
programmatic dependent launch, counts only what it adds). The advances sum
to the step's span. --rows prints every kernel too.
"""
import argparse
import subprocess
import sys
from collections import OrderedDict


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return out[:len(names)]
    except (OSError, subprocess.CalledProcessError):
        return names


def op_of(name):
    """The kernel's name without its parameters; templates kept for ours."""
    n = name.split("(")[0].replace("void ", "").strip()
    if n.startswith("gemm_rows") or n.startswith("moe_"):  # ours
        return n
    if n.startswith("nvjet") or "gemm" in n.lower() or n.startswith("sm90_xmma"):
        return "cublas gemm"
    return n.replace("__nv_bfloat16", "bf16")


def main():
    ap = argparse.ArgumentParser(description="One decode step's kernels from a trace.")
    ap.add_argument("trace", help="a libshoal-lab-trace file")
    ap.add_argument("--step", type=int, default=2, help="the K-th step from the end")
    ap.add_argument("--rows", action="store_true", help="every kernel too")
    args = ap.parse_args()
    step_back, rows = args.step, args.rows
    recs = []
    with open(args.trace) as f:
        next(f)
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) == 6:
                recs.append((int(p[0]), int(p[1]), p[3], p[5]))
    recs.sort()
    names = demangle([r[3] for r in recs])
    recs = [(s, e, g, n) for (s, e, g, _), n in zip(recs, names)]
    starts = [i for i, r in enumerate(recs) if "embed" in op_of(r[3])]
    if len(starts) < step_back + 1:
        sys.exit("trace_step: fewer than %d steps in %s" % (step_back + 1, args.trace))
    a, b = starts[-step_back - 1], starts[-step_back]
    step = recs[a:b]
    t0, prev_end = step[0][0], step[0][0]
    ops = OrderedDict()
    if rows:
        print("%5s %-60s %-14s %9s %8s %8s" % ("#", "kernel", "grid", "at us", "dur us", "adv us"))
    for i, (s, e, g, n) in enumerate(step):
        adv = max(e, prev_end) - prev_end
        dur = e - s
        # an op is a kernel after a kernel: the o and down GEMVs differ so
        op = op_of(n) + "  after " + (op_of(step[i - 1][3]).split("<")[0] if i else "-")
        c = ops.setdefault(op, [0, 0, 0])
        c[0] += 1
        c[1] += dur
        c[2] += adv
        if rows:
            print("%5d %-60s %-14s %9.2f %8.2f %8.2f" % (i, op[:60], g, (s - t0) / 1e3,
                                                           dur / 1e3, adv / 1e3))
        prev_end = max(prev_end, e)
    span = prev_end - t0
    print("step span %.3f ms, %d kernels" % (span / 1e6, len(step)))
    print("%-72s %6s %10s %10s %7s" % ("op", "count", "dur us", "adv us", "share"))
    for op, (cnt, dur, adv) in sorted(ops.items(), key=lambda kv: -kv[1][2]):
        print("%-72s %6d %10.1f %10.1f %6.1f%%" % (op[:72], cnt, dur / 1e3, adv / 1e3,
                                                   100.0 * adv / span))


if __name__ == "__main__":
    main()
