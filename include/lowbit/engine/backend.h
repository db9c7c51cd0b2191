// The forward step of the model on one device, behind an interface so that a
// CUDA backend can slot in beside the CPU one: both read the same Model
// (model_config.h + weights.h) and own their KV cache.
//
// One call of forward() runs the model over new tokens of several sequences
// at once: a prompt block (prefill), one token each (batched decode), or any
// mix. The tokens of input i continue sequence i.seq at its current length;
// their K/V are appended to the cache. Rows of all inputs are stacked, so
// every matrix product reads its weights once per call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lowbit/engine/kv_store.h"
#include "lowbit/engine/weights.h"

namespace lowbit::engine {

struct StepInput {
  int seq = 0;
  std::span<const int32_t> tokens;  // at least one
};

enum class LogitsWanted : uint8_t { last, all };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int add_sequence() = 0;
  virtual void release_sequence(int seq) = 0;
  virtual int64_t length(int seq) const = 0;
  // logits: [rows][vocab], rows = number of inputs (last token of each) or
  // the total token count (every token, in input order) for LogitsWanted::all.
  // Throws Error(invalid_argument) for an unknown sequence, a token outside
  // the vocabulary, or a sequence that would outgrow the cache.
  virtual void forward(std::span<const StepInput> inputs, LogitsWanted wanted, std::vector<float>& logits) = 0;
  virtual const KvStore& kv() const = 0;
  virtual const Model& model() const = 0;

  // The weights as this backend holds them (what `lowbit generate` reports):
  // their formats ("210 x w4 g32, 1 x q8"), their bytes, and the bytes one
  // decode step reads. The CPU backend reads the model as loaded; the CUDA
  // backend has its own copy (fp16 where the model has f32 or q8, q/k/v and
  // gate/up stacked), so it reports that one.
  struct WeightsInfo {
    std::string formats;
    int64_t bytes = 0;
    int64_t bytes_per_step = 0;
  };
  virtual WeightsInfo weights() const {
    const ModelWeights& w = model().weights;
    return {w.format_summary(), static_cast<int64_t>(w.nbytes()), static_cast<int64_t>(w.bytes_per_token())};
  }
};

struct CpuBackendOptions {
  KvOptions kv;
  int threads = 0;  // 0: lowbit::num_threads()
  // make_backend on CUDA: time the W4A16 kernels per layer shape for
  // single-row steps when the engine is made (CudaEngineOptions::tune_decode_gemms).
  bool tune_gemms = false;
};

// The model must outlive the backend.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, const CpuBackendOptions& options = {});

// The CUDA backend (cuda_engine.h): weights uploaded once (4-bit layers stay
// 4-bit, others fp16, or all 4-bit with quantize_dense_to_w4), K/V on the
// device in kv.k / kv.v formats (fp16, tq4, tq3, tq2). Throws
// Error(unsupported) in a build without CUDA, on a machine without a GPU, and
// for models the CUDA kernels do not cover (head_dim other than 64 or 128, attention biases).
// tune_gemms: CudaEngineOptions::tune_decode_gemms.
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const KvOptions& kv, bool quantize_dense_to_w4 = false,
                                           bool tune_gemms = false);

// --device: "cpu", "cuda", or "auto" (the CUDA backend when this build and
// machine have a GPU and its kernels cover the model, else the CPU).
// check_device throws as make_backend would for `device`, without a model
// (fail early): an unknown name, or "cuda" without a usable GPU.
// With "auto" on a machine with a GPU whose backend refuses the model or the
// options (Error(unsupported), e.g. head_dim 96 or a KV fp16 window), the CPU
// backend runs it; `why_cpu`, when given, then receives the refusal's message
// (else it is left empty), so that a caller can tell the user why the GPU
// was not used.
void check_device(const std::string& device);
std::unique_ptr<Backend> make_backend(const std::string& device, const Model& model,
                                      const CpuBackendOptions& options = {}, std::string* why_cpu = nullptr);

}  // namespace lowbit::engine
