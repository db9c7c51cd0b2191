// prefetch_to_l2 (cuda/l2_prefetch.h): it must bring bytes into L2 (a read
// after it is faster than one after a flush), and it must not break the
// stream order of the programmatic-dependent-launch chains it sits in (the
// engine places it between kernels that hand data to each other).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu_test_util.h"
#include "lowbit/core/error.h"
#include "lowbit/core/tensor.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/device.h"
#include "lowbit/cuda/l2_prefetch.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/cuda/timer.h"

namespace lowbit {
namespace {

__global__ void spin_cycles_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Lets its dependents launch at once, spins, then writes `value`: a kernel
// after it that skipped its own wait would read the old value.
__global__ void slow_writer_kernel(int* x, int value, long long cycles) {
  cuda::pdl_launch_dependents();
  cuda::pdl_wait();
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  *x = value;
}

__global__ void copy_after_wait_kernel(const int* x, int* y) {
  cuda::pdl_wait();
  *y = *x;
}

TEST(L2Prefetch, ReadAfterPrefetchIsFasterThanAfterAFlush) {
  LOWBIT_REQUIRE_GPU();
  if (!cuda::l2_prefetch_supported()) {
    EXPECT_LT(cuda_device_info(0).cc_major, 9) << "a Hopper device must support the bulk L2 prefetch";
    std::printf("no bulk L2 prefetch on this device: prefetch_to_l2 launches nothing\n");
    return;
  }
  const CudaDeviceInfo info = cuda_device_info(0);
  const size_t bytes = size_t{16} << 20;  // a third of an H100's L2
  Buffer data(bytes, Device::cuda, 0), sink(sizeof(unsigned), Device::cuda, 0);
  LOWBIT_CUDA_CHECK(cudaMemset(data.data(), 1, bytes));
  // 20 us between the prefetch and the read: the time a chain of small
  // kernels gives the prefetch in the engine (16 MB take ~6 us at 3 TB/s).
  const long long gap_cycles = static_cast<long long>(info.clock_khz) * 20 / 1000;
  auto timed = [&](bool prefetch) {
    cuda::CudaTimerOptions o;
    o.reps = 30;
    o.flush_l2 = true;
    o.flush_by_reading = true;
    return cuda::time_cuda(
               [&](cudaStream_t s) {
                 if (prefetch) {
                   const cuda::L2Range range{data.data(), bytes};
                   cuda::prefetch_to_l2({&range, 1}, bytes, s);
                 }
                 spin_cycles_kernel<<<1, 32, 0, s>>>(gap_cycles);
                 LOWBIT_CUDA_CHECK_LAUNCH();
                 cuda::read_device_buffer(data.data(), bytes, static_cast<unsigned*>(sink.data()), s);
               },
               o)
        .median_us;
  };
  const double without = timed(false), with = timed(true);
  std::printf("20 us gap + 16 MB read after a read flush: %.1f us, with a prefetch first %.1f us\n", without,
              with);
  // The read alone is ~6 us from HBM; from L2 it is about half of that.
  EXPECT_LT(with, without - 1.5);
}

TEST(L2Prefetch, KeepsTheOrderOfAPdlChain) {
  LOWBIT_REQUIRE_GPU();
  const CudaDeviceInfo info = cuda_device_info(0);
  Buffer x(sizeof(int), Device::cuda, 0), y(sizeof(int), Device::cuda, 0);
  Buffer weights(size_t{4} << 20, Device::cuda, 0);
  cudaStream_t stream = nullptr;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const long long cycles = static_cast<long long>(info.clock_khz) * 30 / 1000;  // 30 us
  const cuda::L2Range range{weights.data(), weights.size()};
  for (int value = 1; value <= 20; ++value) {
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(x.data(), 0, sizeof(int), stream));
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(y.data(), 0xFF, sizeof(int), stream));
    cuda::launch_with_pdl(slow_writer_kernel, dim3(1), dim3(32), 0, stream, x.as<int>(), value, cycles);
    cuda::prefetch_to_l2({&range, 1}, range.bytes, stream);
    cuda::launch_with_pdl(copy_after_wait_kernel, dim3(1), dim3(1), 0, stream, x.as<const int>(), y.as<int>());
    int got = 0;
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(&got, y.data(), sizeof got, cudaMemcpyDeviceToHost, stream));
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    ASSERT_EQ(got, value) << "the kernel after the prefetch ran before the writer before it had finished";
  }
  LOWBIT_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(L2Prefetch, RefusesTooManyRangesAndMisalignedPointers) {
  LOWBIT_REQUIRE_GPU();
  Buffer data(4096, Device::cuda, 0);
  std::vector<cuda::L2Range> five(5, cuda::L2Range{data.data(), 1024});
  EXPECT_THROW(cuda::prefetch_to_l2(five, 1 << 20, nullptr), Error);
  const cuda::L2Range odd{static_cast<const char*>(data.data()) + 8, 1024};
  EXPECT_THROW(cuda::prefetch_to_l2({&odd, 1}, 1 << 20, nullptr), Error);
  // Empty, zero-budget and sub-16-byte requests launch nothing and succeed.
  const cuda::L2Range tiny{data.data(), 15};
  EXPECT_NO_THROW(cuda::prefetch_to_l2({&tiny, 1}, 1 << 20, nullptr));
  EXPECT_NO_THROW(cuda::prefetch_to_l2({&odd, 0}, 1 << 20, nullptr));
  const cuda::L2Range whole{data.data(), 4096};
  EXPECT_NO_THROW(cuda::prefetch_to_l2({&whole, 1}, 0, nullptr));
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace lowbit
