// The CUDA forward pass (cuda_engine.h): weights to the device, one step of
// the decoder over stacked rows, and the Backend that `lowbit generate` uses.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/random.h"
#include "lowbit/engine/cuda_engine.h"
#include "lowbit/engine/decode_gemv_splits.h"
#include "lowbit/ops/layer_ops_cuda.h"

namespace lowbit::engine {

namespace {

Buffer upload_f16(std::span<const float> values) {
  std::vector<f16> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = float_to_f16(values[i]);
  Buffer b(std::max<size_t>(h.size() * 2, 2), Device::cuda);
  Buffer::copy(b.data(), Device::cuda, h.data(), Device::cpu, h.size() * 2);
  return b;
}

Buffer ones_f16(int64_t n) { return upload_f16(std::vector<float>(static_cast<size_t>(n), 1.0f)); }

// Rows of several matrices with the same column count stacked into one
// (q, k, v -> qkv; gate, up -> gate_up). 4-bit groups run along a row, so
// stacking rows keeps every group intact; mixed formats become f32.
WeightMatrix stack_rows(std::initializer_list<const WeightMatrix*> parts) {
  const WeightMatrix& first = **parts.begin();
  bool all_w4 = true;
  int64_t rows = 0;
  for (const WeightMatrix* m : parts) {
    if (m->cols != first.cols) fail(ErrorKind::internal, "stack_rows: column counts differ");
    all_w4 = all_w4 && m->format == MatrixFormat::w4 && m->group_size == first.group_size;
    rows += m->rows;
  }
  WeightMatrix out;
  out.rows = rows;
  out.cols = first.cols;
  if (all_w4) {
    out.format = MatrixFormat::w4;
    out.group_size = first.group_size;
    for (const WeightMatrix* m : parts) {
      out.codes.insert(out.codes.end(), m->codes.begin(), m->codes.end());
      out.scales.insert(out.scales.end(), m->scales.begin(), m->scales.end());
      out.mins.insert(out.mins.end(), m->mins.begin(), m->mins.end());
    }
  } else {
    out.format = MatrixFormat::f32;
    out.f32.resize(static_cast<size_t>(rows * first.cols));
    int64_t r0 = 0;
    for (const WeightMatrix* m : parts) {
      for (int64_t r = 0; r < m->rows; ++r)
        m->dequant_row(r, &out.f32[static_cast<size_t>((r0 + r) * first.cols)]);
      r0 += m->rows;
    }
  }
  out.check();
  return out;
}

DeviceLinear upload_linear(const WeightMatrix& m, bool quantize_dense_to_w4) {
  DeviceLinear d;
  d.N = m.rows;
  d.K = m.cols;
  if (m.format == MatrixFormat::w4) {
    d.w4 = W4A16Weights::prepare(m.to_quantized(), DType::f16);
    return d;
  }
  std::vector<float> dense(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.dequant_row(r, &dense[static_cast<size_t>(r * m.cols)]);
  if (quantize_dense_to_w4) {
    const TensorView view = TensorView::contiguous(dense.data(), DType::f32, {m.rows, m.cols});
    d.w4 = W4A16Weights::prepare(WeightMatrix::quantize_w4(view, 128).to_quantized(), DType::f16);
    return d;
  }
  d.dense = upload_f16(dense);
  return d;
}

DeviceLinear random_linear(int64_t N, int64_t K, bool w4, uint64_t seed) {
  DeviceLinear d;
  d.N = N;
  d.K = K;
  if (w4) {
    d.w4 = W4A16Weights::random(K, N, 128, DType::f16, seed);
  } else {
    d.dense = Buffer(static_cast<size_t>(N * K) * 2, Device::cuda);
    cuda::fill_random_f16(d.dense.data(), static_cast<size_t>(N * K), seed, 0.02f);
  }
  return d;
}

// What the CUDA kernels cover; the rest runs on the CPU backend.
void check_cuda_support(const ModelConfig& c) {
  if (!kv::device_head_dim_supported(c.head_dim))
    fail(ErrorKind::unsupported, "the CUDA engine needs head_dim 64 or 128 (its attention kernels are built for "
         "them); this model has ", c.head_dim);
  if (c.num_heads / c.num_kv_heads > kv::kDeviceMaxGroup)
    fail(ErrorKind::unsupported, "the CUDA attention takes at most ", kv::kDeviceMaxGroup,
         " query heads per KV head; this model has ", c.num_heads / c.num_kv_heads);
  if (c.attention_bias) fail(ErrorKind::unsupported, "the CUDA engine does not support attention biases yet");
  if (!c.rope_freq_factors.empty())
    fail(ErrorKind::unsupported, "the CUDA engine does not support rope_freqs factors yet");
}

TensorView dev(void* p, DType t, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(p, t, shape, Device::cuda);
}

// A [rows, cols] f16 view starting `offset` elements into each row of `b`
// (rows `stride` apart): a part of a fused GEMM output.
TensorView rows_view(const Buffer& b, int64_t offset, int64_t rows, int64_t cols, int64_t stride) {
  TensorView v = dev(static_cast<char*>(b.data()) + offset * 2, DType::f16, {rows, cols});
  v.strides[0] = stride;
  return v;
}

kv::KvFormat to_kv_format(KvStorage s) {
  switch (s) {
    case KvStorage::fp16:
      return kv::KvFormat::fp16;
    case KvStorage::tq4:
      return kv::KvFormat::tq4;
    case KvStorage::tq3:
      return kv::KvFormat::tq3;
    case KvStorage::tq2:
      return kv::KvFormat::tq2;
    case KvStorage::fp32:
      break;
  }
  fail(ErrorKind::unsupported, "the CUDA KV cache stores fp16, tq4, tq3 or tq2, not fp32");
}

}  // namespace

size_t DeviceLinear::bytes() const { return w4 ? w4->weight_bytes() : dense.size(); }

size_t DeviceModel::weight_bytes() const {
  size_t total = embed.size() + final_norm.size() + inv_freq.size() + lm_head.bytes();
  for (const DeviceLayer& L : layers) {
    total += L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size();
    total += L.qkv.bytes() + L.o.bytes() + L.gate_up.bytes() + L.down.bytes();
  }
  return total;
}

size_t DeviceModel::bytes_per_token() const {
  size_t total = final_norm.size() + (lm_head_reads_embed ? embed.size() : lm_head.bytes());
  for (const DeviceLayer& L : layers) {
    total += L.attn_norm.size() + L.ffn_norm.size() + L.q_norm.size() + L.k_norm.size();
    total += L.qkv.bytes() + L.o.bytes() + L.gate_up.bytes() + L.down.bytes();
  }
  return total;
}

std::string DeviceModel::format_summary() const {
  const auto format = [](const DeviceLinear& l) {
    return l.w4 ? "w4 g" + std::to_string(l.w4->group_size()) : std::string("fp16");
  };
  std::map<std::string, int> counts;
  for (const DeviceLayer& L : layers)
    for (const DeviceLinear* d : {&L.qkv, &L.o, &L.gate_up, &L.down}) ++counts[format(*d)];
  if (!lm_head_reads_embed) ++counts[format(lm_head)];
  std::ostringstream s;
  for (const auto& [name, n] : counts) s << n << " x " << name << ", ";
  s << "1 x fp16 (embedding" << (lm_head_reads_embed ? ", also the output matrix)" : ")");
  return s.str();
}

std::string DeviceModel::describe() const {
  std::ostringstream s;
  s << format_summary() << ", " << static_cast<double>(weight_bytes()) / 1e9 << " GB on the device";
  return s.str();
}

DeviceModel DeviceModel::upload(const Model& model, bool quantize_dense_to_w4) {
  const ModelConfig& c = model.config;
  check_cuda_support(c);
  DeviceModel d;
  d.config = c;
  const ModelWeights& w = model.weights;
  std::vector<float> table(static_cast<size_t>(w.embed.rows * w.embed.cols));
  for (int64_t r = 0; r < w.embed.rows; ++r)
    w.embed.dequant_row(r, &table[static_cast<size_t>(r * w.embed.cols)]);
  d.embed = upload_f16(table);
  for (const LayerWeights& L : w.layers) {
    DeviceLayer dl;
    dl.attn_norm = upload_f16(L.attn_norm);
    dl.ffn_norm = upload_f16(L.ffn_norm);
    if (c.qk_norm) {
      dl.q_norm = upload_f16(L.q_norm);
      dl.k_norm = upload_f16(L.k_norm);
    }
    dl.qkv = upload_linear(stack_rows({&L.wq, &L.wk, &L.wv}), quantize_dense_to_w4);
    dl.o = upload_linear(L.wo, quantize_dense_to_w4);
    dl.gate_up = upload_linear(stack_rows({&L.w_gate, &L.w_up}), quantize_dense_to_w4);
    dl.down = upload_linear(L.w_down, quantize_dense_to_w4);
    d.layers.push_back(std::move(dl));
  }
  d.final_norm = upload_f16(w.final_norm);
  const WeightMatrix& out = w.output();
  if (!w.lm_head && out.format != MatrixFormat::w4 && !quantize_dense_to_w4) {
    d.lm_head_reads_embed = true;  // tied and dense: the table already on the device
    d.lm_head.N = out.rows;
    d.lm_head.K = out.cols;
  } else {
    d.lm_head = upload_linear(out, quantize_dense_to_w4);
  }
  const std::vector<float> inv_freq = rope_inv_freq(c);
  d.inv_freq = Buffer(inv_freq.size() * 4, Device::cuda);
  Buffer::copy(d.inv_freq.data(), Device::cuda, inv_freq.data(), Device::cpu, inv_freq.size() * 4);
  return d;
}

DeviceModel DeviceModel::random(const ModelConfig& c, bool w4, uint64_t seed) {
  c.validate();
  check_cuda_support(c);
  DeviceModel d;
  d.config = c;
  d.embed = Buffer(static_cast<size_t>(c.vocab * c.hidden) * 2, Device::cuda);
  cuda::fill_random_f16(d.embed.data(), static_cast<size_t>(c.vocab * c.hidden), seed, 1.0f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const uint64_t s = seed + 16 * static_cast<uint64_t>(l + 1);
    DeviceLayer dl;
    dl.attn_norm = ones_f16(c.hidden);
    dl.ffn_norm = ones_f16(c.hidden);
    if (c.qk_norm) {
      dl.q_norm = ones_f16(c.head_dim);
      dl.k_norm = ones_f16(c.head_dim);
    }
    dl.qkv = random_linear(c.q_dim() + 2 * c.kv_dim(), c.hidden, w4, s + 1);
    dl.o = random_linear(c.hidden, c.q_dim(), w4, s + 2);
    dl.gate_up = random_linear(2 * c.intermediate, c.hidden, w4, s + 3);
    dl.down = random_linear(c.hidden, c.intermediate, w4, s + 4);
    d.layers.push_back(std::move(dl));
  }
  d.final_norm = ones_f16(c.hidden);
  if (c.tied_embeddings && !w4) {
    d.lm_head_reads_embed = true;
    d.lm_head.N = c.vocab;
    d.lm_head.K = c.hidden;
  } else {
    d.lm_head = random_linear(c.vocab, c.hidden, w4, seed + 7);
  }
  const std::vector<float> inv_freq = rope_inv_freq(c);
  d.inv_freq = Buffer(inv_freq.size() * 4, Device::cuda);
  Buffer::copy(d.inv_freq.data(), Device::cuda, inv_freq.data(), Device::cpu, inv_freq.size() * 4);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

// ---- CudaEngine -------------------------------------------------------------------

CudaEngine::CudaEngine(const DeviceModel& model, const CudaEngineOptions& options)
    : model_(model), options_(options) {
  const ModelConfig& c = model.config;
  LOWBIT_REQUIRE(options.max_sequences >= 1 && options.max_tokens >= 1,
                 "max_sequences and max_tokens must be >= 1");
  LOWBIT_REQUIRE(options.decode_plan_tokens >= 1, "decode_plan_tokens must be >= 1");
  LOWBIT_REQUIRE(options.decode_gemv_splits.empty() || !options.tune_decode_gemms,
                 "decode_gemv_splits and tune_decode_gemms both choose the single-row GEMMs' plans: give one");
  for (const auto& [role, split] : options.decode_gemv_splits) check_decode_gemv_split(role, split);
  kv::KvCacheConfig kc;
  kc.num_layers = static_cast<int>(c.num_layers);
  kc.num_kv_heads = static_cast<int>(c.num_kv_heads);
  kc.head_dim = static_cast<int>(c.head_dim);
  kc.page_size = options.page_size;
  const int64_t pages_per_seq = (options.max_tokens + options.page_size - 1) / options.page_size;
  kc.num_pages = pages_per_seq * options.max_sequences;
  kc.k_format = options.k_format;
  kc.v_format = options.v_format;
  kc.rotation_seed_base = options.rotation_seed;
  kc.rotation = kv_rotation_for(options.rotation, c.head_dim);
  LOWBIT_REQUIRE(c.num_heads / c.num_kv_heads <= kv::kDeviceMaxGroup, "the CUDA attention takes at most ",
                 kv::kDeviceMaxGroup, " query heads per KV head; this model has ",
                 c.num_heads / c.num_kv_heads);
  cache_ = std::make_unique<kv::DeviceKvCache>(kc);
  LOWBIT_REQUIRE(options.fp16_window >= 0, "fp16_window must be >= 0");
  if (options.fp16_window > 0) {
    // Room for a prompt block of kWindowPrefillBlock queries and the window
    // before its first one; a window longer than a sequence can grow holds
    // the whole sequence.
    const int64_t window = std::min(options.fp16_window, options.max_tokens);
    const int64_t capacity = std::min(window + kWindowPrefillBlock - 1, options.max_tokens);
    window_ = std::make_unique<kv::DeviceKvWindow>(kc, window, capacity, options.max_sequences);
    window_slots_ = Buffer(static_cast<size_t>(options.max_sequences) * 4, Device::cuda);
  }
  for (int64_t p = kc.num_pages - 1; p >= 0; --p) free_pages_.push_back(static_cast<int32_t>(p));
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (options.tune_decode_gemms) tune_decode_gemms();
  if (!options.decode_gemv_splits.empty()) force_decode_gemv_splits();
}

void CudaEngine::force_decode_gemv_splits() {
  const auto role_linears = [&](std::string_view role) {
    std::vector<const DeviceLinear*> out;
    if (role == "lm_head") {
      out.push_back(&model_.lm_head);
      return out;
    }
    for (const DeviceLayer& L : model_.layers)
      out.push_back(role == "qkv" ? &L.qkv : role == "o" ? &L.o : role == "gate_up" ? &L.gate_up : &L.down);
    return out;
  };
  for (std::string_view role : kDecodeGemmRoles) {
    const auto it = options_.decode_gemv_splits.find(std::string(role));
    if (it == options_.decode_gemv_splits.end()) continue;
    const W4A16Options forced{W4A16Strategy::gemv, it->second};
    std::string line = std::string(role) + ": ";
    int forced_count = 0;
    for (const DeviceLinear* d : role_linears(role)) {
      if (!d->w4) continue;  // fp16 layers run cuBLAS
      decode_gemm_[d] = forced;
      if (forced_count++ == 0) {
        const W4A16Plan plan = w4a16_plan(1, *d->w4, forced);
        line += std::to_string(d->K) + " x " + std::to_string(d->N) + " -> gemv split " +
                std::to_string(plan.split_k) + " (forced)";
      }
    }
    decode_gemm_choices_.push_back(forced_count > 0 ? line : line + "not a w4 layer: not forced");
  }
}

void CudaEngine::tune_decode_gemms() {
  // A model has four or five distinct layer shapes; each is timed once.
  std::vector<const DeviceLinear*> linears;
  for (const DeviceLayer& L : model_.layers)
    for (const DeviceLinear* d : {&L.qkv, &L.o, &L.gate_up, &L.down}) linears.push_back(d);
  linears.push_back(&model_.lm_head);
  std::map<std::tuple<int64_t, int64_t, int>, W4A16Options> by_shape;
  for (const DeviceLinear* d : linears) {
    if (!d->w4) continue;
    const auto key = std::make_tuple(d->K, d->N, d->w4->group_size());
    auto it = by_shape.find(key);
    if (it == by_shape.end()) {
      W4A16Tuning t;
      try {
        t = w4a16_tune(*d->w4, 1, w4_workspace_, stream_);
      } catch (const Error& e) {
        // Not enough device memory for the timing buffers: keep `auto`.
        (void)cudaGetLastError();
        decode_gemm_choices_.push_back(std::to_string(d->K) + " x " + std::to_string(d->N) +
                                       ": auto (not tuned: " + e.what() + ")");
        it = by_shape.emplace(key, W4A16Options{}).first;
        decode_gemm_[d] = it->second;
        continue;
      }
      std::string line = std::to_string(d->K) + " x " + std::to_string(d->N) + ": ";
      for (const auto& [name, us] : t.candidates) {
        char cell[64];
        std::snprintf(cell, sizeof cell, "%s%s %.1f us", line.back() == ' ' ? "" : ", ", name.c_str(), us);
        line += cell;
      }
      // A layer's GEMMs (and the lm_head) absorb their neighbouring kernels
      // only when they run the gemv strategy (the SiLU, the add + RMSNorm, the
      // q/k norm + RoPE: ~2-5 us each in a replayed step), so a gemv plan within
      // kFusionMarginUs of the fastest is taken (Qwen3-14B's o projection:
      // wgmma 15.0 us, gemv 15.1 us).
      constexpr double kFusionMarginUs = 1.0;
      const bool fusing = options_.fuse_silu_into_down || options_.fuse_norms_into_gemms ||
                          options_.fuse_attention_inputs_into_qkv;
      W4A16Options chosen = t.best;
      if (fusing && t.best.strategy != W4A16Strategy::gemv && t.fastest_gemv_us > 0 &&
          t.fastest_gemv_us <= t.best_us + kFusionMarginUs)
        chosen = t.fastest_gemv;
      const W4A16Plan plan = w4a16_plan(1, *d->w4, chosen);
      line += std::string(" -> ") + w4a16_strategy_name(plan.strategy) + " split " + std::to_string(plan.split_k);
      if (chosen.strategy != t.best.strategy) line += " (gemv within 1 us: it fuses its neighbours)";
      decode_gemm_choices_.push_back(line);
      it = by_shape.emplace(key, chosen).first;
    }
    decode_gemm_[d] = it->second;
  }
}

CudaEngine::~CudaEngine() {
  drop_decode_graph();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaEngine::drop_decode_graph() {
  if (graph_exec_ != nullptr) cudaGraphExecDestroy(graph_exec_);
  graph_exec_ = nullptr;
  graph_key_seen_ = false;
}

int64_t CudaEngine::kv_bytes_per_token() const {
  const kv::KvCacheConfig& kc = cache_->config();
  return cache_->layout().bytes / kc.page_size * kc.num_kv_heads * kc.num_layers;
}

int CudaEngine::add_sequence() {
  for (size_t s = 0; s < seq_live_.size(); ++s) {
    if (!seq_live_[s]) {
      seq_live_[s] = true;
      seq_length_[s] = 0;
      return static_cast<int>(s);
    }
  }
  LOWBIT_REQUIRE(static_cast<int>(seq_live_.size()) < options_.max_sequences, "the CUDA engine was made for ",
                 options_.max_sequences, " sequences at once");
  seq_live_.push_back(true);
  seq_length_.push_back(0);
  seq_pages_.emplace_back();
  return static_cast<int>(seq_live_.size() - 1);
}

void CudaEngine::release_sequence(int seq) {
  LOWBIT_REQUIRE(seq >= 0 && seq < static_cast<int>(seq_live_.size()) && seq_live_[seq], "unknown sequence ",
                 seq);
  for (int32_t p : seq_pages_[seq]) free_pages_.push_back(p);
  seq_pages_[seq].clear();
  seq_length_[seq] = 0;
  seq_live_[seq] = false;
}

int64_t CudaEngine::length(int seq) const {
  LOWBIT_REQUIRE(seq >= 0 && seq < static_cast<int>(seq_live_.size()) && seq_live_[seq], "unknown sequence ",
                 seq);
  return seq_length_[seq];
}

int64_t CudaEngine::extend(int seq, int64_t n) {
  const int64_t first = length(seq);
  LOWBIT_REQUIRE(n >= 0 && first + n <= options_.max_tokens, "sequence ", seq, " would hold ", first + n,
                 " tokens; the CUDA engine was made for ", options_.max_tokens);
  const int64_t pages = (first + n + options_.page_size - 1) / options_.page_size;
  while (static_cast<int64_t>(seq_pages_[seq].size()) < pages) {
    LOWBIT_REQUIRE(!free_pages_.empty(), "the KV cache is full");
    seq_pages_[seq].push_back(free_pages_.back());
    free_pages_.pop_back();
  }
  seq_length_[seq] = first + n;
  return first;
}

void CudaEngine::ensure_capacity(int64_t tokens, int64_t logit_rows) {
  const ModelConfig& c = model_.config;
  if (tokens > capacity_tokens_) {
    const auto f16_rows = [&](int64_t width) {
      return Buffer(static_cast<size_t>(tokens * width) * 2, Device::cuda);
    };
    const auto f32_rows = [&](int64_t width) {
      return Buffer(static_cast<size_t>(tokens * width) * 4, Device::cuda);
    };
    tokens_ = Buffer(static_cast<size_t>(tokens) * 4, Device::cuda);
    positions_ = Buffer(static_cast<size_t>(tokens) * 4, Device::cuda);
    residual_ = f16_rows(c.hidden);
    normed_ = f16_rows(c.hidden);
    qkv_ = f16_rows(c.q_dim() + 2 * c.kv_dim());
    attn_ = f16_rows(c.q_dim());
    tmp_ = f16_rows(c.hidden);
    gate_up_ = f16_rows(2 * c.intermediate);
    act_ = f16_rows(c.intermediate);
    q32_ = f32_rows(c.q_dim());
    k32_ = f32_rows(c.kv_dim());
    v32_ = f32_rows(c.kv_dim());
    row_sq_ = f32_rows(w4a16_row_sq_floats(c.hidden));
    capacity_tokens_ = tokens;
  }
  if (logit_rows > capacity_logit_rows_) {
    gather_rows_ = Buffer(static_cast<size_t>(logit_rows) * 4, Device::cuda);
    gathered_ = Buffer(static_cast<size_t>(logit_rows * c.hidden) * 2, Device::cuda);
    logits_ = Buffer(static_cast<size_t>(logit_rows * c.vocab) * 2, Device::cuda);
    next_tokens_ = Buffer(static_cast<size_t>(logit_rows) * 4, Device::cuda);
    capacity_logit_rows_ = logit_rows;
  }
}

W4A16Options CudaEngine::single_row_options(const DeviceLinear& w) const {
  const auto it = decode_gemm_.find(&w);
  return it != decode_gemm_.end() ? it->second : options_.decode_gemm;
}

bool CudaEngine::auto_plans_gemv(const DeviceLinear& w, int64_t M) const {
  if (!w.w4) return false;
  auto [it, fresh] = auto_takes_gemv_.try_emplace({&w, M}, false);
  if (fresh) it->second = w4a16_plan(M, *w.w4).strategy == W4A16Strategy::gemv;
  return it->second;
}

W4A16Options CudaEngine::step_gemm_options(const DeviceLinear& w, int64_t M) const {
  if (M == 1) {
    // Untuned one-row GEMMs (lowbit generate without --tune-gemms) get
    // `auto`, which plans them on the gemv kernel on sm_90a; naming it
    // lets the gemv fusions apply there as in a tuned engine. The plan,
    // and so the kernel and its split, is the same either way.
    W4A16Options options = single_row_options(w);
    if (options.strategy == W4A16Strategy::automatic && auto_plans_gemv(w, 1)) options.strategy = W4A16Strategy::gemv;
    return options;
  }
  // A decode step of a few rows whose GEMMs `auto` plans on the gemv kernel
  // (1-4 rows on sm_90a, w4a16_plan): the options name that strategy, so
  // that the gemv fusions apply as at one row. Not a prefill: its attention
  // takes unrotated queries.
  const bool decode = static_cast<int64_t>(rows_.size()) == M;
  if (!decode || !auto_plans_gemv(w, M)) return {};
  return W4A16Options{W4A16Strategy::gemv};
}

bool CudaEngine::down_fuses_silu(const DeviceLinear& down, int64_t M) const {
  return options_.fuse_silu_into_down && down.w4 && !down.w4->act_order() &&
         step_gemm_options(down, M).strategy == W4A16Strategy::gemv;
}

bool CudaEngine::fuses_norm(const DeviceLinear& producer, const DeviceLinear& consumer, int64_t M) const {
  return options_.fuse_norms_into_gemms && producer.w4 && consumer.w4 && !consumer.w4->act_order() &&
         step_gemm_options(producer, M).strategy == W4A16Strategy::gemv &&
         step_gemm_options(consumer, M).strategy == W4A16Strategy::gemv;
}

bool CudaEngine::qkv_makes_attention_inputs(const DeviceLinear& qkv, int64_t M) const {
  const int64_t hd = model_.config.head_dim;
  return options_.fuse_attention_inputs_into_qkv && qkv.w4 && hd % 2 == 0 && 128 % hd == 0 &&
         step_gemm_options(qkv, M).strategy == W4A16Strategy::gemv;
}

bool CudaEngine::qkv_rotates_queries(const DeviceLinear& qkv, int64_t M) const {
  const kv::KvCacheConfig& kc = cache_->config();
  return options_.fuse_query_rotation_into_qkv && qkv_makes_attention_inputs(qkv, M) &&
         (kc.head_dim == 64 || kc.head_dim == 128) && kv::is_quantized(kc.k_format) &&
         kc.rotation == kv::RotationKind::hadamard;
}

void CudaEngine::linear(const DeviceLinear& w, const void* x, int64_t M, void* y, const LinearFusion& fusion) {
  if (w.w4) {
    W4A16Options options = step_gemm_options(w, M);
    options.gemv_early_dependents_bytes = options_.gemv_early_dependents_bytes;
    options.x_silu_mul = fusion.x_silu_mul;
    if (fusion.x_norm != nullptr) {
      options.x_norm_weight = fusion.x_norm->data();
      options.x_norm_row_sq = row_sq_.as<float>();
      options.x_norm_eps = static_cast<float>(model_.config.rms_eps);
    }
    if (fusion.residual_out) options.residual_row_sq = row_sq_.as<float>();
    options.attention_inputs = fusion.attention_inputs;
    w4a16_gemm(dev(const_cast<void*>(x), DType::f16, {M, fusion.x_silu_mul ? 2 * w.K : w.K}), *w.w4,
               dev(y, DType::f16, {M, w.N}), w4_workspace_, options, stream_);
  } else {
    const void* weights = w.dense.data() != nullptr ? w.dense.data() : model_.embed.data();
    cuda::gemm_f16_cublas(cublas_.get(), x, weights, y, M, w.N, w.K, stream_, cuda::WeightLayout::nk);
  }
}

int64_t CudaEngine::kv_window_bytes() const {
  if (!window_) return 0;
  const int64_t live = std::count(seq_live_.begin(), seq_live_.end(), true);
  return window_->bytes() / window_->slots() * live;
}

bool CudaEngine::kv_append_fused_into_attention() const {
  const kv::KvCacheConfig& c = cache_->config();
  const bool quantized_part = c.k_format != kv::KvFormat::fp16 || c.v_format != kv::KvFormat::fp16;
  // (With a window, the window's kernel stores them: the code chunks end
  // before each row's newest token.)
  return options_.fuse_kv_append_into_attention && (!quantized_part || c.rotation == kv::RotationKind::hadamard);
}

void CudaEngine::attention_layer(int layer, std::span<const StepRow> rows,
                                 const kv::DeviceBlockTables& tables, int64_t M, bool queries_rotated) {
  const ModelConfig& c = model_.config;
  const int hq = static_cast<int>(c.num_heads);
  const bool decode = static_cast<int64_t>(rows.size()) == M;  // one token per row
  // The attention output goes straight to fp16 (the o projection's input).
  kv::DeviceDecodeOptions options;
  if (window_) {
    options.window = window_.get();
    options.window_slots = window_slots_.as<const int32_t>();
  }
  if (decode) {
    if (kv_append_fused_into_attention()) {
      options.append_k = k32_.as<float>();
      options.append_v = v32_.as<float>();
    } else {
      kv::device_append_tokens(*cache_, layer, tables, k32_.as<float>(), v32_.as<float>(), stream_);
      mark("KV append");
    }
    if (window_) {  // the newest K/V's copies are stored by the window's kernel
      options.window_k = k32_.as<float>();
      options.window_v = v32_.as<float>();
    }
    options.queries_rotated = queries_rotated;
    options.out_f16 = attn_.data();
    options.plan_length = plan_length_;
    kv::device_decode_attention(*cache_, layer, tables, hq, q32_.as<float>(), nullptr, attention_workspace_, options,
                                stream_);
    mark("attention");
    return;
  }
  int64_t offset = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const StepRow& row = rows[r];
    kv::device_write_tokens(*cache_, layer, tables, static_cast<int>(r), row.first_pos, row.n,
                            k32_.as<float>() + offset * c.kv_dim(), v32_.as<float>() + offset * c.kv_dim(),
                            stream_);
    mark("KV append");
    // With a window, the block's copies and its queries go in pieces that
    // the rings hold with the window before them (device_window_max_block).
    const int64_t piece = window_ ? std::min(row.n, kv::device_window_max_block(*window_)) : row.n;
    for (int64_t s = 0; s < row.n; s += piece) {
      const int64_t n = std::min(piece, row.n - s);
      if (window_) {
        kv::device_window_write(*cache_, *window_, layer, row.seq, row.first_pos + s, n,
                                k32_.as<float>() + (offset + s) * c.kv_dim(),
                                v32_.as<float>() + (offset + s) * c.kv_dim(), stream_);
        mark("KV fp16 window");
      }
      options.out_f16 = static_cast<std::byte*>(attn_.data()) + (offset + s) * c.q_dim() * 2;
      kv::device_prefill_attention(*cache_, layer, tables, static_cast<int>(r), row.first_pos + s, n, hq,
                                   q32_.as<float>() + (offset + s) * c.q_dim(), nullptr, attention_workspace_,
                                   options, stream_);
      mark("attention");
    }
    offset += row.n;
  }
}

void CudaEngine::step(std::span<const StepRow> rows, std::span<const int32_t> tokens_host, bool all_tokens) {
  int64_t M = 0;
  for (const StepRow& r : rows) M += r.n;
  LOWBIT_REQUIRE(static_cast<int64_t>(tokens_host.size()) == M, "step: ", tokens_host.size(),
                 " token ids for ", M, " positions");
  for (int32_t t : tokens_host)
    LOWBIT_REQUIRE(t >= 0 && t < model_.config.vocab, "token id ", t, " outside the vocabulary of ",
                   model_.config.vocab);
  prepare(rows, all_tokens);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(tokens_.data(), tokens_host.data(), static_cast<size_t>(M) * 4,
                                    cudaMemcpyHostToDevice, stream_));
  if (options_.decode_graphs && plan_length_ > 0 && breakdown_ == nullptr && graph_failure_.empty())
    launch_decode_graph();
  else
    launch(tokens_.as<const int32_t>());
}

void CudaEngine::launch_decode_graph() {
  std::vector<int> seqs;
  for (const StepRow& r : rows_) seqs.push_back(r.seq);
  const bool same = graph_key_seen_ && seqs == graph_seqs_ && plan_length_ == graph_plan_length_ &&
                    tables_.stride == graph_table_stride_;
  if (!same) {
    // The first step of these rows and plan length runs eagerly; it also
    // grows every workspace to its size for them, so that nothing is
    // allocated while the next step is captured.
    drop_decode_graph();
    graph_seqs_ = std::move(seqs);
    graph_plan_length_ = plan_length_;
    graph_table_stride_ = tables_.stride;
    graph_key_seen_ = true;
    launch(tokens_.as<const int32_t>());
    return;
  }
  if (graph_exec_ == nullptr) {
    // The inputs that change from step to step (token ids, positions, block
    // tables, lengths, the gather rows) are in device buffers that prepare()
    // and step() rewrite before the replay, in stream order.
    cudaGraph_t graph = nullptr;
    try {
      LOWBIT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        launch(tokens_.as<const int32_t>());
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        throw;
      }
      LOWBIT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      LOWBIT_CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, graph, 0));
    } catch (const Error& e) {
      graph_failure_ = e.what();
      graph_exec_ = nullptr;
      (void)cudaGetLastError();  // a failed capture leaves an error behind
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (graph_exec_ == nullptr) {  // nothing of the capture ran: this step runs eagerly
      launch(tokens_.as<const int32_t>());
      return;
    }
  }
  LOWBIT_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
  ++graph_replays_;
}

void CudaEngine::prepare(std::span<const StepRow> rows, bool all_tokens) {
  LOWBIT_REQUIRE(!rows.empty(), "step: no rows");
  int64_t M = 0;
  std::vector<int32_t> positions;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> lengths;
  std::vector<int32_t> last_rows;
  bool decode = !all_tokens;
  int64_t longest = 0;
  for (const StepRow& r : rows) {
    LOWBIT_REQUIRE(r.n >= 1 && r.first_pos >= 0 && r.first_pos + r.n <= length(r.seq),
                   "step: row of sequence ", r.seq, " at ", r.first_pos, " + ", r.n, " is beyond its length ",
                   length(r.seq), " (extend first)");
    for (int64_t i = 0; i < r.n; ++i) positions.push_back(static_cast<int32_t>(r.first_pos + i));
    tables.push_back(seq_pages_[r.seq]);
    lengths.push_back(r.first_pos + r.n);
    longest = std::max(longest, r.first_pos + r.n);
    decode = decode && r.n == 1;
    M += r.n;
    last_rows.push_back(static_cast<int32_t>(M - 1));
  }
  // A decode step's attention is planned for the longest row rounded up to
  // decode_plan_tokens, and every table is padded to that length (the pages
  // past a row's end are never read), so consecutive decode steps launch the
  // same kernels with the same arguments (decode_graphs).
  plan_length_ = 0;
  if (decode) {
    const int64_t unit = options_.decode_plan_tokens;
    plan_length_ = (longest + unit - 1) / unit * unit;
    const size_t pages = static_cast<size_t>((plan_length_ + options_.page_size - 1) / options_.page_size);
    for (std::vector<int32_t>& t : tables)
      if (t.size() < pages) t.resize(pages, 0);
  } else {
    drop_decode_graph();  // this step may grow a buffer the graph's kernels point to
  }
  const int64_t logit_rows = all_tokens ? M : static_cast<int64_t>(rows.size());
  ensure_capacity(M, logit_rows);
  // Pageable host sources: these copies are staged before they return. The
  // tables' device buffers are reused (no allocation per step); the copies
  // are ordered after the previous step's kernels on the engine's stream.
  tables_.assign(tables, lengths, options_.page_size, stream_);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(positions_.data(), positions.data(), positions.size() * 4,
                                    cudaMemcpyHostToDevice, stream_));
  if (!all_tokens && logit_rows != M) {  // else launch() needs no gather
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(gather_rows_.data(), last_rows.data(), last_rows.size() * 4,
                                      cudaMemcpyHostToDevice, stream_));
  }
  if (window_) {  // each row's ring is its sequence id's
    std::vector<int32_t> slots;
    for (const StepRow& r : rows) slots.push_back(r.seq);
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(window_slots_.data(), slots.data(), slots.size() * 4, cudaMemcpyHostToDevice,
                                      stream_));
  }
  rows_.assign(rows.begin(), rows.end());
  tokens_in_step_ = M;
  logit_rows_ = logit_rows;
  all_tokens_ = all_tokens;
}

void CudaEngine::step_device_tokens(std::span<const StepRow> rows, const int32_t* d_tokens, bool all_tokens) {
  prepare(rows, all_tokens);
  launch(d_tokens);
}

void CudaEngine::launch(const int32_t* d_tokens) {
  const ModelConfig& c = model_.config;
  LOWBIT_REQUIRE(!rows_.empty(), "launch: no step prepared");
  const int64_t M = tokens_in_step_;
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  const float eps = static_cast<float>(c.rms_eps);
  const ops::RopeStyle rope_style = c.rope_style;
  const TensorView positions_view = dev(positions_.data(), DType::i32, {M});
  const TensorView inv_freq_view = dev(model_.inv_freq.data(), DType::f32, {c.head_dim / 2});
  const TensorView residual = dev(residual_.data(), DType::f16, {M, c.hidden});
  const TensorView normed = dev(normed_.data(), DType::f16, {M, c.hidden});
  const TensorView tmp = dev(tmp_.data(), DType::f16, {M, c.hidden});

  mark("");  // the step's start
  ops::embedding(dev(model_.embed.data(), DType::f16, {c.vocab, c.hidden}),
                 dev(const_cast<int32_t*>(d_tokens), DType::i32, {M}), residual, stream_);
  ops::rms_norm(residual, dev(model_.layers[0].attn_norm.data(), DType::f16, {c.hidden}), eps, normed,
                stream_);
  mark("embedding + first norm");
  // The lm_head reads the final norm's rows as they are when every row's
  // last token is its only one (a decode step) or every token gets logits;
  // then the gather is the identity and is left out, and the last down GEMM
  // and the lm_head can do the final add + RMSNorm between them.
  const bool head_reads_every_row = all_tokens_ || logit_rows_ == M;
  const bool norm_in_head =
      head_reads_every_row && fuses_norm(model_.layers.back().down, model_.lm_head, M);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& L = model_.layers[static_cast<size_t>(l)];
    const DeviceLayer* next = l + 1 < c.num_layers ? &model_.layers[static_cast<size_t>(l + 1)] : nullptr;
    // The add + RMSNorm before this layer's qkv GEMM is done by the previous
    // down GEMM and this one, or by the kernel at the end of the last layer.
    // The q/k norm (Qwen3), RoPE and the widening to the fp32 q/k/v that the
    // KV kernels take (they quantize and rotate in fp32) are done in the QKV
    // GEMM's epilogue, or in one launch after it.
    const bool norm_in_qkv = l > 0 && fuses_norm(model_.layers[static_cast<size_t>(l - 1)].down, L.qkv, M);
    const bool prep_in_qkv = qkv_makes_attention_inputs(L.qkv, M);
    const bool rotation_in_qkv = qkv_rotates_queries(L.qkv, M);
    W4A16AttentionInputs inputs;
    if (prep_in_qkv) {
      inputs.num_heads = c.num_heads;
      inputs.num_kv_heads = c.num_kv_heads;
      inputs.head_dim = c.head_dim;
      inputs.q_norm = c.qk_norm ? L.q_norm.data() : nullptr;
      inputs.k_norm = c.qk_norm ? L.k_norm.data() : nullptr;
      inputs.eps = eps;
      inputs.positions = positions_.as<int32_t>();
      inputs.inv_freq = model_.inv_freq.as<float>();
      inputs.rope_interleaved = rope_style == ops::RopeStyle::interleaved;
      inputs.q_out = q32_.as<float>();
      inputs.k_out = k32_.as<float>();
      inputs.v_out = v32_.as<float>();
      if (rotation_in_qkv) {
        inputs.q_rotation_signs = cache_->hadamard_signs(static_cast<int>(l));
        inputs.q_scale = kv::decode_query_scale(cache_->config(), {});
      }
    }
    linear(L.qkv, norm_in_qkv ? residual_.data() : normed_.data(), M, qkv_.data(),
           {.x_norm = norm_in_qkv ? &L.attn_norm : nullptr, .attention_inputs = prep_in_qkv ? &inputs : nullptr});
    mark(norm_in_qkv ? (prep_in_qkv ? "RMSNorm + qkv GEMM + q/k norm + RoPE" : "RMSNorm + qkv GEMM")
                     : (prep_in_qkv ? "qkv GEMM + q/k norm + RoPE" : "qkv GEMM"));
    if (!prep_in_qkv) {
      const TensorView q_norm = dev(L.q_norm.data(), DType::f16, {c.head_dim});
      const TensorView k_norm = dev(L.k_norm.data(), DType::f16, {c.head_dim});
      ops::qkv_to_attention_inputs(rows_view(qkv_, 0, M, qkv_dim, qkv_dim), c.num_heads, c.num_kv_heads,
                                   c.head_dim, c.qk_norm ? &q_norm : nullptr, c.qk_norm ? &k_norm : nullptr,
                                   eps, positions_view, inv_freq_view, rope_style,
                                   dev(q32_.data(), DType::f32, {M, c.q_dim()}),
                                   dev(k32_.data(), DType::f32, {M, c.kv_dim()}),
                                   dev(v32_.data(), DType::f32, {M, c.kv_dim()}), stream_);
      mark("q/k norm + RoPE + fp32");
    }
    attention_layer(static_cast<int>(l), rows_, tables_, M, rotation_in_qkv);
    if (fuses_norm(L.o, L.gate_up, M)) {
      linear(L.o, attn_.data(), M, residual_.data(), {.residual_out = true});
      mark("o GEMM + residual add");
      linear(L.gate_up, residual_.data(), M, gate_up_.data(), {.x_norm = &L.ffn_norm});
      mark("RMSNorm + gate/up GEMM");
    } else {
      linear(L.o, attn_.data(), M, tmp_.data());
      mark("o GEMM");
      ops::add_rms_norm(residual, tmp, dev(L.ffn_norm.data(), DType::f16, {c.hidden}), eps, normed, stream_);
      mark("add + RMSNorm");
      linear(L.gate_up, normed_.data(), M, gate_up_.data());
      mark("gate/up GEMM");
    }
    // The add + RMSNorm after the down GEMM goes into the next GEMM (the
    // next layer's qkv, or the lm_head after the last layer) where it can.
    const bool norm_in_next_gemm = next != nullptr ? fuses_norm(L.down, next->qkv, M) : norm_in_head;
    void* down_out = norm_in_next_gemm ? residual_.data() : tmp_.data();
    if (down_fuses_silu(L.down, M)) {
      linear(L.down, gate_up_.data(), M, down_out, {.x_silu_mul = true, .residual_out = norm_in_next_gemm});
      mark(norm_in_next_gemm ? "SiLU x up + down GEMM + residual add" : "SiLU x up + down GEMM");
    } else {
      ops::silu_mul(rows_view(gate_up_, 0, M, c.intermediate, 2 * c.intermediate),
                    rows_view(gate_up_, c.intermediate, M, c.intermediate, 2 * c.intermediate),
                    dev(act_.data(), DType::f16, {M, c.intermediate}), stream_);
      mark("SiLU x up");
      linear(L.down, act_.data(), M, down_out, {.residual_out = norm_in_next_gemm});
      mark(norm_in_next_gemm ? "down GEMM + residual add" : "down GEMM");
    }
    if (!norm_in_next_gemm) {
      const Buffer& next_norm = next != nullptr ? next->attn_norm : model_.final_norm;
      ops::add_rms_norm(residual, tmp, dev(next_norm.data(), DType::f16, {c.hidden}), eps, normed, stream_);
      mark("add + RMSNorm");
    }
  }
  const void* head_input = norm_in_head ? residual_.data() : normed_.data();
  if (!head_reads_every_row) {
    // The last token of each row: a gather through the embedding kernel.
    ops::embedding(normed, dev(gather_rows_.data(), DType::i32, {logit_rows_}),
                   dev(gathered_.data(), DType::f16, {logit_rows_, c.hidden}), stream_);
    head_input = gathered_.data();
  }
  linear(model_.lm_head, head_input, logit_rows_, logits_.data(),
         {.x_norm = norm_in_head ? &model_.final_norm : nullptr});
  mark(norm_in_head ? "RMSNorm + lm_head GEMM" : (head_reads_every_row ? "lm_head GEMM" : "gather + lm_head GEMM"));
}

void CudaEngine::fill_random_kv(uint64_t seed) {
  const ModelConfig& c = model_.config;
  constexpr int64_t kChunk = 2048;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> lengths;
  std::vector<int> seqs;
  for (size_t s = 0; s < seq_live_.size(); ++s) {
    if (!seq_live_[s] || seq_length_[s] == 0) continue;
    seqs.push_back(static_cast<int>(s));
    tables.push_back(seq_pages_[s]);
    lengths.push_back(seq_length_[s]);
  }
  if (tables.empty()) return;
  const kv::DeviceBlockTables block_tables =
      kv::DeviceBlockTables::from_host(tables, lengths, options_.page_size);
  const size_t values = static_cast<size_t>(kChunk * c.kv_dim());
  Buffer random16(values * 2, Device::cuda), k(values * 4, Device::cuda), v(values * 4, Device::cuda);
  const TensorView r16 = dev(random16.data(), DType::f16, {kChunk, c.kv_dim()});
  cuda::fill_random_f16(random16.data(), values, seed, 1.0f, stream_);
  ops::convert_rows(r16, dev(k.data(), DType::f32, {kChunk, c.kv_dim()}), stream_);
  cuda::fill_random_f16(random16.data(), values, seed + 1, 1.0f, stream_);
  ops::convert_rows(r16, dev(v.data(), DType::f32, {kChunk, c.kv_dim()}), stream_);
  for (int layer = 0; layer < static_cast<int>(c.num_layers); ++layer) {
    for (size_t r = 0; r < tables.size(); ++r) {
      for (int64_t first = 0; first < lengths[r]; first += kChunk) {
        kv::device_write_tokens(*cache_, layer, block_tables, static_cast<int>(r), first,
                                std::min(kChunk, lengths[r] - first), k.as<float>(), v.as<float>(), stream_);
        if (window_)
          kv::device_window_write(*cache_, *window_, layer, seqs[r], first, std::min(kChunk, lengths[r] - first),
                                  k.as<float>(), v.as<float>(), stream_);
      }
    }
  }
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

TensorView CudaEngine::logits() const {
  return dev(logits_.data(), DType::f16, {logit_rows_, model_.config.vocab});
}

const int32_t* CudaEngine::argmax_logits() {
  ops::argmax(logits(), dev(next_tokens_.data(), DType::i32, {logit_rows_}), stream_);
  return next_tokens_.as<const int32_t>();
}

// ---- Backend ------------------------------------------------------------------------

namespace {

// The Backend interface reports the cache through a KvStore; the CUDA cache
// lives on the device, so this one only accounts (bytes, description).
class DeviceKvAccounting final : public KvStore {
 public:
  DeviceKvAccounting(const CudaEngine& engine, std::string description)
      : engine_(engine), description_(std::move(description)) {}
  int add_sequence() override { unsupported(); }
  void release_sequence(int) override { unsupported(); }
  int64_t extend(int, int64_t) override { unsupported(); }
  int64_t length(int) const override { unsupported(); }
  void write(int, int, int64_t, int64_t, std::span<const float>, std::span<const float>) override {
    unsupported();
  }
  void attend(int, int, int64_t, int64_t, std::span<const float>, std::span<float>,
              ThreadPool*) const override {
    unsupported();
  }
  int64_t bytes_per_token() const override { return engine_.kv_bytes_per_token(); }
  // The codes of the tokens held, and the fp16 window's rings (allocated whole).
  int64_t bytes_used() const override { return tokens_ * engine_.kv_bytes_per_token() + engine_.kv_window_bytes(); }
  std::string describe() const override { return description_; }
  int64_t tokens_ = 0;

 private:
  [[noreturn]] static void unsupported() {
    fail(ErrorKind::unsupported,
         "the CUDA backend's KV cache lives on the device; use the backend's methods");
  }
  const CudaEngine& engine_;
  std::string description_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, const KvOptions& kv, bool quantize_dense_to_w4, bool tune_gemms)
      : model_(model),
        device_model_(DeviceModel::upload(model, quantize_dense_to_w4)),
        engine_(device_model_, engine_options(kv, tune_gemms)),
        accounting_(engine_, kv.describe() + " on the device"),
        max_tokens_(kv.max_tokens) {}

  std::string name() const override { return "cuda"; }
  int add_sequence() override { return engine_.add_sequence(); }
  void release_sequence(int seq) override {
    accounting_.tokens_ -= engine_.length(seq);
    engine_.release_sequence(seq);
  }
  int64_t length(int seq) const override { return engine_.length(seq); }

  void forward(std::span<const StepInput> inputs, LogitsWanted wanted, std::vector<float>& logits) override {
    LOWBIT_REQUIRE(!inputs.empty(), "forward: no inputs");
    // Everything is checked before any sequence grows: a refused call
    // leaves the backend as it was.
    for (size_t i = 0; i < inputs.size(); ++i) {
      const StepInput& in = inputs[i];
      LOWBIT_REQUIRE(!in.tokens.empty(), "forward: an input without tokens");
      for (size_t j = 0; j < i; ++j)
        LOWBIT_REQUIRE(inputs[j].seq != in.seq, "forward: sequence ", in.seq, " appears twice in one step");
      for (int32_t t : in.tokens)
        LOWBIT_REQUIRE(t >= 0 && t < model_.config.vocab, "token id ", t, " outside the vocabulary of ",
                       model_.config.vocab);
      const int64_t after = engine_.length(in.seq) + static_cast<int64_t>(in.tokens.size());
      LOWBIT_REQUIRE(after <= max_tokens_, "sequence ", in.seq, " would hold ", after,
                     " tokens; the cache was made for ", max_tokens_, " (--max-tokens)");
    }
    std::vector<StepRow> rows;
    std::vector<int32_t> tokens;
    for (const StepInput& in : inputs) {
      const int64_t n = static_cast<int64_t>(in.tokens.size());
      rows.push_back({in.seq, engine_.extend(in.seq, n), n});
      accounting_.tokens_ += n;
      tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
    }
    engine_.step(rows, tokens, wanted == LogitsWanted::all);
    const TensorView out = engine_.logits();
    std::vector<f16> h(static_cast<size_t>(out.numel()));
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(engine_.stream()));
    Buffer::copy(h.data(), Device::cpu, out.data, Device::cuda, h.size() * 2);
    logits.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) logits[i] = f16_to_float(h[i]);
  }
  const KvStore& kv() const override { return accounting_; }
  const Model& model() const override { return model_; }
  WeightsInfo weights() const override {
    return {device_model_.format_summary(), static_cast<int64_t>(device_model_.weight_bytes()),
            static_cast<int64_t>(device_model_.bytes_per_token())};
  }

 private:
  static CudaEngineOptions engine_options(const KvOptions& kv, bool tune_gemms) {
    kv.validate();
    CudaEngineOptions o;
    o.tune_decode_gemms = tune_gemms;
    o.k_format = to_kv_format(kv.k);
    o.v_format = to_kv_format(kv.v);
    o.max_tokens = kv.max_tokens;
    o.max_sequences = kv.max_sequences;
    o.page_size = std::max(16, (kv.page_size + 15) / 16 * 16);
    o.rotation_seed = kv.rotation_seed;
    o.rotation = kv.rotation;
    o.fp16_window = kv.has_fp16_window() ? kv.fp16_window : 0;
    // LOWBIT_CUDA_GRAPHS=0: every decode step launched eagerly (to compare,
    // or to profile the kernels one by one).
    const char* graphs = std::getenv("LOWBIT_CUDA_GRAPHS");
    o.decode_graphs = graphs == nullptr || std::string(graphs) != "0";
    return o;
  }

  const Model& model_;
  DeviceModel device_model_;
  CudaEngine engine_;
  DeviceKvAccounting accounting_;
  int64_t max_tokens_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const KvOptions& kv, bool quantize_dense_to_w4,
                                           bool tune_gemms) {
  if (cuda_device_count() == 0) fail(ErrorKind::unsupported, "--device cuda: no CUDA device is visible");
  return std::make_unique<CudaBackend>(model, kv, quantize_dense_to_w4, tune_gemms);
}

StepBreakdown::~StepBreakdown() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

void StepBreakdown::mark(const char* stage, cudaStream_t stream) {
  if (used_ == pool_.size()) {
    cudaEvent_t e;
    LOWBIT_CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
  }
  cudaEvent_t e = pool_[used_++];
  LOWBIT_CUDA_CHECK(cudaEventRecord(e, stream));
  marks_.emplace_back(stage, e);
}

void StepBreakdown::collect() {
  if (marks_.empty()) return;
  LOWBIT_CUDA_CHECK(cudaEventSynchronize(marks_.back().second));
  for (size_t i = 1; i < marks_.size(); ++i) {
    float ms = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second));
    const std::string& name = marks_[i].first;
    auto it = std::find_if(stages_.begin(), stages_.end(), [&](const Stage& st) { return st.name == name; });
    if (it == stages_.end()) it = stages_.insert(stages_.end(), Stage{name, 0.0, 0});
    it->total_us += 1e3 * static_cast<double>(ms);
    ++it->count;
  }
  ++steps_;
  marks_.clear();
  used_ = 0;
}

}  // namespace lowbit::engine
