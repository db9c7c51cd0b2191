// The decoder forward pass on a CUDA device: the same arithmetic as the CPU
// backend (model_config.h has it in one place), with activations in fp16 kept
// on the device between kernels:
//
//   linear layers   W4A16 GEMM (w4a16_gemm.h) or cuBLAS fp16 (dense weights);
//                   q/k/v and gate/up are fused into one matrix each, so a step
//                   launches 4 GEMMs per layer and reads each weight once
//   norms, RoPE,    ops/layer_ops_cuda.h (the residual add is fused into the
//   SwiGLU          next RMSNorm)
//   KV cache        kv/device_cache.h: paged TurboQuant or fp16 K/V, decode
//                   attention with split-KV, causal prefill attention
//
// A DeviceModel is built from a loaded Model (upload) or with random weights
// made on the device (for `lowbit bench model`: a full-size model would take
// minutes to make and pack on the host). CudaEngine owns the KV cache, the
// page allocator and the activation buffers, and runs steps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/cuda/cublas_gemm.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/model_config.h"
#include "lowbit/engine/weights.h"
#include "lowbit/kv/device_cache.h"
#include "lowbit/w4a16/w4a16_gemm.h"

namespace lowbit::engine {

// y[M, N] = x[M, K] W^T on the device: 4-bit (prepared for fp16 activations)
// or dense fp16 [N][K].
struct DeviceLinear {
  int64_t N = 0, K = 0;
  std::optional<W4A16Weights> w4;
  Buffer dense;  // f16 [N][K] when not w4
  size_t bytes() const;
};

struct DeviceLayer {
  Buffer attn_norm, ffn_norm;  // f16 [hidden]
  Buffer q_norm, k_norm;       // f16 [head_dim], Qwen3
  DeviceLinear qkv;            // [q_dim + 2 kv_dim][hidden]
  DeviceLinear o;              // [hidden][q_dim]
  DeviceLinear gate_up;        // [2 ffn][hidden]: gate rows, then up rows
  DeviceLinear down;           // [hidden][ffn]
};

struct DeviceModel {
  ModelConfig config;
  Buffer embed;  // f16 [vocab][hidden]
  std::vector<DeviceLayer> layers;
  Buffer final_norm;  // f16 [hidden]
  // The output matrix; when tied it is a dense copy of the table only if the
  // head is 4-bit, else it reads `embed` (lm_head.dense stays empty).
  DeviceLinear lm_head;
  bool lm_head_reads_embed = false;
  Buffer inv_freq;  // f32 [head_dim / 2]

  // Bytes of every weight on the device, and the bytes one decode step reads
  // (every linear layer and the output matrix; one embedding row ignored).
  size_t weight_bytes() const;
  size_t bytes_per_token() const;
  // The linears' formats on the device, counted as the engine runs them
  // (q/k/v and gate/up stacked): "120 x w4 g32, 1 x fp16 (embedding, also
  // the output matrix)".
  std::string format_summary() const;
  std::string describe() const;  // format_summary() and the bytes: "..., 8.1 GB on the device"

  // Uploads a loaded model. Linear layers stored w4 (RTN on load, GPTQ/AWQ,
  // GGUF Q4_x) stay 4-bit; dense and q8 ones become fp16 (or are quantized to
  // w4 with group 128 when `quantize_dense_to_w4`). Throws Error(unsupported)
  // for what the CUDA path lacks (attention biases, head_dim other than 64 or 128).
  static DeviceModel upload(const Model& model, bool quantize_dense_to_w4 = false);
  // Random weights generated on the device: fp16 dense (values of magnitude
  // <= 0.02) or w4 with group 128 (W4A16Weights::random). Norm weights 1.
  static DeviceModel random(const ModelConfig& config, bool w4, uint64_t seed);
};

struct CudaEngineOptions {
  kv::KvFormat k_format = kv::KvFormat::tq4;
  kv::KvFormat v_format = kv::KvFormat::tq4;
  int page_size = 64;
  int64_t max_tokens = 4096;  // per sequence
  int max_sequences = 1;
  uint64_t rotation_seed = kv::kDefaultRotationSeedBase;
  // The TurboQuant rotation of each layer (kv/rotation.h): Haar (QR of a
  // Gaussian matrix, the seed's) or randomized Hadamard (d signs and a fast
  // Walsh-Hadamard transform; head_dim a power of two). Unset:
  // kv_rotation_for (kv_store.h), Hadamard where it applies.
  std::optional<kv::RotationKind> rotation;
  // Time the W4A16 kernels once per distinct w4 layer shape at one row
  // (w4a16_tune, a few ms each at construction) and run single-row steps
  // with the fastest. Off by default: the choice depends on timings, and the
  // kernels round differently, so two runs could differ in the last bits
  // (`lowbit bench model` turns it on; its output lists the choices).
  bool tune_decode_gemms = false;
  // Single-row GEMMs of these roles (kDecodeGemmRoles: "qkv", "o",
  // "gate_up", "down", "lm_head") run the gemv strategy at this K split
  // instead of auto's plan, in every layer; the other roles keep theirs
  // (decode_gemv_splits.h says why; `lowbit bench model --gemv-splits`).
  // Not together with tune_decode_gemms. Splits are clamped to the GEMM's
  // k-iterations (K / 64); w4 layers only.
  std::map<std::string, int> decode_gemv_splits;
  // Decode steps of step() (one new token per row, last-token logits) from a
  // CUDA graph: a decode step launches 5-12 kernels per layer (5 with every
  // fusion of a tuned single-row step), and launched
  // one by one from the host they cost more than they run on a small model
  // (SmolLM2-135M: ~2 ms of launches per step). The attention of a decode
  // step is planned for its longest row rounded up to decode_plan_tokens,
  // and the block tables are padded to that length, so the launches stay
  // the same for that many steps: the first step of a set of rows (and plan
  // length) runs eagerly, the second is captured, the rest replay it.
  // Eager and replayed steps give the same bits.
  bool decode_graphs = true;
  int64_t decode_plan_tokens = 256;
  // The W4A16 options of single-row GEMMs when tune_decode_gemms is off
  // (default: auto's plan; tests force the gemv strategy with them).
  // The fusions below need the gemv strategy. They apply to single-row
  // steps that run it (named here, tuned, or `auto` planning it: 1-4 rows
  // on sm_90a), and to decode steps of 2-4 rows whose GEMMs `auto` plans on
  // the gemv kernel (step_gemm_options).
  W4A16Options decode_gemm;
  // When a single-row down projection runs the gemv strategy, it reads
  // silu(gate) * up straight from the gate/up GEMM's output
  // (W4A16Options::x_silu_mul) instead of a separate SiLU kernel's: one
  // launch fewer per layer (~3.6 us of a Qwen3-14B layer's 124 in a graph
  // replay), the same bits.
  bool fuse_silu_into_down = true;
  // When the GEMMs on both sides of a residual add + RMSNorm of a
  // single-row step run the gemv strategy, the first adds its output to the
  // residual (and sums the squares of each row) in its epilogue and the
  // second normalizes the residual as it reads it
  // (W4A16Options::residual_row_sq, x_norm_weight): no add + RMSNorm
  // kernel between them, two launches fewer per layer. The norm's sum is
  // taken in another order, so logits agree with the separate kernels to
  // rounding, not bit for bit (with a 4-bit KV cache a one-ulp difference
  // can move a cache code: docs/engine.md, v10).
  bool fuse_norms_into_gemms = true;
  // When a single-row QKV projection runs the gemv strategy and head_dim
  // divides 128, its epilogue does the q/k norm, RoPE and widening of
  // ops::qkv_to_attention_inputs (W4A16Options::attention_inputs): one launch
  // fewer per layer, the same bits.
  bool fuse_attention_inputs_into_qkv = true;
  // When that QKV epilogue runs (head_dim 64 or 128) and the cache's
  // rotation is Hadamard, it rotates and scales the queries as the decode
  // attention takes them (W4A16AttentionInputs::q_rotation_signs) instead
  // of the attention kernel doing it, the same bits; Qwen3-14B w4 + tq4 at
  // batch 1 / 1k: 215.7-217.3 tok/s against 214.6-216.5 (docs/engine.md,
  // v11). (A Haar rotation is a 64 KB matrix per layer, which an epilogue
  // warp does not read: its own kernel rotates.)
  bool fuse_query_rotation_into_qkv = true;
  // At a decode step whose cache takes a warp's append (Hadamard rotations,
  // or fp16 K and V: kv::device_append_target), the decode attention stores
  // each row's newest K/V itself, in the CTA that holds it, before reading
  // it (kv::DeviceDecodeOptions::append_k): no KV append kernel between the
  // QKV GEMM and the attention, the same cache bytes.
  bool fuse_kv_append_into_attention = true;
  // W4A16Options::gemv_early_dependents_bytes of every gemv call: from this
  // many bytes of codes a GEMM lets the next kernel launch before its own
  // wait (Qwen3-14B's GEMMs, 13-400 MB: a decode step 2-4% faster; tests set 0
  // to run small models that way too).
  int64_t gemv_early_dependents_bytes = W4A16Options{}.gemv_early_dependents_bytes;
  // KvOptions::fp16_window (0: none): each sequence's newest fp16_window
  // tokens are also kept as fp16 copies (kv/device_window.h), and every query
  // reads its window from them and only older positions from the cache's
  // codes. Costs per step: the window's kernel before each layer's attention
  // (it also appends the K/V where fuse_kv_append_into_attention applies),
  // and the merge kernel (no cluster merge); prompts are attended in blocks
  // of at most kWindowPrefillBlock tokens.
  int64_t fp16_window = 0;
};

// With an fp16 window (CudaEngineOptions::fp16_window), the most prompt
// tokens whose queries one attention call takes: the window's rings hold
// the window plus this many positions (Qwen3-14B, window 64: 1.3 MB per
// layer and sequence).
inline constexpr int64_t kWindowPrefillBlock = 256;

// One row of a step: `n` new tokens of sequence `seq` at positions
// first_pos .. first_pos + n - 1.
struct StepRow {
  int seq = 0;
  int64_t first_pos = 0;
  int64_t n = 1;
};

// Where the time of a step goes (`lowbit bench model --breakdown`): the
// engine records an event after each stage of launch() (embedding, each
// GEMM, the attention inputs, the KV append, the attention, the norms...);
// collect() adds the gaps between consecutive events to per-stage totals.
// The events serialize the stages (no overlap through programmatic dependent
// launch), so each stage's time includes its launch gap: the sum is an eager
// step, somewhat longer than a graph replay. Not for graph capture.
class StepBreakdown {
 public:
  StepBreakdown() = default;
  ~StepBreakdown();
  StepBreakdown(const StepBreakdown&) = delete;
  StepBreakdown& operator=(const StepBreakdown&) = delete;

  void mark(const char* stage, cudaStream_t stream);  // the first mark of a step starts it ("")
  // Synchronizes on the last event, accumulates, and forgets the step's marks.
  void collect();
  struct Stage {
    std::string name;
    double total_us = 0;
    int64_t count = 0;  // marks per collected step x steps
  };
  const std::vector<Stage>& stages() const { return stages_; }  // in order of first appearance
  int steps() const { return steps_; }

 private:
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<Stage> stages_;
  int steps_ = 0;
};

class CudaEngine {
 public:
  // The model must outlive the engine. Allocates the KV pool for
  // max_sequences * max_tokens tokens.
  CudaEngine(const DeviceModel& model, const CudaEngineOptions& options);
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  const DeviceModel& model() const { return model_; }
  // One line per tuned layer shape, "K x N: <candidate> <time> us, ... ->
  // <strategy> split <s>" (or "K x N: auto (not tuned: <why>)"), or per
  // role of decode_gemv_splits, "<role>: K x N -> gemv split <s> (forced)";
  // empty when nothing was tuned or forced.
  const std::vector<std::string>& decode_gemm_choices() const { return decode_gemm_choices_; }
  // Whether single-row steps read the SiLU inside the down projection
  // (CudaEngineOptions::fuse_silu_into_down and a gemv plan for it).
  bool silu_fused_into_down() const {
    return !model_.layers.empty() && down_fuses_silu(model_.layers.front().down, 1);
  }
  // Whether single-row steps do the add + RMSNorm after the o projection
  // inside the o and gate/up GEMMs (CudaEngineOptions::fuse_norms_into_gemms
  // and gemv plans for both; the norm after the down projection follows
  // the same rule with the next layer's qkv GEMM).
  bool norms_fused_into_gemms() const {
    return !model_.layers.empty() && fuses_norm(model_.layers.front().o, model_.layers.front().gate_up, 1);
  }
  // Whether single-row steps do the last layer's add + RMSNorm inside its
  // down GEMM and the lm_head (the same rule, with a w4 lm_head).
  bool final_norm_fused_into_lm_head() const {
    return !model_.layers.empty() && fuses_norm(model_.layers.back().down, model_.lm_head, 1);
  }
  // Whether single-row steps make the attention inputs in the QKV GEMM
  // (CudaEngineOptions::fuse_attention_inputs_into_qkv and a gemv plan).
  bool attention_inputs_fused_into_qkv() const {
    return !model_.layers.empty() && qkv_makes_attention_inputs(model_.layers.front().qkv, 1);
  }
  // Whether that epilogue also rotates the queries
  // (CudaEngineOptions::fuse_query_rotation_into_qkv, a Hadamard cache).
  bool query_rotation_fused_into_qkv() const {
    return !model_.layers.empty() && qkv_rotates_queries(model_.layers.front().qkv, 1);
  }
  // Whether decode steps append the K/V inside the attention
  // (CudaEngineOptions::fuse_kv_append_into_attention, a cache that allows it).
  bool kv_append_fused_into_attention() const;
  // The fp16 window's bytes on the device (0 without one).
  // The fp16 window's bytes on the device held by live sequences (a ring per
  // sequence slot; 0 without a window).
  int64_t kv_window_bytes() const;
  const kv::DeviceKvCache& cache() const { return *cache_; }
  cudaStream_t stream() const { return stream_; }
  int64_t kv_bytes_per_token() const;  // all layers, K and V

  // Sequences and their pages.
  int add_sequence();
  void release_sequence(int seq);
  int64_t length(int seq) const;
  // Makes room for n more tokens; returns the first new position.
  int64_t extend(int seq, int64_t n);

  // Runs the model over `rows` (their tokens stacked: tokens_host has
  // sum(n) ids) on the engine's stream, and leaves the final hidden states
  // of the rows' last tokens (or of every token, when all_tokens) projected
  // to logits in logits(): f16 [rows or tokens][vocab]. The rows' positions
  // must already be extended. Asynchronous; logits() is valid after a
  // stream synchronization.
  void step(std::span<const StepRow> rows, std::span<const int32_t> tokens_host, bool all_tokens);
  // step() in two halves: prepare() does the host work (positions, block
  // tables, buffers) and launch() only enqueues kernels, with the ids already
  // on the device (d_tokens: i32 [sum n]). A prepared step can be launched
  // again (a benchmark repeats it; each launch rewrites the same cache slots)
  // or captured into a CUDA graph.
  void prepare(std::span<const StepRow> rows, bool all_tokens);
  void launch(const int32_t* d_tokens);
  void step_device_tokens(std::span<const StepRow> rows, const int32_t* d_tokens, bool all_tokens);
  TensorView logits() const;
  // Records stage events into `b` during launch() (nullptr: none, the default).
  void set_breakdown(StepBreakdown* b) { breakdown_ = b; }
  // Fills positions [0, length) of every live sequence, in every layer, with
  // K/V quantized from random vectors: a cache at a given context for
  // benchmarks, without running a prefill of that length.
  void fill_random_kv(uint64_t seed);
  // Greedy next tokens of the last step's logit rows, into a device i32 buffer.
  const int32_t* argmax_logits();
  // Decode steps of step() replayed from a CUDA graph so far, and why graphs
  // were turned off (empty while they work; a failed capture turns them off
  // for the engine's life and its steps run eagerly).
  int64_t graph_replays() const { return graph_replays_; }
  const std::string& graph_failure() const { return graph_failure_; }

 private:
  void ensure_capacity(int64_t tokens, int64_t logit_rows);
  void launch_decode_graph();
  void drop_decode_graph();
  // What a w4 linear does besides y = x W^T, where down_fuses_silu and
  // fuses_norm said so: x_silu_mul, x is the [M, 2K] gate | up buffer read
  // through the SiLU; x_norm, x is the residual read through RMSNorm with
  // this weight; residual_out, y is the residual, added to (both norm
  // flags use row_sq_ for the sums of squares); attention_inputs, the QKV
  // GEMM writes q32_, k32_, v32_ instead of y.
  struct LinearFusion {
    bool x_silu_mul = false;
    const Buffer* x_norm = nullptr;
    bool residual_out = false;
    const W4A16AttentionInputs* attention_inputs = nullptr;
  };
  void linear(const DeviceLinear& w, const void* x, int64_t M, void* y, const LinearFusion& fusion);
  void linear(const DeviceLinear& w, const void* x, int64_t M, void* y) { linear(w, x, M, y, LinearFusion{}); }
  W4A16Options single_row_options(const DeviceLinear& w) const;
  // The W4A16 options of w's GEMM in a step of M rows of x: single_row_options
  // at one row (with the gemv strategy named where they leave `auto` and
  // `auto` plans gemv); the gemv strategy named in a decode step of rows that
  // `auto` plans on gemv (so its fusions apply there too); else `auto`.
  W4A16Options step_gemm_options(const DeviceLinear& w, int64_t M) const;
  // Whether `auto` plans w's GEMM of M rows on the gemv kernel (cached).
  bool auto_plans_gemv(const DeviceLinear& w, int64_t M) const;
  bool down_fuses_silu(const DeviceLinear& down, int64_t M) const;
  // Whether the add + RMSNorm between producer's output and consumer's
  // input is done inside the two GEMMs (CudaEngineOptions::fuse_norms_into_gemms).
  bool fuses_norm(const DeviceLinear& producer, const DeviceLinear& consumer, int64_t M) const;
  bool qkv_makes_attention_inputs(const DeviceLinear& qkv, int64_t M) const;
  bool qkv_rotates_queries(const DeviceLinear& qkv, int64_t M) const;
  // queries_rotated: the QKV GEMM rotated the queries.
  void attention_layer(int layer, std::span<const StepRow> rows, const kv::DeviceBlockTables& tables,
                       int64_t M, bool queries_rotated);

  const DeviceModel& model_;
  CudaEngineOptions options_;
  std::unique_ptr<kv::DeviceKvCache> cache_;
  cudaStream_t stream_ = nullptr;
  cuda::CublasHandle cublas_;
  StepBreakdown* breakdown_ = nullptr;
  void mark(const char* stage) {
    if (breakdown_ != nullptr) breakdown_->mark(stage, stream_);
  }
  W4A16Workspace w4_workspace_;
  // Single-row options per w4 linear (tune_decode_gemms), and what was measured.
  std::map<const DeviceLinear*, W4A16Options> decode_gemm_;
  // step_gemm_options' question, whether `auto` plans w's GEMM of M rows on
  // the gemv kernel, answered once per (w, M): eager decode steps ask it a
  // few hundred times per step.
  mutable std::map<std::pair<const DeviceLinear*, int64_t>, bool> auto_takes_gemv_;
  std::vector<std::string> decode_gemm_choices_;
  void tune_decode_gemms();
  void force_decode_gemv_splits();  // options_.decode_gemv_splits into decode_gemm_
  kv::AttentionWorkspace attention_workspace_;
  // CudaEngineOptions::fp16_window: the rings (one slot per sequence id) and
  // each step row's slot (int32 [max_sequences], rewritten by prepare()).
  std::unique_ptr<kv::DeviceKvWindow> window_;
  Buffer window_slots_;
  // Pages: a free list and each live sequence's table and length.
  std::vector<int32_t> free_pages_;
  std::vector<std::vector<int32_t>> seq_pages_;
  std::vector<int64_t> seq_length_;
  std::vector<bool> seq_live_;
  // Activations, sized for the largest step so far.
  int64_t capacity_tokens_ = 0, capacity_logit_rows_ = 0;
  Buffer tokens_, positions_, residual_, normed_, qkv_, attn_, tmp_, gate_up_, act_, gather_rows_, gathered_,
      logits_, q32_, k32_, v32_, next_tokens_;
  // Per row, the residual's sums of squares per block of 128 columns
  // (W4A16Options::residual_row_sq), for the fused norms.
  Buffer row_sq_;
  // The prepared step.
  std::vector<StepRow> rows_;
  kv::DeviceBlockTables tables_;
  int64_t tokens_in_step_ = 0;
  int64_t logit_rows_ = 0;
  bool all_tokens_ = false;
  int64_t plan_length_ = 0;  // a decode step's attention plan length (decode_plan_tokens); 0: not a decode step
  // The decode graph: the rows (sequence ids), plan length and table stride
  // it was made for, whether the last step had them (then the next one is
  // captured), and the instantiated graph. A step that is not a decode step
  // drops it (it may grow the buffers the graph points to).
  std::vector<int> graph_seqs_;
  int64_t graph_plan_length_ = 0, graph_table_stride_ = 0;
  bool graph_key_seen_ = false;
  cudaGraphExec_t graph_exec_ = nullptr;
  int64_t graph_replays_ = 0;
  std::string graph_failure_;
};

// make_cuda_backend (backend.h) is a Backend over CudaEngine: logits come back
// to the host as fp32.

}  // namespace lowbit::engine
