#include "lowbit/ans/seed_format.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "byte_io.h"
#include "lowbit/ans/rans.h"
#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"

namespace lowbit::ans {

using detail::ByteReader;
using detail::ByteWriter;
using lowbit::detail::concat;

namespace {

constexpr int kSeedPrecision = 8;

uint64_t v0_pad(uint64_t n0) { return 3 - ((n0 + 3) % 4); }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

std::string matrix_where(std::string_view where, size_t k) { return concat(where, ": matrix ", k); }

// The whole file in the layout `with_hash` picks; throws Error(format) at the
// first field that does not fit (detection tries both layouts).
SeedFile parse_body(std::span<const uint8_t> bytes, std::string_view where, bool with_hash) {
  ByteReader in(bytes, where);
  SeedFile f;
  f.has_hash = with_hash;
  const uint32_t K = in.u32("K (the number of matrices)");
  if (with_hash) f.result_hash = in.u32("result_hash");
  f.s_max = in.u32("S_max");
  const uint32_t n0 = in.u32("N_0 (the length of v_0)");
  if (n0 == 0) fail(ErrorKind::format, where, ": N_0 = 0: expected a non-empty initial vector v_0");
  in.array(f.v0, n0, "v_0");
  in.zeros(v0_pad(n0), "the padding after v_0");
  // Each matrix takes at least 12 + 4 + 4 + 2 + 3 + 1 + 256 bytes: refuse an
  // absurd K before reserving anything for it.
  constexpr uint64_t kMinMatrixBytes = 282;
  if (K > in.remaining() / kMinMatrixBytes)
    fail(ErrorKind::format, where, ": K = ", K, " matrices cannot fit in the ", in.remaining(),
         " bytes after v_0 (each takes at least ", kMinMatrixBytes, "): K is corrupt or the file is truncated");
  f.matrices.reserve(K);
  uint64_t n_prev = n0;
  for (uint32_t k = 0; k < K; ++k) {
    const std::string mw = matrix_where(where, k);
    const std::string at = concat("matrix ", k, " (at byte ", in.offset(), ")");
    SeedMatrix m;
    m.rows = in.u32(at + ": N_{k+1} (rows)");
    m.cols = in.u32(at + ": N_k (cols)");
    m.delta = in.scalar<float>(at + ": delta");
    if (m.rows == 0) fail(ErrorKind::format, mw, ": N_{k+1} = 0 rows: expected >= 1");
    if (m.cols != n_prev)
      fail(ErrorKind::format, mw, ": N_k = ", m.cols, " columns: expected ", n_prev,
           k == 0 ? " (N_0, the length of v_0)" : " (the rows of the matrix before it)");
    in.array(m.cursors, m.rows, at + ": cursors");
    const uint32_t payload_size = in.u32(at + ": payload_size");
    m.w_min = in.scalar<int8_t>(at + ": w_min");
    const uint8_t G = in.scalar<uint8_t>(at + ": |G|");
    in.array(m.cdf, uint64_t{G} + 1, at + ": cdf");
    in.zeros((uint64_t{G} + 1) % 2, at + ": the padding after cdf");
    const auto ppf = in.bytes(256, at + ": ppf");
    std::copy(ppf.begin(), ppf.end(), m.ppf.begin());
    (void)model_from_seed_tables(m.w_min, m.cdf, m.ppf, mw);  // checks cdf and ppf
    in.array(m.payload, payload_size, at + ": payload");
    in.zeros(2 * (payload_size % 2), at + ": the padding after the payload");
    // Cursors: row i owns [cursors[i], cursors[i+1]) and needs 2 words for its state.
    if (m.cursors[0] != 0) fail(ErrorKind::format, mw, ": cursors[0] = ", m.cursors[0], ": expected 0");
    for (uint32_t i = 0; i < m.rows; ++i) {
      const uint64_t end = i + 1 < m.rows ? m.cursors[i + 1] : payload_size;
      if (end < uint64_t{m.cursors[i]} + 2)
        fail(ErrorKind::format, mw, ": row ", i, " spans words [", m.cursors[i], ", ", end, ")",
             i + 1 < m.rows ? concat(" (cursors[", i + 1, "] = ", end, ")") : concat(" (payload_size = ", end, ")"),
             ": expected at least the 2 words of the row's initial state, in increasing order");
    }
    n_prev = m.rows;
    f.matrices.push_back(std::move(m));
  }
  if (in.remaining() != 0)
    fail(ErrorKind::format, where, ": ", in.remaining(), " bytes follow the last matrix (at byte ", in.offset(),
         "): expected the file to end there");
  return f;
}

}  // namespace

uint64_t SeedMatrix::reference_word_count() const {
  const uint64_t n = payload.size();
  return 2 * (4 + uint64_t{rows}) + (cdf.size() + 3) / 2 + n + n % 2;
}

uint64_t SeedMatrix::file_bytes() const {
  const uint64_t n = payload.size();
  return 12 + 4 * uint64_t{rows} + 4 + 2 + cdf.size() + cdf.size() % 2 + 256 + 2 * n + 2 * (n % 2);
}

SeedFile parse_seed_file(std::span<const uint8_t> bytes, std::string_view where, SeedVariant variant) {
  if (variant == SeedVariant::with_hash) return parse_body(bytes, where, true);
  if (variant == SeedVariant::without_hash) return parse_body(bytes, where, false);
  std::optional<SeedFile> with, without;
  std::string with_error, without_error;
  try {
    with = parse_body(bytes, where, true);
  } catch (const Error& e) {
    with_error = e.what();
  }
  try {
    without = parse_body(bytes, where, false);
  } catch (const Error& e) {
    without_error = e.what();
  }
  if (with && without)
    fail(ErrorKind::format, where,
         ": ambiguous: the layouts with and without result_hash both account for the whole file; name the variant");
  if (with) return std::move(*with);
  if (without) return std::move(*without);
  fail(ErrorKind::format, where, " is not a seed (MATVANS) container: read with result_hash after K: ",
       with_error, "; read without it (the report's Table 1): ", without_error);
}

std::vector<uint8_t> serialize_seed_file(const SeedFile& f) {
  uint64_t total = 16 + f.v0.size() + v0_pad(f.v0.size());
  for (const SeedMatrix& m : f.matrices) total += m.file_bytes();
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(total));
  ByteWriter w(out);
  w.scalar(static_cast<uint32_t>(f.matrices.size()));
  if (f.has_hash) w.scalar(f.result_hash);
  w.scalar(f.s_max);
  w.scalar(static_cast<uint32_t>(f.v0.size()));
  w.array(std::span<const int8_t>(f.v0));
  w.zeros(v0_pad(f.v0.size()));
  for (const SeedMatrix& m : f.matrices) {
    LOWBIT_CHECK_ARG(m.cursors.size() == m.rows, "cursors.size()", m.cursors.size(), "rows");
    LOWBIT_CHECK_ARG(m.cdf.size() >= 3 && m.cdf.size() <= 256, "cdf.size()", m.cdf.size(), "|G| + 1 = 3..256");
    w.scalar(m.rows);
    w.scalar(m.cols);
    w.scalar(m.delta);
    w.array(std::span<const uint32_t>(m.cursors));
    w.scalar(static_cast<uint32_t>(m.payload.size()));
    w.scalar(m.w_min);
    w.scalar(static_cast<uint8_t>(m.cdf.size() - 1));
    w.array(std::span<const uint8_t>(m.cdf));
    w.zeros(m.cdf.size() % 2);
    w.array(std::span<const uint8_t>(m.ppf));
    w.array(std::span<const uint16_t>(m.payload));
    w.zeros(2 * (m.payload.size() % 2));
  }
  return out;
}

SeedMatrix encode_seed_matrix(const Int8Matrix& m, const SeedEncodeOptions& options) {
  LOWBIT_CHECK_ARG(m.rows >= 1 && m.cols >= 1 && m.rows <= UINT32_MAX && m.cols <= UINT32_MAX, "matrix shape",
                   concat(m.rows, " x ", m.cols), "1..2^32-1 in each extent");
  LOWBIT_CHECK_ARG(static_cast<int64_t>(m.data.size()) == m.rows * m.cols, "matrix data size", m.data.size(),
                   "rows * cols");
  if (m.scale_kind != ScaleKind::none && !options.drop_scales)
    fail(ErrorKind::invalid_argument, "the seed container keeps one delta per matrix, but this matrix has ",
         scale_kind_name(m.scale_kind), " scales: drop them explicitly (drop_scales, --drop-scales) to keep the codes");
  const FreqModel model = build_seed_model(SymbolCounts::of(m.data));
  const SeedTables tables = seed_tables(model);
  const std::vector<uint32_t> cdf = model.cdf();
  std::array<RansEncSymbol, 256> enc{};
  for (int i = 0; i < model.grid_size(); ++i)
    if (model.freq[static_cast<size_t>(i)] != 0)
      enc[static_cast<size_t>(i)] = rans_enc_symbol(model.freq[static_cast<size_t>(i)], cdf[static_cast<size_t>(i)], 8);

  // Rows are independent streams (the reference resets the state after each
  // row), so they are encoded in parallel and concatenated in row order.
  std::vector<std::vector<uint16_t>> row_words(static_cast<size_t>(m.rows));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / m.cols);
  parallel_for(0, m.rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<uint16_t> emitted;
    for (int64_t r = r0; r < r1; ++r) {
      emitted.clear();
      uint32_t x = kRansLowerBound;
      const int8_t* row = m.data.data() + r * m.cols;
      for (int64_t c = m.cols - 1; c >= 0; --c)
        rans_encode(x, enc[static_cast<size_t>(row[c] - model.w_min)], kSeedPrecision, emitted);
      emitted.push_back(static_cast<uint16_t>(x & 0xFFFFu));  // flush: low word first...
      emitted.push_back(static_cast<uint16_t>(x >> 16));      // ...so the decoder reads the high word first
      row_words[static_cast<size_t>(r)].assign(emitted.rbegin(), emitted.rend());
    }
  });
  SeedMatrix s;
  s.rows = static_cast<uint32_t>(m.rows);
  s.cols = static_cast<uint32_t>(m.cols);
  s.delta = m.delta;
  s.w_min = static_cast<int8_t>(model.w_min);
  s.cdf = tables.cdf;
  s.ppf = tables.ppf;
  s.cursors.resize(static_cast<size_t>(m.rows));
  uint64_t total = 0;
  for (size_t r = 0; r < row_words.size(); ++r) {
    if (total > UINT32_MAX)
      fail(ErrorKind::unsupported, "the seed container: matrix of ", m.rows, " x ", m.cols,
           " needs more than 2^32 - 1 payload words (cursors are u32)");
    s.cursors[r] = static_cast<uint32_t>(total);
    total += row_words[r].size();
  }
  const uint64_t tail = options.zero_tail ? 2 : 0;
  if (total + tail > UINT32_MAX)
    fail(ErrorKind::unsupported, "the seed container: payload of ", total + tail, " words exceeds payload_size's u32");
  s.payload.reserve(static_cast<size_t>(total + tail));
  for (auto& words : row_words) {
    s.payload.insert(s.payload.end(), words.begin(), words.end());
    std::vector<uint16_t>().swap(words);
  }
  s.payload.resize(static_cast<size_t>(total + tail), 0);
  return s;
}

SeedFile encode_seed_file(const Chain& chain, const SeedEncodeOptions& options) {
  validate_chain(chain, "chain");
  SeedFile f;
  f.has_hash = options.with_hash;
  f.v0 = chain.v0;
  for (const Int8Matrix& m : chain.matrices) f.matrices.push_back(encode_seed_matrix(m, options));
  uint64_t s_max = 0;
  for (const SeedMatrix& m : f.matrices) s_max = std::max(s_max, m.reference_word_count());
  if (s_max > UINT32_MAX) fail(ErrorKind::unsupported, "the seed container: S_max = ", s_max, " exceeds its u32");
  f.s_max = static_cast<uint32_t>(s_max);
  if (options.with_hash) f.result_hash = chain.result_hash ? *chain.result_hash : fxhash32(run_chain_reference(chain));
  return f;
}

namespace {

// Decodes every row of `m`, calling sink(row, col, value). The tables are
// checked once; then each row is decoded exactly as Algorithm 1, with the
// reads bounded by the row's words.
template <typename Sink>
void decode_rows(const SeedMatrix& m, std::string_view where, int64_t grain, Sink&& sink) {
  (void)seed_matrix_model(m, where);
  const uint8_t* cdf = m.cdf.data();
  const uint8_t* ppf = m.ppf.data();
  const int w_min = m.w_min;
  const uint64_t n_words = m.payload.size();
  parallel_for(0, m.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint64_t c = m.cursors[static_cast<size_t>(r)];
      const uint64_t end = r + 1 < m.rows ? m.cursors[static_cast<size_t>(r + 1)] : n_words;
      if (end > n_words || c + 2 > end)
        fail(ErrorKind::format, where, ": row ", r, " spans words [", c, ", ", end, ") of a ", n_words,
             "-word payload: expected at least its 2 state words inside the payload");
      uint32_t head = uint32_t{m.payload[c]} << 16 | m.payload[c + 1];
      c += 2;
      for (uint32_t j = 0; j < m.cols; ++j) {
        const uint32_t quantile = head & 0xFF;
        const uint32_t s = ppf[quantile];
        sink(r, j, static_cast<int8_t>(w_min + static_cast<int>(s)));
        const uint32_t prob = (uint32_t{cdf[s + 1]} - cdf[s]) & 0xFF;
        head = (head >> 8) * prob + (quantile - cdf[s]);
        if (head < kRansLowerBound) {
          if (c >= end)
            fail(ErrorKind::format, where, ": row ", r, " reads past its words [", m.cursors[static_cast<size_t>(r)],
                 ", ", end, ") at column ", j, ": the payload or the cursors are corrupt");
          head = head << 16 | m.payload[c++];
        }
      }
      // The later encoder's two zero words may follow the last row (see the header).
      const bool zero_tail = r + 1 == m.rows && c + 2 == end && m.payload[c] == 0 && m.payload[c + 1] == 0;
      if ((c != end && !zero_tail) || head != kRansLowerBound)
        fail(ErrorKind::format, where, ": row ", r, " decodes to the final state ", hex32(head),
             " after ", c - m.cursors[static_cast<size_t>(r)], " of its ", end - m.cursors[static_cast<size_t>(r)],
             " words: expected the state 0x10000 exactly at the end of its words (the payload is corrupt)");
    }
  });
}

}  // namespace

FreqModel seed_matrix_model(const SeedMatrix& m, std::string_view where) {
  return model_from_seed_tables(m.w_min, m.cdf, m.ppf, where);
}

Int8Matrix decode_seed_matrix(const SeedMatrix& m, std::string_view where) {
  Int8Matrix out;
  out.rows = m.rows;
  out.cols = m.cols;
  out.delta = m.delta;
  allocate_codes(out, where);
  int8_t* data = out.data.data();
  const int64_t cols = out.cols;
  decode_rows(m, where, std::max<int64_t>(1, (int64_t{1} << 14) / cols),
              [&](int64_t r, uint32_t j, int8_t w) { data[r * cols + j] = w; });
  return out;
}

void seed_matvec(const SeedMatrix& m, std::span<const int8_t> v, std::span<int64_t> y, std::string_view where) {
  LOWBIT_CHECK_ARG(v.size() == m.cols, "v.size()", v.size(), concat("the matrix's ", m.cols, " columns"));
  LOWBIT_CHECK_ARG(y.size() == m.rows, "y.size()", y.size(), concat("the matrix's ", m.rows, " rows"));
  std::fill(y.begin(), y.end(), 0);
  decode_rows(m, where, std::max<int64_t>(1, (int64_t{1} << 14) / int64_t{m.cols}),
              [&](int64_t r, uint32_t j, int8_t w) { y[static_cast<size_t>(r)] += int64_t{w} * v[j]; });
}

Chain decode_seed_file(const SeedFile& f, std::string_view where) {
  Chain chain;
  chain.v0 = f.v0;
  if (f.has_hash) chain.result_hash = f.result_hash;
  for (size_t k = 0; k < f.matrices.size(); ++k)
    chain.matrices.push_back(decode_seed_matrix(f.matrices[k], matrix_where(where, k)));
  return chain;
}

}  // namespace lowbit::ans
