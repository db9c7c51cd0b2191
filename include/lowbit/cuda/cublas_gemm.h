// cuBLAS as the dense FP16 baseline: every quantized GEMM in lowbit is
// compared with this call, on the same layouts.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace lowbit::cuda {

// An owned cuBLAS handle, created on the current device. Move-only.
class CublasHandle {
 public:
  CublasHandle();
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// How the dense weight W (K inputs, N outputs) is stored, row-major.
enum class WeightLayout {
  nk,  // [N, K]: what a PyTorch Linear layer holds (y = x @ weight.T); cuBLAS "TN"
  kn,  // [K, N]: y = x @ W as torch.matmul(x, W) on a [K, N] tensor; cuBLAS "NN"
};

// y[M, N] = x[M, K] . W[K, N] in binary16 with fp32 accumulation
// (cublasGemmEx, CUBLAS_COMPUTE_32F), x and y row-major and contiguous on the
// device, W stored as `layout` says (by default the [N, K] matrix of a PyTorch
// Linear layer). Enqueued on `stream`; no synchronisation. Throws
// Error(invalid_argument) for non-positive or too large extents, Error(cuda)
// when cuBLAS fails.
void gemm_f16_cublas(cublasHandle_t handle, const void* x, const void* w, void* y, int64_t M,
                     int64_t N, int64_t K, cudaStream_t stream,
                     WeightLayout layout = WeightLayout::nk);

}  // namespace lowbit::cuda
