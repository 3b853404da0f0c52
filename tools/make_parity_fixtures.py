#!/usr/bin/env python3
"""Makes shoal's HF transformers parity fixtures.

Run on a machine with torch and transformers (the GPU machine has both; the
reference runs on its CPU in float64, so the GPU is not needed). For each tiny
random model below it writes a Hugging Face model directory with
`save_pretrained`, and `expected.safetensors` beside it holding, for prompts
of 1, 16, 17, 128, 129 and 257 random tokens:

  prompt{L}.ids            I32 [L]        the prompt
  prompt{L}.positions      I32 [P]        prompt positions whose logits are kept
  prompt{L}.logits         F32 [P, vocab] logits at those positions
  prompt{L}.greedy_ids     I32 [S]        greedy continuation (S steps)
  prompt{L}.greedy_logits  F32 [S, vocab] logits that chose each greedy token

The reference loads the saved weights (bf16, fp16 or fp32 as saved) and runs
them in float64 with eager attention, recomputing the whole sequence at every
decode step, so it is exact up to float64 rounding. Usage:

  python3 tools/make_parity_fixtures.py --out tests/fixtures/parity
"""
import argparse
import inspect
import json
import math
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

PROMPT_LENS = [1, 16, 17, 128, 129, 257]
DECODE_STEPS = 8
KEEP_EVERY = 8  # keep logits of every 8th prompt position, and the last

MODELS = {
    # Qwen3 as Qwen3-0.6B is built: tied embeddings, head_dim not hidden/heads.
    "qwen3-tied-bf16": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM), dtype=torch.bfloat16, shard=None,
        eos=[2], rope=None, theta=1000000.0,
        cfg=dict(vocab_size=397, hidden_size=80, intermediate_size=176,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=True,
                 max_position_embeddings=4096)),
    # Untied Qwen3 in fp16, saved in shards with an index.
    "qwen3-untied-f16-sharded": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM), dtype=torch.float16, shard="60KB",
        eos=[3, 7], rope=None, theta=10000.0,
        cfg=dict(vocab_size=301, hidden_size=64, intermediate_size=136,
                 num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                 head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 max_position_embeddings=2048)),
    # Llama 3 with llama3 rope scaling; the small original context makes all
    # three wavelength bands (kept, smoothed, scaled) occur at head_dim 16.
    "llama3-scaled-bf16": dict(
        cls=(LlamaConfig, LlamaForCausalLM), dtype=torch.bfloat16, shard=None,
        eos=[1], theta=500000.0,
        rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=64),
        cfg=dict(vocab_size=353, hidden_size=96, intermediate_size=200,
                 num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                 rms_norm_eps=1e-5, tie_word_embeddings=False,
                 max_position_embeddings=1024)),
    # Plain Llama (no scaling), tied, fp32 weights, no GQA.
    "llama-tied-f32": dict(
        cls=(LlamaConfig, LlamaForCausalLM), dtype=torch.float32, shard=None,
        eos=[0], rope=None, theta=10000.0,
        cfg=dict(vocab_size=263, hidden_size=48, intermediate_size=112,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 rms_norm_eps=1e-5, tie_word_embeddings=True,
                 max_position_embeddings=2048)),
}


def make_config(config_cls, spec):
    cfg = dict(spec["cfg"])
    cfg.update(bos_token_id=1, eos_token_id=spec["eos"][0], pad_token_id=None)
    params = inspect.signature(config_cls.__init__).parameters
    if "rope_parameters" in params:  # transformers 5
        rope = dict(rope_type="default") if spec["rope"] is None else dict(spec["rope"])
        rope["rope_theta"] = spec["theta"]
        cfg["rope_parameters"] = rope
    else:
        cfg["rope_theta"] = spec["theta"]
        cfg["rope_scaling"] = spec["rope"]
    return config_cls(**cfg)


def randomize(model, seed):
    """Weights with structure, so greedy margins are clear: norms away from one,
    matrices at 1/sqrt(fan_in), embeddings at unit scale."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


@torch.no_grad()
def reference(model, ids):
    return model(torch.tensor([ids], dtype=torch.long)).logits[0].double()


def make_one(name, spec, out_dir, seed):
    config_cls, model_cls = spec["cls"]
    config = make_config(config_cls, spec)
    torch.manual_seed(seed)
    model = model_cls(config)
    randomize(model, seed)
    model = model.to(spec["dtype"])
    model.generation_config.eos_token_id = spec["eos"] if len(spec["eos"]) > 1 else spec["eos"][0]
    model.generation_config.bos_token_id = 1
    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    kw = {}
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(d, **kw)

    ref = model_cls.from_pretrained(d, attn_implementation="eager").to(torch.float64).eval()
    vocab = config.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    for n in PROMPT_LENS:
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        logits = reference(ref, ids)
        keep = sorted(set(list(range(0, n, KEEP_EVERY)) + [n - 1]))
        tensors[f"prompt{n}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"prompt{n}.positions"] = torch.tensor(keep, dtype=torch.int32)
        tensors[f"prompt{n}.logits"] = logits[keep].float().contiguous()
        seq = list(ids)
        greedy, greedy_logits = [], []
        step_logits = logits[-1]
        for _ in range(DECODE_STEPS):
            tok = int(torch.argmax(step_logits))
            greedy.append(tok)
            greedy_logits.append(step_logits.float())
            seq.append(tok)
            step_logits = reference(ref, seq)[-1]
        tensors[f"prompt{n}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int32)
        tensors[f"prompt{n}.greedy_logits"] = torch.stack(greedy_logits).contiguous()
        top2 = torch.topk(tensors[f"prompt{n}.greedy_logits"], 2, dim=-1).values
        print(f"{name}: prompt {n}: greedy {greedy} min top-2 margin "
              f"{float((top2[:, 0] - top2[:, 1]).min()):.4f}", flush=True)
    save_file(tensors, os.path.join(d, "expected.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder that receives one directory per model")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    for i, (name, spec) in enumerate(MODELS.items()):
        make_one(name, spec, args.out, args.seed + 100 * i)
    with open(os.path.join(args.out, "VERSIONS.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__}, f)
        f.write("\n")
    print("fixtures written to", args.out)


if __name__ == "__main__":
    main()
