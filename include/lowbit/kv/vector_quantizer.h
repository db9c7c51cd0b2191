// TurboQuant (MSE variant) quantization of one K or V head vector: a norm,
// a random rotation and a Lloyd-Max scalar codebook per coordinate; plus the
// bit packing of the indices, which is the cache's storage format.
//
// Quantize x (d floats, original domain), all in fp32 unless said:
//  1. gamma = ||x|| (sum of squares in double, rounded to fp32 once);
//  2. x^ = x / gamma;  3. y = x^ @ M (rotation.h);
//  4. idx_j = number of codebook boundaries b with y_j >= b (fp32 compares;
//     a y_j exactly on a boundary takes the upper cell);
//  5. scale = gamma, or, with renormalize, gamma / ||c[idx]|| (the norm of the
//     gathered centroid vector, in double). The TurboQuant NPU design divides
//     by ||c[idx]|| at dequantization, once per cached token per decode step;
//     folding it into the stored scale gives the same vector for one division
//     per token at write time, and makes the reconstruction's norm exactly
//     gamma (up to the scale's rounding), which keeps attention logits unbiased;
//  6. scale stored as f16 (round to nearest even) or f32. A zero vector stores
//     scale 0 (and the indices of y = 0); a non-finite x or a scale beyond
//     f16's 65504 throws.
// Dequantize: y~_j = scale * c[idx_j] (the rotated domain, where attention
// works) and x~ = y~ @ M^T.
//
// Packed index layouts (little-endian bytes; dim is a multiple of 32, so every
// row is a whole number of 4-byte words and a page of 16 rows a whole number
// of 16-byte vectors):
//  - 4 bits: byte j = idx[2j] | idx[2j+1] << 4. A 16-byte load holds 32
//    consecutive coordinates; d = 128 is 64 bytes = 4 x 16-byte loads.
//  - 2 bits: byte j = idx[4j] | idx[4j+1] << 2 | idx[4j+2] << 4 | idx[4j+3] << 6.
//    A 16-byte load holds 64 coordinates; d = 128 is 32 bytes.
//  - 3 bits: a 2-bit plane then a 1-bit plane. Bytes [0, d/4) hold the low
//    two bits of every index exactly as the 2-bit layout; bytes [d/4, 3d/8)
//    hold bit 2: byte d/4 + j has bit k = bit 2 of idx[8j+k]. Each plane is
//    whole 16-byte vectors at d = 128 (2 + 1), and a kernel decodes the low
//    plane with the 2-bit code path; d = 128 is 48 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "lowbit/kv/codebook.h"
#include "lowbit/kv/rotation.h"

namespace lowbit::kv {

// How a K or V head vector is stored in the cache.
enum class KvFormat : uint8_t {
  tq4,   // 4-bit TurboQuant indices + one scale
  tq3,   // 3-bit
  tq2,   // 2-bit
  fp16,  // pass-through: the original vector as IEEE binary16, no rotation, no scale
};
const char* kv_format_name(KvFormat format);  // "tq4", "tq3", "tq2", "fp16"
std::optional<KvFormat> parse_kv_format(std::string_view name);
int kv_format_bits(KvFormat format);  // 4, 3, 2, or 16 for fp16
bool is_quantized(KvFormat format);   // every format but fp16

enum class ScaleDType : uint8_t { f16, f32 };
const char* scale_dtype_name(ScaleDType dtype);  // "f16", "f32"
std::optional<ScaleDType> parse_scale_dtype(std::string_view name);
size_t scale_dtype_bytes(ScaleDType dtype);  // 2, 4

inline constexpr int kKvDimMultiple = 32;
inline constexpr int kMaxKvDim = 1024;

// Checks a head dimension for the KV cache: a multiple of 32 in [32, 1024]
// (and a power of two for hadamard). Throws Error(invalid_argument) naming `name`.
void check_kv_head_dim(int dim, RotationKind rotation, std::string_view name = "head_dim");

// Bytes of one packed row of `dim` indices of `bits` (2, 3, 4) bits: dim * bits / 8.
size_t packed_index_bytes(int bits, int dim);
// Packs indices (each < 2^bits; dim = indices.size() a multiple of 8) into
// packed (packed_index_bytes(bits, dim) bytes) in the layout above, and back.
void pack_indices(int bits, std::span<const uint8_t> indices, std::span<uint8_t> packed);
void unpack_indices(int bits, std::span<const uint8_t> packed, std::span<uint8_t> indices);

// Bytes one K or V head vector takes in the cache: packed indices + scale, or
// 2 * dim for fp16.
size_t kv_vector_bytes(KvFormat format, int dim, ScaleDType scale_dtype);

struct QuantizerOptions {
  ScaleDType scale_dtype = ScaleDType::f16;
  bool renormalize = true;  // scale = gamma / ||c[idx]|| (see step 5 above)
  CoordinateDistribution distribution = CoordinateDistribution::gaussian;
};

class VectorQuantizer {
 public:
  // bits 2, 3 or 4; dim a multiple of 32 in [32, 1024]. Throws
  // Error(invalid_argument) naming 'bits' or 'dim'.
  VectorQuantizer(int bits, int dim, QuantizerOptions options = {});

  int bits() const { return bits_; }
  int dim() const { return dim_; }
  const QuantizerOptions& options() const { return options_; }
  const Codebook& codebook() const { return *codebook_; }
  size_t code_bytes() const { return packed_index_bytes(bits_, dim_); }
  size_t scale_bytes() const { return scale_dtype_bytes(options_.scale_dtype); }

  // x: dim floats; codes: code_bytes(); scale: scale_bytes(). rotation.dim() must be dim.
  void quantize(const Rotation& rotation, std::span<const float> x, std::span<uint8_t> codes,
                std::span<std::byte> scale) const;
  float load_scale(std::span<const std::byte> scale) const;
  // y = scale * c[idx]: the rotated-domain reconstruction.
  void dequantize_rotated(std::span<const uint8_t> codes, float scale, std::span<float> y) const;
  // x~ = (scale * c[idx]) @ M^T.
  void dequantize(const Rotation& rotation, std::span<const uint8_t> codes, std::span<const std::byte> scale,
                  std::span<float> x) const;

 private:
  int bits_, dim_;
  QuantizerOptions options_;
  const Codebook* codebook_;
};

}  // namespace lowbit::kv
