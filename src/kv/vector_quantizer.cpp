#include "lowbit/kv/vector_quantizer.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "span_checks.h"

namespace lowbit::kv {

const char* kv_format_name(KvFormat format) {
  switch (format) {
    case KvFormat::tq4:
      return "tq4";
    case KvFormat::tq3:
      return "tq3";
    case KvFormat::tq2:
      return "tq2";
    case KvFormat::fp16:
      return "fp16";
  }
  return "?";
}

std::optional<KvFormat> parse_kv_format(std::string_view name) {
  for (KvFormat f : {KvFormat::tq4, KvFormat::tq3, KvFormat::tq2, KvFormat::fp16})
    if (name == kv_format_name(f)) return f;
  return std::nullopt;
}

int kv_format_bits(KvFormat format) {
  switch (format) {
    case KvFormat::tq4:
      return 4;
    case KvFormat::tq3:
      return 3;
    case KvFormat::tq2:
      return 2;
    case KvFormat::fp16:
      return 16;
  }
  return 0;
}

bool is_quantized(KvFormat format) { return format != KvFormat::fp16; }

const char* scale_dtype_name(ScaleDType dtype) { return dtype == ScaleDType::f32 ? "f32" : "f16"; }

std::optional<ScaleDType> parse_scale_dtype(std::string_view name) {
  if (name == "f16") return ScaleDType::f16;
  if (name == "f32") return ScaleDType::f32;
  return std::nullopt;
}

size_t scale_dtype_bytes(ScaleDType dtype) { return dtype == ScaleDType::f32 ? 4 : 2; }

void check_kv_head_dim(int dim, RotationKind rotation, std::string_view name) {
  LOWBIT_CHECK_ARG(dim >= kKvDimMultiple && dim <= kMaxKvDim && dim % kKvDimMultiple == 0, name, dim,
                   "a multiple of 32 in [32, 1024] (whole 4-byte words of packed indices per row)");
  if (rotation == RotationKind::hadamard)
    LOWBIT_CHECK_ARG(std::has_single_bit(static_cast<unsigned>(dim)), name, dim,
                     "a power of two for the hadamard rotation (or use the haar rotation)");
}

namespace {

void check_bits(int bits) { LOWBIT_CHECK_ARG(bits >= 2 && bits <= 4, "bits", bits, "2, 3 or 4"); }

}  // namespace

size_t packed_index_bytes(int bits, int dim) {
  check_bits(bits);
  LOWBIT_CHECK_ARG(dim >= 8 && dim % 8 == 0, "dim", dim, "a positive multiple of 8");
  return static_cast<size_t>(dim) * static_cast<size_t>(bits) / 8;
}

void pack_indices(int bits, std::span<const uint8_t> indices, std::span<uint8_t> packed) {
  const int dim = static_cast<int>(indices.size());
  const size_t bytes = packed_index_bytes(bits, dim);
  detail::check_span_size("packed", packed.size(), bytes,
                          "dim * bits / 8 = " + std::to_string(dim) + " * " + std::to_string(bits) + " / 8");
  const unsigned limit = 1u << bits;
  for (size_t j = 0; j < indices.size(); ++j)
    if (indices[j] >= limit)
      fail(ErrorKind::invalid_argument, "invalid argument 'indices': indices[", j,
           "] = ", static_cast<int>(indices[j]), ": expected below 2^bits = ", limit);
  std::memset(packed.data(), 0, bytes);
  const size_t d = indices.size();
  if (bits == 4) {
    for (size_t j = 0; j < d; ++j) packed[j / 2] |= static_cast<uint8_t>(indices[j] << (4 * (j % 2)));
    return;
  }
  // 2 bits, and the low plane of 3 bits.
  for (size_t j = 0; j < d; ++j) packed[j / 4] |= static_cast<uint8_t>((indices[j] & 3u) << (2 * (j % 4)));
  if (bits == 3) {
    uint8_t* high = packed.data() + d / 4;
    for (size_t j = 0; j < d; ++j) high[j / 8] |= static_cast<uint8_t>(((indices[j] >> 2) & 1u) << (j % 8));
  }
}

void unpack_indices(int bits, std::span<const uint8_t> packed, std::span<uint8_t> indices) {
  const int dim = static_cast<int>(indices.size());
  const size_t bytes = packed_index_bytes(bits, dim);
  detail::check_span_size("packed", packed.size(), bytes,
                          "dim * bits / 8 = " + std::to_string(dim) + " * " + std::to_string(bits) + " / 8");
  const size_t d = indices.size();
  if (bits == 4) {
    for (size_t j = 0; j < d; ++j) indices[j] = static_cast<uint8_t>((packed[j / 2] >> (4 * (j % 2))) & 15u);
    return;
  }
  for (size_t j = 0; j < d; ++j) indices[j] = static_cast<uint8_t>((packed[j / 4] >> (2 * (j % 4))) & 3u);
  if (bits == 3) {
    const uint8_t* high = packed.data() + d / 4;
    for (size_t j = 0; j < d; ++j)
      indices[j] = static_cast<uint8_t>(indices[j] | (((high[j / 8] >> (j % 8)) & 1u) << 2));
  }
}

size_t kv_vector_bytes(KvFormat format, int dim, ScaleDType scale_dtype) {
  if (format == KvFormat::fp16) return 2 * static_cast<size_t>(dim);
  return packed_index_bytes(kv_format_bits(format), dim) + scale_dtype_bytes(scale_dtype);
}

VectorQuantizer::VectorQuantizer(int bits, int dim, QuantizerOptions options)
    : bits_(bits), dim_(dim), options_(options), codebook_(nullptr) {
  check_bits(bits);
  check_kv_head_dim(dim, RotationKind::haar, "dim");
  codebook_ = &cached_codebook(bits, dim, options.distribution);
}

void VectorQuantizer::quantize(const Rotation& rotation, std::span<const float> x, std::span<uint8_t> codes,
                               std::span<std::byte> scale) const {
  const size_t d = static_cast<size_t>(dim_);
  LOWBIT_CHECK_ARG(rotation.dim() == dim_, "rotation.dim()", rotation.dim(),
                   "the quantizer's dim = " + std::to_string(dim_));
  if (x.size() != d) detail::check_span_size("x", x.size(), d, "[dim " + std::to_string(dim_) + "]");
  if (codes.size() != code_bytes())
    detail::check_span_size("codes", codes.size(), code_bytes(), "packed indices");
  if (scale.size() != scale_bytes())
    detail::check_span_size("scale", scale.size(), scale_bytes(), scale_dtype_name(options_.scale_dtype));

  double sum_squares = 0.0;
  for (size_t i = 0; i < d; ++i) {
    if (!std::isfinite(x[i]))
      fail(ErrorKind::invalid_argument, "invalid argument 'x': x[", i, "] = ", x[i],
           ": expected finite K/V values");
    sum_squares += static_cast<double>(x[i]) * x[i];
  }
  const double gamma_exact = std::sqrt(sum_squares);
  if (gamma_exact > std::numeric_limits<float>::max())
    fail(ErrorKind::invalid_argument, "invalid argument 'x': its norm ", gamma_exact,
         " exceeds fp32's range: expected K/V vectors of norm below 3.4e38");
  const float gamma = static_cast<float>(gamma_exact);

  float y[kMaxKvDim];
  float unit[kMaxKvDim];
  const std::span<float> y_span(y, d);
  for (size_t i = 0; i < d; ++i) unit[i] = gamma > 0.0f ? x[i] / gamma : 0.0f;
  rotation.rotate(std::span<const float>(unit, d), y_span);

  const Codebook& book = *codebook_;
  uint8_t indices[kMaxKvDim];
  double centroid_norm2 = 0.0;
  for (size_t j = 0; j < d; ++j) {
    const int idx = bucketize(book.boundaries_f32, y[j]);
    indices[j] = static_cast<uint8_t>(idx);
    const double c = book.centroids_f32[static_cast<size_t>(idx)];
    centroid_norm2 += c * c;
  }
  pack_indices(bits_, std::span<const uint8_t>(indices, d), codes);

  float value = gamma;
  if (options_.renormalize && gamma > 0.0f)
    value = static_cast<float>(gamma_exact / std::sqrt(centroid_norm2));
  if (options_.scale_dtype == ScaleDType::f32) {
    std::memcpy(scale.data(), &value, 4);
    return;
  }
  const f16 stored = float_to_f16(value);
  if (std::isinf(f16_to_float(stored)))
    fail(ErrorKind::invalid_argument, "invalid argument 'x': its scale ", value,
         " exceeds f16's largest value 65504: expected K/V vectors of norm below ~65000, or "
         "scale_dtype f32");
  std::memcpy(scale.data(), &stored.bits, 2);
}

float VectorQuantizer::load_scale(std::span<const std::byte> scale) const {
  if (scale.size() != scale_bytes())
    detail::check_span_size("scale", scale.size(), scale_bytes(), scale_dtype_name(options_.scale_dtype));
  if (options_.scale_dtype == ScaleDType::f32) {
    float v;
    std::memcpy(&v, scale.data(), 4);
    return v;
  }
  f16 h;
  std::memcpy(&h.bits, scale.data(), 2);
  return f16_to_float(h);
}

void VectorQuantizer::dequantize_rotated(std::span<const uint8_t> codes, float scale,
                                         std::span<float> y) const {
  const size_t d = static_cast<size_t>(dim_);
  if (y.size() != d) detail::check_span_size("y", y.size(), d, "[dim " + std::to_string(dim_) + "]");
  uint8_t indices[kMaxKvDim];
  unpack_indices(bits_, codes, std::span<uint8_t>(indices, d));
  const std::vector<float>& c = codebook_->centroids_f32;
  for (size_t j = 0; j < d; ++j) y[j] = scale * c[indices[j]];
}

void VectorQuantizer::dequantize(const Rotation& rotation, std::span<const uint8_t> codes,
                                 std::span<const std::byte> scale, std::span<float> x) const {
  LOWBIT_CHECK_ARG(rotation.dim() == dim_, "rotation.dim()", rotation.dim(),
                   "the quantizer's dim = " + std::to_string(dim_));
  const size_t d = static_cast<size_t>(dim_);
  if (x.size() != d) detail::check_span_size("x", x.size(), d, "[dim " + std::to_string(dim_) + "]");
  float y[kMaxKvDim];
  dequantize_rotated(codes, load_scale(scale), std::span<float>(y, d));
  rotation.unrotate(std::span<const float>(y, d), x);
}

}  // namespace lowbit::kv
