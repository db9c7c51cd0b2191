// The element-wise and per-row operations of a Llama/Qwen3 decoder layer, as
// plain fp32 loops: the references that the CUDA kernels in layer_ops_cuda.h
// are tested against. Shapes are row-major; every function checks its spans.
//
// Conventions shared with the kernels:
// - RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, in fp32, rounded once on output.
// - RoPE rotates pairs of coordinates by angle pos * inv_freq[i], that product
//   taken in fp32 as in HF transformers. Two pairings:
//     half         (HF transformers' rotate_half): pair (i, i + d/2)
//     interleaved  (GPT-J, ggml's "normal" mode): pair (2i, 2i + 1)
//   inv_freq (d/2 values) is an input, so theta and any frequency scaling
//   (e.g. Llama 3's) are decided by the caller, once, on the host.
// - SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
#pragma once

#include <cstdint>
#include <span>

namespace lowbit::ops {

enum class RopeStyle : uint8_t { half, interleaved };
const char* rope_style_name(RopeStyle style);

// x, y: [rows, dim]; w: [dim].
void rms_norm_ref(std::span<const float> x, std::span<const float> w, int64_t rows, int64_t dim, float eps,
                  std::span<float> y);

// residual[r] += x[r], then y[r] = rms_norm(residual[r]) (the pre-norm of the
// next sub-layer, fused with the residual add of the previous one).
void add_rms_norm_ref(std::span<float> residual, std::span<const float> x, std::span<const float> w,
                      int64_t rows, int64_t dim, float eps, std::span<float> y);

// In place on x: [tokens, heads, head_dim] where token t's first element is at
// t * token_stride (elements) and heads are head_dim apart; positions[t] is
// token t's position; inv_freq has head_dim / 2 values.
void rope_ref(std::span<float> x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
              std::span<const int32_t> positions, std::span<const float> inv_freq, RopeStyle style);

// out[t, i] = silu(gate[t, i]) * up[t, i]; gate and up rows are row_stride apart.
void silu_mul_ref(std::span<const float> gate, std::span<const float> up, int64_t tokens, int64_t width,
                  int64_t row_stride, std::span<float> out);

// out[t] = table[ids[t]]; table: [vocab, dim]. Ids outside [0, vocab) throw.
void embedding_ref(std::span<const float> table, int64_t vocab, int64_t dim, std::span<const int32_t> ids,
                   std::span<float> out);

// Index of the largest value of each row (the lowest index among equals;
// NaN never wins). rows x width -> rows indices.
void argmax_ref(std::span<const float> x, int64_t rows, int64_t width, std::span<int32_t> out);

}  // namespace lowbit::ops
