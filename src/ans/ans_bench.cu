// `lowbit bench ans` (lowbit/ans/ans_cuda.h): the seed's Figure 2 on this GPU
// and the issue's targets for the fused lowbit kernel.
//
// Method: every timed call is a whole chain of K products + requantizations
// (or one product, for the per-kernel rows), enqueued through
// lowbit::cuda::time_cuda: CUDA events, warm-up, L2 flushed before every
// call, median of the reps. Every method is timed in the same run on the same
// synthetic chain, and its final vector is checked against the CPU reference
// hash before it is timed (cuBLAS fp32 is reported, not required, to match:
// fp32 sums of int8 products are not exact beyond 2^24).
//
// Bytes per call ("bytes"): what the chain must move from memory for its
// weights: the blob of each matrix (compressed payload + tables + cursors or
// tile offsets for seed and lowbit; the codes for int8; 4 bytes per weight for
// fp32). With copies, the same bytes cross PCIe from pinned host memory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ans_cuda_engine.cuh"
#include "lowbit/ans/ans_cuda.h"
#include "lowbit/ans/synthetic.h"
#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/timer.h"

namespace lowbit::ans {
namespace {

using gpu::ChainEngine;
using gpu::Method;
using gpu::PreparedMatrix;

struct Context {
  CudaDeviceInfo dev;
  double copy_GBps = 0;
  std::unique_ptr<bench::JsonRowsWriter> json;
  std::vector<bench::BenchRow> rows;
  const AnsBenchOptions* options = nullptr;

  void emit(const bench::BenchRow& row) {
    rows.push_back(row);
    if (json) json->write(row);
    std::printf("  %-22s %-22s", row.suite.c_str(), row.impl.c_str());
    for (const auto& [k, v] : row.shape) std::printf(" %s=%s", k.c_str(), v.dump().c_str());
    std::printf("  %10.1f us  %8.1f GB/s", row.stats.median_us, row.GBps());
    for (const auto& [k, v] : row.extra) std::printf("  %s=%s", k.c_str(), v.dump().c_str());
    std::printf("\n");
    std::fflush(stdout);
  }
};

// Lowbit tiles sized for the GPU: the fused kernel runs one warp per tile, so
// the tile count is the parallelism. About 32 warps per SM keeps the decode's
// dependency chains covered (docs/ans-kernels.md); fewer rows per tile cost
// more stream states (32 bits per stream).
LowbitOptions gpu_lowbit_options(int64_t rows, int sm_count, int64_t rows_per_tile = 0, int slots = 1) {
  LowbitOptions o;
  o.states_per_lane = slots;
  o.rows_per_tile = rows_per_tile > 0 ? rows_per_tile
                                      : std::max<int64_t>(1, rows / (int64_t{32} * sm_count / slots));
  return o;
}

std::vector<PreparedMatrix> prepare(const Chain& chain, Method m, const SeedFile* seed, const LowbitFile* lowbit) {
  std::vector<PreparedMatrix> out;
  for (size_t k = 0; k < chain.matrices.size(); ++k) {
    if (m == Method::seed)
      out.push_back(gpu::prepare_seed(seed->matrices[k]));
    else if (m == Method::lowbit_fused)
      out.push_back(gpu::prepare_lowbit(lowbit->matrices[k]));
    else
      out.push_back(gpu::prepare_dense(chain.matrices[k], m));
  }
  return out;
}

// Runs the chain once (resident when the engine has the blobs, else with
// copies) and compares the final vector's hash with the CPU reference.
bool chain_matches(ChainEngine& e, bool resident, uint32_t expected, const char* where) {
  cudaStream_t s = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (resident)
    e.enqueue(s);
  else
    e.enqueue_with_copies(s);
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(s));
  e.check_errors(where);
  return fxhash32(e.final_vector()) == expected;
}

bench::TimingStats time_chain(ChainEngine& e, bool copies, int warmup, int reps) {
  cuda::CudaTimerOptions t;
  t.warmup = warmup;
  t.reps = reps;
  return cuda::time_cuda(
      [&](cudaStream_t s) {
        if (copies)
          e.enqueue_with_copies(s);
        else
          e.enqueue(s);
      },
      t);
}

bench::TimingStats time_product(ChainEngine& e, int reps) {
  cuda::CudaTimerOptions t;
  t.warmup = 10;
  t.reps = reps;
  return cuda::time_cuda([&](cudaStream_t s) { e.enqueue_product(s, 0); }, t);
}

double sym_per_clk_per_sm(const Context& c, uint64_t symbols, double us) {
  const double clk = c.dev.clock_khz > 0 ? c.dev.clock_khz * 1e3 : 1.98e9;
  return static_cast<double>(symbols) / (us * 1e-6) / clk / c.dev.sm_count;
}

// ---- Figure 2 ------------------------------------------------------------------------

void figure2(Context& c) {
  const AnsBenchOptions& o = *c.options;
  std::printf("\n== Figure 2 of the seed: chains of K = %lld square products on the seed's data "
              "(w ~ N(0, 1/sqrt(N)), per-tensor int8), times per chain, with and without weight copies\n",
              static_cast<long long>(o.layers));
  for (int64_t n : o.figure2_sizes) {
    SyntheticOptions so;
    so.layers = o.layers;
    so.dim = n;
    so.seed = o.seed;
    const Chain chain = make_synthetic_chain(so);
    const uint32_t expected = *chain.result_hash;
    const SeedFile seed = encode_seed_file(chain, seed_encoder_with_hash());
    const LowbitFile lowbit = encode_lowbit_file(chain, gpu_lowbit_options(n, c.dev.sm_count));
    const uint64_t weights = static_cast<uint64_t>(n) * static_cast<uint64_t>(n) * static_cast<uint64_t>(o.layers);
    for (Method m : {Method::cublas_sgemv, Method::cublaslt_int8, Method::int8_gemv, Method::seed, Method::lowbit_fused}) {
      ChainEngine e(prepare(chain, m, &seed, &lowbit), chain.v0, /*resident=*/true);
      if (m == Method::cublaslt_int8 && !e.cublaslt_ok()) {
        std::printf("  cuBLASLt refused the int8 %lld x %lld x 32 product: no row\n", static_cast<long long>(n),
                    static_cast<long long>(n));
        continue;
      }
      const bool match = chain_matches(e, true, expected, method_name(m));
      const bool match_copies = chain_matches(e, false, expected, method_name(m));
      if ((!match || !match_copies) && m != Method::cublas_sgemv)
        fail(ErrorKind::internal, "bench ans: ", method_name(m), " at N = ", n,
             " does not reproduce the CPU reference's final vector");
      for (bool copies : {false, true}) {
        bench::BenchRow row;
        row.suite = "ans_figure2";
        row.impl = method_name(m);
        row.shape = {{"n", n}, {"K", o.layers}, {"copies", copies}};
        row.stats = copies ? time_chain(e, true, 2, o.copy_reps) : time_chain(e, false, 5, o.reps);
        row.bytes = e.blob_bytes();
        row.extra = {{"bits_per_weight", 8.0 * static_cast<double>(row.bytes) / static_cast<double>(weights)},
                     {"hash_matches_cpu", copies ? match_copies : match}};
        c.emit(row);
      }
    }
  }
}

// ---- the targets -----------------------------------------------------------------------

struct TargetResult {
  int64_t n = 0;
  double entropy = 0, fused_bits = 0;
  double int8_us = 0, fused_us = 0, lt_us = 0, sgemv_us = 0;
  int64_t R = 0;
  int slots = 0;
  double sym_clk = 0, copy_frac = 0;
  double int8_copy_us = 0, fused_copy_us = 0, ratio_bytes = 0;
};

TargetResult targets_for(Context& c, int64_t n) {
  const AnsBenchOptions& o = *c.options;
  SyntheticOptions so;
  so.layers = o.layers;
  so.dim = n;
  so.seed = o.seed + 1;
  so.bits = 4;
  so.granularity = Granularity::per_group;
  so.group_size = 128;
  const Chain chain = make_synthetic_chain(so);
  const uint32_t expected = *chain.result_hash;
  TargetResult res;
  res.n = n;
  res.entropy = SymbolCounts::of(chain.matrices[0].data).entropy_bits();
  std::printf("\n== targets at %lld x %lld: 4-bit per-group (g = 128) Gaussian codes, entropy %.3f bits/weight\n",
              static_cast<long long>(n), static_cast<long long>(n), res.entropy);
  const uint64_t symbols = static_cast<uint64_t>(n) * static_cast<uint64_t>(n);

  // Single products, resident, L2 flushed: the int8 GEMV and the baselines.
  Chain one;
  one.v0 = chain.v0;
  one.matrices = {chain.matrices[0]};
  const uint32_t expected_one = fxhash32(run_chain_reference(one));
  auto product_row = [&](ChainEngine& e, const std::string& impl, std::vector<bench::JsonField> shape,
                         std::vector<bench::JsonField> extra) {
    bench::BenchRow row;
    row.suite = "ans_product";
    row.impl = impl;
    row.shape = {{"n", n}};
    for (auto& f : shape) row.shape.push_back(f);
    row.stats = time_product(e, o.reps);
    row.bytes = e.matrix(0).blob.size;
    row.extra = std::move(extra);
    row.extra.push_back({"bits_per_weight", 8.0 * static_cast<double>(row.bytes) / static_cast<double>(symbols)});
    return row;
  };
  {
    ChainEngine e(prepare(one, Method::int8_gemv, nullptr, nullptr), one.v0, true);
    if (!chain_matches(e, true, expected_one, "int8 gemv")) fail(ErrorKind::internal, "bench ans: int8 GEMV mismatch");
    auto row = product_row(e, method_name(Method::int8_gemv), {}, {});
    res.int8_us = row.stats.median_us;
    c.emit(row);
  }
  {
    ChainEngine e(prepare(one, Method::cublaslt_int8, nullptr, nullptr), one.v0, true);
    if (e.cublaslt_ok()) {
      if (!chain_matches(e, true, expected_one, "cublaslt")) fail(ErrorKind::internal, "bench ans: cuBLASLt mismatch");
      auto row = product_row(e, method_name(Method::cublaslt_int8), {}, {});
      res.lt_us = row.stats.median_us;
      c.emit(row);
    } else {
      std::printf("  cuBLASLt refused the int8 %lld x %lld x 32 product\n", static_cast<long long>(n),
                  static_cast<long long>(n));
    }
  }
  {
    ChainEngine e(prepare(one, Method::cublas_sgemv, nullptr, nullptr), one.v0, true);
    chain_matches(e, true, expected_one, "sgemv");
    auto row = product_row(e, method_name(Method::cublas_sgemv), {}, {});
    res.sgemv_us = row.stats.median_us;
    c.emit(row);
  }
  // The fused kernel over a few tile geometries (rows per tile R, states per lane k).
  struct Config {
    int64_t R;
    int k;
  };
  std::vector<Config> configs = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 4}};
  double best_us = 1e30;
  Config best{1, 1};
  for (const Config& cf : configs) {
    LowbitOptions lo = gpu_lowbit_options(n, c.dev.sm_count, cf.R, cf.k);
    LowbitFile f;
    f.v0 = one.v0;
    f.matrices.push_back(encode_lowbit_matrix(one.matrices[0], lo));
    std::vector<PreparedMatrix> pm;
    pm.push_back(gpu::prepare_lowbit(f.matrices[0]));
    ChainEngine e(std::move(pm), one.v0, true);
    if (!chain_matches(e, true, expected_one, "lowbit fused"))
      fail(ErrorKind::internal, "bench ans: the fused kernel does not reproduce the CPU reference (R = ", cf.R,
           ", k = ", cf.k, ")");
    auto row = product_row(e, method_name(Method::lowbit_fused),
                           {{"rows_per_tile", cf.R}, {"states_per_lane", cf.k}}, {});
    const double us = row.stats.median_us;
    row.extra.push_back({"symbols_per_clock_per_sm", sym_per_clk_per_sm(c, symbols, us)});
    row.extra.push_back({"copy_bandwidth_fraction", row.GBps() / c.copy_GBps});
    row.extra.push_back({"speed_vs_int8_gemv", res.int8_us / us});
    c.emit(row);
    if (us < best_us) {
      best_us = us;
      best = cf;
      res.fused_bits = 8.0 * static_cast<double>(row.bytes) / static_cast<double>(symbols);
      res.sym_clk = sym_per_clk_per_sm(c, symbols, us);
      res.copy_frac = row.GBps() / c.copy_GBps;
    }
  }
  res.fused_us = best_us;
  res.R = best.R;
  res.slots = best.k;

  // Whole chains, resident and with copies: int8 GEMV against the fused kernel
  // (best geometry). Host-to-device copy speed drifts by several percent
  // between measurements, and the with-copies target compares two of them, so
  // the two methods are timed alternately (A B A B) and each reports the mean
  // of its two medians.
  const LowbitFile lowbit = encode_lowbit_file(chain, gpu_lowbit_options(n, c.dev.sm_count, best.R, best.k));
  ChainEngine e_int8(prepare(chain, Method::int8_gemv, nullptr, nullptr), chain.v0, true);
  ChainEngine e_fused(prepare(chain, Method::lowbit_fused, nullptr, &lowbit), chain.v0, true);
  for (ChainEngine* e : {&e_int8, &e_fused})
    if (!chain_matches(*e, true, expected, method_name(e->method())) ||
        !chain_matches(*e, false, expected, method_name(e->method())))
      fail(ErrorKind::internal, "bench ans: ", method_name(e->method()), " chain mismatch at N = ", n);
  bench::TimingStats copy_stats[2][2];
  for (int round = 0; round < 2; ++round) {
    copy_stats[0][round] = time_chain(e_int8, true, 2, o.copy_reps);
    copy_stats[1][round] = time_chain(e_fused, true, 2, o.copy_reps);
  }
  for (int i = 0; i < 2; ++i) {
    ChainEngine& e = i == 0 ? e_int8 : e_fused;
    for (bool copies : {false, true}) {
      bench::BenchRow row;
      row.suite = "ans_chain_4bit";
      row.impl = method_name(e.method());
      row.shape = {{"n", n}, {"K", o.layers}, {"copies", copies}};
      if (i == 1) {
        row.shape.push_back({"rows_per_tile", best.R});
        row.shape.push_back({"states_per_lane", best.k});
      }
      if (copies) {
        row.stats = copy_stats[i][0];
        row.stats.median_us = 0.5 * (copy_stats[i][0].median_us + copy_stats[i][1].median_us);
        row.stats.reps = copy_stats[i][0].reps + copy_stats[i][1].reps;
        row.stats.min_us = std::min(copy_stats[i][0].min_us, copy_stats[i][1].min_us);
        row.stats.max_us = std::max(copy_stats[i][0].max_us, copy_stats[i][1].max_us);
      } else {
        row.stats = time_chain(e, false, 5, o.reps);
      }
      row.bytes = e.blob_bytes();
      row.extra = {{"bits_per_weight", 8.0 * static_cast<double>(row.bytes) /
                                           static_cast<double>(symbols * static_cast<uint64_t>(o.layers))}};
      if (copies) row.extra.push_back({"median_us_rounds", {copy_stats[i][0].median_us, copy_stats[i][1].median_us}});
      c.emit(row);
      if (copies) (i == 0 ? res.int8_copy_us : res.fused_copy_us) = row.stats.median_us;
    }
  }
  res.ratio_bytes = static_cast<double>(e_fused.blob_bytes()) / static_cast<double>(e_int8.blob_bytes());
  return res;
}

}  // namespace

void run_ans_benchmark(const AnsBenchOptions& options) {
  LOWBIT_CHECK_ARG(options.layers >= 1, "layers", options.layers, "at least 1");
  LOWBIT_CHECK_ARG(options.reps >= 1, "reps", options.reps, "at least 1");
  LOWBIT_CHECK_ARG(options.copy_reps >= 1, "copy_reps", options.copy_reps, "at least 1");
  for (int64_t n : options.figure2_sizes) LOWBIT_CHECK_ARG(n >= 16 && n <= 65536, "size", n, "16..65536");
  for (int64_t n : options.target_sizes) LOWBIT_CHECK_ARG(n >= 16 && n <= 65536, "size", n, "16..65536");
  if (cuda_device_count() == 0) fail(ErrorKind::unsupported, "lowbit bench ans needs a CUDA device; none is visible");
  Context c;
  c.options = &options;
  c.dev = cuda_device_info(0);
  c.copy_GBps = measure_copy_bandwidth_GBps(0);
  std::printf("device: %s, %d SMs, peak SM clock %.3f GHz; measured device copy bandwidth %.0f GB/s "
              "(read + write)\n",
              c.dev.name.c_str(), c.dev.sm_count, c.dev.clock_khz * 1e-6, c.copy_GBps);
  if (!options.json_path.empty()) c.json = std::make_unique<bench::JsonRowsWriter>(options.json_path);
  if (options.figure2) figure2(c);
  std::vector<TargetResult> targets;
  if (options.targets)
    for (int64_t n : options.target_sizes) targets.push_back(targets_for(c, n));

  if (!targets.empty()) {
    std::printf("\n== targets (issue 5) beside the measurements\n");
    std::printf("%-6s %-44s %-22s %-26s %s\n", "n", "target", "measured", "detail", "met");
    for (const TargetResult& t : targets) {
      const double ratio = t.int8_us / t.fused_us;
      std::printf("%-6lld %-44s %-22s %-26s %s\n", static_cast<long long>(t.n),
                  "resident: int8 GEMV time / fused time >= 1.0", (std::to_string(ratio).substr(0, 5)).c_str(),
                  ("int8 " + std::to_string(t.int8_us).substr(0, 6) + " us, fused " +
                   std::to_string(t.fused_us).substr(0, 6) + " us")
                      .c_str(),
                  ratio >= 1.0 ? "yes" : "NO");
      const double bound = t.int8_copy_us * t.ratio_bytes * 1.10;
      std::printf("%-6lld %-44s %-22s %-26s %s\n", static_cast<long long>(t.n),
                  "with copies: fused <= int8 x bytes ratio + 10%",
                  (std::to_string(t.fused_copy_us / 1e3).substr(0, 6) + " ms").c_str(),
                  ("bound " + std::to_string(bound / 1e3).substr(0, 6) + " ms").c_str(),
                  t.fused_copy_us <= bound ? "yes" : "NO");
      std::printf("%-6lld %-44s %-22s %-26s %s\n", static_cast<long long>(t.n), "size: bits/weight (entropy)",
                  (std::to_string(t.fused_bits).substr(0, 5)).c_str(),
                  ("entropy " + std::to_string(t.entropy).substr(0, 5)).c_str(), "-");
      std::printf("%-6lld %-44s %-22s %-26s %s\n", static_cast<long long>(t.n), "decode rate, symbols/clock/SM (peak clk)",
                  std::to_string(t.sym_clk).substr(0, 5).c_str(),
                  ("R = " + std::to_string(t.R) + ", k = " + std::to_string(t.slots)).c_str(), "-");
      std::printf("%-6lld %-44s %-22s %-26s %s\n", static_cast<long long>(t.n),
                  "compressed bytes / time vs copy bandwidth", std::to_string(t.copy_frac).substr(0, 5).c_str(),
                  "", "-");
      std::printf("%-6lld %-44s %-22s %-26s %s\n", static_cast<long long>(t.n), "baselines (single product)",
                  ("cuBLASLt " + std::to_string(t.lt_us).substr(0, 6) + " us").c_str(),
                  ("SGEMV " + std::to_string(t.sgemv_us).substr(0, 6) + " us").c_str(), "-");
    }
  }
  std::printf("\n%s\n", bench::format_table(c.rows).c_str());
}

}  // namespace lowbit::ans
