// CPU reference attention (fp32) read directly from the paged, quantized KV
// cache; THE ORACLE for the GPU decode and prefill kernels. Plus a plain dense
// attention on un-quantized K/V (accumulated in double): the quality oracle
// that says how much the quantization itself costs.
//
// Shapes (all fp32, row-major, flat spans):
//   decode  q, out: [batch][num_q_heads][head_dim]; sequence b's query is the
//           token at position length(seqs[b]) - 1 and attends to all of its
//           tokens 0 .. length - 1 (write the token's K/V before attending).
//   prefill q, out: [n_tokens][num_q_heads][head_dim]; query i is the token at
//           position first_pos + i and attends causally to 0 .. first_pos + i
//           (chunked prefill: earlier chunks are already in the cache).
// GQA: query head g reads KV head g / (num_q_heads / num_kv_heads), the
// grouping of Hugging Face's repeat_kv (Qwen3-14B: 40 query heads over 8 KV heads).
//
// What the GPU kernels mirror (the arithmetic, so "matching" has a meaning):
//  - Keys are never un-rotated. A quantized K is scored in the rotated domain:
//    q' = q @ M (once per query head, fp32), then for token t with indices
//    idx and scale s_t: score = softmax_scale * s_t * sum_j q'_j c[idx_j]
//    (the sum over j in increasing order; a kernel may use a 16-entry table
//    of q'_j c[i] or any order: fp32 reordering is within the tolerance).
//    fp16 K is scored against q directly.
//  - Values are accumulated in their stored domain: acc += p_t * s_t * c[idx]
//    (rotated) and the output is un-rotated once, after normalizing and
//    merging: out = (acc / l) @ M^T. fp16 V needs no un-rotation.
//  - Online softmax over tokens in increasing order, per query head:
//    m = running max of scores, l = sum exp(score - m), acc rescaled by
//    exp(m_old - m_new) when the max grows.
//  - Split-KV (flash-decoding): the token range 0 .. length-1 is cut into
//    chunks of split_tokens (the last one shorter); chunk c yields
//    o_c = acc_c / l_c and lse_c = m_c + log(l_c). The merge is exact:
//    out = sum_c exp(lse_c - LSE) o_c with LSE = log sum_c exp(lse_c),
//    computed as M = max lse_c, w_c = exp(lse_c - M), out = sum w_c o_c / sum w_c.
//    split_tokens = 0 means one chunk per sequence; the unsplit result goes
//    through the same merge (with one chunk it is exact division by 1).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lowbit/kv/paged_cache.h"

namespace lowbit::kv {

struct DecodeOptions {
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  int64_t split_tokens = 0;    // KV chunk length per split (flash-decoding); 0: no split
};

// The per-chunk results of split-KV decode, laid out as a GPU flash-decoding
// kernel writes them before its merge kernel.
struct DecodePartials {
  int batch = 0, num_q_heads = 0, head_dim = 0;
  int max_splits = 0;          // chunks of the longest sequence
  int64_t split_tokens = 0;    // the chunk length used (the longest length when not split)
  bool value_rotated = false;  // whether `out` is in V's rotated domain
  std::vector<float> out;      // [batch][num_q_heads][max_splits][head_dim], o_c; 0 for empty chunks
  std::vector<float> lse;      // [batch][num_q_heads][max_splits], lse_c; -inf for empty chunks
};

// Throws Error(invalid_argument) naming the argument: a bad layer or sequence
// id, an empty sequence, num_q_heads not a positive multiple of num_kv_heads,
// spans of the wrong size, a negative softmax_scale or split_tokens.
DecodePartials paged_decode_partials_ref(const PagedKvCache& cache, int layer, std::span<const int> seqs,
                                         int num_q_heads, std::span<const float> q,
                                         const DecodeOptions& options = {});
// The exact log-sum-exp merge of the chunks: out [batch][num_q_heads][head_dim]
// in the partials' domain (rotated when value_rotated).
void merge_decode_partials_ref(const DecodePartials& partials, std::span<float> out);

// Decode attention: partials, merge, un-rotation of the output.
void paged_decode_attention_ref(const PagedKvCache& cache, int layer, std::span<const int> seqs,
                                int num_q_heads, std::span<const float> q, std::span<float> out,
                                const DecodeOptions& options = {});

// Causal attention for the block of tokens first_pos .. first_pos + n_tokens - 1
// of `seq`, whose K/V are already in the cache (first_pos + n_tokens <= length).
void paged_prefill_attention_ref(const PagedKvCache& cache, int layer, int seq, int64_t first_pos,
                                 int64_t n_tokens, int num_q_heads, std::span<const float> q,
                                 std::span<float> out, float softmax_scale = 0.0f);

// The quality oracle: softmax(q k^T * scale) v on plain K/V, scores, softmax
// and sums in double, rounded to fp32 once. q, out [n_queries][num_q_heads][head_dim],
// k, v [n_keys][num_kv_heads][head_dim]; query i is at position
// n_keys - n_queries + i and attends to keys 0 .. that position.
void dense_attention_ref(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                         int64_t n_queries, int64_t n_keys, int num_q_heads, int num_kv_heads, int head_dim,
                         std::span<float> out, float softmax_scale = 0.0f);

}  // namespace lowbit::kv
