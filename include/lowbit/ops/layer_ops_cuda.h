// CUDA kernels for the element-wise and per-row operations of a decoder layer
// (RMSNorm, fused residual add + RMSNorm, RoPE, SwiGLU, embedding lookup,
// greedy argmax, and q/k norm + RoPE + fp32 widening of a QKV output fused).
// Semantics and references: layer_ops_ref.h. All tensors are device views of
// one dtype (f32, f16 or bf16; argmax ids and positions are i32); arithmetic
// is fp32, each output rounded once. Asynchronous on `stream`.
//
// These are memory-bound and small next to the GEMMs and attention; they are
// written for clarity and one pass over their bytes, and their value is in
// letting the engine keep activations on the device between the big kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/core/tensor.h"
#include "lowbit/ops/layer_ops_ref.h"

namespace lowbit::ops {

// x, y: [rows, dim] (rows dim apart); w: [dim]. y may be x.
void rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
              cudaStream_t stream = nullptr);

// residual += x (stored in residual's dtype), then y = rms_norm(residual).
// residual, x, y: [rows, dim]; w: [dim].
void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& w, float eps,
                  const TensorView& y, cudaStream_t stream = nullptr);

// In place: every head vector of x [tokens, heads, head_dim] (the layout rope
// takes, below) normalized by RMSNorm with weight w [head_dim]: Qwen3's
// per-head q/k norm, applied to slices of a fused QKV output.
void head_rms_norm(const TensorView& x, const TensorView& w, float eps, cudaStream_t stream = nullptr);

// dst = src converted to dst's dtype (f32, f16, bf16). src: rank 2 [rows, cols]
// with unit column stride and any row stride; dst: contiguous [rows, cols].
void convert_rows(const TensorView& src, const TensorView& dst, cudaStream_t stream = nullptr);

// In place on x: rank 3 [tokens, heads, head_dim], heads contiguous
// (strides[1] == head_dim, strides[2] == 1); strides[0] may exceed
// heads * head_dim (a slice of a fused QKV output). positions: [tokens] i32;
// inv_freq: [head_dim / 2] f32.
void rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq, RopeStyle style,
          cudaStream_t stream = nullptr);

// The inputs of the attention kernels from a fused QKV output, in one launch
// (the decode step's per-layer q/k norm, RoPE and widening were 7 launches):
// qkv: rank 2 [tokens, (num_heads + 2 * num_kv_heads) * head_dim], q heads
// then k heads then v heads, unit column stride, any row stride; f32, f16 or
// bf16. head_dim even, <= 256. q_norm / k_norm: [head_dim] in qkv's dtype, or
// null for no per-head norm (Qwen3 has them, Llama not). positions: [tokens]
// i32; inv_freq: [head_dim / 2] f32. q_out [tokens, num_heads * head_dim],
// k_out and v_out [tokens, num_kv_heads * head_dim]: contiguous f32. The
// result equals, bit for bit, head_rms_norm on the q and k heads (when a
// weight is given), rope on both, then convert_rows of q, k and v to f32,
// with the intermediate roundings to qkv's dtype that sequence has; qkv is
// left unchanged.
void qkv_to_attention_inputs(const TensorView& qkv, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                             const TensorView* q_norm, const TensorView* k_norm, float eps,
                             const TensorView& positions, const TensorView& inv_freq, RopeStyle style,
                             const TensorView& q_out, const TensorView& k_out, const TensorView& v_out,
                             cudaStream_t stream = nullptr);

// out[t, i] = silu(gate[t, i]) * up[t, i]. gate, up: rank 2 [tokens, width]
// with unit column stride and any row stride (e.g. halves of a fused
// gate_up output); out: contiguous [tokens, width].
void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out,
              cudaStream_t stream = nullptr);

// out[t] = table[ids[t]]. table: [vocab, dim]; ids: [tokens] i32 on the device;
// out: [tokens, dim]. The ids are not visible to the host here: a row whose id
// is outside [0, vocab) is filled with NaN, so a bad id shows in every later
// result instead of reading out of bounds.
void embedding(const TensorView& table, const TensorView& ids, const TensorView& out,
               cudaStream_t stream = nullptr);

// out[r] = index of the largest value of row r of x [rows, width] (lowest
// index among equals; NaN never wins; an all-NaN row gives 0).
void argmax(const TensorView& x, const TensorView& out, cudaStream_t stream = nullptr);

}  // namespace lowbit::ops
