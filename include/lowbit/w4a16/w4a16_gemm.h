// W4A16 GEMM on CUDA: y[M, N] = x[M, K] * dequant(W)[K, N] for fp16 or bf16
// activations and outputs, fp32 accumulation. Weights are prepared once from
// any QuantizedLinear (GPTQ v1/v2, AWQ, float zero-point, act-order, every
// group size) into lowbit's tiled layout (w4a16_layout.h) and uploaded.
//
// Strategies (all selectable, all tested against w4a16_gemm_ref):
//   data_parallel          one CTA per 64-column block walks all of K
//   split_k_atomic         K split over CTAs; fp32 atomicAdd into a workspace
//                          that the last CTA of a block converts (and re-zeroes)
//   split_k_deterministic  K split over CTAs; each writes its partial, the
//                          last CTA of a block sums them in a fixed order
//   stream_k               the k-iterations of all blocks cut into equal
//                          ranges, one per CTA of exactly one full wave (no
//                          partial last wave); shared blocks fixed up with
//                          fp32 atomics like split_k_atomic
//   decoupled              seed 000's three phases: dequantize W to a 16-bit
//                          workspace in global memory, then a cuBLAS GEMM (its
//                          own split-K/reduction inside): kept to measure what
//                          the memory round trip costs
//   wgmma                  sm_90a only: y^T = dequant(W)^T x^T on wgmma with
//                          the dequantized weights as the register operand and
//                          x tiles of 16..256 rows in shared memory, so one
//                          weight read serves up to 256 rows (prefill); K split
//                          with a deterministic reduction when the grid is small
//   gemv                   decode, sm_80 and later: each thread streams its
//                          own 16 bytes per 64-row k-iteration through a
//                          cp.async ring in shared memory; the weight codes
//                          are the mma.sync A operand and up to 8 rows of x
//                          its n columns, scales and zero points applied once
//                          per window of a group in fp32; K split over the
//                          CTAs of each 128-column block (split_k), summed by
//                          the block's last CTA in a fixed order; larger M
//                          runs in passes of 8 rows. `automatic` takes it
//                          for 1-4 rows on sm_90a (faster than wgmma there
//                          on the benchmark shapes, docs/w4a16-gemm.md v26,
//                          v27)
//   automatic              chosen by M, N, K and the device's SM count
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit {

enum class W4A16Strategy : uint8_t {
  automatic,
  data_parallel,
  split_k_atomic,
  split_k_deterministic,
  stream_k,
  decoupled,
  wgmma,  // needs a device and a build with sm_90a (w4a16_wgmma_available)
  gemv,
};
const char* w4a16_strategy_name(W4A16Strategy s);  // "auto", "data_parallel", ...
std::optional<W4A16Strategy> parse_w4a16_strategy(std::string_view name);
// Whether W4A16Strategy::wgmma can run on `device`: compute capability 9.0 and
// this build compiled for sm_90a. Selecting it where it cannot run throws
// Error(unsupported); `automatic` then picks among the other strategies.
bool w4a16_wgmma_available(int device = 0);

// Weights prepared once and resident on one CUDA device. Move-only.
class W4A16Weights {
 public:
  // Repacks `layer` (validated) for activations of `act_dtype` (f16 or bf16)
  // and uploads it to `device`.
  static W4A16Weights prepare(const formats::QuantizedLinear& layer, DType act_dtype, int device = 0);
  // Random weights generated on the device (uniform codes, scales in
  // [0.001, 0.01], zero terms in [0, 15]): for benchmarks of full-size layers,
  // where packing on the host would dominate the run. Integer zero points.
  static W4A16Weights random(int64_t K, int64_t N, int group_size, DType act_dtype, uint64_t seed, int device = 0);

  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  int64_t K_padded() const { return K_pad_; }
  int64_t N_padded() const { return N_pad_; }
  int group_size() const { return group_size_; }
  bool float_zero() const { return float_zero_; }
  bool act_order() const { return perm_.size() != 0; }
  DType act_dtype() const { return act_dtype_; }
  int device() const { return device_; }
  // Bytes a GEMM must read for the weights (codes, scales and zeros).
  size_t weight_bytes() const { return qweight_.size() + scale_zero_.size(); }

  const void* qweight() const { return qweight_.data(); }
  size_t qweight_bytes() const { return qweight_.size(); }
  const uint32_t* scale_zero() const { return scale_zero_.as<const uint32_t>(); }
  const int32_t* perm() const { return perm_.as<const int32_t>(); }

 private:
  int64_t K_ = 0, N_ = 0, K_pad_ = 0, N_pad_ = 0;
  int group_size_ = 0;
  bool float_zero_ = false;
  DType act_dtype_ = DType::f16;
  int device_ = 0;
  Buffer qweight_, scale_zero_, perm_;
};

// Scratch memory and handles reused across calls (split-K partials and
// counters, permuted activations, the decoupled strategy's 16-bit weights and
// its cuBLAS handle). Grows on demand; use one per stream.
class W4A16Workspace {
 public:
  W4A16Workspace();
  ~W4A16Workspace();
  W4A16Workspace(const W4A16Workspace&) = delete;
  W4A16Workspace& operator=(const W4A16Workspace&) = delete;

  // Device memory of at least `bytes`, kept zero-filled between calls when
  // `zeroed` (the atomic split-K restores zeros after use); a new buffer is
  // zeroed on `stream`, the stream of the call that uses it.
  void* scratch(int slot, size_t bytes, bool zeroed, int device, cudaStream_t stream);
  void* cublas_handle(int device);

 private:
  struct Slot {
    Buffer buffer;
    bool zeroed = false;
  };
  Slot slots_[4];
  void* cublas_ = nullptr;
  int cublas_device_ = -1;
};

// The attention inputs of a fused QKV projection, made by the GEMM that
// computes it (W4A16Options::attention_inputs): the arithmetic of
// ops::qkv_to_attention_inputs (layer_ops_cuda.h), bit for bit. The GEMM's
// N is (num_heads + 2 * num_kv_heads) * head_dim: q heads, k heads, v heads.
struct W4A16AttentionInputs {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;  // head_dim even and dividing 128
  const void* q_norm = nullptr;  // [head_dim] of the activation dtype, or null: no per-head norm
  const void* k_norm = nullptr;
  float eps = 0.0f;
  const int32_t* positions = nullptr;  // [M] i32, device
  const float* inv_freq = nullptr;     // [head_dim / 2] f32, device
  bool rope_interleaved = false;       // pairs (2i, 2i+1) instead of (i, i + head_dim / 2)
  float* q_out = nullptr;              // [M, num_heads * head_dim] f32
  float* k_out = nullptr;              // [M, num_kv_heads * head_dim] f32
  float* v_out = nullptr;              // [M, num_kv_heads * head_dim] f32
  // Optional, for a TurboQuant KV cache with Hadamard rotations (head_dim 64
  // or 128): q_rotation_signs (the layer's signs,
  // kv::DeviceKvCache::hadamard_signs) makes q_out q @ M * q_scale, what the
  // decode attention's own query rotation makes, bit for bit
  // (kv::DeviceDecodeOptions::queries_rotated).
  const float* q_rotation_signs = nullptr;
  float q_scale = 1.0f;
};

struct W4A16Options {
  W4A16Strategy strategy = W4A16Strategy::automatic;
  int split_k = 0;  // 0: chosen from the shape and SM count
  // wgmma only: rows of M per CTA tile, 16, 32, 64, 128 or 256; 0: chosen
  // from M, N and the SM count. For tests and tuning sweeps.
  int rows_per_tile = 0;
  // wgmma only, tiles of 64 rows and more, grids of more than one wave of
  // resident CTAs: the K split of the leftover tiles of their partly filled
  // last wave (choose_wgmma_tail, w4a16_wave_rule.h). 0: its choice; >= 2:
  // that split; 1: no tail split (the rule before it). Ignored when split_k
  // is given. For tests and benchmark comparisons.
  int tail_split = 0;
  // wgmma only, tiles of 64 rows and more: stream-K over this many CTAs
  // (choose_wgmma_stream_k, w4a16_wave_rule.h; at most one per k-iteration;
  // fewer CTAs than tiles give ranges of several tiles). 0: the rule's
  // choice, which takes it only for grids of fewer tiles than one wave of
  // resident CTAs; 1: none (the uniform K split or the tail split).
  // Ignored when split_k is given. For tests and benchmark comparisons.
  int stream_k_ctas = 0;
  // wgmma only, 64-row tiles: the kernel built for this many resident CTAs
  // per SM, 2 or 3 (choose_wgmma_dense, w4a16_wave_rule.h). 0: the rule's
  // choice. For tests and benchmark comparisons.
  int wgmma_ctas_per_sm = 0;
  // wgmma only, grids of whole tiles (no stream-K): the order in which the
  // tiles are handed out, groups of this many row tiles
  // (choose_wgmma_group_rows, w4a16_wave_rule.h; at least the row tile
  // count: the plain row-major order). 0: the rule's choice. For tests and
  // benchmark comparisons.
  int wgmma_group_rows = 0;
  // auto only, M > 256 on the wgmma path: the rows past the last whole
  // 256-row tile as a second GEMM of their own (choose_row_remainder,
  // w4a16_wave_rule.h). 0: the rule's choice; 1: never (one call); 2:
  // whenever M % 256 != 0. For tests and benchmark comparisons.
  int row_remainder = 0;
  // wgmma only, K splits and tail tiles (not stream-K): the CTAs of a split
  // tile sum its partials together, each a part of the tile, rather than
  // its last CTA alone (W4A16Plan::shared_fixup). 0: the rule's choice,
  // wherever every CTA that may wait fits in one wave of resident CTAs (on
  // the 64-row two-CTA, 128- and 256-row kernels, which hold it), and there
  // short K on 64- and 128-row tiles takes the uniform split rather than
  // stream-K (choose_wgmma_stream_k); 1: never (and that stream-K again);
  // 2: on those kernels also past one wave, where CTAs give up their bounded
  // wait (slow; for the tests of that path). The same bits as the last CTA's
  // sum of the same split. For tests and benchmark comparisons.
  int shared_fixup = 0;
  // x is [M, 2K]: a gate half then an up half, and the GEMM multiplies
  // silu(gate) * up, each rounded to the activation dtype (the values
  // ops::silu_mul stores), by the weights: a decode step's SiLU fused into
  // its down projection, one launch fewer per layer. Only the gemv strategy
  // reads x this way (options.strategy must name it); any other strategy
  // and act-order weights are refused with Error(unsupported). (K is a
  // multiple of 8, so the up half's rows start at 16-byte boundaries.)
  bool x_silu_mul = false;
  // A decode step's residual add + RMSNorm, done by the GEMMs on either side
  // of it instead of a kernel of its own (gemv strategy only; the options
  // must name it):
  // - residual_row_sq: y is the residual stream, read and written:
  //   y = round(y + round(x W)), the add of ops::add_rms_norm bit for bit.
  //   The sum of squares of each stored row over each block of 128 columns
  //   goes to residual_row_sq[row * w4a16_row_sq_floats(N) + block] (and to
  //   copies of it further on in the row's floats: M * w4a16_row_sq_floats(N)
  //   in all).
  // - x_norm_weight (+ x_norm_row_sq, x_norm_eps): x is the residual stream
  //   and the GEMM multiplies RMSNorm(x): x_i * rsqrt(sum / K + eps) * w_i,
  //   rounded as ops::rms_norm rounds it, with sum the total of the
  //   w4a16_row_sq_blocks(K) sums of the row that a residual_row_sq GEMM of
  //   N = K wrote to x_norm_row_sq. x_norm_weight: [K] of
  //   the activation dtype. The total is summed in another order than
  //   ops::rms_norm's, so results agree to rounding, not bit for bit.
  //   Act-order weights, x_silu_mul and residual_row_sq are refused with
  //   Error(unsupported). (K, a multiple of 8 for all weights, keeps x's
  //   rows in 16-byte pieces.)
  // Both save a launch and a round trip through the residual per norm.
  float* residual_row_sq = nullptr;
  const void* x_norm_weight = nullptr;
  const float* x_norm_row_sq = nullptr;
  float x_norm_eps = 0.0f;
  // A decode step's q/k norm, RoPE and widening to fp32, done by the QKV
  // GEMM's epilogue instead of a kernel of its own (gemv strategy only;
  // with or without x_norm_weight, not with residual_row_sq): y is not
  // written (it must still be a valid [M, N] tensor), the attention inputs
  // are (W4A16AttentionInputs; its pointers are device memory).
  const W4A16AttentionInputs* attention_inputs = nullptr;
  // gemv and wgmma, when the call reads every weight once (one pass of rows:
  // M <= 8 for gemv, one row tile for wgmma): the launch reads the 4-bit
  // codes through an L2 streaming window (cuda::L2StreamSpan in
  // lowbit/cuda/pdl.cuh), so that a decode step's weight stream, far larger
  // than L2, does not push out what the next kernels read again. Only a
  // cache hint: the same bits either way (tests compare).
  // LOWBIT_L2_STREAMING=0 in the environment turns every such window off.
  bool l2_streaming = true;
  // gemv: from this many bytes of 4-bit codes the kernel lets the next kernel
  // of the stream launch (programmatic dependent launch, lowbit/cuda/pdl.cuh)
  // before its own wait for the previous one, so that the next kernel's launch
  // and first weight requests overlap this one's stream; below, after its K
  // loop. On the H100 (docs/engine.md, v28): a Qwen3-14B decode step (13-400
  // MB per GEMM) gains 2-4%, a decode step of ~1 MB GEMMs (SmolLM2-135M's
  // shape) loses 10% when every GEMM does it and nothing when only its
  // largest (1 MB) does. 0: every call; the same bits either way (tested).
  int64_t gemv_early_dependents_bytes = int64_t{4} << 20;
};

// W4A16Options::residual_row_sq of an N-column GEMM: blocks of 128 columns
// per row, and the floats per row of the buffer (blocks, copied for its
// readers).
int64_t w4a16_row_sq_blocks(int64_t N);
int64_t w4a16_row_sq_floats(int64_t N);

// What a call runs: the strategy, the K split and the rows per pass.
struct W4A16Plan {
  W4A16Strategy strategy;
  int split_k;        // split-K, wgmma, gemv: CTAs per tile along K; stream-K: CTAs in the wave
  int rows_per_pass;  // 16, 32 or 64 (wgmma: 16, 32, 64, 128 or 256; gemv: 8); larger M takes several passes
  // wgmma: the last tail_tiles tiles split tail_split ways along K (split_k
  // is then 1); 0: none.
  int64_t tail_tiles = 0;
  int tail_split = 1;
  // wgmma: stream-K over this many CTAs (split_k is then 1); 0: none.
  int64_t stream_k_ctas = 0;
  // wgmma, 64-row tiles: the kernel built for three resident CTAs per SM
  // rather than two.
  bool wgmma_dense = false;
  // wgmma without stream-K: row tiles per group of the tile order
  // (choose_wgmma_group_rows); 0 otherwise.
  int64_t wgmma_group_rows = 0;
  // auto: the last remainder_rows rows run as a second GEMM with a plan of
  // their own (w4a16_plan(remainder_rows)); every field above is then the
  // plan of the first M - remainder_rows rows. 0: one GEMM.
  int64_t remainder_rows = 0;
  // wgmma, K splits or tail tiles: the split CTAs of a tile wait for each
  // other (a bounded wait) and share its fix-up; false: its last CTA sums
  // the partials alone.
  bool shared_fixup = false;
};
W4A16Plan w4a16_plan(int64_t M, const W4A16Weights& w, const W4A16Options& options = {});

// y = x * dequant(W). x: [M, K] device tensor of w.act_dtype() with rows
// 16-byte aligned (contiguous, or row stride a multiple of 8 elements);
// y: [M, N] device tensor of the same dtype, rows contiguous. Throws
// Error(invalid_argument) naming the tensor for wrong dtypes, shapes, devices
// or alignment. Asynchronous on `stream`.
void w4a16_gemm(const TensorView& x, const W4A16Weights& w, const TensorView& y, W4A16Workspace& workspace,
                const W4A16Options& options = {}, cudaStream_t stream = nullptr);

// What w4a16_tune measured: the fastest options and, for each candidate,
// its name ("auto", "gemv_s<split>") and median time in microseconds.
struct W4A16Tuning {
  W4A16Options best;
  std::vector<std::pair<std::string, double>> candidates;
  double best_us = 0;
  // The gemv split chosen by choose_gemv_split and its time (M <= 8; else
  // fastest_gemv_us stays 0): a caller that fuses neighbouring work into
  // gemv GEMMs may prefer it.
  W4A16Options fastest_gemv;
  double fastest_gemv_us = 0;
};

// Times, for M rows on w's device, the plan `auto` picks and the gemv
// strategy at K splits 1, 2, 4, 8, 12 and 16 and its own choice (M <= 8;
// larger M gets `auto` untimed), on random activations, L2 evicted by reading
// between calls (the state a decode step finds: the previous layer's
// weights), median of `reps` calls each (30 by default: with 10, the medians
// of one kernel moved by up to 8% from one engine to the next, e.g. 15.0 to
// 16.3 us, enough to swap two splits that differ by 2% in a decode step);
// returns the fastest, where among
// the gemv splits a larger one counts only when it is clearly faster
// (choose_gemv_split, w4a16_tune_rule.h). No single split
// rule fits every shape (docs/w4a16-gemm.md, "v7"), so callers that run one
// shape many times (the CUDA engine, once per distinct layer shape at load)
// measure instead. Takes a few milliseconds and a 256 MB flush buffer; runs
// on `stream` and synchronizes it.
W4A16Tuning w4a16_tune(const W4A16Weights& w, int64_t M, W4A16Workspace& workspace, cudaStream_t stream = nullptr,
                       int reps = 30);

}  // namespace lowbit
