#include "lowbit/engine/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>
#include <vector>

#include "lowbit/core/error.h"

namespace lowbit::engine {

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::llama: return "llama";
    case Architecture::qwen3: return "qwen3";
  }
  return "?";
}

void ModelConfig::validate() const {
  const auto positive = [](int64_t v, const char* name) {
    if (v <= 0) fail(ErrorKind::format, "model config: ", name, " = ", v, ": expected a positive value");
  };
  positive(hidden, "hidden");
  positive(intermediate, "intermediate");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(num_kv_heads, "num_kv_heads");
  positive(head_dim, "head_dim");
  positive(vocab, "vocab");
  if (num_heads % num_kv_heads != 0)
    fail(ErrorKind::format, "model config: num_heads = ", num_heads,
         " is not a multiple of num_kv_heads = ", num_kv_heads);
  if (head_dim % 2 != 0)
    fail(ErrorKind::format, "model config: head_dim = ", head_dim, ": RoPE needs an even head_dim");
  if (!(rms_eps > 0.0) || !std::isfinite(rms_eps))
    fail(ErrorKind::format, "model config: rms_eps = ", rms_eps, ": expected a positive number");
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta))
    fail(ErrorKind::format, "model config: rope_theta = ", rope_theta, ": expected a positive number");
  if (rope_scaling.llama3 && !(rope_scaling.factor >= 1.0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                               rope_scaling.original_max_position > 0))
    fail(ErrorKind::format, "model config: llama3 rope_scaling factor = ", rope_scaling.factor,
         ", low_freq_factor = ", rope_scaling.low_freq_factor, ", high_freq_factor = ",
         rope_scaling.high_freq_factor, ", original_max_position_embeddings = ",
         rope_scaling.original_max_position,
         ": expected factor >= 1, high_freq_factor > low_freq_factor, a positive original context");
}

std::string ModelConfig::describe() const {
  std::ostringstream s;
  s << architecture_name(arch) << ": " << num_layers << " layers, hidden " << hidden << ", heads "
    << num_heads << "/" << num_kv_heads << " x " << head_dim << ", ffn " << intermediate << ", vocab "
    << vocab << ", rope theta " << rope_theta
    << (rope_style == RopeStyle::interleaved ? " (interleaved pairs)" : "")
    << (rope_scaling.llama3 ? " llama3-scaled" : "") << ", rms eps " << rms_eps
    << (tied_embeddings ? ", tied embeddings" : "") << (qk_norm ? ", q/k norm" : "")
    << (attention_bias ? ", qkv bias" : "");
  return s.str();
}

namespace {

bool has_architecture(const io::HfConfig& hf, std::string_view name) {
  return std::find(hf.architectures.begin(), hf.architectures.end(), name) != hf.architectures.end();
}

double number_field(const nlohmann::json& obj, const char* key, double fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number())
    fail(ErrorKind::format, "config.json: rope_scaling.", key, " = ", it->dump(), ": expected a number");
  return it->get<double>();
}

}  // namespace

ModelConfig config_from_hf(const io::HfConfig& hf) {
  ModelConfig c;
  if (hf.model_type == "qwen3" || has_architecture(hf, "Qwen3ForCausalLM")) {
    c.arch = Architecture::qwen3;
    c.qk_norm = true;
  } else if (hf.model_type == "llama" || hf.model_type == "mistral" || has_architecture(hf, "LlamaForCausalLM") ||
             has_architecture(hf, "MistralForCausalLM")) {
    c.arch = Architecture::llama;
  } else {
    std::string archs;
    for (const auto& a : hf.architectures) archs += (archs.empty() ? "" : ", ") + a;
    fail(ErrorKind::unsupported, "model_type '", hf.model_type, "' (architectures: ", archs.empty() ? "none" : archs,
         "): the engine runs the Llama family and Qwen3");
  }
  const nlohmann::json& raw = hf.raw;
  if (const auto mb = raw.find("mlp_bias"); mb != raw.end() && mb->is_boolean() && mb->get<bool>())
    fail(ErrorKind::unsupported, "config.json: mlp_bias = true: MLP biases are not supported");
  if (c.arch == Architecture::llama) {
    if (const auto sw = raw.find("sliding_window"); sw != raw.end() && !sw->is_null())
      fail(ErrorKind::unsupported, "config.json: sliding_window = ", sw->dump(),
           ": sliding-window attention is not supported");
  }
  c.hidden = hf.hidden_size;
  c.intermediate = hf.intermediate_size;
  c.num_layers = hf.num_hidden_layers;
  c.num_heads = hf.num_attention_heads;
  c.num_kv_heads = hf.num_key_value_heads;
  c.head_dim = hf.head_dim;
  c.vocab = hf.vocab_size;
  c.rms_eps = hf.rms_norm_eps;
  c.rope_theta = hf.rope_theta;
  c.rope_style = RopeStyle::half;
  // transformers' PretrainedConfig defaults tie_word_embeddings to true, but
  // LlamaConfig to false; HfConfig reads the explicit value. The loader also
  // ties when the checkpoint has no lm_head.weight.
  c.tied_embeddings = hf.tie_word_embeddings;
  if (const auto it = raw.find("max_position_embeddings"); it != raw.end() && it->is_number_integer())
    c.max_position = it->get<int64_t>();
  if (const auto it = raw.find("attention_bias"); it != raw.end() && it->is_boolean())
    c.attention_bias = it->get<bool>();
  if (const auto it = raw.find("bos_token_id"); it != raw.end() && it->is_number_integer())
    c.bos_token = it->get<int64_t>();
  if (const auto it = raw.find("eos_token_id"); it != raw.end()) {
    if (it->is_number_integer()) c.eos_token = it->get<int64_t>();
    else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) c.eos_token = (*it)[0].get<int64_t>();
  }
  // rope_scaling, or (newer transformers) rope_parameters with a rope_type.
  const nlohmann::json* scaling = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = raw.find(key);
    if (it != raw.end() && it->is_object()) { scaling = &*it; break; }
  }
  if (scaling != nullptr) {
    std::string type;
    for (const char* key : {"rope_type", "type"}) {
      const auto it = scaling->find(key);
      if (it != scaling->end() && it->is_string()) { type = it->get<std::string>(); break; }
    }
    if (type == "llama3") {
      c.rope_scaling.llama3 = true;
      c.rope_scaling.factor = number_field(*scaling, "factor", 8.0);
      c.rope_scaling.low_freq_factor = number_field(*scaling, "low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = number_field(*scaling, "high_freq_factor", 4.0);
      c.rope_scaling.original_max_position =
          static_cast<int64_t>(number_field(*scaling, "original_max_position_embeddings", 8192));
    } else if (!type.empty() && type != "default") {
      fail(ErrorKind::unsupported, "config.json: rope_scaling type '", type,
           "': supported are default and llama3");
    }
  }
  c.validate();
  return c;
}

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int64_t half = config.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32.
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(config.rope_theta), exponent);
  }
  if (config.rope_scaling.llama3) {
    // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend between.
    const RopeScaling& s = config.rope_scaling;
    const double low_wavelen = static_cast<double>(s.original_max_position) / s.low_freq_factor;
    const double high_wavelen = static_cast<double>(s.original_max_position) / s.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);
        continue;
      }
      const double smooth = (static_cast<double>(s.original_max_position) / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
    }
  }
  if (!config.rope_freq_factors.empty()) {
    if (config.rope_freq_factors.size() != inv.size())
      fail(ErrorKind::format, "rope frequency factors: ", config.rope_freq_factors.size(), " values, expected head_dim / 2 = ",
           inv.size());
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= config.rope_freq_factors[i];
  }
  return inv;
}

}  // namespace lowbit::engine
