#!/usr/bin/env python3
"""Writes a small random Llama-architecture checkpoint in Hugging Face layout
(config.json + model.safetensors, fp16), for the demo and the tests.

The weights are random (normal, std 0.02, with a few outlier input channels so
that quantization error is not uniform); the architecture fields are those that
transformers' LlamaConfig reads, so later issues can load it as a model.

    python3 scripts/make_tiny_checkpoint.py OUT_DIR [--layers 2] [--hidden 256]
        [--intermediate 768] [--heads 4] [--kv-heads 2] [--vocab 512] [--seed 0]
        [--dtype float16|float32]
"""
import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file


def make_weights(args, rng):
    dtype = np.dtype(args.dtype)
    head_dim = args.hidden // args.heads

    def linear(out_features, in_features):
        w = rng.normal(0.0, 0.02, size=(out_features, in_features))
        outliers = rng.choice(in_features, size=max(1, in_features // 64), replace=False)
        w[:, outliers] *= 8.0  # a few salient input channels, as in real LLM weights
        return w.astype(dtype)

    tensors = {
        "model.embed_tokens.weight": rng.normal(0, 0.02, (args.vocab, args.hidden)).astype(dtype),
        "model.norm.weight": np.ones(args.hidden, dtype=dtype),
        "lm_head.weight": linear(args.vocab, args.hidden),
    }
    for i in range(args.layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(args.hidden, dtype=dtype)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(args.hidden, dtype=dtype)
        tensors[p + "self_attn.q_proj.weight"] = linear(args.heads * head_dim, args.hidden)
        tensors[p + "self_attn.k_proj.weight"] = linear(args.kv_heads * head_dim, args.hidden)
        tensors[p + "self_attn.v_proj.weight"] = linear(args.kv_heads * head_dim, args.hidden)
        tensors[p + "self_attn.o_proj.weight"] = linear(args.hidden, args.heads * head_dim)
        tensors[p + "mlp.gate_proj.weight"] = linear(args.intermediate, args.hidden)
        tensors[p + "mlp.up_proj.weight"] = linear(args.intermediate, args.hidden)
        tensors[p + "mlp.down_proj.weight"] = linear(args.hidden, args.intermediate)
    return tensors


def make_config(args):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "vocab_size": args.vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": args.dtype,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    args = parser.parse_args(argv)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")

    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    save_file(make_weights(args, rng), os.path.join(args.out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(make_config(args), f, indent=2)
    print(f"wrote {args.out_dir}: {args.layers} layers, hidden {args.hidden}, "
          f"intermediate {args.intermediate}, vocab {args.vocab}, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
