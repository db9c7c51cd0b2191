// The decode W4A16 kernel: y[M, N] = x[M, K] * dequant(W) for M <= 8 per
// pass, on mma.sync with the operands swapped (sm_80 and later).
//
// Why it exists: at decode (M = 1 .. 8) the GEMM is a weight stream, and the
// other kernels give a 16-row (or larger) mma tile to x, so 15 of 16 rows of
// every activation operand are padding that still costs shared-memory traffic,
// ldmatrix and barriers per stage. Here:
//   - The dequantized weights are the A operand of mma.m16n8k16 (16 output
//     columns x 16 rows of K) and the rows of x are its n = 8 columns. A
//     lane's 16 bytes of the tiled layout are, after the shared LOP3
//     dequantization (w4a16_device.cuh), exactly the A fragments of four mma
//     (one per k-step of 16): layout slot pairs 0/4, 2/6, 1/5, 3/7 are
//     a0..a3. No padding rows are ever multiplied or moved.
//   - Weights go from global memory straight into registers (one 16-byte
//     load per lane and iteration, L1 bypassed), never through shared
//     memory: no cp.async bookkeeping and no barrier in the main loop. Each
//     lane keeps kAhead iterations of loads in flight (a rolling register
//     pipeline: a slot is refilled with iteration i + kAhead right after
//     iteration i is taken out of it), and many small CTAs per SM keep the
//     bytes in flight that HBM needs (~30 KB per SM at 3 TB/s).
//   - x (a few KB) is staged once per CTA in shared memory, after the first
//     weight loads are issued, and read with ldmatrix (two per iteration).
//   - K is split over CTAs until the device is full; the last CTA of a column
//     block sums the partials in a fixed order (deterministic).
//   - Launched with programmatic dependent launch (lowbit/cuda/pdl.cuh): the
//     first weight loads are issued before waiting for the previous kernel.
// Measured on the H100 it is slower than the sm_90a wgmma kernel on every
// large layer at M = 1 (its weight stream reached 1.3-1.6 TB/s, wgmma's bulk
// copies 2.0): `auto` does not choose it (docs/w4a16-gemm.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/pdl.cuh"
#include "w4a16_device.cuh"
#include "w4a16_gemv.h"

namespace lowbit::w4a16_detail {
namespace {

constexpr int kThreads = 128;  // 4 warps = one 64-column block of the layout, one 16-column strip each
constexpr int kAhead = 4;      // iterations of weight loads in flight per lane
constexpr int kMinCtasPerSm = 6;
// Row stride of the staged activations: the K range plus 8 halves, so the 8
// row addresses of an ldmatrix land on 8 different 16-byte bank groups.
__host__ __device__ constexpr int staged_stride(int range_iters) { return range_iters * 64 + 8; }

// Weights are read exactly once: bypass L1 so they do not evict x and the scales.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One iteration's operands for one lane: its 16 bytes of codes and the
// scale/zero pairs of its two columns for rows k0 (lo) and k0 + 32 (hi).
struct IterLoad {
  uint4 codes;
  uint32_t lo0, lo1, hi0, hi1;
};

template <typename T, bool kFloatZero>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) w4a16_gemv_kernel(const GemvArgs args) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int last_cta;
  T* xs = reinterpret_cast<T*>(smem);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int nb = blockIdx.x, split = blockIdx.y;
  const int m0 = blockIdx.z * kGemvRowsPerPass;
  const int rows = min(kGemvRowsPerPass, args.M - m0);
  const int n_blocks = args.N_pad / 64;
  const int it_begin = static_cast<int>(static_cast<int64_t>(split) * args.iters / args.split_k);
  const int it_end = static_cast<int>(static_cast<int64_t>(split + 1) * args.iters / args.split_k);
  const int range_max = (args.iters + args.split_k - 1) / args.split_k;
  const int stride = staged_stride(range_max);
  const int col0 = nb * 64 + warp * 16 + g, col1 = col0 + 8;  // this lane's two output columns
  const bool two_groups = args.group_shift == 5;              // group 32: rows k0+32.. have their own scales

  const uint4* codes = args.qweight + static_cast<int64_t>(nb) * kThreads + tid;
  const int64_t iter_stride = static_cast<int64_t>(n_blocks) * kThreads;
  auto issue = [&](int it) {
    IterLoad l;
    l.codes = load_stream(codes + it * iter_stride);
    const int k0 = it * 64;
    const int group_lo = args.group_shift < 0 ? 0 : k0 >> args.group_shift;
    const uint32_t* sz = args.scale_zero + static_cast<int64_t>(group_lo) * args.N_pad;
    l.lo0 = __ldg(sz + col0);
    l.lo1 = __ldg(sz + col1);
    l.hi0 = l.lo0;
    l.hi1 = l.lo1;
    if (two_groups) {
      l.hi0 = __ldg(sz + args.N_pad + col0);
      l.hi1 = __ldg(sz + args.N_pad + col1);
    }
    return l;
  };

  // First loads before anything else, so they fly while x is staged.
  IterLoad ring[kAhead] = {};
#pragma unroll
  for (int u = 0; u < kAhead; ++u)
    if (it_begin + u < it_end) ring[u] = issue(it_begin + u);

  // Everything above read only the weights, which no kernel writes: with
  // programmatic dependent launch it overlapped the previous kernel's tail.
  // x, the partials and the counters are the previous kernels' business.
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();

  // Stage x[m0 .. m0+rows, k range] (zeros past K) as [rows][stride] halves.
  {
    const T* x = static_cast<const T*>(args.x);
    const int k_begin = it_begin * 64, chunks_per_row = (it_end - it_begin) * 8;
    for (int c = tid; c < rows * chunks_per_row; c += kThreads) {
      const int r = c / chunks_per_row, kc = (c % chunks_per_row) * 8;
      const int k = k_begin + kc;
      const T* src = x + static_cast<int64_t>(m0 + r) * args.ldx + k;
      uint4 v;
      if (k + 8 <= args.K) {
        v = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        T e[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = k + i < args.K ? src[i] : from_float<T>(0.0f);
        v = *reinterpret_cast<const uint4*>(e);
      }
      *reinterpret_cast<uint4*>(xs + r * stride + kc) = v;
    }
  }
  __syncthreads();

  // ldmatrix row addresses: lane l feeds row l % 8 of matrix l / 8; matrices
  // are (k-step j, k 0-7), (j, 8-15), (j+1, 0-7), (j+1, 8-15). Rows past the
  // pass repeat its last row: their products land in D columns never stored.
  const T* x_lane = xs + min(lane % 8, rows - 1) * stride + ((lane / 8) & 1) * 8 + (lane / 16) * 16;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int base = it_begin; base < it_end; base += kAhead) {
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int it = base + u;
      if (it >= it_end) break;
      const IterLoad cur = ring[u];
      if (it + kAhead < it_end) ring[u] = issue(it + kAhead);

      const ColumnDequant<T> lo0 = column_dequant<T, kFloatZero>(cur.lo0);
      const ColumnDequant<T> lo1 = column_dequant<T, kFloatZero>(cur.lo1);
      const ColumnDequant<T> hi0 = two_groups ? column_dequant<T, kFloatZero>(cur.hi0) : lo0;
      const ColumnDequant<T> hi1 = two_groups ? column_dequant<T, kFloatZero>(cur.hi1) : lo1;
      uint32_t w[4][2][2];  // [k-step][column c0 / c1][register]
      dequant_word<T, kFloatZero>(cur.codes.x, lo0, lo1, w[0][0], w[0][1]);
      dequant_word<T, kFloatZero>(cur.codes.y, lo0, lo1, w[1][0], w[1][1]);
      dequant_word<T, kFloatZero>(cur.codes.z, hi0, hi1, w[2][0], w[2][1]);
      dequant_word<T, kFloatZero>(cur.codes.w, hi0, hi1, w[3][0], w[3][1]);

      const T* xi = x_lane + (it - it_begin) * 64;
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        uint32_t b[4];
        ldmatrix_x4(b, xi + pair * 32);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * pair + h;
          // A = weights: rows g / g+8 are columns c0 / c1, k 2t.. then 2t+8..
          const uint32_t a[4] = {w[j][0][0], w[j][1][0], w[j][0][1], w[j][1][1]};
          const uint32_t bx[2] = {b[2 * h], b[2 * h + 1]};
          mma_16816<T>(acc, a, bx);
        }
      }
    }
  }

  // D fragment: acc[0], acc[1] = column col0, rows 2t, 2t+1 of the pass;
  // acc[2], acc[3] = column col1, same rows.
  auto for_each_output = [&](auto&& f) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 2 * t + (e & 1);
      if (r < rows) f(m0 + r, e < 2 ? col0 : col1, acc[e]);
    }
  };
  T* y = static_cast<T*>(args.y);
  if (args.split_k == 1) {
    for_each_output([&](int row, int col, float v) {
      if (col < args.N) y[static_cast<int64_t>(row) * args.ldy + col] = from_float<T>(v);
    });
    return;
  }
  float* partial = args.partial + static_cast<int64_t>(split) * args.M * args.N_pad;
  for_each_output([&](int row, int col, float v) { __stcg(partial + static_cast<int64_t>(row) * args.N_pad + col, v); });
  __threadfence();  // this thread's partials visible device-wide before the count
  __syncthreads();
  int* counter = args.counters + blockIdx.z * n_blocks + nb;
  if (tid == 0) last_cta = atomicAdd(counter, 1) == args.split_k - 1;
  __syncthreads();
  if (!last_cta) return;
  __threadfence();
  for (int idx = tid; idx < rows * 64; idx += kThreads) {
    const int row = m0 + idx / 64, col = nb * 64 + idx % 64;
    const int64_t offset = static_cast<int64_t>(row) * args.N_pad + col;
    float sum = 0.0f;
    for (int s = 0; s < args.split_k; ++s)  // fixed order: bitwise reproducible
      sum += __ldcg(args.partial + static_cast<int64_t>(s) * args.M * args.N_pad + offset);
    if (col < args.N) y[static_cast<int64_t>(row) * args.ldy + col] = from_float<T>(sum);
  }
  if (tid == 0) *counter = 0;  // ready for the next call
}

template <typename T, bool kFloatZero>
void launch_typed(const GemvArgs& args, cudaStream_t stream) {
  const int range_max = (args.iters + args.split_k - 1) / args.split_k;
  const int rows = std::min(args.M, kGemvRowsPerPass);
  const int smem = rows * staged_stride(range_max) * 2;
  const dim3 grid(static_cast<unsigned>(args.N_pad / 64), static_cast<unsigned>(args.split_k),
                  static_cast<unsigned>((args.M + kGemvRowsPerPass - 1) / kGemvRowsPerPass));
  cuda::launch_with_pdl(w4a16_gemv_kernel<T, kFloatZero>, grid, dim3(kThreads), static_cast<size_t>(smem), stream,
                        args);
}

}  // namespace

int gemv_min_split(int64_t M, int iters) {
  const int64_t rows = std::min<int64_t>(M, kGemvRowsPerPass);
  // rows * staged_stride(ceil(iters / s)) <= kGemvMaxStagedElements + rows * 8
  const int64_t max_range = std::max<int64_t>(1, kGemvMaxStagedElements / (rows * 64));
  return static_cast<int>(std::max<int64_t>(1, (iters + max_range - 1) / max_range));
}

int gemv_ctas_per_sm(bool bf16, int device) {
  static int cached[2][64] = {};
  int& slot = cached[bf16 ? 1 : 0][std::clamp(device, 0, 63)];
  if (slot == 0) {
    const int smem = staged_stride(kGemvMaxStagedElements / 64) * 2;  // the largest a CTA asks for
    int per_sm = 0;
    if (bf16)
      LOWBIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, w4a16_gemv_kernel<__nv_bfloat16, false>, kThreads, smem));
    else
      LOWBIT_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, w4a16_gemv_kernel<half, false>, kThreads, smem));
    slot = std::max(1, per_sm);
  }
  return slot;
}

void launch_gemv(const GemvArgs& args, bool bf16, bool float_zero, cudaStream_t stream) {
  LOWBIT_REQUIRE(args.split_k >= gemv_min_split(args.M, args.iters), "gemv: split_k ", args.split_k,
                 " leaves more activations per CTA than the staging buffer holds (at least ",
                 gemv_min_split(args.M, args.iters), ")");
  if (bf16) {
    if (float_zero) launch_typed<__nv_bfloat16, true>(args, stream);
    else launch_typed<__nv_bfloat16, false>(args, stream);
  } else {
    if (float_zero) launch_typed<half, true>(args, stream);
    else launch_typed<half, false>(args, stream);
  }
}

}  // namespace lowbit::w4a16_detail
