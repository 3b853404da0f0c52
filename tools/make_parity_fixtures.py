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

  python3 tools/make_parity_fixtures.py --out tests/fixtures/parity [--only NAME,...]

Mixture-of-experts models are written the way Hugging Face hub checkpoints
of Qwen3-MoE store them, each expert as its own tensors
(model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight), whatever layout
the installed transformers keeps in memory (transformers 5 stacks them as
mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I],
and 5.17 writes them back per expert on save; a version that saves them
stacked is rewritten here). The reference runs its experts eagerly
(experts_implementation="eager": the grouped GEMM takes no float64). Their
prompts are 1, 17, 129 and 257 tokens. The script prints, for each MoE
model, the smallest gap between the k-th and (k+1)-th router logit over
every token and layer (relative to the token's router-logit spread), and
takes the next seed while it is under MOE_GAP_MIN: at a near tie an engine
within rounding of the reference could pick another expert.

Hybrid models (Qwen3-Next, Qwen3.5 with its vision tower config, Qwen3.5-MoE)
have gated DeltaNet layers beside gated full attention; their prompts are
1, 17, 63, 64, 65, 129 and 257 tokens, on both sides of the 64-token chunk of
the chunked delta rule. transformers runs their delta rule in chunks in the
model's dtype; the script patches its token-by-token form in, in float64, and
checks that it was called, so the reference is the recurrence itself. A_log
and dt_bias are drawn so that every head decays at its own rate.
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

try:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
except ImportError:  # older transformers: the MoE fixtures cannot be made
    Qwen3MoeConfig = Qwen3MoeForCausalLM = None
try:  # the hybrid (gated DeltaNet) models
    from transformers import (Qwen3NextConfig, Qwen3NextForCausalLM, Qwen3_5Config,
                              Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig,
                              Qwen3_5MoeForConditionalGeneration)
except ImportError:
    Qwen3NextConfig = Qwen3NextForCausalLM = Qwen3_5Config = None
    Qwen3_5ForConditionalGeneration = Qwen3_5MoeConfig = None
    Qwen3_5MoeForConditionalGeneration = None

PROMPT_LENS = [1, 16, 17, 128, 129, 257]
MOE_PROMPT_LENS = [1, 17, 129, 257]
# hybrids: both sides of the 64-token chunk of the chunked delta rule
HYBRID_PROMPT_LENS = [1, 17, 63, 64, 65, 129, 257]
# A MoE model that routes some token of its prompts or continuations with a
# gap between its k-th and (k+1)-th router logit under this fraction of the
# token's router-logit spread is made again from the next seed: an engine
# whose hidden states differ from float64 by bf16 KV rounding (a few 1e-4
# relative) could pick another expert there.
MOE_GAP_MIN = 1.5e-4
MOE_TRIES = 16
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
    # Qwen3-MoE, every layer sparse, top-k weights renormalized (as
    # Qwen3-30B-A3B): 8 experts, 2 a token.
    "qwen3moe-norm-bf16": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM), dtype=torch.bfloat16, shard=None,
        eos=[2], rope=None, theta=1000000.0, moe=True,
        cfg=dict(vocab_size=331, hidden_size=64, intermediate_size=160,
                 moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 max_position_embeddings=2048)),
    # top-k weights as the softmax gives them (norm_topk_prob false), every
    # second layer sparse (decoder_sparse_step 2), fp32 weights.
    "qwen3moe-nonorm-step2-f32": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM), dtype=torch.float32, shard=None,
        eos=[0], rope=None, theta=10000.0, moe=True,
        cfg=dict(vocab_size=293, hidden_size=48, intermediate_size=112,
                 moe_intermediate_size=40, num_experts=6, num_experts_per_tok=3,
                 norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 head_dim=12, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 max_position_embeddings=2048)),
    # mlp_only_layers (layers 0 and 2 dense), top-k = every expert (4 of 4),
    # bf16, sharded.
    "qwen3moe-mlponly-topall-bf16": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM), dtype=torch.bfloat16, shard="80KB",
        eos=[5], rope=None, theta=1000000.0, moe=True,
        cfg=dict(vocab_size=307, hidden_size=64, intermediate_size=128,
                 moe_intermediate_size=32, num_experts=4, num_experts_per_tok=4,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0, 2],
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 max_position_embeddings=2048)),
    # Qwen3-Next as Qwen3-Next-80B-A3B is built, small: three gated DeltaNet
    # layers then one gated full-attention layer, the fused in_proj_qkvz /
    # in_proj_ba projections, two value heads a key head, conv kernel 4,
    # a quarter of the head rotated, MoE with a sigmoid-gated shared expert
    # (layer 1 a dense MLP by mlp_only_layers).
    "qwen3next-bf16": dict(
        cls=(Qwen3NextConfig, Qwen3NextForCausalLM), dtype=torch.bfloat16, shard=None,
        eos=[2], rope=dict(partial_rotary_factor=0.25), theta=10000000.0, moe=True,
        hybrid=True,
        cfg=dict(vocab_size=311, hidden_size=64, intermediate_size=96,
                 moe_intermediate_size=32, shared_expert_intermediate_size=48,
                 num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[1],
                 num_hidden_layers=4,
                 layer_types=["linear_attention"] * 3 + ["full_attention"],
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 linear_num_key_heads=2, linear_num_value_heads=4,
                 linear_key_head_dim=16, linear_value_head_dim=24,
                 linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                 tie_word_embeddings=False, max_position_embeddings=2048)),
    # Qwen3.5 dense (Qwen3_5ForConditionalGeneration, a tiny vision tower
    # beside the text model): two layers of each type alternating, split
    # projections, one value head a key head, conv kernel 3, half the head
    # rotated, tied embeddings, fp32 weights.
    "qwen3_5-f32": dict(
        cls=(Qwen3_5Config, Qwen3_5ForConditionalGeneration), dtype=torch.float32, shard=None,
        eos=[3], rope=dict(partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
                           mrope_interleaved=True),
        theta=10000000.0, hybrid=True, vl=True,
        cfg=dict(vocab_size=283, hidden_size=48, intermediate_size=112,
                 num_hidden_layers=4,
                 layer_types=["linear_attention", "full_attention"] * 2,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=2,
                 linear_key_head_dim=12, linear_value_head_dim=20,
                 linear_conv_kernel_dim=3, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, max_position_embeddings=2048)),
    # Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration): two of each layer
    # type, conv kernel 4, three value heads a key head, a shared expert,
    # bf16, sharded.
    "qwen3_5moe-bf16": dict(
        cls=(Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration), dtype=torch.bfloat16,
        shard="120KB", eos=[4],
        rope=dict(partial_rotary_factor=0.25, mrope_section=[2, 1, 1], mrope_interleaved=True),
        theta=10000000.0, moe=True, hybrid=True, vl=True,
        cfg=dict(vocab_size=317, hidden_size=64, moe_intermediate_size=32,
                 shared_expert_intermediate_size=40, num_experts=6, num_experts_per_tok=2,
                 num_hidden_layers=4,
                 layer_types=["linear_attention", "linear_attention", "full_attention",
                              "full_attention"],
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 linear_num_key_heads=1, linear_num_value_heads=3,
                 linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                 tie_word_embeddings=False, max_position_embeddings=2048)),
}

# The vision tower of the Qwen3.5 fixtures: as small as its config takes.
# shoal loads the text model and says it leaves the vision tensors.
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                   patch_size=2, spatial_merge_size=2, temporal_patch_size=2,
                   num_position_embeddings=16)


def make_config(config_cls, spec):
    cfg = dict(spec["cfg"])
    cfg.update(bos_token_id=1, eos_token_id=spec["eos"][0], pad_token_id=None)
    params = inspect.signature(config_cls.__init__).parameters
    if spec.get("hybrid"):  # transformers 5 only: rope_parameters
        rope = dict(rope_type="default", rope_theta=spec["theta"], **spec["rope"])
        cfg["rope_parameters"] = rope
        if spec.get("vl"):
            vision = dict(TINY_VISION, out_hidden_size=cfg["hidden_size"])
            return config_cls(text_config=cfg, vision_config=vision,
                              tie_word_embeddings=cfg["tie_word_embeddings"])
        return config_cls(**cfg)
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
    matrices at 1/sqrt(fan_in), embeddings at unit scale. Stacked expert
    tensors ([E, out, in]) count their last dimension as fan-in; routers get
    a larger scale, so that routing is spread and decided."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):  # decays exp(g) of 0.6 to 0.95 a token
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 0.45 + 0.05))
            elif name.endswith("dt_bias"):
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 3.0 / math.sqrt(p.shape[-1]))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def split_experts(tensors):
    """The stacked expert tensors of transformers 5 as the hub's per-expert
    tensors; anything else as it is."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def rewrite_per_expert(d):
    """Rewrites the saved safetensors of d with each expert as its own
    tensors (one file, model.safetensors). Returns the layout found."""
    from safetensors.torch import load_file
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(d, f)))
    fused = any(n.endswith("mlp.experts.gate_up_proj") for n in tensors)
    if not fused:
        return "per-expert"
    for f in files:
        os.remove(os.path.join(d, f))
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        os.remove(idx)
    save_file(split_experts(tensors), os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    return "stacked, rewritten per expert"


def routing_gap(model, ids, top_k):
    """The smallest gap between the k-th and (k+1)-th router logit of any
    token in any sparse layer, over the standard deviation of that token's
    router logits (inf where top_k is every expert)."""
    gaps = []

    def hook(module, inputs, output):
        x = inputs[0].double().reshape(-1, module.weight.shape[-1])
        logits = x @ module.weight.double().T
        if top_k < logits.shape[-1]:
            v = torch.topk(logits, top_k + 1, dim=-1).values
            rel = (v[:, top_k - 1] - v[:, top_k]) / logits.std(dim=-1)
            gaps.append(float(rel.min()))

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules()
               if n.endswith("mlp.gate")]
    with torch.no_grad():
        model(torch.tensor([ids], dtype=torch.long))
    for h in handles:
        h.remove()
    return min(gaps) if gaps else float("inf")


DELTA_RULE_CALLS = [0]


def delta_rule_f64(query, key, value, g, beta, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, **kwargs):
    """The gated delta rule token by token in float64, for the reference
    (transformers' torch fallbacks compute it in float32). Same arguments
    and results as torch_chunk_gated_delta_rule: [B, T, H, D] in and out."""
    DELTA_RULE_CALLS[0] += 1
    dtype = query.dtype
    q, k, v, b, gg = (x.double() for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (q.shape[-1] ** -0.5)
    bs, t, h, dk = k.shape
    dv = v.shape[-1]
    s = (torch.zeros(bs, h, dk, dv, dtype=torch.float64) if initial_state is None
         else initial_state.double())
    out = torch.zeros(bs, t, h, dv, dtype=torch.float64)
    for i in range(t):
        s = s * gg[:, i].exp()[..., None, None]
        kv = (s * k[:, i, :, :, None]).sum(-2)
        delta = (v[:, i] - kv) * b[:, i][..., None]
        s = s + k[:, i, :, :, None] * delta[:, :, None, :]
        out[:, i] = (s * q[:, i, :, :, None]).sum(-2)
    return out.to(dtype), (s if output_final_state else None)


def use_f64_delta_rule(model):
    """Points the hybrid models' delta-rule calls at delta_rule_f64: the
    modules' globals and each layer's own attributes."""
    import importlib
    for mod in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        try:
            m = importlib.import_module(f"transformers.models.{mod}.modeling_{mod}")
        except ImportError:
            continue
        for fn in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                   "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
            if hasattr(m, fn):
                setattr(m, fn, delta_rule_f64)
    for sub in model.modules():
        for attr in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule"):
            if hasattr(sub, attr):
                setattr(sub, attr, delta_rule_f64)


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
    moe = spec.get("moe", False)
    hybrid = spec.get("hybrid", False)
    if moe:
        names = sorted(n for n, _ in model.named_parameters() if ".experts." in n)
        print(f"{name}: transformers {transformers.__version__} keeps experts as "
              f"{names[:3]} ...", flush=True)
    if moe and not hybrid:
        print(f"{name}: saved layout: {rewrite_per_expert(d)}", flush=True)
    if hybrid:  # as transformers saves them: the names show the layout
        from safetensors import safe_open
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(d, f), "pt") as st:
                    for k in sorted(st.keys()):
                        if ".layers.0." in k or ".layers.2." in k or "layers" not in k:
                            print(f"{name}: {f}: {k} {list(st.get_slice(k).get_shape())} "
                                  f"{st.get_slice(k).get_dtype()}", flush=True)

    load_kw = dict(attn_implementation="eager")
    if moe:
        load_kw["experts_implementation"] = "eager"
    ref = model_cls.from_pretrained(d, **load_kw).to(torch.float64).eval()
    if hybrid:
        use_f64_delta_rule(ref)
    # the reloaded weights must be the saved ones (a layout transformers
    # could not read would leave fresh random experts behind)
    mine = {n: p.double() for n, p in model.named_parameters()}
    for n, p in ref.named_parameters():
        if n in mine and not torch.equal(mine[n], p):
            raise SystemExit(f"{name}: {n} reloaded differs from what was saved")
    text = getattr(config, "text_config", config)
    vocab = text.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    gap = float("inf")
    lens = HYBRID_PROMPT_LENS if hybrid else MOE_PROMPT_LENS if moe else PROMPT_LENS
    for n in lens:
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
        if moe:  # every token of the prompt and its continuation
            gap = min(gap, routing_gap(ref, seq, text.num_experts_per_tok))
        tensors[f"prompt{n}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int32)
        tensors[f"prompt{n}.greedy_logits"] = torch.stack(greedy_logits).contiguous()
        top2 = torch.topk(tensors[f"prompt{n}.greedy_logits"], 2, dim=-1).values
        print(f"{name}: prompt {n}: greedy {greedy} min top-2 margin "
              f"{float((top2[:, 0] - top2[:, 1]).min()):.4f}", flush=True)
    if hybrid:
        print(f"{name}: delta rule calls in float64: {DELTA_RULE_CALLS[0]}", flush=True)
        if DELTA_RULE_CALLS[0] == 0:
            raise SystemExit(f"{name}: the float64 delta rule was never called")
    if moe:
        print(f"{name}: smallest top-k router-logit gap {gap:.3e} of the spread", flush=True)
        if gap < MOE_GAP_MIN:
            return False
    save_file(tensors, os.path.join(d, "expected.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__})
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder that receives one directory per model")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    for i, (name, spec) in enumerate(MODELS.items()):
        if only and name not in only:
            continue
        if spec["cls"][0] is None:
            raise SystemExit(f"{name}: this transformers has no {name.split('-')[0]} model")
        for t in range(MOE_TRIES if spec.get("moe") else 1):
            if make_one(name, spec, args.out, args.seed + 100 * i + 7 * t):
                break
        else:
            raise SystemExit(f"{name}: no seed of {MOE_TRIES} routes with a clear top-k gap")
    with open(os.path.join(args.out, "VERSIONS.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__}, f)
        f.write("\n")
    print("fixtures written to", args.out)


if __name__ == "__main__":
    main()
