#include <filesystem>

#include "lowbit/core/error.h"
#include "lowbit/engine/model_bench.h"
#include "lowbit/io/hf_config.h"

namespace lowbit::engine {

ModelConfig bench_model_config(const std::string& name_or_path) {
  ModelConfig c;
  if (name_or_path == "qwen3-14b") {  // Qwen/Qwen3-14B config.json
    c.arch = Architecture::qwen3;
    c.hidden = 5120;
    c.intermediate = 17408;
    c.num_layers = 40;
    c.num_heads = 40;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab = 151936;
    c.max_position = 40960;
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
    c.qk_norm = true;
  } else if (name_or_path == "llama3-8b") {  // meta-llama/Meta-Llama-3-8B config.json
    c.arch = Architecture::llama;
    c.hidden = 4096;
    c.intermediate = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab = 128256;
    c.max_position = 8192;
    c.rms_eps = 1e-5;
    c.rope_theta = 500000.0;
  } else {
    LOWBIT_REQUIRE(std::filesystem::is_regular_file(name_or_path), "--config: '", name_or_path,
                   "' is neither qwen3-14b, llama3-8b nor a config.json file");
    c = config_from_hf(io::parse_hf_config(io::read_json_file(name_or_path)));
  }
  c.validate();
  return c;
}

}  // namespace lowbit::engine
