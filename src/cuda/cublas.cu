#include <climits>
#include <utility>

#include "lowbit/core/error.h"
#include "lowbit/cuda/cublas_check.h"
#include "lowbit/cuda/cublas_gemm.h"

namespace lowbit::cuda {

void throw_cublas_error(cublasStatus_t status, const char* what, const char* file, int line) {
  fail(ErrorKind::cuda, what, " failed: ", cublasGetStatusName(status), " (",
       cublasGetStatusString(status), ") at ", file, ":", line);
}

CublasHandle::CublasHandle() { LOWBIT_CUBLAS_CHECK(cublasCreate(&handle_)); }

CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_) cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void gemm_f16_cublas(cublasHandle_t handle, const void* x, const void* w, void* y, int64_t M,
                     int64_t N, int64_t K, cudaStream_t stream, WeightLayout layout) {
  LOWBIT_CHECK_ARG(handle != nullptr, "handle", "nullptr", "a cuBLAS handle");
  LOWBIT_CHECK_ARG(M > 0 && M <= INT_MAX, "M", M, "1 <= M <= INT_MAX");
  LOWBIT_CHECK_ARG(N > 0 && N <= INT_MAX, "N", N, "1 <= N <= INT_MAX");
  LOWBIT_CHECK_ARG(K > 0 && K <= INT_MAX, "K", K, "1 <= K <= INT_MAX");
  LOWBIT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  LOWBIT_CHECK_ARG(layout == WeightLayout::nk || layout == WeightLayout::kn, "layout",
                   static_cast<int>(layout), "WeightLayout::nk or WeightLayout::kn");
  // cuBLAS is column-major. Row-major y[M, N] is column-major y^T [N, M], and
  // y^T = W^T . x^T, with row-major x[M, K] read as column-major x^T [K, M]
  // (ldb = K). A row-major [N, K] weight is column-major [K, N] (lda = K),
  // used transposed: the "TN" GEMM PyTorch issues for a Linear layer. A
  // row-major [K, N] weight is column-major W^T [N, K] (lda = N), used as is.
  const float alpha = 1.0f, beta = 0.0f;
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const bool nk = layout == WeightLayout::nk;
  LOWBIT_CUBLAS_CHECK(cublasGemmEx(handle, nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, m, n, k,
                                   &alpha, w, CUDA_R_16F, nk ? k : m, x, CUDA_R_16F, k, &beta, y,
                                   CUDA_R_16F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace lowbit::cuda
