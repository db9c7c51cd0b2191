// What the commands that run a model (generate, perplexity) share: where the
// default model lives, loading a model with a progress line, its tokenizer,
// and parsing KV-cache format names.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "lowbit/engine/backend.h"
#include "lowbit/engine/kv_store.h"
#include "lowbit/engine/weights.h"
#include "lowbit/tokenizer/bpe_tokenizer.h"

namespace lowbit::cli {

// The cached default model (scripts/fetch-default-model): SmolLM2-135M-Instruct
// Q4_1 under $LOWBIT_CACHE_DIR, else $XDG_CACHE_HOME/lowbit, else ~/.cache/lowbit.
// Throws Error(invalid_argument) saying how to get it when it is not there.
std::filesystem::path default_model();

// The tokenizer of a .gguf file (its metadata) or of a Hugging Face folder
// (tokenizer.json beside the weights); `command` names the caller in errors.
tokenizer::BpeTokenizer load_tokenizer(const std::filesystem::path& model, const std::string& command);

// The model at `path` with weights as `weights` says ("auto", "fp16", "w4"),
// with a progress line on stderr unless quiet.
engine::Model load_model_for_cli(const std::filesystem::path& path, const std::string& weights, bool quiet);

// "fp32", "fp16", "tq4", "tq3", "tq2"; `flag` names the option in errors.
engine::KvStorage kv_option(const std::string& name, const char* flag);

// The options of every command that runs a model: which model, where, and
// in which weight and KV-cache formats.
struct ModelRunOptions {
  std::string model;
  std::string device = "auto";
  std::string weights = "auto";
  std::string kv = "fp16";
  std::string kv_k, kv_v;
  std::string kv_rotation = "auto";
  int64_t kv_fp16_window = 0;
  int threads = 0;
  bool tune_gemms = false;
};
// Adds --model, --device, --weights, --kv, --kv-k, --kv-v, --kv-rotation, --kv-fp16-window, --threads and
// --tune-gemms.
void add_model_run_options(CLI::App& cmd, ModelRunOptions& o);
// --model, or the default model; Error(io) when it does not exist.
std::filesystem::path model_path(const ModelRunOptions& o);
// The KV formats and threads (max_tokens / max_sequences left to the caller);
// also checks --weights and that --device can run here, before any slow load.
engine::CpuBackendOptions backend_options(const ModelRunOptions& o);
// engine::make_backend for o.device; when --device auto runs on the CPU
// because the GPU's backend refused the run, says why on stderr (unless
// quiet), so that nobody waits on a CPU run believing it is on the GPU.
std::unique_ptr<engine::Backend> make_run_backend(const ModelRunOptions& o, const engine::Model& model,
                                                  const engine::CpuBackendOptions& options, bool quiet);

}  // namespace lowbit::cli
