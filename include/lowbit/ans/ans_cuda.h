// The seed's chain experiment on a CUDA GPU, for every ans container, and the
// `lowbit bench ans` benchmark. Plain C++ header: a build without CUDA links
// versions that throw Error(unsupported) ("built without CUDA").
//
// Kernels (src/ans/ans_cuda.cu; design and numbers in docs/ans-kernels.md),
// each checked against the CPU reference of its container:
//   * seed container: the seed-faithful MATVANS kernel: one thread per row,
//     the 8-bit cdf/ppf tables and the input vector in shared memory, one
//     symbol per step (report Algorithm 1);
//   * baseline container (uncompressed int8): lowbit's int8 GEMV, one warp
//     per row, 16-byte loads, dp4a;
//   * lowbit container: the fused decode + GEMV: one warp per tile, its 32k
//     interleaved streams decoded in lock step from the tile's word stream
//     (staged in shared memory by cp.async), one packed 2^P-entry
//     slot -> (value, freq, bias) table in shared memory, dp4a on 4 decoded
//     weights at a time.
// Between steps the chain requantizes on the GPU (v = round_half_even(127 y /
// max|y|), exactly as chain.h), so a chain runs without host round trips; the
// host reads the final vector and one error word at the end. A corrupt payload
// found by a kernel (a read past a row or tile, a stream not ending at 2^16)
// is reported as Error(format) naming the file and matrix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/ans/ans_file.h"

namespace lowbit::ans {

struct CudaRunOptions {
  int device = 0;
  // Copy each matrix's bytes (compressed bytes for seed and lowbit files)
  // from pinned host memory before its product, double-buffered on a second
  // stream, instead of keeping the whole chain resident on the GPU.
  bool with_copies = false;
};

// Runs the chain of `file` on the GPU; the result (final vector, hash,
// recorded hash, per-matrix kernel times from CUDA events, total time) as
// run_chain_cpu gives it. `matrix_seconds` holds each matrix's product
// (+ decode) kernel time; `requantize_seconds` the sum of the requantization
// kernels; `total_seconds` the whole chain on the GPU (copies included when
// options.with_copies). Throws Error(unsupported) without CUDA or a device,
// for matrices with more than 131071 columns (the int32 accumulator would not
// be exact) or lowbit files with P > 15; Error(format) for a corrupt payload.
ChainRun run_chain_cuda(const AnsFile& file, std::string_view where, const CudaRunOptions& options = {});

// `lowbit bench ans` (see cmd_bench_ans.cpp for what each part measures).
struct AnsBenchOptions {
  std::vector<int64_t> figure2_sizes = {512, 1024, 2048, 4096, 6144, 8192};
  int64_t layers = 20;              // K, as the seed's Figure 2
  std::vector<int64_t> target_sizes = {4096, 8192};
  int reps = 30;                    // timed calls of a resident chain / single product (median)
  int copy_reps = 10;               // timed calls of a chain with copies (median)
  bool figure2 = true;
  bool targets = true;
  uint64_t seed = 20250310;
  std::string json_path;            // JSON rows, one per line, when not empty
};
void run_ans_benchmark(const AnsBenchOptions& options);

}  // namespace lowbit::ans
