// `lowbit generate`: text generation with the model engine.
//
//   lowbit generate [--model PATH] [--prompt TEXT]... [--max-tokens N] [--device auto|cpu|cuda]
//                   [--weights auto|fp16|w4] [--kv F] [--kv-k F] [--kv-v F] [--chat]
//                   [--temperature T] [--top-k K] [--top-p P] [--seed S] [--threads N]
//                   [--max-context N] [--quiet] [--ignore-eos] [--json FILE]
//
// PATH is a .gguf file or a Hugging Face folder (config.json, safetensors,
// tokenizer.json); without --model, the default model in the cache
// (scripts/fetch-default-model). One prompt streams its text as it is
// produced; several prompts are decoded as one batch and printed at the end.
// Then it prints prefill and decode speed and memory (weights, KV cache).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/generate.h"
#include "lowbit/engine/weights.h"
#include "lowbit/tokenizer/bpe_tokenizer.h"
#include "model_args.h"

namespace lowbit::cli {
namespace {

namespace fs = std::filesystem;
using namespace lowbit::engine;

constexpr const char* kDefaultPrompt = "The three most important things to know about the Moon are";

std::string mib(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(bytes < 10.0 * 1024 * 1024 ? 2 : 1) << bytes / (1024.0 * 1024.0) << " MiB";
  return s.str();
}

struct Options {
  ModelRunOptions run;
  std::vector<std::string> prompts;
  int64_t max_tokens = 128;
  bool chat = false;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int64_t max_context = 0;
  bool quiet = false;
  bool ignore_eos = false;
  std::string json;
};

void run_generate(const Options& o) {
  const fs::path model_path = cli::model_path(o.run);
  CpuBackendOptions backend_options = cli::backend_options(o.run);  // refuses --device cuda before the slow load

  const tokenizer::BpeTokenizer tok = load_tokenizer(model_path, "generate");
  const Model model = load_model_for_cli(model_path, o.run.weights, o.quiet);
  if (tok.vocab_size() > model.config.vocab)
    fail(ErrorKind::format, "the tokenizer has ", tok.vocab_size(), " tokens but the model only ", model.config.vocab);

  std::vector<std::string> texts = o.prompts.empty() ? std::vector<std::string>{kDefaultPrompt} : o.prompts;
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) {
    const std::string text = o.chat ? tok.apply_chat_template({{"user", t}}, true) : t;
    std::vector<int32_t> ids = tok.encode(text, true);
    if (ids.empty()) fail_argument("--prompt", "\"\"", "a prompt that encodes to at least one token");
    prompts.push_back(std::move(ids));
  }
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  backend_options.kv.max_sequences = static_cast<int>(prompts.size());
  backend_options.kv.max_tokens = o.max_context > 0 ? o.max_context : longest + o.max_tokens;
  if (longest + o.max_tokens > backend_options.kv.max_tokens)
    fail_argument("--max-context", backend_options.kv.max_tokens, "at least the prompt plus --max-tokens");
  std::unique_ptr<Backend> backend = cli::make_run_backend(o.run, model, backend_options, o.quiet);
  // On the GPU, one-time setup (module loading, workspaces) would otherwise
  // be ~100 ms of the reported prefill time; on the CPU the first calls cost
  // nothing extra, and three tokens of a large model would.
  if (backend->name() == "cuda" && backend_options.kv.max_tokens >= 3) warm_up(*backend, prompts[0][0]);

  GenerateOptions gen;
  gen.max_tokens = o.max_tokens;
  gen.sampling.temperature = o.temperature;
  gen.sampling.top_k = o.top_k;
  gen.sampling.top_p = o.top_p;
  gen.sampling.seed = o.seed;
  for (int32_t id = 0; id < tok.vocab_size() && !o.ignore_eos; ++id)
    if (tok.is_end_of_generation(id)) gen.stop_tokens.push_back(id);

  const bool stream = prompts.size() == 1;
  std::vector<tokenizer::BpeTokenizer::StreamDecoder> decoders;
  for (size_t i = 0; i < prompts.size(); ++i) decoders.emplace_back(tok, true);
  std::vector<std::string> outputs(prompts.size());
  if (stream) {
    // The prompt as typed; a chat turn's answer starts on its own line.
    std::cout << texts[0] << (o.chat ? "\n" : "") << std::flush;
  }
  const GenerateResult r = generate(*backend, prompts, gen, [&](size_t i, int32_t token) {
    const std::string piece = decoders[i].push(token);
    if (stream) std::cout << piece << std::flush;
    else outputs[i] += piece;
    return true;
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string rest = decoders[i].finish();
    if (stream) std::cout << rest;
    else outputs[i] += rest;
  }
  if (stream) {
    std::cout << "\n";
  } else {
    for (size_t i = 0; i < prompts.size(); ++i)
      std::cout << "== prompt " << i << ": " << texts[i] << "\n" << outputs[i] << "\n";
  }
  // The first token of each prompt comes out of the prefill call.
  const int64_t decode_tokens = std::max<int64_t>(0, r.generated_tokens - static_cast<int64_t>(prompts.size()));
  const double prefill_tps = r.prefill_seconds > 0 ? static_cast<double>(r.prompt_tokens) / r.prefill_seconds : 0.0;
  const double decode_tps = r.decode_seconds > 0 ? static_cast<double>(decode_tokens) / r.decode_seconds : 0.0;
  const Backend::WeightsInfo weights = backend->weights();
  if (!o.json.empty()) {
    nlohmann::ordered_json row;
    row["suite"] = "generate";
    row["impl"] = backend->name();
    row["model"] = model_path.filename().string();
    row["weights"] = weights.formats;
    row["kv"] = backend_options.kv.describe();
    row["batch"] = prompts.size();
    row["prompt_tokens"] = r.prompt_tokens;
    row["generated_tokens"] = r.generated_tokens;
    row["prefill_s"] = r.prefill_seconds;
    row["decode_s"] = r.decode_seconds;
    row["prefill_tokens_per_s"] = prefill_tps;
    row["decode_tokens_per_s"] = decode_tps;
    row["weight_bytes"] = weights.bytes;
    row["weight_bytes_per_step"] = weights.bytes_per_step;
    row["kv_bytes"] = r.kv_bytes;
    row["kv_bytes_per_token"] = backend->kv().bytes_per_token();
    bench::JsonRowsWriter(o.json).write(row);
  }
  if (o.quiet) return;
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  s << "\n-- " << model_path.filename().string() << ": " << model.config.describe() << "\n";
  s << "-- device " << backend->name() << ", weights " << weights.formats << "\n";
  s << "-- prefill: " << r.prompt_tokens << " tokens in " << r.prefill_seconds * 1e3 << " ms ("
    << prefill_tps << " tokens/s)\n";
  s << "-- decode: " << decode_tokens << " tokens in " << r.decode_steps << " steps, " << r.decode_seconds * 1e3 << " ms ("
    << decode_tps << " tokens/s";
  if (prompts.size() > 1) s << ", batch " << prompts.size();
  s << ")\n";
  s << "-- memory: weights " << mib(static_cast<double>(weights.bytes)) << " ("
    << mib(static_cast<double>(weights.bytes_per_step)) << " read per decode step), KV cache "
    << mib(static_cast<double>(r.kv_bytes)) << " for " << r.kv_tokens << " tokens, "
    << backend->kv().bytes_per_token() << " bytes per token (" << backend->kv().describe() << ")\n";
  std::cout << s.str() << std::flush;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate text with a model: a .gguf file (Llama or Qwen3 architecture) or a Hugging Face folder\n"
      "(config.json, safetensors plain or GPTQ/AWQ, tokenizer.json). Without --model: the default model,\n"
      "SmolLM2-135M-Instruct Q4_1, from the cache (scripts/fetch-default-model puts it there).\n"
      "Streams the text, then prints prefill and decode tokens/s and memory.");
  static Options o;
  add_model_run_options(*cmd, o.run);
  cmd->add_option("--prompt", o.prompts, "Prompt text; repeat for a batch of prompts decoded together")
      ->expected(1)
      ->take_all();
  cmd->add_option("--max-tokens", o.max_tokens, "New tokens per prompt")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_flag("--chat", o.chat, "Wrap the prompt in the model's chat template (a user turn)");
  cmd->add_option("--temperature", o.temperature, "0 = greedy")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", o.top_k, "Sample among the k most likely tokens (0 = all)")->check(at_least(0));
  cmd->add_option("--top-p", o.top_p, "Nucleus sampling threshold in (0, 1]")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--seed", o.seed, "Sampling seed");
  cmd->add_option("--max-context", o.max_context, "KV cache capacity per prompt in tokens (default: prompt + max-tokens)")
      ->check(at_least(0));
  cmd->add_flag("--quiet", o.quiet, "Print only the generated text");
  cmd->add_option("--json", o.json, "Also write the numbers as one JSON line to this file");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Do not stop at end-of-generation tokens (for timing N tokens)");
  cmd->callback([] { run_generate(o); });
}

}  // namespace lowbit::cli
