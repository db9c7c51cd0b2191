// The seed's compressed container (MATVANS report, Table 1), read and
// written byte for byte, its encoder, and its CPU reference decoder.
//
// Format facts this code relies on (all fields little-endian; docs/ans-formats.md
// has the byte-by-byte description):
//   * file: K u32 | [result_hash u32] | S_max u32 | N_0 u32 | v_0 i8[N_0] |
//     pad u8[3 - ((N_0 + 3) mod 4)] | W_0 .. W_{K-1}.
//     result_hash (the FxHash of the chain's final vector, see chain.h) is
//     absent in the report's Table 1 and present in the files of the later
//     MATVANS tooling and the conformance data; a reader tells the two apart
//     by checking which layout accounts for the file length exactly;
//   * S_max is what the reference encoder calls the largest "compressed word
//     count": max over matrices of 2*(4 + rows) + (|G| + 4) div 2 +
//     payload_size + (payload_size mod 2), in u16 words. It leaves out the
//     256-byte ppf (an older layout had none); we write the same value and
//     keep whatever a file holds (readers must not trust it as a size);
//   * matrix: N_{k+1} u32 (rows) | N_k u32 (cols) | delta f32 | cursors
//     u32[rows] | payload_size u32 | w_min i8 | |G| u8 | cdf u8[|G|+1] |
//     pad u8[(|G|+1) mod 2] | ppf u8[256] | payload u16[payload_size] |
//     pad u8[2 * (payload_size mod 2)] (the encoder keeps matrices 4-byte aligned);
//   * cdf/ppf: the seed's 8-bit model (entropy_model.h); coder: rans.h with P = 8;
//   * row i's words are payload[cursors[i] .. cursors[i+1]) (payload_size ends
//     the last row), cursors[0] = 0. Decoding row i starts with
//     x = payload[c] << 16 | payload[c+1] and decodes columns 0..cols-1 in
//     order (Algorithm 1 of the report). The encoder pushes the row's columns
//     last to first starting from x = 2^16, then flushes x as two words, low
//     word emitted first; a row's words in the payload are its emitted words
//     reversed. So a well-formed row ends exactly at the next cursor with x = 2^16;
//   * the later MATVANS encoder (the one with result_hash; it wrote the
//     conformance files) starts its coder from the words [0, 0, 0, 1], which
//     leaves x = 2^16 and the two words [0, 0] in its bulk; they end up as the
//     last two words of the payload, after the last row's own words (and are
//     counted in payload_size and S_max). The report-era encoder started from
//     [0, 1] and has no such tail. Readers accept a last row that ends at
//     payload_size, or 2 words before it when those 2 words are zero.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lowbit/ans/chain.h"
#include "lowbit/ans/entropy_model.h"

namespace lowbit::ans {

struct SeedMatrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  float delta = 1.0f;
  std::vector<uint32_t> cursors;  // rows entries, in u16 words
  int8_t w_min = 0;
  std::vector<uint8_t> cdf;       // |G| + 1 entries, low 8 bits
  std::array<uint8_t, 256> ppf{};
  std::vector<uint16_t> payload;

  int grid_size() const { return static_cast<int>(cdf.size()) - 1; }
  // The reference encoder's word count (see S_max above).
  uint64_t reference_word_count() const;
  // Bytes this matrix takes in a file.
  uint64_t file_bytes() const;
};

struct SeedFile {
  bool has_hash = true;   // the variant with result_hash after K
  uint32_t result_hash = 0;
  uint32_t s_max = 0;
  std::vector<int8_t> v0;
  std::vector<SeedMatrix> matrices;
};

enum class SeedVariant : uint8_t { detect, with_hash, without_hash };

// Parses a whole file. Every field is checked (sizes against the file length
// before anything is allocated, zero padding, cursors, the cdf/ppf tables,
// the chain's shapes), so a truncated, corrupt or oversized file throws
// Error(format) naming `where`, the matrix, the field, its value and what was
// expected. The payload itself is checked when it is decoded. With
// SeedVariant::detect, the layout that accounts for the file's length exactly
// is taken; when both do (possible only for crafted files) the file is
// refused as ambiguous.
SeedFile parse_seed_file(std::span<const uint8_t> bytes, std::string_view where,
                         SeedVariant variant = SeedVariant::detect);
std::vector<uint8_t> serialize_seed_file(const SeedFile& file);

struct SeedEncodeOptions {
  bool with_hash = true;   // write result_hash after K (chain.result_hash if set, else computed)
  bool zero_tail = true;   // end each payload with the later encoder's two zero words
  bool drop_scales = false;  // allow per-row/per-group scaled codes (the container keeps one delta)
};
// The options that reproduce each reference encoder byte for byte: the later
// one (hash and tail) or the report-era one (neither).
inline SeedEncodeOptions seed_encoder_with_hash() { return {true, true, false}; }
inline SeedEncodeOptions seed_encoder_report_era() { return {false, false, false}; }

// Encodes one matrix with the seed's 8-bit model of its codes (multithreaded
// over rows; the bytes do not depend on the thread count). Throws
// Error(unsupported) when the codes span all 256 int8 values, and
// Error(invalid_argument) for per-row/per-group scales unless
// options.drop_scales (the container keeps one delta per matrix).
SeedMatrix encode_seed_matrix(const Int8Matrix& m, const SeedEncodeOptions& options = {});
// A whole chain, with S_max as the reference computes it.
SeedFile encode_seed_file(const Chain& chain, const SeedEncodeOptions& options = {});

// Decodes with Algorithm 1 (the cdf and ppf tables, 8-bit quantiles). Throws
// Error(format) naming `where`, the row and what went wrong when the payload
// is corrupt: a row that would read past its words, or that does not end
// exactly at the next cursor with the state 2^16.
Int8Matrix decode_seed_matrix(const SeedMatrix& m, std::string_view where);
// y = W v, decoding on the fly (fused, no decoded matrix in memory). Same checks.
void seed_matvec(const SeedMatrix& m, std::span<const int8_t> v, std::span<int64_t> y, std::string_view where);
Chain decode_seed_file(const SeedFile& file, std::string_view where);

// The 8-bit model stored in the matrix (checked; see model_from_seed_tables).
FreqModel seed_matrix_model(const SeedMatrix& m, std::string_view where);

}  // namespace lowbit::ans
