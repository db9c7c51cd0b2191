#!/usr/bin/env python3
"""Writes the golden files of the engine tests (tests/engine/golden/<model>/).

Tiny random-initialized models built with Hugging Face transformers (fp32,
eager attention, CPU):
  llama       hidden 64, 2 layers, 4 heads / 2 KV heads (head_dim 16), vocab
              256, llama3 rope_scaling, untied lm_head
  qwen3       hidden 64, 2 layers, 4 heads / 2 KV heads, head_dim 32 (q_dim 128
              != hidden), per-head q/k RMSNorm, tied embeddings
and two with the head dimensions of the CUDA attention kernels, whose
checkpoints are stored in fp16 (transformers runs them in fp32 on those
fp16 values) to keep the files small:
  llama_d64   hidden 128, ffn 128, 2 layers, 2 heads / 1 KV head (head_dim
              64), untied lm_head
  qwen3_d128  hidden 128, ffn 128, 2 layers, 2 heads / 1 KV head, head_dim 128
              (q_dim 256 != hidden), per-head q/k RMSNorm, tied embeddings

For each: config.json + model.safetensors (the checkpoint the C++ test loads)
and golden.safetensors with
  tokens     i32 [T]      a random prompt of 10 tokens, then 4 greedy tokens
  logits     f32 [T, V]   logits at every position (one causal forward; equal to
                          prefill + incremental decode)
  logits_w4  f32 [T, V]   the same with every linear layer (and an untied
                          lm_head) fake-quantized by 4-bit RTN as lowbit does it
                          on load (--weights w4): integer zero points,
                          AutoGPTQ min-max, scale rounded to f16 first, group 128
                          or the largest of 64/32 that divides in_features
  w4.<name>  f32          the fake-quantized weights themselves (not for the
                          fp16 models: the tests then check the logits only)

Needs torch, transformers and safetensors (not in CI: the outputs are
committed). Run from the repository root:  python3 tests/engine/make_golden.py
[MODEL ...]  (default: all four).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
PROMPT_TOKENS = 10
DECODE_TOKENS = 4


def rtn_w4(weight: torch.Tensor) -> torch.Tensor:
    """lowbit's RTN (formats/rtn.h, ZeroPoint::integer), dequantized, in fp32."""
    n, k = weight.shape
    group = next(g for g in (128, 64, 32) if k % g == 0)
    w = weight.detach().float().reshape(n, k // group, group)
    xmin = torch.clamp(w.amin(dim=-1, keepdim=True), max=0.0)
    xmax = torch.clamp(w.amax(dim=-1, keepdim=True), min=0.0)
    s = ((xmax - xmin) / 15.0).half().float()
    s = torch.where(s > 0, s, torch.ones_like(s))  # degenerate groups: scale 1
    z = torch.clamp(torch.round(-xmin / s), 0, 15)
    q = torch.clamp(torch.round(w / s) + z, 0, 15)
    return (s * (q - z)).reshape(n, k)


MODELS = ("llama", "qwen3", "llama_d64", "qwen3_d128")
FP16_CHECKPOINT = ("llama_d64", "qwen3_d128")


def build(kind: str):
    import transformers

    torch.manual_seed({"llama": 1234, "qwen3": 4321, "llama_d64": 64, "qwen3_d128": 128}[kind])
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.1, rms_norm_eps=1e-5, attention_bias=False)
    if kind in FP16_CHECKPOINT:
        common.update(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    if kind == "llama_d64":
        config = transformers.LlamaConfig(**common, head_dim=64, rope_theta=10000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "qwen3_d128":
        config = transformers.Qwen3Config(**common, head_dim=128, rope_theta=1000000.0, tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(
            **common, rope_theta=10000.0, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**common, head_dim=32, rope_theta=1000000.0,
                                          tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(config)
    model = model.float().eval()
    # Norm weights away from 1 so that a missing norm weight shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        if kind in FP16_CHECKPOINT:  # the checkpoint holds fp16: run on exactly those values
            for p in model.parameters():
                p.copy_(p.half().float())
    model.config._attn_implementation = "eager"
    return model


def greedy_tokens(model, prompt):
    ids = prompt.clone()
    with torch.no_grad():
        for _ in range(DECODE_TOKENS):
            logits = model(ids[None]).logits[0, -1]
            ids = torch.cat([ids, logits.argmax().reshape(1)])
    return ids


def linear_names(model):
    names = [n for n, _ in model.named_parameters()
             if n.endswith("_proj.weight") and ".layers." in n]
    if not model.config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def main():
    kinds = sys.argv[1:] or MODELS
    for kind in kinds:
        if kind not in MODELS:
            sys.exit(f"unknown model {kind!r}; one of {', '.join(MODELS)}")
    for kind in kinds:
        model = build(kind)
        folder = os.path.join(OUT, kind)
        os.makedirs(folder, exist_ok=True)
        if kind in FP16_CHECKPOINT:
            # An fp16 copy of the weights (model.half() would also round the
            # rotary inv_freq buffer the logits below are computed with).
            state = {k: v.half() for k, v in model.state_dict().items()}
            if model.config.tie_word_embeddings:
                state.pop("lm_head.weight", None)  # tied: the file holds the embedding only
            model.save_pretrained(folder, safe_serialization=True, state_dict=state)
        else:
            model.save_pretrained(folder, safe_serialization=True)
        for extra in ("generation_config.json",):
            path = os.path.join(folder, extra)
            if os.path.exists(path):
                os.remove(path)
        gen = torch.Generator().manual_seed(7)
        prompt = torch.randint(0, model.config.vocab_size, (PROMPT_TOKENS,), generator=gen)
        tokens = greedy_tokens(model, prompt)
        with torch.no_grad():
            logits = model(tokens[None]).logits[0].float()
            fake = {}
            params = dict(model.named_parameters())
            for name in linear_names(model):
                fake[name] = rtn_w4(params[name])
            original = {name: params[name].detach().clone() for name in fake}
            for name, w in fake.items():
                params[name].copy_(w)
            logits_w4 = model(tokens[None]).logits[0].float()
            for name, w in original.items():
                params[name].copy_(w)
        golden = {"tokens": tokens.to(torch.int32).contiguous(), "logits": logits.contiguous(),
                  "logits_w4": logits_w4.contiguous()}
        if kind not in FP16_CHECKPOINT:
            for name, w in fake.items():
                golden["w4." + name] = w.contiguous()
        save_file(golden, os.path.join(folder, "golden.safetensors"),
                  metadata={"transformers": __import__("transformers").__version__,
                            "torch": torch.__version__})
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        print(f"{kind}: {folder} tokens {tokens.tolist()} config keys {sorted(cfg)[:6]}...")


if __name__ == "__main__":
    sys.exit(main())
