// initcheck_probe CASE [M]        (CASE: kernel, cublas, or a w4a16 strategy name)
// initcheck_probe --list
// Writes y[M, 512] (x[M, 1024] random fp16, 4-bit weights in groups of 128)
// into a fresh cudaMalloc buffer that nothing cleared, with one producer,
// then copies y to the host. Run alone it prints how many outputs are
// nonzero; run under `compute-sanitizer --tool initcheck` the copy is
// reported for every 32 bytes of y that the tool did not see written.
//
// Why: the GPU tests poison every output with cudaMemset first (so an
// unwritten element shows in the comparison), and a memset counts as
// initialization for initcheck, so those tests cannot tell whether the tool
// tracks a kernel's own stores. This program can: scripts/gpu-sanitize runs
// each case in its own process and expects no report from lowbit's kernels
// (and from `kernel`, a plain store per element), while `cublas` shows
// whether the tool sees cuBLAS's stores, the reason for its exclusions.
// Exit codes: 0 ran, 1 a CUDA or lowbit error (message on stderr), 2 usage,
// 3 the case cannot run on this device (wgmma without sm_90a).
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/cublas_gemm.h"
#include "lowbit/cuda/random.h"
#include "lowbit/w4a16/w4a16_gemm.h"

namespace {

constexpr int64_t kK = 1024, kN = 512;

__global__ void store_every_output(half* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half(1.0f + static_cast<float>(i % 1000));
}

constexpr lowbit::W4A16Strategy kStrategies[] = {
    lowbit::W4A16Strategy::automatic,      lowbit::W4A16Strategy::data_parallel,
    lowbit::W4A16Strategy::split_k_atomic, lowbit::W4A16Strategy::split_k_deterministic,
    lowbit::W4A16Strategy::stream_k,       lowbit::W4A16Strategy::decoupled,
    lowbit::W4A16Strategy::wgmma,          lowbit::W4A16Strategy::gemv,
};

int run(const std::string& name, int64_t M) {
  using namespace lowbit;
  // Buffer is a bare cudaMalloc (no clearing), as the engine allocates.
  const Buffer x(static_cast<size_t>(M * kK) * 2, Device::cuda);
  const Buffer y(static_cast<size_t>(M * kN) * 2, Device::cuda);
  const Buffer w_dense(static_cast<size_t>(kN * kK) * 2, Device::cuda);
  cuda::fill_random_f16(x.data(), static_cast<size_t>(M * kK), 1, 1.0f);
  cuda::fill_random_f16(w_dense.data(), static_cast<size_t>(kN * kK), 2, 0.05f);
  if (name == "kernel") {
    store_every_output<<<static_cast<unsigned>((M * kN + 255) / 256), 256>>>(y.as<half>(), M * kN);
    LOWBIT_CUDA_CHECK_LAUNCH();
  } else if (name == "cublas") {
    cuda::CublasHandle handle;
    cuda::gemm_f16_cublas(handle.get(), x.data(), w_dense.data(), y.data(), M, kN, kK, nullptr);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());  // before the handle goes
  } else {
    const std::optional<W4A16Strategy> strategy = parse_w4a16_strategy(name);  // main checked the name
    if (*strategy == W4A16Strategy::wgmma && !w4a16_wgmma_available()) {
      std::printf("initcheck_probe %s: not available on this device\n", name.c_str());
      return 3;
    }
    const W4A16Weights w = W4A16Weights::random(kK, kN, 128, DType::f16, 3);
    W4A16Workspace workspace;
    W4A16Options options;
    options.strategy = *strategy;
    w4a16_gemm(TensorView::contiguous(x.data(), DType::f16, {M, kK}, Device::cuda), w,
               TensorView::contiguous(y.data(), DType::f16, {M, kN}, Device::cuda), workspace, options, nullptr);
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());  // before the workspace goes
  }
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> host(static_cast<size_t>(M * kN));
  LOWBIT_CUDA_CHECK(cudaMemcpy(host.data(), y.data(), host.size() * 2, cudaMemcpyDeviceToHost));
  size_t nonzero = 0;
  for (uint16_t v : host) nonzero += (v & 0x7fff) != 0;
  std::printf("initcheck_probe %s M=%lld: %zu of %zu outputs nonzero\n", name.c_str(), static_cast<long long>(M),
              nonzero, host.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--list") {
    std::printf("kernel\ncublas\n");
    for (lowbit::W4A16Strategy s : kStrategies) std::printf("%s\n", lowbit::w4a16_strategy_name(s));
    return 0;
  }
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: initcheck_probe CASE [M]   (initcheck_probe --list names the cases; M: 1-8192)\n");
    return 2;
  }
  int64_t M = 10;
  if (argc == 3) {
    const std::string_view text = argv[2];
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), M);
    if (ec != std::errc{} || end != text.data() + text.size()) M = 0;
  }
  if (M < 1 || M > 8192) {
    std::fprintf(stderr, "initcheck_probe: M must be 1-8192, not '%s'\n", argv[2]);
    return 2;
  }
  const std::string name = argv[1];
  if (name != "kernel" && name != "cublas" && !lowbit::parse_w4a16_strategy(name)) {
    std::fprintf(stderr, "initcheck_probe: unknown case '%s' (--list names them)\n", name.c_str());
    return 2;
  }
  try {
    return run(name, M);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "initcheck_probe: %s\n", e.what());
    return 1;
  }
}
