// The CPU forward pass (the arithmetic is written out in model_config.h).
// Activations are fp32 [rows][features]; every matrix product goes through
// cpu::matmul (weights streamed once per call for all rows), attention through
// the KV store. Elementwise work (norms, RoPE, SwiGLU) is cheap next to the
// weight traffic and runs on the calling thread.
#include <algorithm>
#include <cmath>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/cuda/device.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/cpu_kernels.h"

namespace lowbit::engine {

namespace {

// out = x / sqrt(mean(x^2) + eps) * w, as transformers' LlamaRMSNorm (fp32).
void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const CpuBackendOptions& options)
      : model_(model), pool_(options.threads), kv_(make_kv_store(model.config, options.kv)),
        inv_freq_(rope_inv_freq(model.config)) {
    model.weights.check(model.config);
  }

  std::string name() const override {
    return "cpu (" + std::to_string(pool_.size()) + " threads, " + cpu::isa_name(cpu::active_isa()) + " kernels)";
  }
  int add_sequence() override { return kv_->add_sequence(); }
  void release_sequence(int seq) override { kv_->release_sequence(seq); }
  int64_t length(int seq) const override { return kv_->length(seq); }
  const KvStore& kv() const override { return *kv_; }
  const Model& model() const override { return model_; }

  void forward(std::span<const StepInput> inputs, LogitsWanted wanted, std::vector<float>& logits) override;

 private:
  void rope(float* v, int64_t heads, int64_t pos) const;
  void matmul(const WeightMatrix& w, const float* x, int64_t rows, float* y) {
    cpu::matmul(w, x, rows, y, &pool_);
  }

  const Model& model_;
  ThreadPool pool_;
  std::unique_ptr<KvStore> kv_;
  std::vector<float> inv_freq_;
  // Activations, reused across calls.
  std::vector<float> x_, h_, q_, k_, v_, att_, gate_, up_, out_, sel_;
};

void CpuBackend::rope(float* v, int64_t heads, int64_t pos) const {
  const ModelConfig& c = model_.config;
  const int64_t D = c.head_dim, half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    // transformers: freqs = position * inv_freq in fp32, then cos/sin.
    const float angle = static_cast<float>(pos) * inv_freq_[static_cast<size_t>(i)];
    const float cs = std::cos(angle), sn = std::sin(angle);
    for (int64_t h = 0; h < heads; ++h) {
      float* hv = v + h * D;
      const int64_t a = c.rope_style == RopeStyle::half ? i : 2 * i;
      const int64_t b = c.rope_style == RopeStyle::half ? i + half : 2 * i + 1;
      const float x0 = hv[a], x1 = hv[b];
      hv[a] = x0 * cs - x1 * sn;
      hv[b] = x1 * cs + x0 * sn;
    }
  }
}

void CpuBackend::forward(std::span<const StepInput> inputs, LogitsWanted wanted, std::vector<float>& logits) {
  const ModelConfig& c = model_.config;
  const ModelWeights& W = model_.weights;
  LOWBIT_CHECK_ARG(!inputs.empty(), "inputs", 0, "at least one sequence");
  // Validate everything before touching the cache.
  int64_t rows = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    LOWBIT_CHECK_ARG(!in.tokens.empty(), "inputs[i].tokens", 0, "at least one token");
    for (size_t j = 0; j < i; ++j)
      LOWBIT_CHECK_ARG(inputs[j].seq != in.seq, "inputs[i].seq", in.seq, "each sequence at most once per step");
    for (const int32_t t : in.tokens)
      if (t < 0 || t >= c.vocab) fail_argument("token", t, "an id in [0, vocab = " + std::to_string(c.vocab) + ")");
    (void)kv_->length(in.seq);  // throws for an unknown sequence
    rows += static_cast<int64_t>(in.tokens.size());
  }
  std::vector<int64_t> first(inputs.size()), row0(inputs.size());
  {
    int64_t r = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      first[i] = kv_->extend(inputs[i].seq, static_cast<int64_t>(inputs[i].tokens.size()));
      row0[i] = r;
      r += static_cast<int64_t>(inputs[i].tokens.size());
    }
  }
  const int64_t H = c.hidden, QD = c.q_dim(), KVD = c.kv_dim(), F = c.intermediate, D = c.head_dim;
  const auto sz = [](int64_t n) { return static_cast<size_t>(n); };
  x_.resize(sz(rows * H));
  h_.resize(sz(rows * H));
  q_.resize(sz(rows * QD));
  k_.resize(sz(rows * KVD));
  v_.resize(sz(rows * KVD));
  att_.resize(sz(rows * QD));
  gate_.resize(sz(rows * F));
  up_.resize(sz(rows * F));
  out_.resize(sz(rows * H));

  for (size_t i = 0; i < inputs.size(); ++i)
    for (size_t j = 0; j < inputs[i].tokens.size(); ++j)
      W.embed.dequant_row(inputs[i].tokens[j], x_.data() + (row0[i] + static_cast<int64_t>(j)) * H);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = W.layers[static_cast<size_t>(l)];
    for (int64_t r = 0; r < rows; ++r) rmsnorm(&x_[sz(r * H)], L.attn_norm.data(), H, c.rms_eps, &h_[sz(r * H)]);
    matmul(L.wq, h_.data(), rows, q_.data());
    matmul(L.wk, h_.data(), rows, k_.data());
    matmul(L.wv, h_.data(), rows, v_.data());
    if (c.attention_bias)
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < QD; ++j) q_[sz(r * QD + j)] += L.q_bias[sz(j)];
        for (int64_t j = 0; j < KVD; ++j) {
          k_[sz(r * KVD + j)] += L.k_bias[sz(j)];
          v_[sz(r * KVD + j)] += L.v_bias[sz(j)];
        }
      }
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (int64_t j = 0; j < static_cast<int64_t>(inputs[i].tokens.size()); ++j) {
        const int64_t r = row0[i] + j, pos = first[i] + j;
        float* qr = &q_[sz(r * QD)];
        float* kr = &k_[sz(r * KVD)];
        if (c.qk_norm) {
          for (int64_t h = 0; h < c.num_heads; ++h) rmsnorm(qr + h * D, L.q_norm.data(), D, c.rms_eps, qr + h * D);
          for (int64_t h = 0; h < c.num_kv_heads; ++h) rmsnorm(kr + h * D, L.k_norm.data(), D, c.rms_eps, kr + h * D);
        }
        rope(qr, c.num_heads, pos);
        rope(kr, c.num_kv_heads, pos);
      }
      const int64_t n = static_cast<int64_t>(inputs[i].tokens.size());
      kv_->write(static_cast<int>(l), inputs[i].seq, first[i], n,
                 std::span<const float>(&k_[sz(row0[i] * KVD)], sz(n * KVD)),
                 std::span<const float>(&v_[sz(row0[i] * KVD)], sz(n * KVD)));
      kv_->attend(static_cast<int>(l), inputs[i].seq, first[i], n,
                  std::span<const float>(&q_[sz(row0[i] * QD)], sz(n * QD)),
                  std::span<float>(&att_[sz(row0[i] * QD)], sz(n * QD)), &pool_);
    }
    matmul(L.wo, att_.data(), rows, out_.data());
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += out_[i];

    for (int64_t r = 0; r < rows; ++r) rmsnorm(&x_[sz(r * H)], L.ffn_norm.data(), H, c.rms_eps, &h_[sz(r * H)]);
    matmul(L.w_gate, h_.data(), rows, gate_.data());
    matmul(L.w_up, h_.data(), rows, up_.data());
    for (size_t i = 0; i < gate_.size(); ++i) {
      const float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // SiLU(gate) * up
    }
    matmul(L.w_down, gate_.data(), rows, out_.data());
    for (size_t i = 0; i < x_.size(); ++i) x_[i] += out_[i];
  }

  // Final norm and the output matrix, for the rows that are asked for.
  std::vector<int64_t> picked;
  if (wanted == LogitsWanted::all) {
    for (int64_t r = 0; r < rows; ++r) picked.push_back(r);
  } else {
    for (size_t i = 0; i < inputs.size(); ++i) picked.push_back(row0[i] + static_cast<int64_t>(inputs[i].tokens.size()) - 1);
  }
  const int64_t P = static_cast<int64_t>(picked.size());
  sel_.resize(sz(P * H));
  for (int64_t p = 0; p < P; ++p)
    rmsnorm(&x_[sz(picked[sz(p)] * H)], W.final_norm.data(), H, c.rms_eps, &sel_[sz(p * H)]);
  logits.resize(sz(P * c.vocab));
  matmul(W.output(), sel_.data(), P, logits.data());
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(model, options);
}

void check_device(const std::string& device) {
  if (device == "cpu" || device == "auto") return;
  if (device == "cuda") {
    if (!cuda_built()) fail(ErrorKind::unsupported, "--device cuda: this lowbit was built without CUDA");
    if (cuda_device_count() == 0) fail(ErrorKind::unsupported, "--device cuda: no CUDA device is visible");
    return;
  }
  fail_argument("device", device, "auto, cpu or cuda");
}

std::unique_ptr<Backend> make_backend(const std::string& device, const Model& model, const CpuBackendOptions& options,
                                      std::string* why_cpu) {
  check_device(device);
  if (why_cpu) why_cpu->clear();
  if (device == "cuda") return make_cuda_backend(model, options.kv, false, options.tune_gemms);
  if (device == "auto" && cuda_device_count() > 0) {
    try {
      return make_cuda_backend(model, options.kv, false, options.tune_gemms);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      // What the CUDA path does not cover (e.g. head_dim 96, attention biases, an fp32 KV
      // cache) runs on the CPU; the output names the device used, and the caller may say why.
      if (why_cpu) *why_cpu = e.what();
    }
  }
  return make_cpu_backend(model, options);
}

}  // namespace lowbit::engine
