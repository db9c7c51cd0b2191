// `lowbit bench attention`: decode attention on the paged KV cache, tq4 K/V
// against our FP16 paged kernel (same kernel, fp16 K/V) and torch SDPA (FP16,
// unpaged): times measured on this GPU when given (--sdpa FILE), else the
// anchors' H100 times (../shared anchors table, copied below).
//
// Method: one layer's cache per configuration, filled with random bytes
// (random indices; scales rewritten to finite positive f16, fp16 K/V to
// random finite halves), pages of each sequence in a random permutation of
// the pool (paging costs what it costs in a real server); all sequences at the
// full context. time_cuda: warm-up, L2 flushed before each call, median.
// Each timed call is the whole decode step: query rotation, attention, merge
// and output un-rotation. Bytes = the K/V bytes every call must read (the
// floor): batch * context * kv_heads * (K + V vector bytes); GB/s on those.
#include "lowbit/kv/attention_bench.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lowbit/bench/anchors.h"
#include "lowbit/bench/json_rows.h"
#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/launch_switches.h"
#include "lowbit/cuda/random.h"
#include "lowbit/cuda/timer.h"
#include "lowbit/kv/device_cache.h"
#include "prefill_attention.h"

namespace lowbit {
namespace {

constexpr int kQHeads = 40, kKvHeads = 8, kHeadDim = 128;  // Qwen3-14B attention

// torch SDPA decode, FP16 K/V, GQA 40/8, d = 128 (the anchors, taken on an H100).
double sdpa_anchor_us(int batch, int64_t context) {
  struct A {
    int b;
    int64_t ctx;
    double us;
  };
  static const A anchors[] = {{1, 4096, 19.5}, {1, 32768, 64.7},  {8, 4096, 64.7},
                              {8, 32768, 366.0}, {32, 4096, 190.4}, {32, 32768, 1392.5}};
  for (const A& a : anchors)
    if (a.b == batch && a.ctx == context) return a.us;
  return 0.0;
}

// Issue 4's targets: tq4 >= 3.0x SDPA at batch 8 / 32k, >= 2.5x at batch 1 / 32k.
double target_speedup(int batch, int64_t context) {
  if (context == 32768 && batch == 8) return 3.0;
  if (context == 32768 && batch == 1) return 2.5;
  return 0.0;
}

// Random bytes make random indices, but scales must be finite: every scale
// becomes a positive f16 in [1, 2) from a hash of its position.
__global__ void fix_scales_kernel(std::byte* pool, int64_t slabs, int64_t slab_bytes, int64_t k_scales,
                                  int64_t v_scales, int page_size, bool k_quantized, bool v_quantized) {
  const int64_t n = slabs * page_size;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t slab = i / page_size;
    const int slot = static_cast<int>(i % page_size);
    const float value = 1.0f + static_cast<float>((i * 2654435761ll) & 1023) / 1024.0f;
    std::byte* base = pool + slab * slab_bytes;
    if (k_quantized) reinterpret_cast<__half*>(base + k_scales)[slot] = __float2half_rn(value);
    if (v_quantized) reinterpret_cast<__half*>(base + v_scales)[slot] = __float2half_rn(value);
  }
}

kv::KvCacheConfig bench_config(kv::KvFormat format, int page_size, int64_t pages, bool hadamard) {
  kv::KvCacheConfig c;
  c.rotation = hadamard ? kv::RotationKind::hadamard : kv::RotationKind::haar;
  c.num_layers = 1;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.page_size = page_size;
  c.num_pages = pages;
  c.k_format = format;
  c.v_format = format;
  return c;
}

void fill_cache(const kv::DeviceKvCache& cache, uint64_t seed) {
  const kv::KvCacheConfig& c = cache.config();
  if (c.k_format == kv::KvFormat::fp16 && c.v_format == kv::KvFormat::fp16) {
    cuda::fill_random_f16(cache.pool(0), static_cast<size_t>(cache.pool_bytes()) / 2, seed, 1.0f);
    return;
  }
  cuda::fill_random_bytes(cache.pool(0), static_cast<size_t>(cache.pool_bytes()), seed);
  const kv::PageLayout& l = cache.layout();
  fix_scales_kernel<<<1024, 256>>>(cache.pool(0), c.num_pages * c.num_kv_heads, l.bytes, l.k_scales, l.v_scales,
                                   c.page_size, kv::is_quantized(c.k_format), kv::is_quantized(c.v_format));
  LOWBIT_CUDA_CHECK_LAUNCH();
}

// Every sequence at `context` tokens, its pages a random permutation of the pool.
kv::DeviceBlockTables random_tables(int batch, int64_t context, int page_size, int64_t pages, uint64_t seed) {
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t per_seq = (context + page_size - 1) / page_size;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b)
    tables[static_cast<size_t>(b)].assign(perm.begin() + b * per_seq, perm.begin() + (b + 1) * per_seq);
  const std::vector<int64_t> lengths(static_cast<size_t>(batch), context);
  return kv::DeviceBlockTables::from_host(tables, lengths, page_size);
}

Buffer random_floats(size_t n, uint64_t seed) {
  std::vector<float> h(n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : h) x = normal(rng);
  Buffer d(n * 4, Device::cuda);
  Buffer::copy(d.data(), Device::cuda, h.data(), Device::cpu, n * 4);
  return d;
}

size_t free_device_memory() {
  size_t free_bytes = 0, total = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

struct Point {
  double us = 0, GBps = 0;
};

}  // namespace

void run_kv_attention_benchmark(const KvAttentionBenchOptions& options) {
  for (int b : options.batches) LOWBIT_CHECK_ARG(b >= 1, "batches", b, "positive batch sizes");
  for (int64_t c : options.contexts) LOWBIT_CHECK_ARG(c >= 1, "contexts", c, "positive context lengths");
  LOWBIT_CHECK_ARG(options.reps >= 1, "reps", options.reps, "at least 1");
  LOWBIT_CHECK_ARG(options.page_size >= kv::kMinPageSize && options.page_size <= kv::kMaxPageSize &&
                       options.page_size % kv::kPageSizeMultiple == 0,
                   "page_size", options.page_size, "a multiple of 16 in [16, 256]");
  for (int64_t s : options.split_tokens)
    LOWBIT_CHECK_ARG(s >= 16 && s % 16 == 0, "split_tokens", s, "positive multiples of 16");
  LOWBIT_CHECK_ARG(options.prefill_reps >= 1, "prefill_reps", options.prefill_reps, "at least 1");
  LOWBIT_CHECK_ARG(options.prefill_tokens >= 0 && options.prefill_tokens <= 65535, "prefill_tokens",
                   options.prefill_tokens, "0 (skip) to 65535");
  LOWBIT_CHECK_ARG(options.settle_ms >= 0, "settle_ms", options.settle_ms, "milliseconds >= 0");
  if (cuda_device_count() == 0)
    fail(ErrorKind::unsupported, "lowbit bench attention needs a CUDA device; none is visible");
  const CudaDeviceInfo dev = cuda_device_info(0);
  const double copy_GBps = measure_copy_bandwidth_GBps(0);
  std::printf("device: %s, %d SMs; measured copy bandwidth %.0f GB/s; L2 evicted between calls by %s; the GPU "
              "idles %d ms before each decode row\n",
              dev.name.c_str(), dev.sm_count, copy_GBps,
              options.flush_by_reading ? "reading a buffer (clean lines)" : "writing a buffer (dirty lines)",
              options.settle_ms);
  // The SDPA column: times measured on this GPU when given, else the H100
  // anchors, which say nothing about another GPU's SDPA (an H200's HBM is
  // about 1.4x faster), so the ratios would then compare two GPUs.
  const auto sdpa_us = [&](int batch, int64_t context) {
    if (options.sdpa_measured.empty()) return sdpa_anchor_us(batch, context);
    for (const SdpaBaselinePoint& p : options.sdpa_measured)
      if (p.batch == batch && p.context == context) return p.us;
    return 0.0;
  };
  const std::string sdpa_source =
      options.sdpa_measured.empty() ? std::string("anchors (H100)") : "measured (" + options.sdpa_source + ")";
  std::printf("torch SDPA times: %s\n", sdpa_source.c_str());
  if (options.sdpa_measured.empty() && !bench::is_anchors_gpu(dev.name))
    std::printf("warning: this device is %s, not the H100 of the SDPA anchors: the SDPA ratios below compare two "
                "GPUs. Time SDPA here (scripts/bench_torch_peers.py --what sdpa --out F) and pass --sdpa F.\n",
                dev.name.c_str());
  std::printf("geometry: %d query heads over %d KV heads, head_dim %d, page %d tokens; %s rotation\n", kQHeads,
              kKvHeads, kHeadDim, options.page_size, options.hadamard ? "Hadamard" : "Haar");
  std::unique_ptr<bench::JsonRowsWriter> json;
  if (!options.json_path.empty()) json = std::make_unique<bench::JsonRowsWriter>(options.json_path);
  cuda::announce_launch_switches(json.get());
  cuda::CudaTimerOptions timer;
  timer.reps = options.reps;
  timer.warmup = 10;
  timer.flush_by_reading = options.flush_by_reading;
  timer.settle_ms = options.settle_ms;

  const std::pair<kv::KvFormat, const char*> impls[] = {{kv::KvFormat::tq4, "lowbit_tq4"},
                                                       {kv::KvFormat::fp16, "lowbit_fp16_paged"}};
  std::map<std::pair<int, int64_t>, std::map<std::string, Point>> results;
  std::vector<std::string> skipped;
  for (int64_t context : options.contexts)
    for (int batch : options.batches)
      for (const auto& [format, impl] : impls) {
        const int64_t per_seq = (context + options.page_size - 1) / options.page_size;
        const int64_t pages = per_seq * batch;
        const kv::KvCacheConfig config = bench_config(format, options.page_size, pages, options.hadamard);
        const int64_t vec_bytes = static_cast<int64_t>(kv::kv_vector_bytes(format, kHeadDim, config.scale_dtype));
        const int64_t slab = (vec_bytes * 2) * options.page_size;  // K + V, scales padded to 16 B by the layout
        const size_t need = static_cast<size_t>(pages * kKvHeads * slab) +
                            static_cast<size_t>(batch) * kQHeads * kHeadDim * 4 * 4 + (64u << 20);
        if (need > free_device_memory()) {
          char line[200];
          std::snprintf(line, sizeof line, "skipped %s batch %d context %lld: needs %.1f GB, %.1f GB free", impl, batch,
                        static_cast<long long>(context), static_cast<double>(need) / 1e9,
                        static_cast<double>(free_device_memory()) / 1e9);
          std::printf("%s\n", line);
          skipped.push_back(line);
          continue;
        }
        const kv::DeviceKvCache cache(config);
        fill_cache(cache, 11 + static_cast<uint64_t>(batch) * 7 + static_cast<uint64_t>(context));
        const kv::DeviceBlockTables tables = random_tables(batch, context, options.page_size, pages, 5);
        const Buffer q = random_floats(static_cast<size_t>(batch) * kQHeads * kHeadDim, 3);
        Buffer out(static_cast<size_t>(batch) * kQHeads * kHeadDim * 4, Device::cuda);
        kv::AttentionWorkspace ws;
        // The chosen CTA layout first, then each --cta-warps one (packed K/V
        // only; rows marked cta_warps_forced); in each, the chosen chunk
        // length first, then each --split-tokens value (rows marked
        // split_forced). The summary table uses the chosen ones.
        struct Run {
          int forced_warps;
          int64_t forced, split;  // the forced chunk length (0: none) and the one used
        };
        std::vector<Run> runs;
        std::vector<int> layouts = {0};
        if (format != kv::KvFormat::fp16)
          layouts.insert(layouts.end(), options.cta_warps.begin(), options.cta_warps.end());
        for (const int w : layouts) {
          const int64_t auto_split = kv::decode_split_tokens(config, batch, context, dev.sm_count, w);
          runs.push_back({w, 0, auto_split});
          // A forced chunk longer than the row is the whole row (as the kernel clamps it).
          for (int64_t s : options.split_tokens)
            if (s != auto_split) runs.push_back({w, s, std::min(s, (context + 15) / 16 * 16)});
        }
        for (const auto& [forced_warps, forced, split] : runs) {
          kv::DeviceDecodeOptions decode;
          decode.split_tokens = forced;
          decode.cta_warps = forced_warps;
          decode.cluster_merge = options.cluster_merge;
          bench::BenchRow row;
          row.suite = "kv_decode_attention";
          row.impl = impl;
          row.shape = {{"batch", batch},        {"context", context},     {"q_heads", kQHeads},
                       {"kv_heads", kKvHeads}, {"head_dim", kHeadDim}, {"page_size", options.page_size},
                       {"rotation", std::string(options.hadamard ? "hadamard" : "haar")},
                       {"cluster_merge", options.cluster_merge}};
          row.bytes = static_cast<uint64_t>(batch) * static_cast<uint64_t>(context) * kKvHeads *
                      static_cast<uint64_t>(2 * vec_bytes);
          row.stats = cuda::time_cuda(
              [&](cudaStream_t s) {
                kv::device_decode_attention(cache, 0, tables, kQHeads, q.as<float>(), out.as<float>(), ws, decode, s);
              },
              timer);
          const double sdpa = sdpa_us(batch, context);
          row.extra = {{"kv_bytes_per_token", kKvHeads * 2 * vec_bytes},
                       {"split_tokens", split},
                       {"split_forced", forced > 0},
                       {"cta_warps_forced", forced_warps},
                       {"sdpa_fp16_us", sdpa},
                       {"sdpa_source", sdpa_source},
                       {"speedup_vs_sdpa", sdpa > 0 ? sdpa / row.stats.median_us : 0.0},
                       {"copy_GBps", copy_GBps},
                       {"l2_flush", options.flush_by_reading ? "read" : "write"}};
          if (json) json->write(row);
          if (forced == 0 && forced_warps == 0)
            results[{batch, context}][impl] = Point{row.stats.median_us, row.GBps()};
          const std::string layout = forced_warps > 0 ? ", " + std::to_string(forced_warps) + " warps (forced)" : "";
          std::printf("batch %2d context %6lld %-18s %9.1f us  %6.0f GB/s (%4.1f%% of copy)  split %lld%s%s  %s\n",
                      batch, static_cast<long long>(context), impl, row.stats.median_us, row.GBps(),
                      100.0 * row.GBps() / copy_GBps, static_cast<long long>(split), forced > 0 ? " (forced)" : "",
                      layout.c_str(), sdpa > 0 ? ("SDPA " + std::to_string(sdpa) + " us").c_str() : "");
          std::fflush(stdout);
        }
        if (options.read_floor && format == kv::KvFormat::tq4) {
          // The same bytes, read by a grid-stride kernel of 16-byte loads
          // that computes nothing: what streaming this cache alone takes
          // under the same timer and flush (launch, ramp and, with the write
          // flush, the dirty lines' write-back included).
          bench::BenchRow row;
          row.suite = "kv_decode_attention";
          row.impl = "read_floor";
          row.shape = {{"batch", batch}, {"context", context}, {"kv_heads", kKvHeads}, {"head_dim", kHeadDim}};
          row.bytes = static_cast<uint64_t>(cache.pool_bytes()) / 16 * 16;
          Buffer sink(sizeof(unsigned), Device::cuda);
          LOWBIT_CUDA_CHECK(cudaMemset(sink.data(), 0, sizeof(unsigned)));
          row.stats = cuda::time_cuda(
              [&](cudaStream_t s) {
                cuda::read_device_buffer(cache.pool(0), row.bytes, static_cast<unsigned*>(sink.data()), s,
                                        /*l2_streaming=*/true);
              },
              timer);
          const double sdpa = sdpa_us(batch, context);
          row.extra = {{"sdpa_fp16_us", sdpa},
                       {"sdpa_source", sdpa_source},
                       {"speedup_vs_sdpa", sdpa > 0 ? sdpa / row.stats.median_us : 0.0},
                       {"copy_GBps", copy_GBps},
                       {"l2_flush", options.flush_by_reading ? "read" : "write"}};
          if (json) json->write(row);
          results[{batch, context}]["read_floor"] = Point{row.stats.median_us, row.GBps()};
          std::printf("batch %2d context %6lld %-18s %9.1f us  %6.0f GB/s (%4.1f%% of copy)  reads the tq4 cache only\n",
                      batch, static_cast<long long>(context), "read_floor", row.stats.median_us, row.GBps(),
                      100.0 * row.GBps() / copy_GBps);
        }
      }

  std::printf("\n==== decode attention, Qwen3-14B geometry (40/8 heads, d = 128), %s; us (median); SDPA %s ====\n",
              dev.name.c_str(), sdpa_source.c_str());
  std::printf("%5s %7s | %9s %7s | %9s %7s | %9s | %8s %14s | %9s %8s | %9s %10s\n", "batch", "context", "tq4 us",
              "GB/s", "fp16 us", "GB/s", "SDPA us", "tq4/SDPA", "target", "fp16/SDPA", "tq4/fp16", "floor us",
              "floor/SDPA");
  for (const auto& [key, by_impl] : results) {
    const auto tq = by_impl.find("lowbit_tq4"), fp = by_impl.find("lowbit_fp16_paged");
    const auto fl = by_impl.find("read_floor");
    const double floor_us = fl == by_impl.end() ? 0 : fl->second.us;
    const double t = tq == by_impl.end() ? 0 : tq->second.us, f = fp == by_impl.end() ? 0 : fp->second.us;
    const double sdpa = sdpa_us(key.first, key.second), target = target_speedup(key.first, key.second);
    const auto ratio = [](double num, double den) { return num > 0 && den > 0 ? num / den : 0.0; };
    // Met or not, decided on the unrounded ratio: 2.995x prints as 3.00x.
    char target_s[32] = "-";
    if (target > 0)
      std::snprintf(target_s, sizeof target_s, ">=%.1fx %s", target,
                    ratio(sdpa, t) > 0 ? (ratio(sdpa, t) >= target ? "met" : "not met") : "no SDPA");
    // A time or ratio that is not there (no SDPA time for this point in
    // --sdpa's file, no read floor run) prints as "-", not as 0.
    const auto cell = [](double v, const char* format) {
      char b[32] = "-";
      if (v > 0) std::snprintf(b, sizeof b, format, v);
      return std::string(b);
    };
    std::printf("%5d %7lld | %9.1f %7.0f | %9.1f %7.0f | %9s | %8s %14s | %9s %7.2fx | %9s %10s\n", key.first,
                static_cast<long long>(key.second), t, tq == by_impl.end() ? 0.0 : tq->second.GBps, f,
                fp == by_impl.end() ? 0.0 : fp->second.GBps, cell(sdpa, "%.1f").c_str(),
                cell(ratio(sdpa, t), "%.2fx").c_str(), target_s, cell(ratio(sdpa, f), "%.2fx").c_str(),
                ratio(f, t), cell(floor_us, "%.1f").c_str(), cell(ratio(sdpa, floor_us), "%.2fx").c_str());
  }
  const auto target_time = [&](int batch, double speedup) {
    const double us = sdpa_us(batch, 32768);
    char b[48] = "no SDPA time";
    if (us > 0) std::snprintf(b, sizeof b, "<= %.1f us", us / speedup);
    return std::string(b);
  };
  std::printf("targets: tq4 >= 3.0x SDPA at batch 8 / 32k (%s), >= 2.5x at batch 1 / 32k (%s); "
              "fp16/SDPA >= 0.91 (within 10%%). Floor: tq4 = 132 B per token per KV head at %.0f GB/s.\n",
              target_time(8, 3.0).c_str(), target_time(1, 2.5).c_str(), copy_GBps);
  for (const std::string& s : skipped) std::printf("%s\n", s.c_str());

  if (options.prefill_tokens == 0) return;
  // ---- the cost of quantizing a long prefill's K/V ----
  const int64_t n = options.prefill_tokens;
  const int64_t pages = (n + options.page_size - 1) / options.page_size;
  const kv::KvCacheConfig config = bench_config(kv::KvFormat::tq4, options.page_size, pages, options.hadamard);
  const kv::DeviceKvCache cache(config);
  const kv::DeviceBlockTables tables = random_tables(1, n, options.page_size, pages, 9);
  const Buffer k = random_floats(static_cast<size_t>(n) * kKvHeads * kHeadDim, 21);
  const Buffer v = random_floats(static_cast<size_t>(n) * kKvHeads * kHeadDim, 22);
  const Buffer q = random_floats(static_cast<size_t>(n) * kQHeads * kHeadDim, 23);
  Buffer out(static_cast<size_t>(n) * kQHeads * kHeadDim * 4, Device::cuda);
  kv::AttentionWorkspace ws;
  cuda::CudaTimerOptions qt;
  qt.reps = 20;
  qt.warmup = 3;
  const bench::TimingStats quant = cuda::time_cuda(
      [&](cudaStream_t s) { kv::device_write_tokens(cache, 0, tables, 0, 0, n, k.as<float>(), v.as<float>(), s); },
      qt);
  cuda::CudaTimerOptions at;
  at.reps = options.prefill_reps;
  at.warmup = 1;
  // The tiled prefill kernel (what users get) and, as its baseline, the
  // decode kernel with one row per query token, in the same run.
  auto time_prefill = [&](bool tiled_kernel, int64_t split_tokens = 0) {
    kv::DeviceDecodeOptions po;
    po.prefill_tiled = tiled_kernel;
    po.split_tokens = split_tokens;
    return cuda::time_cuda(
        [&](cudaStream_t s) {
          kv::device_prefill_attention(cache, 0, tables, 0, 0, n, kQHeads, q.as<float>(), out.as<float>(), ws, po, s);
        },
        at);
  };
  const bench::TimingStats attn = time_prefill(true);
  const bench::TimingStats attn_rows = time_prefill(false);
  // A tensor-core FP16 flash attention at 50% of the H100's dense fp16 peak
  // (989 TFLOP/s): 4 * q_heads * n^2 / 2 * d flops for causal QK^T and PV.
  const double flops = 4.0 * kQHeads * static_cast<double>(n) * static_cast<double>(n) / 2.0 * kHeadDim;
  const double fa_estimate_us = flops / (0.5 * 989e12) * 1e6;
  bench::BenchRow qrow;
  qrow.suite = "kv_prefill_quantize";
  qrow.impl = "lowbit_tq4_write";
  qrow.shape = {{"tokens", n}, {"kv_heads", kKvHeads}, {"head_dim", kHeadDim}};
  qrow.stats = quant;
  qrow.bytes = static_cast<uint64_t>(n) * kKvHeads * (2 * kHeadDim * 4 + 2 * 66);
  qrow.extra = {{"prefill_attention_us", attn.median_us},
                {"share_of_our_prefill", quant.median_us / attn.median_us},
                {"fa_estimate_us", fa_estimate_us},
                {"share_of_fa_estimate", quant.median_us / fa_estimate_us}};
  bench::BenchRow arow;
  arow.suite = "kv_prefill_attention";
  arow.impl = "lowbit_tq4_prefill";
  arow.shape = qrow.shape;
  arow.stats = attn;
  arow.flops = flops;
  arow.extra = {{"fa_estimate_us", fa_estimate_us}};
  bench::BenchRow rrow = arow;
  rrow.impl = "lowbit_tq4_prefill_decode_kernel";
  rrow.stats = attn_rows;
  const int64_t auto_chunk =
      kv::attention_mma::tiled_prefill_split_tokens(static_cast<int>(n), n, kKvHeads, kQHeads / kKvHeads, dev.sm_count);
  arow.extra.emplace_back("split_tokens", auto_chunk);
  if (json) {
    json->write(qrow);
    json->write(arow);
    json->write(rrow);
  }
  // --split-tokens: the tiled kernel with those KV chunks forced, same run.
  std::vector<std::pair<int64_t, double>> forced_chunks;
  for (int64_t chunk : options.split_tokens) {
    bench::BenchRow row = arow;
    row.stats = time_prefill(true, chunk);
    row.extra = {{"fa_estimate_us", fa_estimate_us}, {"split_tokens", chunk}, {"split_forced", true}};
    if (json) json->write(row);
    forced_chunks.emplace_back(chunk, row.stats.median_us);
  }
  std::printf("\n==== prefill of %lld tokens (tq4 K/V) ====\n", static_cast<long long>(n));
  std::printf("quantize + write K/V: %10.1f us (%.0f GB/s on fp32 in + packed out)\n", quant.median_us, qrow.GBps());
  std::printf("our causal prefill attention, tiled kernel: %10.1f us (%.0f TFLOP/s; %.2fx the estimate below)\n",
              attn.median_us, flops / attn.median_us * 1e-6, attn.median_us / fa_estimate_us);
  std::printf("   (KV chunks of %lld keys, the rule's)\n", static_cast<long long>(auto_chunk));
  for (const auto& [chunk, us] : forced_chunks)
    std::printf("   the tiled kernel with KV chunks of %lld keys forced: %10.1f us (%.2fx the rule's)\n",
                static_cast<long long>(chunk), us, us / attn.median_us);
  std::printf("the same through the decode kernel, one row per query token: %10.1f us (tiled %.1fx faster)\n",
              attn_rows.median_us, attn_rows.median_us / attn.median_us);
  std::printf("quantization / our prefill attention: %.2f%% (target < 10%%)\n", 100.0 * quant.median_us / attn.median_us);
  std::printf("quantization / estimated tensor-core flash attention (%.0f us at 50%% of 989 TFLOP/s): %.2f%%\n",
              fa_estimate_us, 100.0 * quant.median_us / fa_estimate_us);
}

}  // namespace lowbit
