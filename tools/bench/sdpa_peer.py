"""The peers of shoal's attention kernels on the same GPU: torch's
scaled_dot_product_attention with contiguous KV, at the shapes that
shoal-lab-ops measures (32 query heads, 8 KV heads, head dim 128, bf16).

  python3 tools/bench/sdpa_peer.py

Decode: q [B, 32, 1, 128], k and v [B, 8, C, 128] (GQA through enable_gqa),
effective KV read bandwidth = B * C * 8 * 128 * 2 bytes * 2 / time. KV sets
rotate so that at least 1 GB is read between repeats (the 60 MB L2 does not
serve them). Causal prompt attention: one sequence of n tokens, FLOPs
2 n^2 d heads (the causal half of 4 n^2 d heads). Times are CUDA-event
medians over 20 runs after 3 warm-ups.
"""
import torch
import torch.nn.functional as F


def median_time(fn, reps=20, warm=3):
    for _ in range(warm):
        fn(0)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("sdpa decode (contiguous KV, bf16, enable_gqa)")
    for B in (1, 32, 64):
        for C in (4096, 8192, 32768):
            kv_bytes = B * C * 8 * 128 * 2 * 2
            sets = max(1, min(64, -(-1_000_000_000 // kv_bytes)))
            q = torch.randn(B, 32, 1, 128, device=dev, dtype=torch.bfloat16)
            ks = [torch.randn(B, 8, C, 128, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            vs = [torch.randn(B, 8, C, 128, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            t = median_time(lambda i: F.scaled_dot_product_attention(
                q, ks[i % sets], vs[i % sets], enable_gqa=True))
            print(f"  sdpa decode b{B} ctx{C}: {t * 1e6:10.2f} us  {kv_bytes / t / 1e9:7.0f} GB/s")
            del ks, vs
            torch.cuda.empty_cache()
    print("sdpa causal prompt attention (one sequence, bf16, enable_gqa)")
    for n in (2048, 4096):
        q = torch.randn(1, 32, n, 128, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, 8, n, 128, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, 8, n, 128, device=dev, dtype=torch.bfloat16)
        t = median_time(lambda i: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True))
        flops = 2.0 * n * n * 128 * 32
        print(f"  sdpa prompt {n} tokens: {t * 1e6:10.2f} us  {flops / t / 1e12:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
