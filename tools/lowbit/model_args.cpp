#include "model_args.h"

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"
#include "lowbit/gguf/gguf_file.h"
#include "progress.h"

namespace lowbit::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

fs::path cache_dir() {
  if (const char* d = std::getenv("LOWBIT_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') return fs::path(x) / "lowbit";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return fs::path(h) / ".cache" / "lowbit";
  fail(ErrorKind::invalid_argument, "no --model given and no model cache folder: set LOWBIT_CACHE_DIR or HOME");
}

}  // namespace

fs::path default_model() {
  const fs::path p = cache_dir() / "models" / kDefaultModelFile;
  if (!fs::exists(p))
    fail(ErrorKind::invalid_argument, "no --model given and the default model is not in the cache (", p.string(),
         "): run scripts/fetch-default-model to download it (about 98 MB), or pass --model PATH");
  return p;
}

tokenizer::BpeTokenizer load_tokenizer(const fs::path& model, const std::string& command) {
  if (model.extension() == ".gguf") return tokenizer::BpeTokenizer::from_gguf(gguf::GgufFile::open(model));
  const fs::path dir = fs::is_directory(model) ? model : model.parent_path();
  const fs::path json = dir / "tokenizer.json";
  if (!fs::exists(json))
    fail(ErrorKind::invalid_argument, "model ", model.string(), " has no tokenizer.json beside it: ", command,
         " needs one");
  return tokenizer::BpeTokenizer::from_tokenizer_json(json);
}

engine::Model load_model_for_cli(const fs::path& path, const std::string& weights, bool quiet) {
  if (!fs::exists(path)) fail(ErrorKind::io, "model ", path.string(), " does not exist");
  const auto mode = engine::parse_weight_mode(weights);
  if (!mode) fail_argument("--weights", weights, "auto, fp16 or w4");
  engine::LoadOptions load;
  load.weights = *mode;
  std::unique_ptr<Progress> progress;
  load.progress = [&](int64_t, int64_t total, const std::string& item) {
    if (quiet) return;
    if (!progress) progress = std::make_unique<Progress>("loading " + path.filename().string(), total);
    progress->advance(item);
  };
  engine::Model model = engine::load_model(path, load);
  if (progress) progress->finish();
  return model;
}

engine::KvStorage kv_option(const std::string& name, const char* flag) {
  const auto s = engine::parse_kv_storage(name);
  if (!s) fail_argument(flag, name, "fp32, fp16, tq4, tq3 or tq2");
  return *s;
}

void add_model_run_options(CLI::App& cmd, ModelRunOptions& o) {
  cmd.add_option("--model", o.model, "Model file or folder (default: the cached default model)");
  cmd.add_option("--device", o.device, "auto (the GPU when one is visible and its kernels cover the model: head_dim 64 or 128; else the "
                 "CPU, saying why on stderr), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd.add_option("--weights", o.weights,
                 "auto: as stored; fp16: every linear unquantized; w4: 4-bit RTN (group 128) on load")
      ->check(CLI::IsMember({"auto", "fp16", "w4"}));
  const auto formats = CLI::IsMember({"fp32", "fp16", "tq4", "tq3", "tq2"});
  cmd.add_option("--kv", o.kv, "KV cache format for K and V: fp32, fp16, tq4, tq3, tq2")->check(formats);
  cmd.add_option("--kv-k", o.kv_k, "K format (overrides --kv)")->check(formats);
  cmd.add_option("--kv-v", o.kv_v, "V format (overrides --kv)")->check(formats);
  cmd.add_option("--kv-rotation", o.kv_rotation,
                 "TurboQuant rotation of tq2/3/4 K/V, one per layer: haar (dense QR rotation, the seed's), "
                 "hadamard (random signs + fast Walsh-Hadamard transform, head_dim a power of two; cheaper, and on "
                 "CUDA the decode step's qkv GEMM then also rotates the queries), or auto (hadamard when head_dim "
                 "is a power of two, else haar)")
      ->check(CLI::IsMember({"auto", "haar", "hadamard"}))
      ->capture_default_str();
  cmd.add_option("--kv-fp16-window", o.kv_fp16_window,
                 "With tq2/3/4 K or V: attend the newest N tokens of each sequence from fp16 copies of their K/V "
                 "instead of their codes (4 * kv_dim bytes per token of the window, per layer and sequence). "
                 "On SmolLM2-135M, 256 greedy decode steps with tq4 K/V agree with fp16 K/V on 89.8% of steps "
                 "without it and 98.4% with 64, and over a 6k-token text tq4 K/V cost 8.4% perplexity without "
                 "it and 0.7% with 64 (docs/engine.md). On CUDA the window costs a kernel per layer and step, and "
                 "prompts are attended 256 tokens at a time")
      ->check(at_least(0))
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "CPU threads, at most " + std::to_string(kMaxThreads) + " (default: LOWBIT_NUM_THREADS or all cores)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd.add_flag("--tune-gemms", o.tune_gemms,
               "CUDA: time the 4-bit GEMM kernels per layer shape when the model is loaded (a few ms each) and "
               "decode single sequences with the fastest, each timed alone (slower in a whole decode step on an "
               "H100: Qwen3-14B 228.6 against 249.7-249.9 tok/s in one run, docs/engine.md v28; on an H200 235.6 against 257-260, v32; the logits may then differ in the last bits from run to run, and from "
               "the same sequence decoded in a batch: with a 4-bit KV cache such a difference can move a cache "
               "code). Without it, auto's plan. Either way, GEMMs on the decode kernel also read the SiLU, do the "
               "residual add + RMSNorm and the q/k norm + RoPE themselves (with a Hadamard KV rotation, the "
               "default, also the query rotation)");
}

fs::path model_path(const ModelRunOptions& o) {
  const fs::path p = o.model.empty() ? default_model() : fs::path(o.model);
  if (!fs::exists(p)) fail(ErrorKind::io, "model ", p.string(), " does not exist");
  return p;
}

engine::CpuBackendOptions backend_options(const ModelRunOptions& o) {
  if (!engine::parse_weight_mode(o.weights)) fail_argument("--weights", o.weights, "auto, fp16 or w4");
  engine::CpuBackendOptions b;
  b.kv.k = kv_option(o.kv_k.empty() ? o.kv : o.kv_k, "--kv-k");
  b.kv.v = kv_option(o.kv_v.empty() ? o.kv : o.kv_v, "--kv-v");
  if (o.kv_rotation != "auto") {
    const auto rotation = kv::parse_rotation_kind(o.kv_rotation);
    if (!rotation) fail_argument("--kv-rotation", o.kv_rotation, "auto, haar or hadamard");
    b.kv.rotation = *rotation;
  }
  b.kv.fp16_window = o.kv_fp16_window;
  b.threads = o.threads;
  b.tune_gemms = o.tune_gemms;
  engine::check_device(o.device);
  return b;
}

std::unique_ptr<engine::Backend> make_run_backend(const ModelRunOptions& o, const engine::Model& model,
                                                  const engine::CpuBackendOptions& options, bool quiet) {
  std::string why_cpu;
  std::unique_ptr<engine::Backend> backend = engine::make_backend(o.device, model, options, &why_cpu);
  if (!why_cpu.empty() && !quiet)
    std::cerr << "lowbit: --device auto: running on the CPU, since the GPU's backend refused: " << why_cpu << "\n";
  return backend;
}

}  // namespace lowbit::cli
