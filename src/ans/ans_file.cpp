#include "lowbit/ans/ans_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>

#include "lowbit/core/error.h"

namespace lowbit::ans {

using lowbit::detail::concat;

namespace {

constexpr Container kAllContainers[] = {Container::seed, Container::seed_nohash, Container::baseline,
                                        Container::baseline_rowmajor, Container::lowbit};

std::string show(const std::filesystem::path& p) { return concat("'", p.string(), "'"); }

template <typename... F>
struct overloaded : F... {
  using F::operator()...;
};
template <typename... F>
overloaded(F...) -> overloaded<F...>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* container_name(Container c) {
  switch (c) {
    case Container::seed: return "seed";
    case Container::seed_nohash: return "seed-nohash";
    case Container::baseline: return "baseline";
    case Container::baseline_rowmajor: return "baseline-rowmajor";
    case Container::lowbit: return "lowbit";
  }
  return "?";
}

std::optional<Container> parse_container(std::string_view name) {
  for (Container c : kAllContainers)
    if (name == container_name(c)) return c;
  return std::nullopt;
}

Container container_of(const AnsFile& file) {
  return std::visit(overloaded{
                        [](const SeedFile& f) { return f.has_hash ? Container::seed : Container::seed_nohash; },
                        [](const BaselineFile& f) {
                          return f.order == BaselineOrder::row_major ? Container::baseline_rowmajor
                                                                     : Container::baseline;
                        },
                        [](const LowbitFile&) { return Container::lowbit; },
                    },
                    file);
}

// ---- reading -----------------------------------------------------------------------------

AnsFile parse_ans_file(std::span<const uint8_t> bytes, std::string_view where, const ReadOptions& options) {
  if (options.container) {
    switch (*options.container) {
      case Container::seed: return parse_seed_file(bytes, where, SeedVariant::with_hash);
      case Container::seed_nohash: return parse_seed_file(bytes, where, SeedVariant::without_hash);
      case Container::baseline: return parse_baseline_file(bytes, BaselineOrder::column_major, where);
      case Container::baseline_rowmajor: return parse_baseline_file(bytes, BaselineOrder::row_major, where);
      case Container::lowbit: return parse_lowbit_file(bytes, where, {options.verify_checksums});
    }
  }
  if (bytes.size() >= 8 && std::equal(std::begin(kLowbitMagic), std::end(kLowbitMagic), bytes.begin()))
    return parse_lowbit_file(bytes, where, {options.verify_checksums});
  std::string seed_error, baseline_error;
  try {
    return parse_seed_file(bytes, where, SeedVariant::detect);
  } catch (const Error& e) {
    seed_error = e.what();
  }
  try {
    return parse_baseline_file(bytes, options.baseline_order, where);
  } catch (const Error& e) {
    baseline_error = e.what();
  }
  fail(ErrorKind::format, where,
       " is not a lowbit, seed or baseline ANS file (no lowbit magic). As a seed container: ", seed_error,
       ". As a baseline container: ", baseline_error);
}

AnsFile read_ans_file(const std::filesystem::path& path, const ReadOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(ErrorKind::io, "cannot read ", show(path), ": it is a directory, expected an ANS file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::io, "cannot open ", show(path), ": ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) fail(ErrorKind::io, "cannot determine the size of ", show(path));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size))
    fail(ErrorKind::io, "cannot read ", size, " bytes from ", show(path));
  return parse_ans_file(bytes, show(path), options);
}

// ---- writing -------------------------------------------------------------------------------

std::vector<uint8_t> serialize_ans_file(const AnsFile& file, bool drop_scales) {
  return std::visit(overloaded{
                        [](const SeedFile& f) { return serialize_seed_file(f); },
                        [&](const BaselineFile& f) { return serialize_baseline_file(f, drop_scales); },
                        [](const LowbitFile& f) { return serialize_lowbit_file(f); },
                    },
                    file);
}

void write_bytes_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  static std::atomic<uint64_t> counter{0};
  std::filesystem::path tmp = path;
  tmp += concat(".partial-", ::getpid(), "-", counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    fail(ErrorKind::io, "cannot create ", show(tmp), " (to write ", show(path), "): ", std::strerror(err));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(ErrorKind::io, "cannot write ", show(path), ": ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(ErrorKind::io, "cannot flush ", show(path), ": ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(ErrorKind::io, "cannot rename ", show(tmp), " to ", show(path), ": ", std::strerror(err));
  }
}

void write_ans_file(const std::filesystem::path& path, const AnsFile& file, bool drop_scales) {
  const std::vector<uint8_t> bytes = serialize_ans_file(file, drop_scales);
  write_bytes_atomically(path, bytes);
}

// ---- conversion ----------------------------------------------------------------------------

Chain decode_ans_file(const AnsFile& file, std::string_view where) {
  return std::visit(overloaded{
                        [&](const SeedFile& f) { return decode_seed_file(f, where); },
                        [](const BaselineFile& f) { return f.chain; },
                        [&](const LowbitFile& f) { return decode_lowbit_file(f, where); },
                    },
                    file);
}

AnsFile encode_ans_file(const Chain& chain, const EncodeOptions& options) {
  switch (options.container) {
    case Container::seed: {
      SeedEncodeOptions o = seed_encoder_with_hash();
      o.drop_scales = options.drop_scales;
      return encode_seed_file(chain, o);
    }
    case Container::seed_nohash: {
      SeedEncodeOptions o = seed_encoder_report_era();
      o.drop_scales = options.drop_scales;
      return encode_seed_file(chain, o);
    }
    case Container::baseline:
    case Container::baseline_rowmajor: {
      validate_chain(chain, "chain");
      for (size_t k = 0; k < chain.matrices.size(); ++k)
        if (chain.matrices[k].scale_kind != ScaleKind::none && !options.drop_scales)
          fail(ErrorKind::invalid_argument, "the baseline container keeps one delta per matrix, but matrix ", k,
               " has ", scale_kind_name(chain.matrices[k].scale_kind),
               " scales: drop them explicitly (drop_scales, --drop-scales)");
      BaselineFile f;
      f.chain = chain;
      f.chain.result_hash.reset();
      for (Int8Matrix& m : f.chain.matrices) {
        m.scale_kind = ScaleKind::none;
        m.group_size = 0;
        m.scales.clear();
      }
      f.order = options.container == Container::baseline ? BaselineOrder::column_major : BaselineOrder::row_major;
      return f;
    }
    case Container::lowbit: return encode_lowbit_file(chain, options.lowbit);
  }
  fail(ErrorKind::internal, "encode_ans_file: unknown container");
}

// ---- the chain run -------------------------------------------------------------------------

ChainRun run_chain_cpu(const AnsFile& file, std::string_view where) {
  ChainRun run;
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<int8_t> v;
  std::vector<int64_t> y;
  auto step = [&](auto&& product, int64_t rows, int64_t cols) {
    try {
      y.assign(static_cast<size_t>(rows), 0);
    } catch (const std::bad_alloc&) {
      fail(ErrorKind::unsupported, where, ": matrix ", run.matrix_seconds.size(), " has ", rows,
           " rows: their results do not fit in memory");
    }
    const auto t0 = std::chrono::steady_clock::now();
    product();
    run.matrix_seconds.push_back(seconds_since(t0));
    const auto t1 = std::chrono::steady_clock::now();
    v = requantize(y);
    run.requantize_seconds += seconds_since(t1);
    run.weights += static_cast<uint64_t>(rows * cols);
  };
  std::visit(overloaded{
                 [&](const SeedFile& f) {
                   v = f.v0;
                   if (f.has_hash) run.recorded_hash = f.result_hash;
                   for (size_t k = 0; k < f.matrices.size(); ++k) {
                     const SeedMatrix& m = f.matrices[k];
                     step([&] { seed_matvec(m, v, y, concat(where, ": matrix ", k)); }, m.rows, m.cols);
                   }
                 },
                 [&](const BaselineFile& f) {
                   validate_chain(f.chain, where);
                   v = f.chain.v0;
                   for (const Int8Matrix& m : f.chain.matrices) step([&] { matvec_int8(m, v, y); }, m.rows, m.cols);
                 },
                 [&](const LowbitFile& f) {
                   v = f.v0;
                   run.recorded_hash = f.result_hash;
                   for (size_t k = 0; k < f.matrices.size(); ++k) {
                     const LowbitMatrix& m = f.matrices[k];
                     step([&] { lowbit_matvec(m, v, y, concat(where, ": matrix ", k)); }, m.rows, m.cols);
                   }
                 },
             },
             file);
  run.total_seconds = seconds_since(t_start);
  run.final_vector = std::move(v);
  run.hash = fxhash32(run.final_vector);
  return run;
}

// ---- statistics ----------------------------------------------------------------------------

namespace {

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// The length serialize_ans_file() would produce, without building the bytes.
uint64_t file_bytes_of(const AnsFile& file) {
  return std::visit(
      overloaded{
          [](const SeedFile& f) {
            uint64_t n = (f.has_hash ? 16 : 12) + align_up(f.v0.size(), 4);
            for (const SeedMatrix& m : f.matrices) n += m.file_bytes();
            return n;
          },
          [](const BaselineFile& f) {
            uint64_t n = 8 + align_up(f.chain.v0.size(), 4);
            for (const Int8Matrix& m : f.chain.matrices)
              n += 12 + static_cast<uint64_t>(m.rows * m.cols) + static_cast<uint64_t>(m.rows * m.cols) % 2;
            return n;
          },
          [](const LowbitFile& f) {
            uint64_t n = 64 + align_up(f.v0.size(), kLowbitArrayAlign) + 32 * f.matrices.size();
            for (const LowbitMatrix& m : f.matrices) n = align_up(n, kLowbitSectionAlign) + m.section_bytes();
            return n;
          },
      },
      file);
}

void add_into(MatrixStats& total, const MatrixStats& m) {
  const double n0 = static_cast<double>(total.weights), n1 = static_cast<double>(m.weights);
  const double n = n0 + n1;
  if (n > 0) {
    total.entropy_bits = (total.entropy_bits * n0 + m.entropy_bits * n1) / n;
    total.cross_entropy_bits = (total.cross_entropy_bits * n0 + m.cross_entropy_bits * n1) / n;
  }
  total.weights += m.weights;
  total.rows += m.rows;
  total.cols = std::max(total.cols, m.cols);
  total.distinct = std::max(total.distinct, m.distinct);
  total.grid_size = std::max(total.grid_size, m.grid_size);
  total.precision = std::max(total.precision, m.precision);
  total.streams += m.streams;
  total.coded_bytes += m.coded_bytes;
  total.state_bytes += m.state_bytes;
  total.padding_bytes += m.padding_bytes;
  total.table_bytes += m.table_bytes;
  total.scale_bytes += m.scale_bytes;
}

}  // namespace

FileStats inspect_ans_file(const AnsFile& file, std::string_view where) {
  FileStats stats;
  stats.container = container_of(file);
  stats.file_bytes = file_bytes_of(file);
  std::visit(overloaded{
                 [&](const SeedFile& f) {
                   if (f.has_hash) stats.result_hash = f.result_hash;
                   for (size_t k = 0; k < f.matrices.size(); ++k) {
                     const SeedMatrix& m = f.matrices[k];
                     const std::string mw = concat(where, ": matrix ", k);
                     const Int8Matrix d = decode_seed_matrix(m, mw);
                     const SymbolCounts counts = SymbolCounts::of(d.data);
                     MatrixStats s;
                     s.rows = m.rows;
                     s.cols = m.cols;
                     s.weights = uint64_t{m.rows} * m.cols;
                     s.distinct = counts.distinct();
                     s.grid_size = m.grid_size();
                     s.precision = 8;
                     s.streams = m.rows;
                     s.entropy_bits = counts.entropy_bits();
                     s.cross_entropy_bits = seed_matrix_model(m, mw).cross_entropy_bits(counts);
                     s.coded_bytes = 2 * m.payload.size();
                     s.state_bytes = 4 * uint64_t{m.rows};
                     s.padding_bytes = m.cdf.size() % 2 + 2 * (m.payload.size() % 2);
                     s.table_bytes = m.file_bytes() - s.coded_bytes - s.padding_bytes;
                     stats.matrices.push_back(s);
                   }
                 },
                 [&](const BaselineFile& f) {
                   for (const Int8Matrix& m : f.chain.matrices) {
                     const SymbolCounts counts = SymbolCounts::of(m.data);
                     MatrixStats s;
                     s.rows = m.rows;
                     s.cols = m.cols;
                     s.weights = static_cast<uint64_t>(m.rows * m.cols);
                     s.distinct = counts.distinct();
                     s.grid_size = 256;
                     s.entropy_bits = counts.entropy_bits();
                     s.cross_entropy_bits = 8.0;
                     s.coded_bytes = s.weights;
                     s.padding_bytes = s.weights % 2;
                     s.table_bytes = 12;
                     stats.matrices.push_back(s);
                   }
                 },
                 [&](const LowbitFile& f) {
                   stats.result_hash = f.result_hash;
                   for (size_t k = 0; k < f.matrices.size(); ++k) {
                     const LowbitMatrix& m = f.matrices[k];
                     const std::string mw = concat(where, ": matrix ", k);
                     uint64_t words = 0;
                     const Int8Matrix d = decode_lowbit_matrix(m, mw, &words);
                     const SymbolCounts counts = SymbolCounts::of(d.data);
                     MatrixStats s;
                     s.rows = m.rows;
                     s.cols = m.cols;
                     s.weights = uint64_t{m.rows} * m.cols;
                     s.distinct = counts.distinct();
                     s.grid_size = static_cast<int>(m.freq.size());
                     s.precision = m.precision;
                     s.streams = uint64_t{m.tiles()} * static_cast<uint64_t>(m.streams_per_tile());
                     s.entropy_bits = counts.entropy_bits();
                     s.cross_entropy_bits = m.model().cross_entropy_bits(counts);
                     s.state_bytes = 4 * s.streams;
                     s.coded_bytes = s.state_bytes + 2 * words;
                     s.table_bytes = 64 + 2 * m.freq.size() + 4 * m.tile_offsets.size();
                     s.scale_bytes = 4 * m.scales.size();
                     s.padding_bytes = m.section_bytes() - s.coded_bytes - s.table_bytes - s.scale_bytes;
                     stats.matrices.push_back(s);
                   }
                 },
             },
             file);
  for (const MatrixStats& s : stats.matrices) add_into(stats.total, s);
  stats.file_overhead_bytes = stats.file_bytes - stats.total.total_bytes();
  return stats;
}

}  // namespace lowbit::ans
