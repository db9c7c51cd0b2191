// The seed's uncompressed baseline container (MATVANS report, appendix A),
// read and written byte for byte, in both element orders found in the wild.
//
// Format facts this code relies on (little-endian; docs/ans-formats.md):
//   * file: K u32 | N_0 u32 | v_0 i8[N_0] | pad u8[3 - ((N_0 + 3) mod 4)] |
//     W_0 .. W_{K-1}; no S_max and no result hash;
//   * matrix: rows u32 | cols u32 | delta f32 | codes i8[rows * cols] |
//     pad i8[(rows * cols) mod 2];
//   * the codes are column-major in the report's appendix A, but the later
//     reference encoder (create_matfiles.py, which wrote the conformance file
//     raw-matrices_512.bin) writes them row-major. Nothing in the file tells
//     the two apart (same sizes, same header), so the order is an explicit
//     choice of the caller: BaselineOrder::column_major ("baseline", the
//     report) or BaselineOrder::row_major ("baseline-rowmajor").
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lowbit/ans/chain.h"

namespace lowbit::ans {

enum class BaselineOrder : uint8_t { column_major, row_major };
const char* baseline_order_name(BaselineOrder order);  // "column-major", "row-major"

struct BaselineFile {
  Chain chain;  // codes held row-major in memory whatever the order on disk; no result_hash
  BaselineOrder order = BaselineOrder::column_major;
};

// Parses a whole file; every size is checked against the file length before
// anything is allocated; padding must be zero; the matrices must chain
// (cols = previous rows). Throws Error(format) naming `where`, the matrix, the
// field, its value and what was expected.
BaselineFile parse_baseline_file(std::span<const uint8_t> bytes, BaselineOrder order, std::string_view where);
// Throws Error(invalid_argument) for per-row/per-group scales unless
// drop_scales (the container keeps one delta per matrix). The chain's
// result_hash has no field here and is not written.
std::vector<uint8_t> serialize_baseline_file(const BaselineFile& file, bool drop_scales = false);

}  // namespace lowbit::ans
