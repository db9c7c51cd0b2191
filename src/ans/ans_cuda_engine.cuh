// The GPU side of the ans chain experiment, shared by run_chain_cuda
// (ans_cuda.cu) and the benchmark (ans_bench.cu). CUDA-only internal header.
//
// A chain is run by a ChainEngine: every matrix is first turned into one
// contiguous blob of bytes in pinned host memory (PreparedMatrix), exactly the
// bytes the GPU needs for that matrix (compressed payload and tables for the
// entropy-coded methods, the int8 or fp32 codes for the baselines), so that
// "with copies" copies precisely those bytes. Resident mode uploads all blobs
// once; streaming mode copies blob k into one of two device buffers on a copy
// stream while matrix k-1 is multiplied (double buffering).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "lowbit/ans/baseline_format.h"
#include "lowbit/ans/chain.h"
#include "lowbit/ans/lowbit_format.h"
#include "lowbit/ans/seed_format.h"

namespace lowbit::ans::gpu {

enum class Method : uint8_t {
  seed,           // seed container, seed-faithful kernel (one thread per row)
  lowbit_fused,   // lowbit container, fused warp-per-tile decode + dp4a GEMV
  int8_gemv,      // uncompressed int8, lowbit's GEMV (warp per row, dp4a)
  cublas_sgemv,   // uncompressed, converted to fp32, cublasSgemv
  cublaslt_int8,  // uncompressed int8, cublasLtMatmul int8 -> int32 with N padded to 32 columns
};
const char* method_name(Method m);

// Pinned host bytes / device bytes, owned.
struct PinnedBytes {
  uint8_t* data = nullptr;
  size_t size = 0;
  PinnedBytes() = default;
  explicit PinnedBytes(size_t n);
  ~PinnedBytes();
  PinnedBytes(PinnedBytes&& o) noexcept;
  PinnedBytes& operator=(PinnedBytes&& o) noexcept;
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
};
struct DeviceBytes {
  uint8_t* data = nullptr;
  size_t size = 0;
  DeviceBytes() = default;
  explicit DeviceBytes(size_t n);
  ~DeviceBytes();
  DeviceBytes(DeviceBytes&& o) noexcept;
  DeviceBytes& operator=(DeviceBytes&& o) noexcept;
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

// Everything a kernel needs besides the blob; offsets are into the blob.
struct MatrixParams {
  uint32_t rows = 0, cols = 0;
  // seed
  uint32_t payload_words = 0;
  int w_min = 0;
  uint64_t tables_off = 0;   // seed: ppf u8[256] then cdf u8[G+1] (padded to 272 bytes); lowbit: the LUT
  uint64_t cursors_off = 0;  // seed: cursors u32[rows]; lowbit: tile_offsets u32[T+1]
  uint64_t payload_off = 0;  // seed: u16 words; lowbit: the tiles; baselines: the codes (offset 0)
  // lowbit
  int precision = 0;
  int slots = 1;             // states per lane
  uint32_t rows_per_tile = 1, tiles = 0;
  bool packed_lut = true;    // P <= 12: u32 (value | freq-1 << 8 | bias << 20); else u8 symbol + u32 (freq | cdf << 16)
  uint32_t lut_bytes = 0;
};

struct PreparedMatrix {
  Method method = Method::int8_gemv;
  MatrixParams p;
  PinnedBytes blob;
};

PreparedMatrix prepare_seed(const SeedMatrix& m);
PreparedMatrix prepare_lowbit(const LowbitMatrix& m);
// int8_gemv and cublaslt_int8: the codes row-major; cublas_sgemv: as fp32.
PreparedMatrix prepare_dense(const Int8Matrix& m, Method method);

class ChainEngine {
 public:
  // `resident`: also upload every blob now (enqueue, enqueue_product);
  // enqueue_with_copies works either way.
  ChainEngine(std::vector<PreparedMatrix> matrices, const std::vector<int8_t>& v0, bool resident);
  ~ChainEngine();
  ChainEngine(const ChainEngine&) = delete;
  ChainEngine& operator=(const ChainEngine&) = delete;

  Method method() const { return method_; }
  size_t size() const { return mats_.size(); }
  const PreparedMatrix& matrix(size_t k) const { return mats_[k]; }
  uint64_t blob_bytes() const;  // all matrices

  // Enqueues the whole chain on `stream` (resident blobs). When `events` is
  // given it must hold 2K + 1 events: recorded at the start and after each
  // product and each requantization.
  void enqueue(cudaStream_t stream, cudaEvent_t* events = nullptr);
  // The chain with every blob copied from pinned host memory first (on a copy
  // stream, two buffers, each product waiting for its copy and each copy for
  // the product that last used its buffer). The copy stream is fenced to
  // `stream`, so events on `stream` time the whole thing. Same `events`.
  void enqueue_with_copies(cudaStream_t stream, cudaEvent_t* events = nullptr);
  // One product only (matrix k, resident), on the current vector: what the
  // per-kernel benchmark rows time.
  void enqueue_product(cudaStream_t stream, size_t k);

  // Synchronises, then returns the final vector (the rows of the last matrix).
  std::vector<int8_t> final_vector();
  // Synchronises; throws Error(format) naming `where` when a kernel flagged a
  // corrupt payload since the last call (and clears the flag).
  void check_errors(std::string_view where);
  // Whether cuBLASLt found an algorithm for every shape (cublaslt_int8 only).
  bool cublaslt_ok() const { return lt_ok_; }

 private:
  void product(size_t k, const uint8_t* dev_blob, cudaStream_t stream);
  void requantize(size_t k, cudaStream_t stream);
  void start(cudaStream_t stream);

  Method method_;
  std::vector<PreparedMatrix> mats_;
  std::vector<DeviceBytes> resident_;
  DeviceBytes stream_buf_[2];
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copied_[2] = {nullptr, nullptr}, used_[2] = {nullptr, nullptr}, fence_ = nullptr;
  DeviceBytes v0_, vf0_, v_, vf_, y_, err_;
  uint32_t max_dim_ = 0;
  int sm_count_ = 0;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBytes lt_workspace_;
  struct LtPlan;
  std::vector<std::unique_ptr<LtPlan>> lt_plans_;  // per matrix
  bool lt_ok_ = true;
};

}  // namespace lowbit::ans::gpu
