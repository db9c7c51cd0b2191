// The seed's experiment in memory: a chain of K int8 matrix-vector products
// with dynamic requantization between the steps, and its plain (uncompressed)
// CPU reference.
//
// Facts this header relies on (MATVANS report section 2, the testdata README):
//   * matrix W_k has N_{k+1} rows and N_k columns; v_0 has N_0 int8 entries;
//   * y = W_k v_k is computed exactly in integers (int64 here; a GPU int32
//     accumulator is exact while N_k * 128 * 128 < 2^31, i.e. N_k <= 131071);
//   * v_{k+1} = round_half_even(127 * y / max_i |y_i|), which lies in
//     -127..127. We compute it exactly in integers; evaluating it in double
//     gives the same result (a quotient that is not a tie is at least
//     1/(2 max|y|) away from one, far more than double's rounding error) and
//     so does float32 on the conformance data. An all-zero y gives v = 0;
//   * the result hash is FxHash-style over the final vector's bytes taken as
//     unsigned: h = 0; for each byte b: h = rotl32(h, 5); h = (h ^ b) *
//     0x27220a95 mod 2^32;
//   * the chain multiplies the integer codes only: the seed's delta and any
//     per-row or per-group scales are carried for readers that dequantize, and
//     the absmax requantization would cancel a per-tensor scale anyway.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace lowbit::ans {

// How the real weights relate to the codes: w = scale * code.
enum class ScaleKind : uint8_t {
  none = 0,       // only the per-matrix delta (the seed formats)
  per_row = 1,    // scales[r], one per output channel
  per_group = 2,  // scales[r * groups + c / group_size], groups = ceil(cols / group_size)
};
const char* scale_kind_name(ScaleKind kind);

struct Int8Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  float delta = 1.0f;         // the seed formats' per-matrix grid spacing (written as 1.0 by the seed tools)
  std::vector<int8_t> data;   // row-major, rows * cols codes
  ScaleKind scale_kind = ScaleKind::none;
  int64_t group_size = 0;     // per_group only
  std::vector<float> scales;  // empty, rows, or rows * groups entries

  int8_t at(int64_t r, int64_t c) const { return data[static_cast<size_t>(r * cols + c)]; }
  int64_t scale_count() const;  // entries `scales` must have for scale_kind
};

struct Chain {
  std::vector<int8_t> v0;
  std::vector<Int8Matrix> matrices;
  std::optional<uint32_t> result_hash;  // the hash of the final vector, when the file records one
};

uint32_t fxhash32(std::span<const int8_t> v);

// v = round_half_even(127 * y / max|y|) (zeros when y is all zero).
std::vector<int8_t> requantize(std::span<const int64_t> y);

// y = W v over the codes, exactly; multithreaded over rows. Throws
// Error(invalid_argument) when v or y has the wrong length.
void matvec_int8(const Int8Matrix& w, std::span<const int8_t> v, std::span<int64_t> y);

// Throws Error(format) naming `where` unless every matrix has positive extents,
// rows * cols codes, the scales its kind needs, and columns equal to the
// previous matrix's rows (N_0 = v0.size() for the first).
void validate_chain(const Chain& chain, std::string_view where);

// Sizes m.data for rows * cols codes. A small file can describe a huge matrix
// (a one-symbol model costs no bits), so running out of memory here throws
// Error(unsupported) naming `where` and the size instead of std::bad_alloc.
void allocate_codes(Int8Matrix& m, std::string_view where);

// The final vector of the chain, from the plain int8 matrices.
std::vector<int8_t> run_chain_reference(const Chain& chain);

}  // namespace lowbit::ans
