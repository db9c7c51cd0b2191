#include "lowbit/ans/chain.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <new>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"

namespace lowbit::ans {

const char* scale_kind_name(ScaleKind kind) {
  switch (kind) {
    case ScaleKind::none: return "none";
    case ScaleKind::per_row: return "per-row";
    case ScaleKind::per_group: return "per-group";
  }
  return "?";
}

int64_t Int8Matrix::scale_count() const {
  switch (scale_kind) {
    case ScaleKind::none: return 0;
    case ScaleKind::per_row: return rows;
    case ScaleKind::per_group: return group_size > 0 ? rows * ((cols + group_size - 1) / group_size) : -1;
  }
  return -1;
}

uint32_t fxhash32(std::span<const int8_t> v) {
  uint32_t h = 0;
  for (int8_t b : v) h = (std::rotl(h, 5) ^ static_cast<uint8_t>(b)) * 0x27220a95u;
  return h;
}

std::vector<int8_t> requantize(std::span<const int64_t> y) {
  int64_t m = 0;
  for (int64_t v : y) m = std::max(m, v < 0 ? -v : v);
  std::vector<int8_t> out(y.size(), 0);
  if (m == 0) return out;
  for (size_t i = 0; i < y.size(); ++i) {
    // 127*y/m = q + r/m exactly (floor division); round half to even on r.
    const int64_t num = 127 * y[i];
    int64_t q = num / m, r = num % m;
    if (r < 0) r += m, q -= 1;
    if (2 * r > m || (2 * r == m && (q & 1) != 0)) ++q;
    out[i] = static_cast<int8_t>(q);
  }
  return out;
}

void matvec_int8(const Int8Matrix& w, std::span<const int8_t> v, std::span<int64_t> y) {
  LOWBIT_CHECK_ARG(static_cast<int64_t>(v.size()) == w.cols, "v.size()", v.size(),
                   detail::concat("the matrix's ", w.cols, " columns"));
  LOWBIT_CHECK_ARG(static_cast<int64_t>(y.size()) == w.rows, "y.size()", y.size(),
                   detail::concat("the matrix's ", w.rows, " rows"));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(w.cols, 1));
  parallel_for(0, w.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* row = w.data.data() + r * w.cols;
      int32_t acc = 0;  // |partial| <= 65536 * 127 * 128 < 2^31 within one block below
      int64_t total = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        acc += int32_t{row[c]} * int32_t{v[static_cast<size_t>(c)]};
        if ((c & 0xFFFF) == 0xFFFF) total += acc, acc = 0;
      }
      y[static_cast<size_t>(r)] = total + acc;
    }
  });
}

void validate_chain(const Chain& chain, std::string_view where) {
  int64_t n = static_cast<int64_t>(chain.v0.size());
  if (n < 1) fail(ErrorKind::format, where, ": N_0 = 0: expected a non-empty initial vector v_0");
  for (size_t k = 0; k < chain.matrices.size(); ++k) {
    const Int8Matrix& m = chain.matrices[k];
    if (m.rows < 1 || m.cols < 1)
      fail(ErrorKind::format, where, ": matrix ", k, " is ", m.rows, " x ", m.cols, ": expected positive extents");
    if (m.cols != n)
      fail(ErrorKind::format, where, ": matrix ", k, " has N_k = ", m.cols, " columns: expected ", n,
           k == 0 ? " (the length N_0 of v_0)" : " (the rows of the matrix before it)");
    if (static_cast<int64_t>(m.data.size()) != m.rows * m.cols)
      fail(ErrorKind::format, where, ": matrix ", k, " holds ", m.data.size(), " codes: expected ", m.rows,
           " x ", m.cols, " = ", m.rows * m.cols);
    if (m.scale_kind == ScaleKind::per_group && m.group_size < 1)
      fail(ErrorKind::format, where, ": matrix ", k, " has per-group scales with group size ", m.group_size,
           ": expected >= 1");
    if (static_cast<int64_t>(m.scales.size()) != m.scale_count())
      fail(ErrorKind::format, where, ": matrix ", k, " has ", m.scales.size(), " ", scale_kind_name(m.scale_kind),
           " scales: expected ", m.scale_count());
    n = m.rows;
  }
}

void allocate_codes(Int8Matrix& m, std::string_view where) {
  const uint64_t n = static_cast<uint64_t>(m.rows) * static_cast<uint64_t>(m.cols);
  try {
    if (n > m.data.max_size()) throw std::bad_alloc();
    m.data.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::unsupported, where, ": ", m.rows, " x ", m.cols, " = ", n,
         " codes do not fit in memory (decode such a matrix on the fly: run, not convert)");
  }
}

std::vector<int8_t> run_chain_reference(const Chain& chain) {
  validate_chain(chain, "chain");
  std::vector<int8_t> v = chain.v0;
  std::vector<int64_t> y;
  for (const Int8Matrix& m : chain.matrices) {
    y.assign(static_cast<size_t>(m.rows), 0);
    matvec_int8(m, v, y);
    v = requantize(y);
  }
  return v;
}

}  // namespace lowbit::ans
