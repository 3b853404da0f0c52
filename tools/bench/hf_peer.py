"""HF transformers as shoal's peer on the same GPU, Qwen3-8B shape with
random bf16 weights (the figures do not depend on the values):

  python3 tools/bench/hf_peer.py CONFIG_DIR

prints prefill time of 2,048 tokens (one forward pass, batch 1) and greedy
decode tokens/s at batch 1 after a 128-token prompt (a manual loop over the
model with its KV cache, no sampling overhead), CUDA-event medians.
"""
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    cfg = AutoConfig.from_pretrained(sys.argv[1])
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.eval()
    print(f"hf: transformers model built in {time.time() - t0:.1f} s")
    vocab = cfg.vocab_size
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, 2048), device="cuda")
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(ids, use_cache=False, logits_to_keep=1)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        print(f"hf: prefill 2048 tokens {times[len(times) // 2]:.1f} ms (median of 5)")
        prompt = torch.randint(0, vocab, (1, 128), device="cuda")
        out = model(prompt, use_cache=True, logits_to_keep=1)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        steps = 128
        torch.cuda.synchronize()
        t0 = time.time()
        for _ in range(steps):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        dt = time.time() - t0
        print(f"hf: decode batch 1: {steps} tokens in {dt:.2f} s, {steps / dt:.1f} tokens/s")


if __name__ == "__main__":
    main()
