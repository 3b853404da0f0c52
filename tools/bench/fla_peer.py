#!/usr/bin/env python3
"""The peer of shoal-lab-deltanet: flash-linear-attention's Triton kernels
for the gated delta rule, at the same shapes and in the same units.

  python3 tools/bench/fla_peer.py [--prefill T]

fla is not a dependency: tools/gpu-hybrid carries its source (with einops) in
.fla and puts it on PYTHONPATH. For Qwen3.5-27B (16 key heads, 48 value
heads of 128) and Qwen3.5-35B-A3B (16 and 32) it times
chunk_gated_delta_rule over one T-token prompt (bf16 q, k, v; F32 gates;
the L2 norm of q and k in the kernel, as shoal's op does; the final state
out) and fused_recurrent_gated_delta_rule over one token for 1 and 64
streams, each the median of 20 runs after warm-up, with CUDA events. The
TFLOP/s of the prefill is counted as shoal-lab-deltanet counts it.
"""
import argparse
import math
import statistics
import sys

import torch


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def inputs(batch, t, h, hv, d, dev):
    q = torch.randn(batch, t, h, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(batch, t, h, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(batch, t, hv, d, device=dev, dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(batch, t, hv, device=dev, dtype=torch.float32))
    beta = torch.rand(batch, t, hv, device=dev, dtype=torch.float32).sigmoid()
    return q, k, v, g, beta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=8192)
    args = ap.parse_args()
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - say why and stop
        print(f"fla_peer: cannot import fla ({type(e).__name__}: {e})")
        return 1
    dev = "cuda"
    print("fla_peer: torch", torch.__version__, "on", torch.cuda.get_device_name(0))
    for name, h, hv in (("qwen3.5-27b", 16, 48), ("qwen3.5-35b-a3b", 16, 32)):
        d, t = 128, args.prefill
        q, k, v, g, beta = inputs(1, t, h, hv, d, dev)

        def prefill():
            return chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)

        s = timed(prefill)
        c = 64
        flops = 2.0 * hv * math.ceil(t / c) * (c * c * d * 3 + c * c * d * 3 + 5 * c * d * d)
        print(f"{name:16s} fla prefill: {t} tokens in {s * 1e3:.3f} ms, "
              f"{flops / s / 1e12:.1f} TFLOP/s (chunked-form work), {t / s:.0f} tokens/s")
        for streams in (1, 64):
            q, k, v, g, beta = inputs(streams, 1, h, hv, d, dev)
            state = torch.randn(streams, hv, d, d, device=dev, dtype=torch.float32)

            def step():
                return fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                        output_final_state=True,
                                                        use_qk_l2norm_in_kernel=True)

            s = timed(step)
            moved = 2.0 * state.numel() * 4
            print(f"{name:16s} fla decode, {streams:2d} stream(s): rule {s * 1e6:.2f} us "
                  f"({moved / s / 1e9:.0f} GB/s of its states)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
