// lowbit's own entropy-coded container: rANS streams interleaved for a GPU
// warp, so that a fused decode + matrix-vector kernel can keep 32 lanes busy
// on one shared, coalesced word stream. docs/ans-formats.md has the
// byte-by-byte description and the reasons behind each choice.
//
// Format facts this code relies on (little-endian, version 1):
//   * file header, 64 bytes: magic 89 4C 42 41 4E 53 0D 0A ("\x89LBANS\r\n") |
//     version u16 = 1 | header_bytes u16 = 64 | flags u32 (bit 0: result_hash
//     present) | K u32 | N_0 u32 | result_hash u32 | reserved u32 | file_bytes
//     u64 | directory_offset u64 | reserved u64 | header_crc u32 | reserved u32;
//     then v_0 i8[N_0] zero-padded to 16 bytes; then the directory, K entries
//     of 32 bytes: section offset u64 | section bytes u64 | section crc u32 |
//     reserved u32[3]. header_crc is the CRC-32 (checksum.h) of bytes [0, 56)
//     followed by bytes [64, end of the directory). Reserved fields are zero.
//   * matrix k's section starts at the next multiple of 256 after the
//     directory or the previous section (zero bytes between), so each section
//     can be copied to the GPU as is and keeps its 16-byte alignments there.
//     Section header, 64 bytes: rows u32 | cols u32 | delta f32 | precision u8
//     (P, 1..15) | states_per_lane u8 (k in {1, 2, 4, 8}) | w_min i8 |
//     scale_kind u8 (chain.h) | grid_size u16 (n, 1..256) | reserved u16 |
//     rows_per_tile u32 (R, 1..min(rows, 65536)) | tiles u32 (T = ceil(rows / R)) | group_size u32 |
//     payload_bytes u64 | reserved u8[24]. Then, each starting at a multiple of
//     16 from the section start, zero-padded: freq u16[n] (sum 2^P) |
//     scales f32[0, rows, or rows * ceil(cols / group_size)] |
//     tile_offsets u32[T + 1] (16-byte units from the payload start;
//     [0] = 0, [T] = payload_bytes / 16) | payload.
//   * tile t holds rows [tR, min(rows, (t+1)R)) and S = 32k rANS streams
//     (rans.h, precision P). Its bytes: states u32[S], the decoder's initial
//     state of stream s = 32m + lane (lane 0..31, slot m 0..k-1); then the
//     tile's shared word stream u16[] in the order the decoder reads it; then
//     zeros to a multiple of 16 bytes.
//   * decoding order, which fixes both the stream of every weight and the
//     order of the word reads: quads g of 4 columns [4g, 4g + 4) (the last may
//     be partial), Q = ceil(cols / 4), blocks of S quads, B = ceil(Q / S);
//     for each row of the tile, each block b, each position p in 0..3, each
//     slot m, each lane l: stream s = 32m + l decodes the weight at column
//     4(bS + s) + p, if that column exists, then reads the tile's next word
//     if its state is below 2^16. In a warp: lane l handles quad bS + 32m + l
//     (4 consecutive weights for one dp4a against 4 consecutive activations,
//     coalesced across lanes), and the lanes that need a word take
//     consecutive words in lane order (ballot + popc).
//   * every stream of a tile ends at the state 2^16 and the words end within
//     the tile's last 16 bytes: readers check both.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "lowbit/ans/chain.h"
#include "lowbit/ans/entropy_model.h"

namespace lowbit::ans {

inline constexpr uint8_t kLowbitMagic[8] = {0x89, 'L', 'B', 'A', 'N', 'S', '\r', '\n'};
inline constexpr uint16_t kLowbitVersion = 1;
inline constexpr int kLowbitLanes = 32;          // one warp
inline constexpr int kLowbitQuad = 4;            // consecutive columns per lane visit (one dp4a)
inline constexpr uint64_t kLowbitSectionAlign = 256;
inline constexpr uint64_t kLowbitArrayAlign = 16;
// A tile is one warp's work; capping its rows keeps the GPU's parallelism
// (many tiles) and bounds what a small file can make a reader allocate (each
// tile costs at least its 128-byte states, so rows <= 512 x the file's bytes).
inline constexpr int64_t kLowbitMaxRowsPerTile = 65536;

// Each stream costs its 32-bit state (about 16-32 bits of real overhead), so
// the automatic stream length spends at most this share of the codes'
// entropy on states: symbols per stream >= 32 / (share * H), and at least
// kLowbitMinAutoSymbolsPerStream (1024: 0.03 bits per weight), at most
// kLowbitMaxAutoSymbolsPerStream. Shorter streams mean more independent
// streams (GPU parallelism) at a higher size cost: the options override it.
inline constexpr double kLowbitAutoStateShare = 0.004;
inline constexpr int64_t kLowbitMinAutoSymbolsPerStream = 1024;
inline constexpr int64_t kLowbitMaxAutoSymbolsPerStream = 8192;

struct LowbitOptions {
  int precision = 12;            // P of the frequency model
  int states_per_lane = 1;       // k: streams per tile S = 32k (1, 2, 4 or 8)
  int64_t rows_per_tile = 0;     // R (<= 65536); 0 picks the smallest R giving >= the target below
  int64_t target_symbols_per_stream = 0;  // 0: automatic from the entropy (see above)
};

struct LowbitMatrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  float delta = 1.0f;
  int precision = 12;
  int states_per_lane = 1;
  int w_min = 0;
  std::vector<uint16_t> freq;  // grid_size entries, sum 2^P
  ScaleKind scale_kind = ScaleKind::none;
  uint32_t group_size = 0;
  std::vector<float> scales;
  uint32_t rows_per_tile = 1;
  std::vector<uint32_t> tile_offsets;  // tiles + 1 entries, 16-byte units
  std::vector<uint8_t> payload;

  int streams_per_tile() const { return kLowbitLanes * states_per_lane; }
  uint32_t tiles() const { return static_cast<uint32_t>(tile_offsets.size()) - 1; }
  FreqModel model() const;
  // Bytes of the section (header, tables, payload), without the alignment to 256 after it.
  uint64_t section_bytes() const;
};

struct LowbitFile {
  std::vector<int8_t> v0;
  std::optional<uint32_t> result_hash;
  std::vector<LowbitMatrix> matrices;
};

struct LowbitReadOptions {
  // Off only for fuzzing and tests that corrupt single fields on purpose and
  // want the field's own check to report it.
  bool verify_checksums = true;
};

// Parses and checks a whole file (header, checksums, every section field,
// table sums, tile offsets, canonical placement). Throws Error(format) naming
// `where`, the matrix, the field, its value and what was expected, and
// Error(unsupported) for a newer format version. The payload is checked when
// decoded.
LowbitFile parse_lowbit_file(std::span<const uint8_t> bytes, std::string_view where,
                             const LowbitReadOptions& options = {});
std::vector<uint8_t> serialize_lowbit_file(const LowbitFile& file);

// Encodes with a `options.precision`-bit model of the codes (build_freq_model),
// multithreaded over tiles (the bytes do not depend on the thread count).
// Throws Error(invalid_argument) naming a bad option.
LowbitMatrix encode_lowbit_matrix(const Int8Matrix& m, const LowbitOptions& options = {});
// A whole chain; keeps chain.result_hash when set, else computes it.
LowbitFile encode_lowbit_file(const Chain& chain, const LowbitOptions& options = {});

// The reference decoder. Throws Error(format) naming `where`, the tile and the
// problem when the payload is corrupt (a read past the tile, a stream not
// ending at 2^16, words left over, non-zero padding). `words_read`, when
// given, receives the number of u16 words the tiles' streams hold (the rest
// of the payload is states and padding).
Int8Matrix decode_lowbit_matrix(const LowbitMatrix& m, std::string_view where, uint64_t* words_read = nullptr);
// y = W v, decoding on the fly, tile by tile (multithreaded). Same checks.
void lowbit_matvec(const LowbitMatrix& m, std::span<const int8_t> v, std::span<int64_t> y, std::string_view where);
Chain decode_lowbit_file(const LowbitFile& file, std::string_view where);

// R as encode_lowbit_matrix picks it for `options` and codes of entropy
// `entropy_bits` per symbol (used only by the automatic stream length).
int64_t lowbit_rows_per_tile(int64_t rows, int64_t cols, const LowbitOptions& options, double entropy_bits);

}  // namespace lowbit::ans
