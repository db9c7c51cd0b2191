// `lowbit perplexity`: how much a weight or KV-cache format costs in quality.
//
//   lowbit perplexity [--model PATH] [--text FILE] [--max-tokens N] [--chunk N]
//                     [--device auto|cpu|cuda] [--weights auto|fp16|w4]
//                     [--kv F] [--kv-k F] [--kv-v F] [--threads N] [--json FILE]
//
// The text is tokenized (with the model's BOS token) and run as one sequence;
// every token after the first is scored (engine/perplexity.h).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/engine/backend.h"
#include "lowbit/engine/perplexity.h"
#include "model_args.h"
#include "progress.h"

namespace lowbit::cli {
namespace {

namespace fs = std::filesystem;
using namespace lowbit::engine;

struct Options {
  ModelRunOptions run;
  std::string text;
  int64_t max_tokens = 1024;
  int64_t chunk = 512;
  bool quiet = false;
  std::string json;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::io, "cannot open --text ", path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail(ErrorKind::io, "cannot read --text ", path);
  return s.str();
}

void run_perplexity(const Options& o) {
  const fs::path model_path = cli::model_path(o.run);
  CpuBackendOptions backend_options = cli::backend_options(o.run);
  const std::string text = read_text(o.text);

  const tokenizer::BpeTokenizer tok = load_tokenizer(model_path, "perplexity");
  std::vector<int32_t> tokens = tok.encode(text, true);
  if (static_cast<int64_t>(tokens.size()) > o.max_tokens) tokens.resize(static_cast<size_t>(o.max_tokens));
  if (tokens.size() < 2)
    fail_argument("--text", o.text, "a text of at least 2 tokens (with the BOS token) to score");
  const Model model = load_model_for_cli(model_path, o.run.weights, o.quiet);
  backend_options.kv.max_sequences = 1;
  backend_options.kv.max_tokens = static_cast<int64_t>(tokens.size());
  std::unique_ptr<Backend> backend = cli::make_run_backend(o.run, model, backend_options, o.quiet);

  PerplexityOptions options;
  options.chunk = o.chunk;
  std::unique_ptr<Progress> progress;
  const int64_t chunks = (static_cast<int64_t>(tokens.size()) - 1 + o.chunk - 1) / o.chunk;
  options.progress = [&](int64_t done, int64_t) {
    if (o.quiet) return;
    if (!progress) progress = std::make_unique<Progress>("scoring " + std::to_string(tokens.size()) + " tokens", chunks);
    progress->advance(std::to_string(done) + " tokens");
  };
  const PerplexityResult r = perplexity(*backend, tokens, options);
  if (progress) progress->finish();

  if (!o.json.empty()) {
    nlohmann::ordered_json row;
    row["suite"] = "perplexity";
    row["impl"] = backend->name();
    row["model"] = model_path.filename().string();
    row["text"] = fs::path(o.text).filename().string();
    row["weights"] = backend->weights().formats;
    row["kv"] = backend_options.kv.describe();
    row["tokens"] = tokens.size();
    row["scored"] = r.scored;
    row["mean_nll"] = r.mean_nll();
    row["perplexity"] = r.perplexity();
    row["seconds"] = r.seconds;
    bench::JsonRowsWriter(o.json).write(row);
  }
  std::printf("perplexity %.4f (mean NLL %.5f nats over %lld tokens)\n", r.perplexity(), r.mean_nll(),
              static_cast<long long>(r.scored));
  if (!o.quiet)
    std::printf("-- %s, device %s, weights %s, KV %s, %.1f s\n", model_path.filename().string().c_str(),
                backend->name().c_str(), backend->weights().formats.c_str(),
                backend_options.kv.describe().c_str(), r.seconds);
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a text under a model: the text (with the model's BOS token) runs as one sequence in\n"
      "chunks, each position's logits scoring the next token, later chunks attending to earlier tokens\n"
      "through the KV cache. Compare --weights and --kv formats on the same text to see what they cost.\n"
      "Example: lowbit perplexity --text data/perplexity/lowbit-prose.txt --kv tq4");
  static Options o;
  add_model_run_options(*cmd, o.run);
  cmd->add_option("--text", o.text, "UTF-8 text file to score")->required();
  cmd->add_option("--max-tokens", o.max_tokens, "Score at most this many tokens of the text")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--chunk", o.chunk, "Tokens per forward call")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "Print only the perplexity line");
  cmd->add_option("--json", o.json, "Also write the numbers as one JSON line to this file");
  cmd->callback([] { run_perplexity(o); });
}

}  // namespace lowbit::cli
