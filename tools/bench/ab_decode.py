#!/usr/bin/env python3
"""ab_decode.py: decode steps under variants of the environment, side by
side, each beside the bound of the same run.

    ab_decode.py --bench shoal-model-bench --model DIR [--device 0]
                 (--membw PROGRAM | --bw GBPS) [--prefill N] [--reps R]
                 [--shape B,C,S]... [--variant NAME:VAR=VALUE[,VAR=VALUE]...]...

e.g. --variant tree: --variant nographs:SHOAL_CUDA_GRAPHS=0. The CUDA
backend reads three settings, SHOAL_CUDA_ACT_DTYPE, SHOAL_CUDA_GRAPHS and
SHOAL_CUDA_DELTANET_CHUNK; a variant naming another SHOAL_CUDA_ variable is
refused, since the backend would ignore it and run the defaults again.
Each shape (batch B, context C, S steps) runs every variant R times, the
variants taking turns (one run of each, then the next round), so that a
drift of the machine falls on all of them alike. The first variant is the
reference; `tree:` (no variables) is the default. The bound is the bytes a
step reads, as shoal-model-bench prints them, over the copy bandwidth:
--bw, or what --membw prints (`... N GB/s`) once at the start. A run that
fails is reported with its last line and left out of the medians.
Prints one table a shape: each variant's runs, median, its ratio to the
bound and its difference from the reference."""
import argparse
import os
import re
import statistics
import subprocess
import sys

DECODE = re.compile(r"decode: batch (\d+) at context (\d+): ([0-9.]+) ms a step.*?, "
                    r"([0-9.]+) tokens/s")
BYTES = re.compile(r"bytes a step: weights ([0-9]+), KV ([0-9]+)")
BW = re.compile(r"([0-9.]+) GB/s")
# what kernels/cuda/cuda_backend.cu (cuda_options_default) reads
CUDA_SETTINGS = ("SHOAL_CUDA_ACT_DTYPE", "SHOAL_CUDA_GRAPHS", "SHOAL_CUDA_DELTANET_CHUNK")


def fail(msg):
    print(f"ab_decode: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_variant(spec):
    name, sep, rest = spec.partition(":")
    if not sep or not name:
        fail(f"variant '{spec}': want NAME:VAR=VALUE[,VAR=VALUE], or NAME: for none")
    env = {}
    for kv in filter(None, rest.split(",")):
        var, eq, val = kv.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
            fail(f"variant '{spec}': '{kv}' is not VAR=VALUE")
        if var.startswith("SHOAL_CUDA_") and var not in CUDA_SETTINGS:
            fail(f"variant '{spec}': the CUDA backend reads no {var} (only "
                 + ", ".join(CUDA_SETTINGS) + ")")
        env[var] = val
    return name, env


def parse_shape(spec):
    parts = spec.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        fail(f"shape '{spec}': want B,C,S (batch, context, steps), each a positive integer")
    if int(parts[2]) < 2:
        fail(f"shape '{spec}': at least 2 steps (the first records the graph and is not timed)")
    return tuple(int(p) for p in parts)


def run_once(args, env, shape):
    b, c, s = shape
    cmd = [args.bench, "--model", args.model, "--device", args.device, "--prefill",
           str(args.prefill), "--batch", str(b), "--context", str(c), "--steps", str(s)]
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"past {args.timeout} s"
    out = p.stdout + p.stderr
    d, by = DECODE.search(out), BYTES.search(out)
    if p.returncode != 0 or not d or not by:
        last = (out.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {p.returncode}: {last}"
    return (float(d.group(3)), float(d.group(4)), int(by.group(1)) + int(by.group(2))), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="shoal-model-bench")
    ap.add_argument("--model", required=True, help="the model's directory (config.json)")
    ap.add_argument("--device", default="0")
    ap.add_argument("--membw", help="a program printing the copy bandwidth as 'N GB/s'")
    ap.add_argument("--bw", type=float, help="the copy bandwidth, GB/s")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120, help="seconds a run, at most")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--variant", action="append", default=[])
    args = ap.parse_args()
    if (args.bw is None) == (args.membw is None):
        fail("give the copy bandwidth: --bw GBPS or --membw PROGRAM, one of them")
    if args.reps < 1:
        fail(f"--reps {args.reps}: at least 1")
    shapes = [parse_shape(s) for s in args.shape or ["1,4096,64"]]
    variants = [parse_variant(v) for v in args.variant or ["tree:"]]
    if len({n for n, _ in variants}) != len(variants):
        fail("two variants share a name")
    bw = args.bw
    if bw is None:
        p = subprocess.run([args.membw], capture_output=True, text=True)
        m = BW.search(p.stdout)
        if p.returncode != 0 or not m:
            fail(f"{args.membw} printed no 'N GB/s' (exit {p.returncode})")
        bw = float(m.group(1))
    if bw <= 0:
        fail(f"copy bandwidth {bw} GB/s: must be positive")
    print(f"copy bandwidth {bw:.1f} GB/s; {args.reps} run(s) a variant, taking turns")
    for shape in shapes:
        runs = {n: [] for n, _ in variants}
        errors = {n: [] for n, _ in variants}
        step_bytes = None
        for rep in range(args.reps):
            for name, env in variants:
                r, err = run_once(args, env, shape)
                if err:
                    errors[name].append(err)
                    print(f"  {name}, run {rep + 1}: failed ({err})", file=sys.stderr)
                    continue
                runs[name].append(r[1])
                step_bytes = r[2]
        b, c, s = shape
        bound = b / (step_bytes / (bw * 1e9)) if step_bytes else None
        print(f"\nbatch {b}, context {c}, {s} steps" +
              (f": bound {bound:.1f} tokens/s ({step_bytes / 1e9:.3f} GB a step)"
               if bound else ": every run failed"))
        print(f"| variant | tokens/s, runs | median | ratio to the bound | vs {variants[0][0]} |")
        print("|---|---|---|---|---|")
        ref = statistics.median(runs[variants[0][0]]) if runs[variants[0][0]] else None
        for name, _ in variants:
            xs = runs[name]
            if not xs:
                print(f"| {name} | failed: {errors[name][-1]} | | | |")
                continue
            med = statistics.median(xs)
            ratio = med / bound
            diff = f"{(med / ref - 1) * 100:+.1f}%" if ref else ""
            shown = " / ".join(f"{x:.1f}" for x in xs)
            failed = f" ({len(errors[name])} failed)" if errors[name] else ""
            print(f"| {name} | {shown}{failed} | {med:.1f} | {ratio:.3f}x | {diff} |")


if __name__ == "__main__":
    main()
