#include "lowbit/engine/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"
#include "lowbit/formats/rtn.h"

namespace lowbit::engine {

const char* matrix_format_name(MatrixFormat f) {
  switch (f) {
    case MatrixFormat::f32: return "f32";
    case MatrixFormat::f16: return "f16";
    case MatrixFormat::w4: return "w4";
    case MatrixFormat::q8: return "q8";
  }
  return "?";
}

const char* weight_mode_name(WeightMode m) {
  switch (m) {
    case WeightMode::as_stored: return "auto";
    case WeightMode::dense: return "fp16";
    case WeightMode::w4: return "w4";
  }
  return "?";
}

std::optional<WeightMode> parse_weight_mode(std::string_view name) {
  if (name == "auto") return WeightMode::as_stored;
  if (name == "fp16") return WeightMode::dense;
  if (name == "w4") return WeightMode::w4;
  return std::nullopt;
}

size_t WeightMatrix::nbytes() const {
  return f32.size() * sizeof(float) + f16v.size() * sizeof(f16) + codes.size() + scales.size() * sizeof(float) +
         mins.size() * sizeof(float);
}

void WeightMatrix::check() const {
  const auto expect = [&](size_t got, int64_t want, const char* what) {
    if (got != static_cast<size_t>(want))
      fail(ErrorKind::internal, "weight matrix ", describe(), ": ", what, " has ", got, " entries, expected ", want);
  };
  if (rows <= 0 || cols <= 0) fail(ErrorKind::internal, "weight matrix with shape [", rows, " x ", cols, "]");
  switch (format) {
    case MatrixFormat::f32: expect(f32.size(), rows * cols, "f32"); break;
    case MatrixFormat::f16: expect(f16v.size(), rows * cols, "f16"); break;
    case MatrixFormat::w4:
      if (group_size <= 0 || group_size % kW4BlockCols != 0 || cols % group_size != 0)
        fail(ErrorKind::internal, "w4 matrix ", describe(), ": bad group size");
      expect(codes.size(), rows * cols / 2, "codes");
      expect(scales.size(), rows * groups_per_row(), "scales");
      expect(mins.size(), rows * groups_per_row(), "mins");
      break;
    case MatrixFormat::q8:
      if (group_size != kQ8BlockCols || cols % kQ8BlockCols != 0)
        fail(ErrorKind::internal, "q8 matrix ", describe(), ": bad group size");
      expect(codes.size(), rows * cols, "codes");
      expect(scales.size(), rows * groups_per_row(), "scales");
      break;
  }
}

std::string WeightMatrix::describe() const {
  std::ostringstream s;
  s << matrix_format_name(format) << " [" << rows << " x " << cols << "]";
  if (format == MatrixFormat::w4) s << " g" << group_size;
  return s.str();
}

void WeightMatrix::dequant_row(int64_t r, float* out) const {
  switch (format) {
    case MatrixFormat::f32:
      std::memcpy(out, f32.data() + r * cols, static_cast<size_t>(cols) * sizeof(float));
      return;
    case MatrixFormat::f16: {
      const f16* src = f16v.data() + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = f16_to_float(src[c]);
      return;
    }
    case MatrixFormat::w4: {
      const uint8_t* row = codes.data() + r * (cols / 2);
      const int64_t G = groups_per_row();
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t block = c / kW4BlockCols, j = c % kW4BlockCols;
        const uint8_t byte = row[block * 16 + (j & 15)];
        const int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
        const int64_t g = r * G + c / group_size;
        out[c] = scales[g] * static_cast<float>(q) + mins[g];
      }
      return;
    }
    case MatrixFormat::q8: {
      const uint8_t* row = codes.data() + r * cols;
      const int64_t G = groups_per_row();
      for (int64_t c = 0; c < cols; ++c)
        out[c] = scales[r * G + c / kQ8BlockCols] * static_cast<float>(static_cast<int8_t>(row[c]));
      return;
    }
  }
}

namespace {

float view_element(const TensorView& w, int64_t r, int64_t c) {
  const int64_t off = r * w.strides[0] + c * w.strides[1];
  switch (w.dtype) {
    case DType::f32: return static_cast<const float*>(w.data)[off];
    case DType::f16: return f16_to_float(static_cast<const f16*>(w.data)[off]);
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(w.data)[off]);
    default: break;
  }
  fail(ErrorKind::internal, "view_element on ", dtype_name(w.dtype));
}

void check_dense_view(const TensorView& w) {
  if (w.device != Device::cpu || w.rank != 2 ||
      (w.dtype != DType::f32 && w.dtype != DType::f16 && w.dtype != DType::bf16))
    fail_argument("weight", w.shape_string(), "a 2-D f32/f16/bf16 CPU tensor");
}

}  // namespace

WeightMatrix WeightMatrix::from_dense(const TensorView& w, bool widen) {
  check_dense_view(w);
  WeightMatrix m;
  m.rows = w.shape[0];
  m.cols = w.shape[1];
  const size_t n = static_cast<size_t>(m.rows * m.cols);
  if (w.dtype == DType::f16 && !widen) {
    m.format = MatrixFormat::f16;
    m.f16v.resize(n);
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c)
        m.f16v[static_cast<size_t>(r * m.cols + c)] =
            static_cast<const f16*>(w.data)[r * w.strides[0] + c * w.strides[1]];
  } else {
    m.format = MatrixFormat::f32;
    m.f32.resize(n);
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) m.f32[static_cast<size_t>(r * m.cols + c)] = view_element(w, r, c);
  }
  return m;
}

WeightMatrix WeightMatrix::from_floats(int64_t rows, int64_t cols, std::vector<float> values) {
  LOWBIT_CHECK_ARG(rows > 0 && cols > 0 && values.size() == static_cast<size_t>(rows * cols), "values",
                   values.size(), "rows * cols floats");
  WeightMatrix m;
  m.format = MatrixFormat::f32;
  m.rows = rows;
  m.cols = cols;
  m.f32 = std::move(values);
  return m;
}

WeightMatrix WeightMatrix::from_quantized(const formats::QuantizedLinear& layer) {
  layer.validate();
  if (!layer.has_trivial_g_idx())
    fail(ErrorKind::unsupported, "4-bit layer ", layer.describe(),
         ": act-order (g_idx) layers have no w4 CPU layout; they are dequantized instead");
  if (layer.K % kW4BlockCols != 0)
    fail(ErrorKind::unsupported, "4-bit layer ", layer.describe(), ": in_features must be a multiple of 32");
  const int group = layer.group_size == -1 ? static_cast<int>(layer.K) : layer.group_size;
  if (group % kW4BlockCols != 0)
    fail(ErrorKind::unsupported, "4-bit layer ", layer.describe(), ": group size must be a multiple of 32");
  WeightMatrix m;
  m.format = MatrixFormat::w4;
  m.rows = layer.N;
  m.cols = layer.K;
  m.group_size = group;
  const int64_t G = m.groups_per_row();
  m.codes.assign(static_cast<size_t>(m.rows * m.cols / 2), 0);
  m.scales.resize(static_cast<size_t>(m.rows * G));
  m.mins.resize(static_cast<size_t>(m.rows * G));
  parallel_for(0, m.rows, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      uint8_t* row = m.codes.data() + n * (m.cols / 2);
      for (int64_t k = 0; k < m.cols; ++k) {
        const uint8_t q = layer.codes[static_cast<size_t>(k * layer.N + n)];
        const int64_t block = k / kW4BlockCols, j = k % kW4BlockCols;
        uint8_t& byte = row[block * 16 + (j & 15)];
        byte = static_cast<uint8_t>(j < 16 ? (byte & 0xF0) | q : (byte & 0x0F) | (q << 4));
      }
      for (int64_t g = 0; g < G; ++g) {
        m.scales[static_cast<size_t>(n * G + g)] = f16_to_float(layer.scales[static_cast<size_t>(g * layer.N + n)]);
        m.mins[static_cast<size_t>(n * G + g)] = layer.offset(g, n);
      }
    }
  });
  return m;
}

WeightMatrix WeightMatrix::quantize_w4(const TensorView& w, int group_size) {
  check_dense_view(w);
  const int64_t K = w.shape[1];
  int group = group_size;
  if (group <= 0 || K % group != 0) {
    group = 0;
    for (int g : {128, 64, 32})
      if (K % g == 0) { group = g; break; }
    if (group == 0)
      fail(ErrorKind::unsupported, "cannot quantize a weight of shape ", w.shape_string(),
           " to w4: in_features is not a multiple of 32");
  }
  formats::RtnOptions options;
  options.group_size = group;
  options.zero_point = formats::ZeroPoint::integer;
  return from_quantized(formats::quantize_rtn(w, formats::WeightOrientation::out_in, options));
}

formats::QuantizedLinear WeightMatrix::to_quantized() const {
  if (format != MatrixFormat::w4) fail(ErrorKind::invalid_argument, "to_quantized on a ", describe(), " matrix");
  formats::QuantizedLinear q = formats::QuantizedLinear::allocate(
      cols, rows, group_size == cols && !formats::is_supported_group_size(group_size) ? -1 : group_size,
      formats::ZeroPoint::float_min);
  const int64_t G = groups_per_row();
  if (q.num_groups() != G) fail(ErrorKind::unsupported, "to_quantized: group size ", group_size, " has no canonical form");
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t* row = codes.data() + n * (cols / 2);
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t block = k / kW4BlockCols, j = k % kW4BlockCols;
      const uint8_t byte = row[block * 16 + (j & 15)];
      q.codes[static_cast<size_t>(k * rows + n)] = static_cast<uint8_t>(j < 16 ? (byte & 0x0F) : (byte >> 4));
    }
    for (int64_t g = 0; g < G; ++g) {
      q.scales[static_cast<size_t>(g * rows + n)] = float_to_f16(scales[static_cast<size_t>(n * G + g)]);
      q.mins[static_cast<size_t>(g * rows + n)] = mins[static_cast<size_t>(n * G + g)];
    }
  }
  return q;
}

// ---- the model's weights --------------------------------------------------------

namespace {

template <typename Fn>
void for_each_matrix(const ModelWeights& w, Fn&& fn) {
  fn(w.embed, "embed");
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) fn(*m, "layer");
  }
  if (w.lm_head) fn(*w.lm_head, "lm_head");
}

size_t vec_bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

size_t layer_vector_bytes(const LayerWeights& L) {
  return vec_bytes(L.attn_norm) + vec_bytes(L.ffn_norm) + vec_bytes(L.q_norm) + vec_bytes(L.k_norm) +
         vec_bytes(L.q_bias) + vec_bytes(L.k_bias) + vec_bytes(L.v_bias);
}

}  // namespace

size_t ModelWeights::nbytes() const {
  size_t total = vec_bytes(final_norm);
  for_each_matrix(*this, [&](const WeightMatrix& m, const char*) { total += m.nbytes(); });
  for (const LayerWeights& L : layers) total += layer_vector_bytes(L);
  return total;
}

size_t ModelWeights::bytes_per_token() const {
  size_t total = vec_bytes(final_norm) + output().nbytes();
  for (const LayerWeights& L : layers) {
    total += layer_vector_bytes(L);
    for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) total += m->nbytes();
  }
  return total;
}

void ModelWeights::check(const ModelConfig& c) const {
  const auto shape = [](const WeightMatrix& m, int64_t rows, int64_t cols, const std::string& name) {
    m.check();
    if (m.rows != rows || m.cols != cols)
      fail(ErrorKind::format, "weight ", name, " has shape [", m.rows, " x ", m.cols, "], expected [", rows, " x ",
           cols, "] from the model config");
  };
  const auto vec = [](const std::vector<float>& v, int64_t n, const std::string& name) {
    if (v.size() != static_cast<size_t>(n))
      fail(ErrorKind::format, "weight ", name, " has ", v.size(), " entries, expected ", n, " from the model config");
  };
  shape(embed, c.vocab, c.hidden, "embed");
  if (lm_head) shape(*lm_head, c.vocab, c.hidden, "lm_head");
  vec(final_norm, c.hidden, "final_norm");
  if (layers.size() != static_cast<size_t>(c.num_layers))
    fail(ErrorKind::format, "model has ", layers.size(), " layers, the config says ", c.num_layers);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& L = layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    vec(L.attn_norm, c.hidden, p + "attn_norm");
    vec(L.ffn_norm, c.hidden, p + "ffn_norm");
    if (c.qk_norm) {
      vec(L.q_norm, c.head_dim, p + "q_norm");
      vec(L.k_norm, c.head_dim, p + "k_norm");
    }
    if (c.attention_bias) {
      vec(L.q_bias, c.q_dim(), p + "q_bias");
      vec(L.k_bias, c.kv_dim(), p + "k_bias");
      vec(L.v_bias, c.kv_dim(), p + "v_bias");
    }
    shape(L.wq, c.q_dim(), c.hidden, p + "wq");
    shape(L.wk, c.kv_dim(), c.hidden, p + "wk");
    shape(L.wv, c.kv_dim(), c.hidden, p + "wv");
    shape(L.wo, c.hidden, c.q_dim(), p + "wo");
    shape(L.w_gate, c.intermediate, c.hidden, p + "w_gate");
    shape(L.w_up, c.intermediate, c.hidden, p + "w_up");
    shape(L.w_down, c.hidden, c.intermediate, p + "w_down");
  }
}

std::string ModelWeights::format_summary() const {
  std::map<std::string, int> counts;
  for_each_matrix(*this, [&](const WeightMatrix& m, const char*) {
    std::string key = matrix_format_name(m.format);
    if (m.format == MatrixFormat::w4) key += " g" + std::to_string(m.group_size);
    ++counts[key];
  });
  std::ostringstream s;
  bool first = true;
  for (const auto& [k, v] : counts) {
    s << (first ? "" : ", ") << v << " x " << k;
    first = false;
  }
  return s.str();
}

Model load_model(const std::filesystem::path& path, const LoadOptions& options) {
  if (path.extension() == ".gguf") return load_gguf_model(path, options);
  return load_hf_model(path, options);
}

// ---- random models ------------------------------------------------------------------

Model make_random_model(const ModelConfig& config, uint64_t seed, WeightMode weights, float scale) {
  config.validate();
  Model model;
  model.config = config;
  model.source_format = "random";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random_vec = [&](int64_t n, float s, float center) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = center + s * normal(rng);
    return v;
  };
  const auto matrix = [&](int64_t rows, int64_t cols, bool linear) {
    std::vector<float> v = random_vec(rows * cols, scale, 0.0f);
    if (linear && weights == WeightMode::w4) {
      const TensorView view = TensorView::contiguous(v.data(), DType::f32, {rows, cols});
      return WeightMatrix::quantize_w4(view);
    }
    return WeightMatrix::from_floats(rows, cols, std::move(v));
  };
  const ModelConfig& c = config;
  model.weights.embed = matrix(c.vocab, c.hidden, false);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights L;
    L.attn_norm = random_vec(c.hidden, 0.1f, 1.0f);
    L.ffn_norm = random_vec(c.hidden, 0.1f, 1.0f);
    if (c.qk_norm) {
      L.q_norm = random_vec(c.head_dim, 0.1f, 1.0f);
      L.k_norm = random_vec(c.head_dim, 0.1f, 1.0f);
    }
    if (c.attention_bias) {
      L.q_bias = random_vec(c.q_dim(), scale, 0.0f);
      L.k_bias = random_vec(c.kv_dim(), scale, 0.0f);
      L.v_bias = random_vec(c.kv_dim(), scale, 0.0f);
    }
    L.wq = matrix(c.q_dim(), c.hidden, true);
    L.wk = matrix(c.kv_dim(), c.hidden, true);
    L.wv = matrix(c.kv_dim(), c.hidden, true);
    L.wo = matrix(c.hidden, c.q_dim(), true);
    L.w_gate = matrix(c.intermediate, c.hidden, true);
    L.w_up = matrix(c.intermediate, c.hidden, true);
    L.w_down = matrix(c.hidden, c.intermediate, true);
    model.weights.layers.push_back(std::move(L));
  }
  model.weights.final_norm = random_vec(c.hidden, 0.1f, 1.0f);
  if (!c.tied_embeddings) model.weights.lm_head = matrix(c.vocab, c.hidden, false);
  model.weights.check(config);
  return model;
}

}  // namespace lowbit::engine
