#include "lowbit/ans/baseline_format.h"

#include <string>

#include "byte_io.h"
#include "lowbit/core/error.h"

namespace lowbit::ans {

using detail::ByteReader;
using detail::ByteWriter;
using lowbit::detail::concat;

const char* baseline_order_name(BaselineOrder order) {
  return order == BaselineOrder::column_major ? "column-major" : "row-major";
}

namespace {
uint64_t v0_pad(uint64_t n0) { return 3 - ((n0 + 3) % 4); }
}  // namespace

BaselineFile parse_baseline_file(std::span<const uint8_t> bytes, BaselineOrder order, std::string_view where) {
  ByteReader in(bytes, where);
  BaselineFile f;
  f.order = order;
  const uint32_t K = in.u32("K (the number of matrices)");
  const uint32_t n0 = in.u32("N_0 (the length of v_0)");
  if (n0 == 0) fail(ErrorKind::format, where, ": N_0 = 0: expected a non-empty initial vector v_0");
  in.array(f.chain.v0, n0, "v_0");
  in.zeros(v0_pad(n0), "the padding after v_0");
  constexpr uint64_t kMinMatrixBytes = 14;  // 12-byte header + at least one code (+ pad)
  if (K > in.remaining() / kMinMatrixBytes)
    fail(ErrorKind::format, where, ": K = ", K, " matrices cannot fit in the ", in.remaining(),
         " bytes after v_0 (each takes at least ", kMinMatrixBytes, "): K is corrupt or the file is truncated");
  f.chain.matrices.reserve(K);
  uint64_t n_prev = n0;
  std::vector<int8_t> stored;
  for (uint32_t k = 0; k < K; ++k) {
    const std::string at = concat("matrix ", k, " (at byte ", in.offset(), ")");
    Int8Matrix m;
    const uint32_t rows = in.u32(at + ": rows");
    const uint32_t cols = in.u32(at + ": cols");
    m.delta = in.scalar<float>(at + ": delta");
    if (rows == 0) fail(ErrorKind::format, where, ": matrix ", k, ": rows = 0: expected >= 1");
    if (cols != n_prev)
      fail(ErrorKind::format, where, ": matrix ", k, ": cols = ", cols, ": expected ", n_prev,
           k == 0 ? " (N_0, the length of v_0)" : " (the rows of the matrix before it)");
    m.rows = rows;
    m.cols = cols;
    const uint64_t n = uint64_t{rows} * cols;
    if (order == BaselineOrder::row_major) {
      in.array(m.data, n, at + ": codes");
    } else {
      in.array(stored, n, at + ": codes");
      m.data.resize(static_cast<size_t>(n));
      for (uint64_t c = 0; c < cols; ++c)
        for (uint64_t r = 0; r < rows; ++r) m.data[r * cols + c] = stored[c * rows + r];
    }
    in.zeros(n % 2, at + ": the padding after the codes");
    n_prev = rows;
    f.chain.matrices.push_back(std::move(m));
  }
  if (in.remaining() != 0)
    fail(ErrorKind::format, where, ": ", in.remaining(), " bytes follow the last matrix (at byte ", in.offset(),
         "): expected the file to end there");
  return f;
}

std::vector<uint8_t> serialize_baseline_file(const BaselineFile& f, bool drop_scales) {
  validate_chain(f.chain, "baseline chain");
  uint64_t total = 8 + f.chain.v0.size() + v0_pad(f.chain.v0.size());
  for (const Int8Matrix& m : f.chain.matrices) {
    LOWBIT_CHECK_ARG(m.rows <= UINT32_MAX && m.cols <= UINT32_MAX, "matrix shape", concat(m.rows, " x ", m.cols),
                     "extents that fit a u32");
    if (m.scale_kind != ScaleKind::none && !drop_scales)
      fail(ErrorKind::invalid_argument, "the baseline container keeps one delta per matrix, but a matrix has ",
           scale_kind_name(m.scale_kind), " scales: drop them explicitly (drop_scales, --drop-scales)");
    total += 12 + static_cast<uint64_t>(m.rows * m.cols) + static_cast<uint64_t>(m.rows * m.cols) % 2;
  }
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(total));
  ByteWriter w(out);
  w.scalar(static_cast<uint32_t>(f.chain.matrices.size()));
  w.scalar(static_cast<uint32_t>(f.chain.v0.size()));
  w.array(std::span<const int8_t>(f.chain.v0));
  w.zeros(v0_pad(f.chain.v0.size()));
  for (const Int8Matrix& m : f.chain.matrices) {
    w.scalar(static_cast<uint32_t>(m.rows));
    w.scalar(static_cast<uint32_t>(m.cols));
    w.scalar(m.delta);
    if (f.order == BaselineOrder::row_major) {
      w.array(std::span<const int8_t>(m.data));
    } else {
      const size_t at = out.size();
      out.resize(at + m.data.size());
      for (int64_t c = 0; c < m.cols; ++c)
        for (int64_t r = 0; r < m.rows; ++r)
          out[at + static_cast<size_t>(c * m.rows + r)] = static_cast<uint8_t>(m.data[static_cast<size_t>(r * m.cols + c)]);
    }
    w.zeros(static_cast<size_t>(m.rows * m.cols) % 2);
  }
  return out;
}

}  // namespace lowbit::ans
