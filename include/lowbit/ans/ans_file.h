// The three ans containers behind one interface: detection, reading and
// writing files, conversion, the chain run on the CPU, and the size
// statistics `lowbit ans inspect` prints.
//
// Facts this header relies on:
//   * containers (docs/ans-formats.md): "seed" (MATVANS Table 1 with the
//     result hash after K, as the later MATVANS tooling and the conformance
//     files), "seed-nohash" (Table 1 exactly), "baseline" (appendix A,
//     column-major), "baseline-rowmajor" (appendix A's layout with row-major
//     codes, as create_matfiles.py writes), "lowbit" (lowbit_format.h);
//   * detection: a lowbit file starts with its magic; otherwise the seed
//     layouts (with and without the hash) and then the baseline layout are
//     tried, and the first that accounts for the whole file exactly wins. The
//     two baseline orders cannot be told apart, so the order is the caller's
//     (ReadOptions::baseline_order, column-major unless told);
//   * the chain run multiplies the integer codes (chain.h) and decodes the
//     compressed containers on the fly (fused decode + matrix-vector product,
//     no decoded matrix in memory).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lowbit/ans/baseline_format.h"
#include "lowbit/ans/chain.h"
#include "lowbit/ans/lowbit_format.h"
#include "lowbit/ans/seed_format.h"

namespace lowbit::ans {

enum class Container : uint8_t { seed, seed_nohash, baseline, baseline_rowmajor, lowbit };
const char* container_name(Container c);  // "seed", "seed-nohash", "baseline", "baseline-rowmajor", "lowbit"
std::optional<Container> parse_container(std::string_view name);

using AnsFile = std::variant<SeedFile, BaselineFile, LowbitFile>;
Container container_of(const AnsFile& file);

struct ReadOptions {
  std::optional<Container> container;  // skip detection (baseline orders: as named here)
  BaselineOrder baseline_order = BaselineOrder::column_major;  // for detected baseline files
  bool verify_checksums = true;        // lowbit files
};

// Parses bytes (see detection above). A file that fits no container throws
// Error(format) naming `where` and why each container refused it.
AnsFile parse_ans_file(std::span<const uint8_t> bytes, std::string_view where, const ReadOptions& options = {});
// Reads `path` whole (Error(io) naming it when the system refuses) and parses it.
AnsFile read_ans_file(const std::filesystem::path& path, const ReadOptions& options = {});

// Bytes of the file; `drop_scales` allows writing per-row/per-group scaled
// codes into the seed and baseline containers, which cannot hold the scales.
std::vector<uint8_t> serialize_ans_file(const AnsFile& file, bool drop_scales = false);
// Writes atomically (a temporary file next to `path`, renamed over it), so a
// failure leaves no partial file behind.
void write_ans_file(const std::filesystem::path& path, const AnsFile& file, bool drop_scales = false);
void write_bytes_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes);

// All the codes, decoded (and checked).
Chain decode_ans_file(const AnsFile& file, std::string_view where);

struct EncodeOptions {
  Container container = Container::lowbit;
  LowbitOptions lowbit;     // for Container::lowbit
  bool drop_scales = false; // for the seed containers
};
// Encodes a chain (its result_hash is kept, or computed for the containers that store one).
AnsFile encode_ans_file(const Chain& chain, const EncodeOptions& options);

struct ChainRun {
  std::vector<int8_t> final_vector;
  uint32_t hash = 0;
  std::optional<uint32_t> recorded_hash;  // the file's result_hash, if it has one
  std::vector<double> matrix_seconds;     // decode + product, per matrix
  double requantize_seconds = 0;
  double total_seconds = 0;
  uint64_t weights = 0;
};
// Runs the chain on the CPU, decoding compressed matrices on the fly.
ChainRun run_chain_cpu(const AnsFile& file, std::string_view where);

struct MatrixStats {
  int64_t rows = 0, cols = 0;
  uint64_t weights = 0;
  int distinct = 0;            // values that occur
  int grid_size = 0;           // symbols of the model (256 for the raw baseline)
  int precision = 0;           // P of the model (8 for the seed, 0 for the baseline)
  uint64_t streams = 0;        // rANS streams (seed: one per row; lowbit: 32k per tile)
  double entropy_bits = 0;     // empirical entropy of the codes, bits per weight
  double cross_entropy_bits = 0;  // their cost under the stored model (8 for the baseline)
  // Bytes of the matrix in the file, split by cause:
  uint64_t coded_bytes = 0;    // rANS words incl. each stream's 32-bit state (baseline: the codes)
  uint64_t state_bytes = 0;    // of which the streams' states (flush / initial state)
  uint64_t padding_bytes = 0;  // zero bytes for alignment
  uint64_t table_bytes = 0;    // headers, cursors or tile offsets, model tables
  uint64_t scale_bytes = 0;    // per-row / per-group scales (part of the quantization, not of the coding)
  uint64_t total_bytes() const { return coded_bytes + padding_bytes + table_bytes + scale_bytes; }
  // Bits per weight. achieved = coded bytes (the seed's "achieved bits per
  // weight", 16 * payload_size / weights); total = everything; and
  // total = entropy + model loss + coder loss + padding + tables + scales exactly.
  double bits(uint64_t bytes) const { return 8.0 * static_cast<double>(bytes) / static_cast<double>(weights); }
  double achieved_bits() const { return bits(coded_bytes); }
  double total_bits() const { return bits(total_bytes()); }
  double coding_bits() const { return bits(total_bytes() - scale_bytes); }  // what the entropy coding costs
  double model_loss_bits() const { return cross_entropy_bits - entropy_bits; }
  double coder_loss_bits() const { return achieved_bits() - cross_entropy_bits; }
};

struct FileStats {
  Container container = Container::lowbit;
  uint64_t file_bytes = 0;
  uint64_t file_overhead_bytes = 0;  // file header, v_0, directory and gaps between matrices
  std::optional<uint32_t> result_hash;
  std::vector<MatrixStats> matrices;
  MatrixStats total;  // all matrices together (entropy of the pooled codes is not used: averages weighted by size)
};
// Decodes every matrix to count its codes (checking the payload on the way).
FileStats inspect_ans_file(const AnsFile& file, std::string_view where);

}  // namespace lowbit::ans
