#include "lowbit/ans/lowbit_format.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "byte_io.h"
#include "lowbit/ans/checksum.h"
#include "lowbit/ans/rans.h"
#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"

namespace lowbit::ans {

using detail::ByteReader;
using detail::ByteWriter;
using lowbit::detail::concat;

namespace {

constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kDirectoryEntryBytes = 32;
constexpr uint64_t kSectionHeaderBytes = 64;
constexpr uint64_t kHeaderCrcOffset = 56;

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Where each array of a section starts, from the section start.
struct SectionLayout {
  uint64_t freq = 0, scales = 0, tile_offsets = 0, payload = 0, end = 0;
};

SectionLayout section_layout(uint64_t grid_size, uint64_t n_scales, uint64_t tiles, uint64_t payload_bytes) {
  SectionLayout l;
  l.freq = kSectionHeaderBytes;
  l.scales = align_up(l.freq + 2 * grid_size, kLowbitArrayAlign);
  l.tile_offsets = align_up(l.scales + 4 * n_scales, kLowbitArrayAlign);
  l.payload = align_up(l.tile_offsets + 4 * (tiles + 1), kLowbitArrayAlign);
  l.end = l.payload + payload_bytes;
  return l;
}

uint64_t scale_count(ScaleKind kind, uint64_t rows, uint64_t cols, uint64_t group_size) {
  switch (kind) {
    case ScaleKind::none: return 0;
    case ScaleKind::per_row: return rows;
    case ScaleKind::per_group: return group_size == 0 ? 0 : rows * ((cols + group_size - 1) / group_size);
  }
  return 0;
}

// The decoder's view of a symbol, indexed by the low P bits of the state.
struct DecodeEntry {
  uint16_t freq;
  uint16_t cdf;
  int8_t value;
};

std::vector<DecodeEntry> decode_table(const FreqModel& model) {
  std::vector<DecodeEntry> t(size_t{1} << model.precision);
  uint32_t c = 0;
  for (int i = 0; i < model.grid_size(); ++i) {
    const uint32_t f = model.freq[static_cast<size_t>(i)];  // <= 2^15: fits the u16
    for (uint32_t q = c; q < c + f; ++q)
      t[q] = {static_cast<uint16_t>(f), static_cast<uint16_t>(c), static_cast<int8_t>(model.w_min + i)};
    c += f;
  }
  return t;
}

// The tile geometry shared by the encoder and the decoder.
struct Geometry {
  int64_t rows, cols, R, tiles, S, k, quads, blocks;
  Geometry(int64_t rows_, int64_t cols_, int64_t R_, int k_)
      : rows(rows_), cols(cols_), R(R_), tiles((rows_ + R_ - 1) / R_), S(kLowbitLanes * k_), k(k_),
        quads((cols_ + kLowbitQuad - 1) / kLowbitQuad), blocks((quads + S - 1) / S) {}
};

// Calls f(stream, column) for one row in the encoder's order: the exact
// reverse of the decoder's loop in decode_tiles (rows, blocks b, positions p,
// streams s = 32m + l, i.e. slot-major then lane, as the format fixes).
template <typename F>
inline void for_each_in_row_reversed(const Geometry& g, F&& f) {
  for (int64_t b = g.blocks - 1; b >= 0; --b)
    for (int64_t p = kLowbitQuad - 1; p >= 0; --p) {
      const int64_t active = std::min(g.S, g.quads - b * g.S);  // streams with a quad in this block
      for (int64_t s = active - 1; s >= 0; --s) {
        const int64_t col = kLowbitQuad * (b * g.S + s) + p;
        if (col < g.cols) f(s, col);
      }
    }
}

void check_options(const LowbitOptions& o) {
  LOWBIT_CHECK_ARG(o.precision >= 1 && o.precision <= kRansMaxPrecision, "precision", o.precision, "1..15 bits");
  LOWBIT_CHECK_ARG(o.states_per_lane == 1 || o.states_per_lane == 2 || o.states_per_lane == 4 ||
                       o.states_per_lane == 8,
                   "states_per_lane", o.states_per_lane, "1, 2, 4 or 8");
  LOWBIT_CHECK_ARG(o.rows_per_tile >= 0 && o.rows_per_tile <= kLowbitMaxRowsPerTile, "rows_per_tile",
                   o.rows_per_tile, "0 (automatic) .. 65536");
  LOWBIT_CHECK_ARG(o.target_symbols_per_stream >= 0, "target_symbols_per_stream", o.target_symbols_per_stream,
                   ">= 0 (0 = automatic)");
}

}  // namespace

// ---- LowbitMatrix ---------------------------------------------------------------------

FreqModel LowbitMatrix::model() const {
  FreqModel m;
  m.precision = precision;
  m.w_min = w_min;
  m.freq.assign(freq.begin(), freq.end());
  return m;
}

uint64_t LowbitMatrix::section_bytes() const {
  return section_layout(freq.size(), scales.size(), tiles(), payload.size()).end;
}

int64_t lowbit_rows_per_tile(int64_t rows, int64_t cols, const LowbitOptions& options, double entropy_bits) {
  check_options(options);
  if (options.rows_per_tile > 0) return std::min(options.rows_per_tile, rows);
  int64_t target = options.target_symbols_per_stream;
  if (target == 0) {
    const double by_share = 32.0 / (kLowbitAutoStateShare * std::max(entropy_bits, 1e-3));
    target = static_cast<int64_t>(std::clamp(std::ceil(by_share), static_cast<double>(kLowbitMinAutoSymbolsPerStream),
                                             static_cast<double>(kLowbitMaxAutoSymbolsPerStream)));
  }
  const int64_t S = kLowbitLanes * int64_t{options.states_per_lane};
  const int64_t want = (target * S + cols - 1) / std::max<int64_t>(cols, 1);
  return std::clamp<int64_t>(want, 1, std::clamp<int64_t>(rows, 1, kLowbitMaxRowsPerTile));
}

// ---- encoder --------------------------------------------------------------------------

LowbitMatrix encode_lowbit_matrix(const Int8Matrix& m, const LowbitOptions& options) {
  check_options(options);
  LOWBIT_CHECK_ARG(m.rows >= 1 && m.cols >= 1 && m.rows <= UINT32_MAX && m.cols <= UINT32_MAX, "matrix shape",
                   concat(m.rows, " x ", m.cols), "1..2^32-1 in each extent");
  LOWBIT_CHECK_ARG(static_cast<int64_t>(m.data.size()) == m.rows * m.cols, "matrix data size", m.data.size(),
                   "rows * cols");
  LOWBIT_CHECK_ARG(static_cast<int64_t>(m.scales.size()) == m.scale_count(), "matrix scales",
                   concat(m.scales.size(), " ", scale_kind_name(m.scale_kind), " scales"),
                   concat(m.scale_count()));
  const SymbolCounts counts = SymbolCounts::of(m.data);
  const FreqModel model = build_freq_model(counts, options.precision);
  const int P = model.precision;
  const std::vector<uint32_t> cdf = model.cdf();
  std::array<RansEncSymbol, 256> enc{};
  for (int i = 0; i < model.grid_size(); ++i)
    if (model.freq[static_cast<size_t>(i)] != 0)
      enc[static_cast<size_t>(i)] = rans_enc_symbol(model.freq[static_cast<size_t>(i)], cdf[static_cast<size_t>(i)], P);

  const int64_t R = lowbit_rows_per_tile(m.rows, m.cols, options, counts.entropy_bits());
  const Geometry g(m.rows, m.cols, R, options.states_per_lane);
  std::vector<std::vector<uint8_t>> tile_bytes(static_cast<size_t>(g.tiles));
  parallel_for(0, g.tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint16_t> emitted;
    std::vector<uint32_t> x(static_cast<size_t>(g.S));
    for (int64_t t = t0; t < t1; ++t) {
      emitted.clear();
      std::fill(x.begin(), x.end(), kRansLowerBound);
      const int64_t r_begin = t * R, r_end = std::min(m.rows, r_begin + R);
      for (int64_t r = r_end - 1; r >= r_begin; --r) {
        const int8_t* row = m.data.data() + r * m.cols;
        for_each_in_row_reversed(g, [&](int64_t s, int64_t col) {
          rans_encode(x[static_cast<size_t>(s)], enc[static_cast<size_t>(row[col] - model.w_min)], P, emitted);
        });
      }
      std::vector<uint8_t>& out = tile_bytes[static_cast<size_t>(t)];
      out.resize(static_cast<size_t>(align_up(4 * x.size() + 2 * emitted.size(), kLowbitArrayAlign)), 0);
      std::memcpy(out.data(), x.data(), 4 * x.size());
      uint8_t* w = out.data() + 4 * x.size();
      for (size_t i = 0; i < emitted.size(); ++i) {  // the decoder reads the emitted words backwards
        const uint16_t word = emitted[emitted.size() - 1 - i];
        std::memcpy(w + 2 * i, &word, 2);
      }
    }
  });

  LowbitMatrix out;
  out.rows = static_cast<uint32_t>(m.rows);
  out.cols = static_cast<uint32_t>(m.cols);
  out.delta = m.delta;
  out.precision = P;
  out.states_per_lane = options.states_per_lane;
  out.w_min = model.w_min;
  out.freq.assign(model.freq.begin(), model.freq.end());
  out.scale_kind = m.scale_kind;
  out.group_size = m.scale_kind == ScaleKind::per_group ? static_cast<uint32_t>(m.group_size) : 0;
  out.scales = m.scales;
  out.rows_per_tile = static_cast<uint32_t>(R);
  out.tile_offsets.resize(static_cast<size_t>(g.tiles) + 1);
  uint64_t total = 0;
  for (size_t t = 0; t < tile_bytes.size(); ++t) {
    out.tile_offsets[t] = static_cast<uint32_t>(total / kLowbitArrayAlign);
    total += tile_bytes[t].size();
    if (total / kLowbitArrayAlign > UINT32_MAX)
      fail(ErrorKind::unsupported, "lowbit format: a ", m.rows, " x ", m.cols,
           " matrix needs more than 64 GiB of payload (tile offsets are u32 counts of 16 bytes)");
  }
  out.tile_offsets.back() = static_cast<uint32_t>(total / kLowbitArrayAlign);
  out.payload.reserve(static_cast<size_t>(total));
  for (auto& bytes : tile_bytes) {
    out.payload.insert(out.payload.end(), bytes.begin(), bytes.end());
    std::vector<uint8_t>().swap(bytes);
  }
  return out;
}

LowbitFile encode_lowbit_file(const Chain& chain, const LowbitOptions& options) {
  validate_chain(chain, "chain");
  LowbitFile f;
  f.v0 = chain.v0;
  f.result_hash = chain.result_hash ? *chain.result_hash : fxhash32(run_chain_reference(chain));
  for (const Int8Matrix& m : chain.matrices) f.matrices.push_back(encode_lowbit_matrix(m, options));
  return f;
}

// ---- decoder --------------------------------------------------------------------------

namespace {

template <typename Sink>
void decode_tiles(const LowbitMatrix& m, std::string_view where, Sink&& sink, uint64_t* words_read = nullptr) {
  const FreqModel model = m.model();
  model.validate(where);
  const std::vector<DecodeEntry> table = decode_table(model);
  const int P = m.precision;
  const uint32_t mask = (1u << P) - 1;
  if (m.rows < 1 || m.cols < 1 || m.rows_per_tile < 1 ||
      m.rows_per_tile > std::min<int64_t>(m.rows, kLowbitMaxRowsPerTile))
    fail(ErrorKind::format, where, ": ", m.rows, " x ", m.cols, " with rows_per_tile = ", m.rows_per_tile,
         ": expected positive extents and 1 <= rows_per_tile <= min(rows, 65536)");
  if (m.states_per_lane != 1 && m.states_per_lane != 2 && m.states_per_lane != 4 && m.states_per_lane != 8)
    fail(ErrorKind::format, where, ": states_per_lane = ", m.states_per_lane, ": expected 1, 2, 4 or 8");
  const Geometry g(m.rows, m.cols, m.rows_per_tile, m.states_per_lane);
  if (m.tile_offsets.size() != static_cast<size_t>(g.tiles) + 1)
    fail(ErrorKind::format, where, ": ", m.tile_offsets.size(), " tile offsets: expected tiles + 1 = ", g.tiles + 1);
  std::atomic<uint64_t> total_words{0};
  parallel_for(0, g.tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<uint32_t> x(static_cast<size_t>(g.S));
    uint64_t chunk_words = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const uint64_t begin = uint64_t{m.tile_offsets[static_cast<size_t>(t)]} * kLowbitArrayAlign;
      const uint64_t end = uint64_t{m.tile_offsets[static_cast<size_t>(t) + 1]} * kLowbitArrayAlign;
      if (end > m.payload.size() || begin + 4 * static_cast<uint64_t>(g.S) > end)
        fail(ErrorKind::format, where, ": tile ", t, " spans payload bytes [", begin, ", ", end, ") of ",
             m.payload.size(), ": expected room for its ", g.S, " states inside the payload");
      const uint8_t* tile = m.payload.data() + begin;
      std::memcpy(x.data(), tile, 4 * x.size());
      for (int64_t s = 0; s < g.S; ++s)
        if (x[static_cast<size_t>(s)] < kRansLowerBound)
          fail(ErrorKind::format, where, ": tile ", t, " stream ", s, " starts from the state ",
               hex32(x[static_cast<size_t>(s)]), ": expected at least 0x00010000 (the stored states are corrupt)");
      const uint8_t* words = tile + 4 * x.size();
      const uint64_t n_words = (end - begin - 4 * x.size()) / 2;
      static constexpr uint8_t kNoWords[2] = {0, 0};
      const uint8_t* word_at = n_words != 0 ? words : kNoWords;  // a valid address for the clamped load
      const uint64_t last_word = n_words != 0 ? n_words - 1 : 0;
      uint64_t next = 0;
      const int64_t r_begin = t * g.R, r_end = std::min(g.rows, r_begin + g.R);
      // The format's decoding order (see the header) with everything the hot
      // loop touches in locals, so stores through the sink cannot force reloads.
      const int64_t S = g.S, quads = g.quads, cols = g.cols, blocks = g.blocks;
      const int shift = P;
      const uint32_t low = mask;
      const DecodeEntry* tab = table.data();
      uint32_t* xs = x.data();
      for (int64_t r = r_begin; r < r_end; ++r) {
        auto row = sink.row(r);
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t first = b * S, active = std::min(S, quads - first);
          for (int64_t p = 0; p < kLowbitQuad; ++p) {
            int64_t col = kLowbitQuad * first + p;
            for (int64_t s = 0; s < active; ++s, col += kLowbitQuad) {
              if (col >= cols) break;  // only the last, partial quad; later streams' columns are larger still
              uint32_t state = xs[s];
              const uint32_t q = state & low;
              const DecodeEntry e = tab[q];
              row(col, e.value);
              // Cannot wrap: q - cdf < f, so the result is below f * 2^(32-P) <= 2^32.
              state = uint32_t{e.freq} * (state >> shift) + q - e.cdf;
              // Branch-free refill: about a third of the symbols need a word, in
              // no predictable pattern, so a branch would mispredict often.
              // The load is clamped into the tile; it is used only when needed.
              const bool need = state < kRansLowerBound;
              if (need && next >= n_words) [[unlikely]]
                fail(ErrorKind::format, where, ": tile ", t, " (rows ", r_begin, "..", r_end - 1, ") stream ", s,
                     " needs word ", next, " at row ", r, " column ", col, " but the tile holds only ", n_words,
                     " words: the payload is corrupt");
              uint16_t word;
              std::memcpy(&word, word_at + 2 * std::min(next, last_word), 2);
              const uint32_t take = need ? 1u : 0u;
              state = (state << (16 * take)) | (word & (0u - take));  // arithmetic, so no branch is emitted
              next += take;
              xs[s] = state;
            }
          }
        }
        row.finish();
      }
      for (int64_t s = 0; s < g.S; ++s)
        if (x[static_cast<size_t>(s)] != kRansLowerBound)
          fail(ErrorKind::format, where, ": tile ", t, " stream ", s, " ends at the state ",
               hex32(x[static_cast<size_t>(s)]), ": expected 0x00010000 (the payload is corrupt)");
      const uint64_t used = 4 * x.size() + 2 * next;
      if (end - begin - used >= kLowbitArrayAlign)
        fail(ErrorKind::format, where, ": tile ", t, " leaves ", end - begin - used, " of its ", end - begin,
             " bytes unread: expected fewer than 16 (padding); the tile offsets or the payload are corrupt");
      for (uint64_t i = used; i < end - begin; ++i)
        if (tile[i] != 0)
          fail(ErrorKind::format, where, ": tile ", t, " padding byte ", i, " = ", int{tile[i]}, ": expected 0");
      chunk_words += next;
    }
    total_words += chunk_words;
  });
  if (words_read != nullptr) *words_read = total_words;
}

}  // namespace

Int8Matrix decode_lowbit_matrix(const LowbitMatrix& m, std::string_view where, uint64_t* words_read) {
  Int8Matrix out;
  out.rows = m.rows;
  out.cols = m.cols;
  out.delta = m.delta;
  out.scale_kind = m.scale_kind;
  out.group_size = m.group_size;
  out.scales = m.scales;
  allocate_codes(out, where);
  int8_t* data = out.data.data();
  const int64_t cols = out.cols;
  struct Store {
    int8_t* data;
    int64_t cols;
    struct Row {
      int8_t* out;
      void operator()(int64_t c, int8_t w) const { out[c] = w; }
      void finish() const {}
    };
    Row row(int64_t r) const { return {data + r * cols}; }
  };
  decode_tiles(m, where, Store{data, cols}, words_read);
  return out;
}

void lowbit_matvec(const LowbitMatrix& m, std::span<const int8_t> v, std::span<int64_t> y, std::string_view where) {
  LOWBIT_CHECK_ARG(v.size() == m.cols, "v.size()", v.size(), concat("the matrix's ", m.cols, " columns"));
  LOWBIT_CHECK_ARG(y.size() == m.rows, "y.size()", y.size(), concat("the matrix's ", m.rows, " rows"));
  std::fill(y.begin(), y.end(), 0);
  struct Dot {
    const int8_t* v;
    int64_t* y;
    struct Row {
      const int8_t* v;
      int64_t* out;
      int64_t acc = 0;
      void operator()(int64_t c, int8_t w) { acc += int32_t{w} * int32_t{v[c]}; }
      void finish() const { *out = acc; }
    };
    Row row(int64_t r) const { return {v, y + r}; }
  };
  decode_tiles(m, where, Dot{v.data(), y.data()});
}

Chain decode_lowbit_file(const LowbitFile& f, std::string_view where) {
  Chain chain;
  chain.v0 = f.v0;
  chain.result_hash = f.result_hash;
  for (size_t k = 0; k < f.matrices.size(); ++k)
    chain.matrices.push_back(decode_lowbit_matrix(f.matrices[k], concat(where, ": matrix ", k)));
  return chain;
}

// ---- file I/O -------------------------------------------------------------------------

std::vector<uint8_t> serialize_lowbit_file(const LowbitFile& f) {
  const uint64_t K = f.matrices.size();
  const uint64_t directory = kHeaderBytes + align_up(f.v0.size(), kLowbitArrayAlign);
  std::vector<uint64_t> offsets(K);
  uint64_t at = directory + K * kDirectoryEntryBytes;
  for (uint64_t k = 0; k < K; ++k) {
    at = align_up(at, kLowbitSectionAlign);
    offsets[k] = at;
    at += f.matrices[k].section_bytes();
  }
  const uint64_t file_bytes = at;
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(file_bytes));
  ByteWriter w(out);
  w.array(std::span<const uint8_t>(kLowbitMagic));
  w.scalar(kLowbitVersion);
  w.scalar(static_cast<uint16_t>(kHeaderBytes));
  w.scalar(static_cast<uint32_t>(f.result_hash ? 1 : 0));
  w.scalar(static_cast<uint32_t>(K));
  w.scalar(static_cast<uint32_t>(f.v0.size()));
  w.scalar(f.result_hash.value_or(0));
  w.scalar(uint32_t{0});
  w.scalar(file_bytes);
  w.scalar(directory);
  w.scalar(uint64_t{0});
  w.scalar(uint32_t{0});  // header_crc, filled in below
  w.scalar(uint32_t{0});
  w.array(std::span<const int8_t>(f.v0));
  w.pad_to(kLowbitArrayAlign);
  const size_t directory_at = out.size();
  w.zeros(static_cast<size_t>(K * kDirectoryEntryBytes));  // filled in after the sections
  std::vector<uint32_t> crcs(K);
  for (uint64_t k = 0; k < K; ++k) {
    const LowbitMatrix& m = f.matrices[k];
    LOWBIT_CHECK_ARG(m.freq.size() >= 1 && m.freq.size() <= 256, "freq.size()", m.freq.size(), "1..256");
    LOWBIT_CHECK_ARG(m.tile_offsets.size() >= 2, "tile_offsets.size()", m.tile_offsets.size(), ">= 2");
    w.pad_to(kLowbitSectionAlign);
    const size_t start = out.size();
    w.scalar(m.rows);
    w.scalar(m.cols);
    w.scalar(m.delta);
    w.scalar(static_cast<uint8_t>(m.precision));
    w.scalar(static_cast<uint8_t>(m.states_per_lane));
    w.scalar(static_cast<int8_t>(m.w_min));
    w.scalar(static_cast<uint8_t>(m.scale_kind));
    w.scalar(static_cast<uint16_t>(m.freq.size()));
    w.scalar(uint16_t{0});
    w.scalar(m.rows_per_tile);
    w.scalar(m.tiles());
    w.scalar(m.group_size);
    w.scalar(static_cast<uint64_t>(m.payload.size()));
    w.zeros(24);
    w.array(std::span<const uint16_t>(m.freq));
    w.pad_to(kLowbitArrayAlign);
    w.array(std::span<const float>(m.scales));
    w.pad_to(kLowbitArrayAlign);
    w.array(std::span<const uint32_t>(m.tile_offsets));
    w.pad_to(kLowbitArrayAlign);
    w.array(std::span<const uint8_t>(m.payload));
    if (out.size() - start != m.section_bytes())
      fail(ErrorKind::internal, "serialize_lowbit_file: matrix ", k, " wrote ", out.size() - start,
           " bytes, its layout says ", m.section_bytes());
    crcs[k] = crc32(std::span<const uint8_t>(out.data() + start, out.size() - start));
  }
  if (out.size() != file_bytes)
    fail(ErrorKind::internal, "serialize_lowbit_file: wrote ", out.size(), " bytes, planned ", file_bytes);
  for (uint64_t k = 0; k < K; ++k) {
    uint8_t* e = out.data() + directory_at + k * kDirectoryEntryBytes;
    const uint64_t bytes = f.matrices[k].section_bytes();
    std::memcpy(e, &offsets[k], 8);
    std::memcpy(e + 8, &bytes, 8);
    std::memcpy(e + 16, &crcs[k], 4);
  }
  const size_t directory_end = directory_at + static_cast<size_t>(K * kDirectoryEntryBytes);
  uint32_t crc = crc32(std::span<const uint8_t>(out.data(), kHeaderCrcOffset));
  crc = crc32(std::span<const uint8_t>(out.data() + kHeaderBytes, directory_end - kHeaderBytes), crc);
  std::memcpy(out.data() + kHeaderCrcOffset, &crc, 4);
  return out;
}

LowbitFile parse_lowbit_file(std::span<const uint8_t> bytes, std::string_view where,
                             const LowbitReadOptions& options) {
  ByteReader in(bytes, where);
  const auto magic = in.bytes(8, "the magic number");
  if (!std::equal(magic.begin(), magic.end(), std::begin(kLowbitMagic)))
    fail(ErrorKind::format, where, ": the first 8 bytes are not the lowbit ANS magic 89 4C 42 41 4E 53 0D 0A");
  const auto version = in.scalar<uint16_t>("version");
  if (version != kLowbitVersion)
    fail(version > kLowbitVersion ? ErrorKind::unsupported : ErrorKind::format, where, ": format version ", version,
         ": this reader knows version ", kLowbitVersion);
  const auto header_bytes = in.scalar<uint16_t>("header_bytes");
  if (header_bytes != kHeaderBytes)
    fail(ErrorKind::format, where, ": header_bytes = ", header_bytes, ": expected ", kHeaderBytes);
  const uint32_t flags = in.u32("flags");
  if ((flags & ~1u) != 0) fail(ErrorKind::format, where, ": flags = ", hex32(flags), ": expected only bit 0 (result_hash)");
  const uint32_t K = in.u32("K");
  const uint32_t n0 = in.u32("N_0");
  const uint32_t hash = in.u32("result_hash");
  if (in.u32("reserved (byte 28)") != 0) fail(ErrorKind::format, where, ": reserved bytes 28..31 are not zero");
  const uint64_t file_bytes = in.scalar<uint64_t>("file_bytes");
  const uint64_t directory = in.scalar<uint64_t>("directory_offset");
  if (in.scalar<uint64_t>("reserved (byte 48)") != 0) fail(ErrorKind::format, where, ": reserved bytes 48..55 are not zero");
  const uint32_t header_crc = in.u32("header_crc");
  if (in.u32("reserved (byte 60)") != 0) fail(ErrorKind::format, where, ": reserved bytes 60..63 are not zero");
  if (file_bytes != bytes.size())
    fail(ErrorKind::format, where, ": the header says the file has ", file_bytes, " bytes but it has ", bytes.size(),
         file_bytes > bytes.size() ? ": it is truncated" : ": extra bytes follow");
  if (n0 == 0) fail(ErrorKind::format, where, ": N_0 = 0: expected a non-empty initial vector v_0");
  const uint64_t want_directory = kHeaderBytes + align_up(n0, kLowbitArrayAlign);
  if (directory != want_directory)
    fail(ErrorKind::format, where, ": directory_offset = ", directory, ": expected ", want_directory,
         " (64 + N_0 rounded up to 16)");
  LowbitFile f;
  if (flags & 1u) f.result_hash = hash;
  else if (hash != 0) fail(ErrorKind::format, where, ": result_hash = ", hash, " without flag bit 0: expected 0");
  in.array(f.v0, n0, "v_0");
  in.zeros(align_up(n0, kLowbitArrayAlign) - n0, "the padding after v_0");
  in.need(uint64_t{K} * kDirectoryEntryBytes, concat("the directory of K = ", K, " matrices"));
  const uint64_t directory_end = directory + uint64_t{K} * kDirectoryEntryBytes;
  if (options.verify_checksums) {
    uint32_t crc = crc32(bytes.subspan(0, kHeaderCrcOffset));
    crc = crc32(bytes.subspan(kHeaderBytes, static_cast<size_t>(directory_end - kHeaderBytes)), crc);
    if (crc != header_crc)
      fail(ErrorKind::format, where, ": header checksum mismatch: stored ", hex32(header_crc), ", computed ",
           hex32(crc), " over the header, v_0 and the directory: the file is corrupt");
  }
  struct Entry {
    uint64_t offset, bytes;
    uint32_t crc;
  };
  std::vector<Entry> entries(K);
  uint64_t expect = directory_end;
  for (uint32_t k = 0; k < K; ++k) {
    const std::string at = concat("directory entry ", k);
    Entry& e = entries[k];
    e.offset = in.scalar<uint64_t>(at + ": offset");
    e.bytes = in.scalar<uint64_t>(at + ": bytes");
    e.crc = in.u32(at + ": crc");
    in.zeros(12, at + ": reserved");
    expect = align_up(expect, kLowbitSectionAlign);
    if (e.offset != expect)
      fail(ErrorKind::format, where, ": matrix ", k, " section offset = ", e.offset, ": expected ", expect,
           " (the end of what precedes it, rounded up to 256)");
    if (e.bytes < kSectionHeaderBytes || e.bytes > bytes.size() - std::min<uint64_t>(e.offset, bytes.size()))
      fail(ErrorKind::format, where, ": matrix ", k, " section of ", e.bytes, " bytes at offset ", e.offset,
           " does not fit in the file's ", bytes.size(), " bytes (at least ", kSectionHeaderBytes, " expected)");
    expect = e.offset + e.bytes;
  }
  if (expect != bytes.size())
    fail(ErrorKind::format, where, ": the last section ends at byte ", expect, " but the file has ", bytes.size(),
         " bytes");
  // The gaps before each section (alignment) must be zero, as the writer leaves them.
  for (uint32_t k = 0; k < K; ++k) {
    in.zeros(entries[k].offset - in.offset(), concat("the padding before matrix ", k));
    in.seek(entries[k].offset + entries[k].bytes);
  }

  uint64_t n_prev = n0;
  f.matrices.reserve(K);
  for (uint32_t k = 0; k < K; ++k) {
    const Entry& e = entries[k];
    const std::string mw = concat(where, ": matrix ", k);
    const auto section = bytes.subspan(static_cast<size_t>(e.offset), static_cast<size_t>(e.bytes));
    if (options.verify_checksums) {
      const uint32_t crc = crc32(section);
      if (crc != e.crc)
        fail(ErrorKind::format, mw, ": section checksum mismatch: stored ", hex32(e.crc), ", computed ", hex32(crc),
             " over bytes [", e.offset, ", ", e.offset + e.bytes, "): the file is corrupt");
    }
    ByteReader s(section, mw);
    LowbitMatrix m;
    m.rows = s.u32("rows");
    m.cols = s.u32("cols");
    m.delta = s.scalar<float>("delta");
    m.precision = s.scalar<uint8_t>("precision");
    m.states_per_lane = s.scalar<uint8_t>("states_per_lane");
    m.w_min = s.scalar<int8_t>("w_min");
    const uint8_t scale_kind = s.scalar<uint8_t>("scale_kind");
    const uint16_t grid_size = s.scalar<uint16_t>("grid_size");
    if (s.scalar<uint16_t>("reserved (byte 18)") != 0) fail(ErrorKind::format, mw, ": reserved bytes 18..19 are not zero");
    m.rows_per_tile = s.u32("rows_per_tile");
    const uint32_t tiles = s.u32("tiles");
    m.group_size = s.u32("group_size");
    const uint64_t payload_bytes = s.scalar<uint64_t>("payload_bytes");
    s.zeros(24, "reserved bytes 40..63");
    if (m.rows == 0) fail(ErrorKind::format, mw, ": rows = 0: expected >= 1");
    if (m.cols != n_prev)
      fail(ErrorKind::format, mw, ": cols = ", m.cols, ": expected ", n_prev,
           k == 0 ? " (N_0, the length of v_0)" : " (the rows of the matrix before it)");
    if (m.precision < 1 || m.precision > kRansMaxPrecision)
      fail(ErrorKind::format, mw, ": precision = ", m.precision, ": expected 1..15 bits");
    if (m.states_per_lane != 1 && m.states_per_lane != 2 && m.states_per_lane != 4 && m.states_per_lane != 8)
      fail(ErrorKind::format, mw, ": states_per_lane = ", m.states_per_lane, ": expected 1, 2, 4 or 8");
    if (scale_kind > 2) fail(ErrorKind::format, mw, ": scale_kind = ", int{scale_kind}, ": expected 0, 1 or 2");
    m.scale_kind = static_cast<ScaleKind>(scale_kind);
    if ((m.scale_kind == ScaleKind::per_group) != (m.group_size != 0))
      fail(ErrorKind::format, mw, ": group_size = ", m.group_size, " with ", scale_kind_name(m.scale_kind),
           " scales: expected ", m.scale_kind == ScaleKind::per_group ? ">= 1" : "0");
    if (grid_size < 1 || grid_size > 256 || m.w_min + int{grid_size} - 1 > 127)
      fail(ErrorKind::format, mw, ": grid_size = ", grid_size, " from w_min = ", m.w_min,
           ": expected 1..256 values ending at most at 127");
    if (m.rows_per_tile < 1 || m.rows_per_tile > std::min<int64_t>(m.rows, kLowbitMaxRowsPerTile))
      fail(ErrorKind::format, mw, ": rows_per_tile = ", m.rows_per_tile, ": expected 1..min(rows = ", m.rows,
           ", 65536)");
    const uint64_t want_tiles = (uint64_t{m.rows} + m.rows_per_tile - 1) / m.rows_per_tile;
    if (tiles != want_tiles)
      fail(ErrorKind::format, mw, ": tiles = ", tiles, ": expected ceil(rows / rows_per_tile) = ", want_tiles);
    if (payload_bytes % kLowbitArrayAlign != 0)
      fail(ErrorKind::format, mw, ": payload_bytes = ", payload_bytes, ": expected a multiple of 16");
    const uint64_t n_scales = scale_count(m.scale_kind, m.rows, m.cols, m.group_size);
    const SectionLayout layout = section_layout(grid_size, n_scales, tiles, payload_bytes);
    if (layout.end != e.bytes)
      fail(ErrorKind::format, mw, ": the section's fields add up to ", layout.end, " bytes (", grid_size,
           " frequencies, ", n_scales, " scales, ", tiles, " tiles, ", payload_bytes,
           " payload bytes) but the directory gives it ", e.bytes);
    s.array(m.freq, grid_size, "freq");
    s.zeros(layout.scales - s.offset(), "the padding after freq");
    s.array(m.scales, n_scales, "scales");
    s.zeros(layout.tile_offsets - s.offset(), "the padding after scales");
    s.array(m.tile_offsets, uint64_t{tiles} + 1, "tile_offsets");
    s.zeros(layout.payload - s.offset(), "the padding after tile_offsets");
    s.array(m.payload, payload_bytes, "payload");
    m.model().validate(mw);
    const uint64_t S = static_cast<uint64_t>(m.streams_per_tile());
    if (m.tile_offsets[0] != 0) fail(ErrorKind::format, mw, ": tile_offsets[0] = ", m.tile_offsets[0], ": expected 0");
    if (m.tile_offsets[tiles] != payload_bytes / kLowbitArrayAlign)
      fail(ErrorKind::format, mw, ": tile_offsets[", tiles, "] = ", m.tile_offsets[tiles], ": expected ",
           payload_bytes / kLowbitArrayAlign, " (payload_bytes / 16)");
    for (uint32_t t = 0; t < tiles; ++t)
      if (uint64_t{m.tile_offsets[t + 1]} < uint64_t{m.tile_offsets[t]} + S * 4 / kLowbitArrayAlign)
        fail(ErrorKind::format, mw, ": tile_offsets[", t + 1, "] = ", m.tile_offsets[t + 1], " after ",
             m.tile_offsets[t], ": expected at least ", S * 4 / kLowbitArrayAlign,
             " more (16-byte units for the tile's ", S, " states)");
    n_prev = m.rows;
    f.matrices.push_back(std::move(m));
  }
  return f;
}

}  // namespace lowbit::ans
