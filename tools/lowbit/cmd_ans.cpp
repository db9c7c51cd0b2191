// `lowbit ans`: Entropy-coded (rANS) weights: MATVANS files, synthetic chains, conversion, runs.
//
//   lowbit ans make-synthetic --layers K --dim N --out FILE [--format F] [--seed S] ...
//   lowbit ans inspect FILE [--json]
//   lowbit ans convert IN OUT --format F ...
//   lowbit ans run FILE [--device cpu|cuda|auto] [--with-copies] [--repeat N] [--json]
//
// The containers (docs/ans-formats.md): seed, seed-nohash, baseline,
// baseline-rowmajor, lowbit. Input files are detected; only the element order
// of a baseline file cannot be, hence --baseline-order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "lowbit/ans/ans_cuda.h"
#include "lowbit/ans/ans_file.h"
#include "lowbit/ans/synthetic.h"
#include "lowbit/core/error.h"
#include "lowbit/core/host_memory.h"
#include "lowbit/core/parallel.h"
#include "lowbit/cuda/device.h"

namespace lowbit::cli {
namespace {

using namespace lowbit::ans;

const std::vector<std::string> kContainerNames = {"seed", "seed-nohash", "lowbit", "baseline", "baseline-rowmajor"};

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Options shared by the commands that encode (make-synthetic, convert).
struct EncodeFlags {
  std::string format = "lowbit";
  int precision = 12;
  int states_per_lane = 1;
  int64_t rows_per_tile = 0;
  int64_t symbols_per_stream = 0;
  bool drop_scales = false;

  void add(CLI::App* cmd, bool format_required) {
    auto* f = cmd->add_option("--format", format,
                              "Container to write:\n"
                              "  lowbit: lowbit's interleaved rANS format for the GPU (12-bit model by default)\n"
                              "  seed: the MATVANS container (report Table 1) with the result hash after K,\n"
                              "        as the later MATVANS tools and the conformance files have it\n"
                              "  seed-nohash: report Table 1 exactly (no result hash)\n"
                              "  baseline: uncompressed int8, column-major (report appendix A)\n"
                              "  baseline-rowmajor: the same layout with row-major codes (create_matfiles.py)")
                  ->check(CLI::IsMember(kContainerNames));
    if (format_required) f->required();
    else f->capture_default_str();
    cmd->add_option("--precision", precision,
                    "lowbit only: probability precision P in bits (the seed's model is always 8)")
        ->check(CLI::Range(1, 15))
        ->capture_default_str();
    cmd->add_option("--states-per-lane", states_per_lane,
                    "lowbit only: rANS states per warp lane; a tile has 32 x this many streams")
        ->check(CLI::IsMember({1, 2, 4, 8}))
        ->capture_default_str();
    cmd->add_option("--rows-per-tile", rows_per_tile,
                    "lowbit only: matrix rows per tile (one warp's work), at most 65536; 0 picks the fewest\n"
                    "rows that give every stream --symbols-per-stream symbols")
        ->check(CLI::Range(int64_t{0}, kLowbitMaxRowsPerTile))
        ->capture_default_str();
    cmd->add_option("--symbols-per-stream", symbols_per_stream,
                    "lowbit only: target symbols per stream when --rows-per-tile is 0. Each stream costs about\n"
                    "32 bits of state (1024 symbols: ~0.03 bits per weight); 0 picks 1024..8192 from the\n"
                    "codes' entropy so that states cost at most 0.4% of it. Shorter streams: more parallelism")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
        ->capture_default_str();
    cmd->add_flag("--drop-scales", drop_scales,
                  "Allow writing per-channel/per-group quantized codes to the seed and baseline containers,\n"
                  "which keep only one delta per matrix (the scales are lost)");
  }
  EncodeOptions options() const {
    EncodeOptions o;
    o.container = *parse_container(format);
    o.lowbit.precision = precision;
    o.lowbit.states_per_lane = states_per_lane;
    o.lowbit.rows_per_tile = rows_per_tile;
    o.lowbit.target_symbols_per_stream = symbols_per_stream;
    o.drop_scales = drop_scales;
    return o;
  }
};

// How input files are read.
struct ReadFlags {
  std::string baseline_order = "column";
  void add(CLI::App* cmd) {
    cmd->add_option("--baseline-order", baseline_order,
                    "Element order of a baseline (uncompressed) input, which the file cannot tell:\n"
                    "column (report appendix A) or row (create_matfiles.py, e.g. raw-matrices_512.bin)")
        ->check(CLI::IsMember({"column", "row"}))
        ->capture_default_str();
  }
  ReadOptions options() const {
    ReadOptions o;
    o.baseline_order = baseline_order == "row" ? BaselineOrder::row_major : BaselineOrder::column_major;
    return o;
  }
};

std::string describe_layout(const AnsFile& file) {
  if (const auto* f = std::get_if<LowbitFile>(&file); f != nullptr && !f->matrices.empty()) {
    const LowbitMatrix& m = f->matrices.front();
    return "P = " + std::to_string(m.precision) + " bits, " + std::to_string(m.streams_per_tile()) +
           " streams per tile, " + std::to_string(m.rows_per_tile) + " rows per tile (matrix 0)";
  }
  if (std::holds_alternative<SeedFile>(file)) return "the seed's 8-bit model, one stream per row";
  return "uncompressed";
}

nlohmann::json stats_json(const MatrixStats& s) {
  return {{"rows", s.rows},
          {"cols", s.cols},
          {"weights", s.weights},
          {"distinct_values", s.distinct},
          {"grid_size", s.grid_size},
          {"precision_bits", s.precision},
          {"streams", s.streams},
          {"entropy_bits", s.entropy_bits},
          {"cross_entropy_bits", s.cross_entropy_bits},
          {"achieved_bits", s.achieved_bits()},
          {"total_bits", s.total_bits()},
          {"overhead_bits",
           {{"model", s.model_loss_bits()},
            {"coder_and_stream_states", s.coder_loss_bits()},
            {"padding", s.bits(s.padding_bytes)},
            {"tables", s.bits(s.table_bytes)},
            {"scales", s.bits(s.scale_bytes)}}},
          {"bytes",
           {{"coded", s.coded_bytes},
            {"states", s.state_bytes},
            {"padding", s.padding_bytes},
            {"tables", s.table_bytes},
            {"scales", s.scale_bytes},
            {"total", s.total_bytes()}}}};
}

void print_stats(const std::string& path, const AnsFile& file, const FileStats& st) {
  std::cout << path << ": " << container_name(st.container) << " container, K = " << st.matrices.size()
            << " matrices, " << st.file_bytes << " bytes";
  if (st.result_hash) std::cout << ", result_hash " << *st.result_hash;
  std::cout << "\nmodel: " << describe_layout(file) << "\n";
  std::printf("%-6s %-13s %5s %4s %2s %8s %7s %7s %8s %7s | %7s %7s %7s %7s\n", "matrix", "shape", "vals", "|G|",
              "P", "streams", "H", "xent", "achieved", "total", "model", "coder", "pad", "tables");
  auto row = [](const std::string& name, const MatrixStats& s) {
    const std::string shape = name == "all" ? "" : std::to_string(s.rows) + "x" + std::to_string(s.cols);
    std::printf("%-6s %-13s %5d %4d %2d %8llu %7.4f %7.4f %8.4f %7.4f | %+7.4f %+7.4f %+7.4f %+7.4f\n", name.c_str(),
                shape.c_str(), s.distinct, s.grid_size, s.precision, static_cast<unsigned long long>(s.streams),
                s.entropy_bits, s.cross_entropy_bits, s.achieved_bits(), s.total_bits(), s.model_loss_bits(),
                s.coder_loss_bits(), s.bits(s.padding_bytes), s.bits(s.table_bytes));
  };
  for (size_t k = 0; k < st.matrices.size(); ++k) row(std::to_string(k), st.matrices[k]);
  if (st.matrices.empty()) return;
  if (st.matrices.size() > 1) row("all", st.total);
  const MatrixStats& t = st.total;
  const double whole = 8.0 * static_cast<double>(st.file_bytes) / static_cast<double>(t.weights);
  std::cout << "bits per weight (H: empirical entropy of the codes; xent: their cost under the stored model;\n"
               "achieved: coded words incl. stream states; total: all bytes of the matrices). Overhead by cause:\n";
  auto line = [&](const char* what, double bits) {
    std::printf("  %-44s %+8.4f  (%+6.2f%% of H)\n", what, bits, t.entropy_bits > 0 ? 100 * bits / t.entropy_bits : 0.0);
  };
  line("model (probability precision)", t.model_loss_bits());
  line("coder (rANS + per-stream 32-bit states)", t.coder_loss_bits());
  line("padding", t.bits(t.padding_bytes));
  line("tables (headers, cursors/offsets, cdf/freq)", t.bits(t.table_bytes));
  if (t.scale_bytes != 0) line("quantization scales (f32)", t.bits(t.scale_bytes));
  line("file header, v_0, directory", t.bits(st.file_overhead_bytes));
  std::printf("  %-44s %8.4f  (%+6.2f%% over H; int8 is 8)\n", "whole file", whole,
              t.entropy_bits > 0 ? 100 * (whole / t.entropy_bits - 1) : 0.0);
}

void add_make_synthetic(CLI::App* ans) {
  auto* cmd = ans->add_subcommand(
      "make-synthetic",
      "Generate the seed's experiment: K square N x N int8 matrices (w ~ Normal(0, 1/sqrt(N)), symmetric\n"
      "absmax quantization) and v_0 = round(Normal(0, 1)), compute the chain's result hash, and write\n"
      "them in one container. Per-channel and per-group 8- and 4-bit codes are available for\n"
      "compression studies (the chain multiplies codes; scales are kept by the lowbit container).");
  struct Flags {
    int64_t layers = 0, dim = 0;
    std::string out;
    uint64_t seed = 20250310;
    std::string dist = "gaussian";
    int bits = 8;
    std::string quant = "per-tensor";
    int64_t group_size = 128;
    EncodeFlags encode;
  };
  static Flags f;
  cmd->add_option("--layers", f.layers, "K, the number of matrices")->required()->check(CLI::Range(1, 10000));
  cmd->add_option("--dim", f.dim, "N: matrices are N x N, v_0 has N entries")->required()->check(CLI::Range(1, 32768));
  cmd->add_option("--out", f.out, "File to write (replaced atomically)")->required();
  cmd->add_option("--seed", f.seed, "Random seed (the same seed gives the same file)")->capture_default_str();
  cmd->add_option("--dist", f.dist, "Weight distribution (unit variance, scaled by 1/sqrt(N))")
      ->check(CLI::IsMember({"gaussian", "laplace", "student-t4"}))
      ->capture_default_str();
  cmd->add_option("--bits", f.bits, "Bits of the symmetric codes: 8 (-127..127) or 4 (-7..7)")
      ->check(CLI::IsMember({8, 4}))
      ->capture_default_str();
  cmd->add_option("--quant", f.quant,
                  "Scale granularity: per-tensor (the seed's), per-channel (one scale per row), per-group")
      ->check(CLI::IsMember({"per-tensor", "per-channel", "per-group"}))
      ->capture_default_str();
  cmd->add_option("--group-size", f.group_size, "Columns per scale with --quant per-group")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  f.encode.add(cmd, /*format_required=*/false);
  cmd->callback([] {
    SyntheticOptions o;
    o.layers = f.layers;
    o.dim = f.dim;
    o.seed = f.seed;
    o.distribution = *parse_distribution(f.dist);
    o.bits = f.bits;
    o.granularity = *parse_granularity(f.quant);
    o.group_size = f.group_size;
    const EncodeOptions eo = f.encode.options();
    // Refuse before the (long) generation when the container cannot hold the scales.
    if (o.granularity != Granularity::per_tensor && !eo.drop_scales && eo.container != Container::lowbit)
      fail(ErrorKind::invalid_argument, "--format ", f.encode.format, " keeps one delta per matrix and cannot store ",
           f.quant, " scales: use --format lowbit, or --drop-scales to write the codes alone");
    // The chain's codes (one byte per weight) and the encoded container are
    // in memory together: refuse a chain that cannot be, before generating it.
    require_host_memory(2 * f.layers * f.dim * f.dim,
                        "make-synthetic (" + std::to_string(f.layers) + " matrices of " + std::to_string(f.dim) + " x " +
                            std::to_string(f.dim) + " one-byte codes, and their encoding beside them)");
    const auto t0 = std::chrono::steady_clock::now();
    const Chain chain = make_synthetic_chain(o);
    const double t_gen = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    const AnsFile file = encode_ans_file(chain, eo);
    const double t_enc = seconds_since(t1);
    const auto t2 = std::chrono::steady_clock::now();
    write_ans_file(f.out, file, eo.drop_scales);
    const double t_write = seconds_since(t2);
    const FileStats st = inspect_ans_file(file, f.out);
    std::cout << "wrote " << f.out << ": " << container_name(st.container) << ", K = " << f.layers << " matrices of "
              << f.dim << " x " << f.dim << " (" << f.dist << ", " << f.bits << "-bit " << f.quant
              << "), result_hash " << *chain.result_hash << "\n"
              << "entropy " << fmt("%.4f", st.total.entropy_bits) << " bits/weight, achieved "
              << fmt("%.4f", st.total.achieved_bits()) << ", file " << st.file_bytes << " bytes ("
              << fmt("%.4f", 8.0 * static_cast<double>(st.file_bytes) / static_cast<double>(st.total.weights))
              << " bits/weight)\n"
              << "time: generate + reference chain " << fmt("%.2f", t_gen) << " s, encode " << fmt("%.2f", t_enc)
              << " s (" << fmt("%.1f", static_cast<double>(st.total.weights) / t_enc / 1e6) << " M weights/s, "
              << num_threads() << " threads), write " << fmt("%.2f", t_write) << " s\n";
  });
}

void add_inspect(CLI::App* ans) {
  auto* cmd = ans->add_subcommand(
      "inspect",
      "Check a file whole (every matrix is decoded) and report, per matrix and in total, the empirical\n"
      "entropy of the codes, their cross-entropy under the stored model, the achieved bits per weight,\n"
      "and the overhead by cause: model precision, coder and stream states, padding, tables.");
  static std::string path;
  static bool json = false;
  static ReadFlags read;
  cmd->add_option("FILE", path, "A seed, baseline or lowbit ANS file")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--json", json, "Print JSON instead of text");
  read.add(cmd);
  cmd->callback([] {
    const AnsFile file = read_ans_file(path, read.options());
    const FileStats st = inspect_ans_file(file, path);
    if (!json) {
      print_stats(path, file, st);
      return;
    }
    nlohmann::json out = {{"path", path},
                          {"container", container_name(st.container)},
                          {"file_bytes", st.file_bytes},
                          {"file_overhead_bytes", st.file_overhead_bytes},
                          {"total", stats_json(st.total)}};
    if (st.result_hash) out["result_hash"] = *st.result_hash;
    nlohmann::json matrices = nlohmann::json::array();
    for (const MatrixStats& s : st.matrices) matrices.push_back(stats_json(s));
    out["matrices"] = matrices;
    std::cout << out.dump(2) << "\n";
  });
}

void add_convert(CLI::App* ans) {
  auto* cmd = ans->add_subcommand(
      "convert",
      "Decode IN (any container; checked whole) and write its chain to OUT in another container. The\n"
      "result hash is kept, or computed when IN has none and OUT stores one.");
  static std::string in_path, out_path;
  static EncodeFlags encode;
  static ReadFlags read;
  cmd->add_option("IN", in_path, "File to read")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", out_path, "File to write (replaced atomically)")->required();
  encode.add(cmd, /*format_required=*/true);
  read.add(cmd);
  cmd->callback([] {
    const AnsFile in = read_ans_file(in_path, read.options());
    const auto t0 = std::chrono::steady_clock::now();
    const Chain chain = decode_ans_file(in, in_path);
    const double t_dec = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    const AnsFile out = encode_ans_file(chain, encode.options());
    const double t_enc = seconds_since(t1);
    write_ans_file(out_path, out, encode.drop_scales);
    const FileStats st = inspect_ans_file(out, out_path);
    std::cout << "wrote " << out_path << ": " << container_name(container_of(out)) << ", K = " << chain.matrices.size()
              << ", " << st.file_bytes << " bytes, achieved " << fmt("%.4f", st.total.achieved_bits())
              << " bits/weight (entropy " << fmt("%.4f", st.total.entropy_bits) << "); decode "
              << fmt("%.2f", t_dec) << " s, encode " << fmt("%.2f", t_enc) << " s\n";
  });
}

void add_run(CLI::App* ans) {
  auto* cmd = ans->add_subcommand(
      "run",
      "Run the seed's experiment on a file: v_{k+1} = round_half_even(127 * W_k v_k / max|W_k v_k|) from v_0,\n"
      "decoding compressed matrices on the fly. Prints the final vector's hash (checked against the\n"
      "file's result_hash when it has one: a mismatch is an error) and the timings. On the GPU each\n"
      "container has its kernel: seed -> the seed-faithful MATVANS kernel (thread per row), lowbit ->\n"
      "the fused warp-per-tile decode + GEMV, baseline -> lowbit's int8 GEMV; the whole chain runs on\n"
      "the GPU (requantization included) and the timings come from CUDA events.");
  static std::string path;
  static std::string device = "cpu";
  static int repeat = 1;
  static bool json = false;
  static bool with_copies = false;
  static ReadFlags read;
  cmd->add_option("FILE", path, "A seed, baseline or lowbit ANS file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--device", device, "cpu (the reference), cuda, or auto (cuda when a GPU is visible)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  cmd->add_option("--repeat", repeat, "Run the chain this many times; timings report the fastest and the median")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--with-copies", with_copies,
                "cuda: copy each matrix's bytes (compressed bytes for seed and lowbit files) from pinned host\n"
                "memory during the chain instead of keeping the chain resident on the GPU");
  cmd->add_flag("--json", json, "Print JSON instead of text");
  read.add(cmd);
  cmd->callback([] {
    const bool cuda = device == "cuda" || (device == "auto" && cuda_device_count() > 0);
    const AnsFile file = read_ans_file(path, read.options());
    std::vector<ChainRun> runs;
    for (int i = 0; i < repeat; ++i) {
      if (cuda) {
        CudaRunOptions o;
        o.with_copies = with_copies;
        runs.push_back(run_chain_cuda(file, path, o));
      } else {
        runs.push_back(run_chain_cpu(file, path));
      }
    }
    const ChainRun& first = runs.front();
    for (const ChainRun& r : runs)
      if (r.hash != first.hash) fail(ErrorKind::internal, "the chain gave different hashes on repeated runs");
    std::vector<double> totals;
    for (const ChainRun& r : runs) totals.push_back(r.total_seconds);
    std::sort(totals.begin(), totals.end());
    const double best = totals.front(), median = totals[totals.size() / 2];
    const double gws = best > 0 ? static_cast<double>(first.weights) / best / 1e9 : 0.0;
    std::string device_text = "cpu (" + std::to_string(num_threads()) + " threads)";
    if (cuda) {
      const CudaDeviceInfo info = cuda_device_info(0);
      device_text = "cuda (" + info.name + (with_copies ? ", weights copied from pinned host memory" : ", resident") + ")";
    }
    if (json) {
      nlohmann::json out = {{"path", path},
                            {"container", container_name(container_of(file))},
                            {"device", cuda ? "cuda" : "cpu"},
                            {"with_copies", cuda && with_copies},
                            {"threads", num_threads()},
                            {"matrices", first.matrix_seconds.size()},
                            {"weights", first.weights},
                            {"hash", first.hash},
                            {"best_seconds", best},
                            {"median_seconds", median},
                            {"giga_weights_per_second", gws},
                            {"requantize_seconds", first.requantize_seconds},
                            {"matrix_seconds", first.matrix_seconds}};
      if (first.recorded_hash) out["recorded_hash"] = *first.recorded_hash;
      std::cout << out.dump(2) << "\n";
    } else {
      std::cout << path << ": " << container_name(container_of(file)) << ", K = " << first.matrix_seconds.size()
                << ", " << first.weights << " weights, device " << device_text << "\n"
                << "final vector hash: " << first.hash;
      if (first.recorded_hash)
        std::cout << (*first.recorded_hash == first.hash ? " (matches the file's result_hash)"
                                                         : " (the file's result_hash is " +
                                                               std::to_string(*first.recorded_hash) + ")");
      else
        std::cout << " (the file records no result_hash)";
      std::cout << "\ntime: best " << fmt("%.3f", best * 1e3) << " ms, median " << fmt("%.3f", median * 1e3)
                << " ms over " << repeat << " run(s); " << fmt("%.3f", gws)
                << " G weights/s (decode + multiply + requantize); requantize "
                << fmt("%.3f", first.requantize_seconds * 1e3) << " ms\n";
    }
    std::cout.flush();
    if (first.recorded_hash && *first.recorded_hash != first.hash)
      fail(ErrorKind::format, path, ": the final vector's hash ", first.hash, " differs from the file's result_hash ",
           *first.recorded_hash, ": the file is corrupt or was written by a different chain");
  });
}

}  // namespace

void add_ans_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("ans", "Entropy-coded (rANS) weights: MATVANS files, synthetic chains, conversion, runs");
  cmd->require_subcommand(1);
  add_make_synthetic(cmd);
  add_inspect(cmd);
  add_convert(cmd);
  add_run(cmd);
}

}  // namespace lowbit::cli
