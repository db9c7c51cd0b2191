// CUDA kernels of layer_ops_cuda.h. Each is one pass over its bytes with fp32
// arithmetic; the per-row ones use one CTA per row and a block reduction.
//
// Every kernel here is launched with programmatic dependent launch
// (lowbit/cuda/pdl.cuh) and starts with pdl_wait(): they are microseconds of
// work each, between GEMMs and attention, so the launch gap before them
// (a few us, even in a CUDA graph) would otherwise cost as much as their work.
// They trigger their dependents at once: the next kernel (usually a GEMV)
// then issues its weight loads while this one runs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/pdl.cuh"
#include "lowbit/ops/head_math.cuh"
#include "lowbit/ops/layer_ops_cuda.h"
#include "lowbit/ops/silu.cuh"

namespace lowbit::ops {

namespace {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// One CTA per row: at decode a norm is one row, so the row's latency is the
// kernel's; 1024 threads keep a 5120-wide row to one chunk (below) per pass.
constexpr int kRowThreads = 1024;

// Sum over the CTA; every thread gets the total. `scratch` holds one float per warp.
__device__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused by the caller's next reduction
  return total;
}

// The row kernels below read kChunk elements per thread before using any:
// one element per loop trip (the first version) made every trip wait for its
// own L2 round trip behind the previous trip's store, and a 5120-wide
// add + RMSNorm took ~18 us on the H100. Each thread sums its elements in
// order i = t, t + blockDim, ..., whatever the chunking.
constexpr int kChunk = 8;

// out[i] = src[i] * inv_rms * w[i] for i = t, t + blockDim, ..., kChunk loads
// in flight per thread.
template <typename T>
__device__ __forceinline__ void store_normalized(const T* __restrict__ src, const T* __restrict__ w, float inv_rms,
                                                 T* __restrict__ out, int64_t dim) {
  const int64_t step = blockDim.x;
  for (int64_t base = threadIdx.x; base < dim; base += kChunk * step) {
    float v[kChunk], g[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t i = base + c * step;
      v[c] = i < dim ? to_float(src[i]) : 0.0f;
      g[c] = i < dim ? to_float(w[i]) : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c)
      if (base + c * step < dim) out[base + c * step] = from_float<T>(v[c] * inv_rms * g[c]);
  }
}

template <typename T>
__global__ void rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ w, float eps, T* __restrict__ y,
                                int64_t dim) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  __shared__ float scratch[32];
  const T* row = x + blockIdx.x * dim;
  const int64_t step = blockDim.x;
  float sum_sq = 0.0f;
  for (int64_t base = threadIdx.x; base < dim; base += kChunk * step) {
    float v[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) v[c] = base + c * step < dim ? to_float(row[base + c * step]) : 0.0f;
#pragma unroll
    for (int c = 0; c < kChunk; ++c)
      if (base + c * step < dim) sum_sq += v[c] * v[c];
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
  store_normalized(row, w, inv_rms, y + blockIdx.x * dim, dim);
}

// The residual is rounded to T when stored, and the norm is taken of the
// stored value, so that what the next layer adds to is what was normalized.
template <typename T>
__global__ void add_rms_norm_kernel(T* __restrict__ residual, const T* __restrict__ x, const T* __restrict__ w,
                                    float eps, T* __restrict__ y, int64_t dim) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  __shared__ float scratch[32];
  T* res = residual + blockIdx.x * dim;
  const T* in = x + blockIdx.x * dim;
  const int64_t step = blockDim.x;
  float sum_sq = 0.0f;
  for (int64_t base = threadIdx.x; base < dim; base += kChunk * step) {
    float r[kChunk], a[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t i = base + c * step;
      r[c] = i < dim ? to_float(res[i]) : 0.0f;
      a[c] = i < dim ? to_float(in[i]) : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int64_t i = base + c * step;
      if (i >= dim) continue;
      const T stored = from_float<T>(r[c] + a[c]);
      res[i] = stored;
      const float v = to_float(stored);
      sum_sq += v * v;
    }
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
  // Each thread re-reads only the elements it wrote above: no barrier needed.
  store_normalized(res, w, inv_rms, y + blockIdx.x * dim, dim);
}

// One warp per head vector (head_dim <= 1024 values, 32 per lane at most).
template <typename T>
__global__ void head_rms_norm_kernel(T* x, int64_t token_stride, int heads, int head_dim, const T* w,
                                     float eps) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  const int head = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  if (head >= heads) return;
  const int lane = threadIdx.x % 32;
  T* v = x + blockIdx.x * token_stride + static_cast<int64_t>(head) * head_dim;
  float sum_sq = 0.0f;
  for (int i = lane; i < head_dim; i += 32) sum_sq = sum_sq_step(sum_sq, to_float(v[i]));
  for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  const float inv_rms = head_inv_rms(sum_sq, head_dim, eps);
  for (int i = lane; i < head_dim; i += 32)
    v[i] = from_float<T>(norm_scale(to_float(v[i]), inv_rms, to_float(w[i])));
}

template <typename S, typename D>
__global__ void convert_rows_kernel(const S* src, int64_t src_stride, int64_t rows, int64_t cols, D* dst) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[e] = from_float<D>(to_float(src[(e / cols) * src_stride + e % cols]));
  }
}

// One CTA per token; a thread per (head, pair).
template <typename T>
__global__ void rope_kernel(T* x, int64_t token_stride, int heads, int head_dim, const int32_t* positions,
                            const float* inv_freq, bool interleaved) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[blockIdx.x]);
  T* token = x + blockIdx.x * token_stride;
  for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int h = p / half, i = p % half;
    float c, s;
    rope_cos_sin(pos, inv_freq[i], &c, &s);
    T* v = token + h * head_dim;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    float y0, y1;
    rope_rotate(to_float(v[a]), to_float(v[b]), c, s, &y0, &y1);
    v[a] = from_float<T>(y0);
    v[b] = from_float<T>(y1);
  }
}

// Fused q/k/v preparation for attention (qkv_to_attention_inputs): the decode
// step ran head_rms_norm(q), head_rms_norm(k), rope(q), rope(k) and three
// convert_rows per layer, 7 launches of ~2-3 us each (280 per step of a
// 40-layer model, a measurable share of a ~9 ms decode step even in a CUDA
// graph), for a few KB of data. This is the same arithmetic in one launch.
//
// Grid: (token, group of kQkvWarps head vectors); one warp per head vector of
// the fused row (q heads, then k heads, then v heads). Each warp reproduces the
// separate kernels exactly: the norm's lane i sums elements i, i + 32, ... in
// order and the same butterfly reduction follows; the norm's result is rounded
// to T (as head_rms_norm stores it) before RoPE, RoPE's result is rounded to T
// (as rope stores it) before the widening to f32. The CTA computes each pair's
// (cos, sin) once into shared memory, for all its heads.
constexpr int kQkvWarps = 4;
constexpr int kQkvMaxHeadDim = 256;

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

template <typename T>
__global__ void __launch_bounds__(kQkvWarps * 32)
    qkv_to_attention_inputs_kernel(const T* qkv, int64_t token_stride, int heads, int kv_heads, int head_dim,
                                   const T* q_norm, const T* k_norm, float eps, const int32_t* positions,
                                   const float* inv_freq, bool interleaved, float* q_out, float* k_out,
                                   float* v_out) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  __shared__ float cos_sin[2][kQkvMaxHeadDim / 2];
  __shared__ float vec[kQkvWarps][kQkvMaxHeadDim];
  const int half = head_dim / 2;
  const int64_t token = blockIdx.x;
  const int first_head = static_cast<int>(blockIdx.y) * kQkvWarps;
  if (first_head < heads + kv_heads) {  // uniform over the CTA: all-V CTAs need no angles
    const float pos = static_cast<float>(positions[token]);
    for (int i = threadIdx.x; i < half; i += blockDim.x)
      rope_cos_sin(pos, inv_freq[i], &cos_sin[0][i], &cos_sin[1][i]);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = first_head + warp;
  if (head >= heads + 2 * kv_heads) return;
  const T* in = qkv + token * token_stride + static_cast<int64_t>(head) * head_dim;
  if (head >= heads + kv_heads) {  // v: widened as it is
    float* out = v_out + (token * kv_heads + (head - heads - kv_heads)) * head_dim;
    for (int i = lane; i < head_dim; i += 32) out[i] = to_float(in[i]);
    return;
  }
  const bool is_q = head < heads;
  const T* w = is_q ? q_norm : k_norm;
  float* out =
      is_q ? q_out + (token * heads + head) * head_dim : k_out + (token * kv_heads + head - heads) * head_dim;
  float* v = vec[warp];
  if (w != nullptr) {  // head_rms_norm_kernel's arithmetic, element for element
    float sum_sq = 0.0f;
    for (int i = lane; i < head_dim; i += 32) {
      const float f = to_float(in[i]);
      v[i] = f;
      sum_sq = sum_sq_step(sum_sq, f);
    }
    for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
    const float inv_rms = head_inv_rms(sum_sq, head_dim, eps);
    for (int i = lane; i < head_dim; i += 32) v[i] = round_to<T>(norm_scale(v[i], inv_rms, to_float(w[i])));
  } else {
    for (int i = lane; i < head_dim; i += 32) v[i] = to_float(in[i]);
  }
  __syncwarp();
  // rope_kernel's arithmetic; each lane rotates its pairs in place (the pairs
  // are disjoint), then the warp writes the vector out in coalesced order.
  for (int i = lane; i < half; i += 32) {
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    float y0, y1;
    rope_rotate(v[a], v[b], cos_sin[0][i], cos_sin[1][i], &y0, &y1);
    v[a] = round_to<T>(y0);
    v[b] = round_to<T>(y1);
  }
  __syncwarp();
  for (int i = lane; i < head_dim; i += 32) out[i] = v[i];
}

template <typename T>
__global__ void silu_mul_kernel(const T* gate, const T* up, int64_t row_stride, int64_t tokens, int64_t width,
                                T* out) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  const int64_t n = tokens * width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / width, i = e % width;
    out[e] = from_float<T>(silu_times(to_float(gate[t * row_stride + i]), to_float(up[t * row_stride + i])));
  }
}

template <typename T>
__global__ void embedding_kernel(const T* table, int64_t vocab, int64_t dim, const int32_t* ids, T* out) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  const int32_t id = ids[blockIdx.x];
  T* row = out + blockIdx.x * dim;
  const bool valid = id >= 0 && id < vocab;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    row[i] = valid ? table[id * dim + i] : from_float<T>(NAN);
  }
}

// (value, index) pairs; `better` is the order argmax_ref uses.
__device__ __forceinline__ bool better(float v, int i, float best_v, int best_i) {
  if (isnan(v)) return false;
  if (best_i < 0 || isnan(best_v)) return true;
  return v > best_v || (v == best_v && i < best_i);
}

template <typename T>
__global__ void argmax_kernel(const T* x, int64_t width, int32_t* out) {
  cuda::pdl_wait();  // PDL: see the file comment
  cuda::pdl_launch_dependents();
  __shared__ float values[32];
  __shared__ int indices[32];
  const T* row = x + blockIdx.x * width;
  float best_v = NAN;
  int best_i = -1;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = to_float(row[i]);
    if (better(v, static_cast<int>(i), best_v, best_i)) {
      best_v = v;
      best_i = static_cast<int>(i);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_v = __shfl_xor_sync(0xffffffffu, best_v, offset);
    const int other_i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (other_i >= 0 && better(other_v, other_i, best_v, best_i)) {
      best_v = other_v;
      best_i = other_i;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    values[warp] = best_v;
    indices[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (indices[w] >= 0 && better(values[w], indices[w], best_v, best_i)) {
        best_v = values[w];
        best_i = indices[w];
      }
    }
    out[blockIdx.x] = best_i < 0 ? 0 : best_i;
  }
}

// ---- host side: checks and dtype dispatch ----------------------------------------

void check_device(const TensorView& t, const char* what) {
  LOWBIT_REQUIRE(t.device == Device::cuda && t.data != nullptr, what, " must be a CUDA tensor");
}

void check_float_dtype(const TensorView& t, DType dtype, const char* what) {
  LOWBIT_REQUIRE(t.dtype == dtype, what, " is ", dtype_name(t.dtype), ", expected ", dtype_name(dtype));
}

void check_rows(const TensorView& t, int64_t rows, int64_t dim, const char* what) {
  LOWBIT_REQUIRE(t.rank == 2 && t.shape[0] == rows && t.shape[1] == dim && t.is_contiguous(), what,
                 " must be contiguous [", rows, ", ", dim, "], got ", t.shape_string());
}

template <typename Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      fn(float{});
      return;
    case DType::f16:
      fn(__half{});
      return;
    case DType::bf16:
      fn(__nv_bfloat16{});
      return;
    default:
      fail(ErrorKind::unsupported, "layer ops take f32, f16 or bf16, not ", dtype_name(dtype));
  }
}

unsigned grid_1d(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y, cudaStream_t stream) {
  check_device(x, "rms_norm x");
  check_device(w, "rms_norm w");
  check_device(y, "rms_norm y");
  LOWBIT_REQUIRE(x.rank == 2, "rms_norm x must be [rows, dim], got ", x.shape_string());
  const int64_t rows = x.shape[0], dim = x.shape[1];
  check_rows(x, rows, dim, "rms_norm x");
  check_rows(y, rows, dim, "rms_norm y");
  LOWBIT_REQUIRE(w.rank == 1 && w.shape[0] == dim, "rms_norm w must be [dim]");
  check_float_dtype(w, x.dtype, "rms_norm w");
  check_float_dtype(y, x.dtype, "rms_norm y");
  if (rows == 0) return;
  LOWBIT_REQUIRE(rows <= INT32_MAX, "rms_norm: too many rows");
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kRowThreads), 0, stream,
                          x.as<const T>(), w.as<const T>(), eps, y.as<T>(), dim);
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

void add_rms_norm(const TensorView& residual, const TensorView& x, const TensorView& w, float eps,
                  const TensorView& y, cudaStream_t stream) {
  check_device(residual, "add_rms_norm residual");
  check_device(x, "add_rms_norm x");
  check_device(w, "add_rms_norm w");
  check_device(y, "add_rms_norm y");
  LOWBIT_REQUIRE(residual.rank == 2, "add_rms_norm residual must be [rows, dim]");
  const int64_t rows = residual.shape[0], dim = residual.shape[1];
  check_rows(residual, rows, dim, "add_rms_norm residual");
  check_rows(x, rows, dim, "add_rms_norm x");
  check_rows(y, rows, dim, "add_rms_norm y");
  LOWBIT_REQUIRE(w.rank == 1 && w.shape[0] == dim, "add_rms_norm w must be [dim]");
  for (const TensorView* t : {&x, &w, &y}) check_float_dtype(*t, residual.dtype, "add_rms_norm operand");
  LOWBIT_REQUIRE(y.data != residual.data, "add_rms_norm: y must not be the residual");
  if (rows == 0) return;
  LOWBIT_REQUIRE(rows <= INT32_MAX, "add_rms_norm: too many rows");
  dispatch_float(residual.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(add_rms_norm_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kRowThreads), 0,
                          stream, residual.as<T>(), x.as<const T>(), w.as<const T>(), eps, y.as<T>(), dim);
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

namespace {
void check_heads_view(const TensorView& x, const char* what) {
  check_device(x, what);
  LOWBIT_REQUIRE(x.rank == 3 && x.strides[2] == 1 && x.strides[1] == x.shape[2] &&
                     x.strides[0] >= x.shape[1] * x.shape[2],
                 what, " must be [tokens, heads, head_dim] with contiguous heads, got ", x.shape_string());
}
}  // namespace

void head_rms_norm(const TensorView& x, const TensorView& w, float eps, cudaStream_t stream) {
  check_heads_view(x, "head_rms_norm x");
  check_device(w, "head_rms_norm w");
  const int64_t tokens = x.shape[0], heads = x.shape[1], head_dim = x.shape[2];
  LOWBIT_REQUIRE(w.rank == 1 && w.shape[0] == head_dim, "head_rms_norm w must be [head_dim]");
  check_float_dtype(w, x.dtype, "head_rms_norm w");
  LOWBIT_REQUIRE(head_dim > 0 && head_dim <= 1024 && heads <= 65535 * 8 && tokens <= INT32_MAX,
                 "head_rms_norm: head_dim in [1, 1024], fewer heads and tokens");
  if (tokens == 0) return;
  constexpr int kWarps = 8;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(head_rms_norm_kernel<T>, dim3(grid), dim3(kWarps * 32), 0, stream, x.as<T>(),
                          x.strides[0], static_cast<int>(heads), static_cast<int>(head_dim), w.as<const T>(),
                          eps);
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

void convert_rows(const TensorView& src, const TensorView& dst, cudaStream_t stream) {
  check_device(src, "convert_rows src");
  check_device(dst, "convert_rows dst");
  LOWBIT_REQUIRE(src.rank == 2 && src.strides[1] == 1 && src.strides[0] >= src.shape[1],
                 "convert_rows src must be [rows, cols] with unit column stride, got ", src.shape_string());
  const int64_t rows = src.shape[0], cols = src.shape[1];
  check_rows(dst, rows, cols, "convert_rows dst");
  if (rows == 0 || cols == 0) return;
  dispatch_float(src.dtype, [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_float(dst.dtype, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      cuda::launch_with_pdl(convert_rows_kernel<S, D>, dim3(grid_1d(rows * cols, 256)), dim3(256), 0, stream,
                            src.as<const S>(), src.strides[0], rows, cols, dst.as<D>());
      LOWBIT_CUDA_CHECK_LAUNCH();
    });
  });
}

void rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq, RopeStyle style,
          cudaStream_t stream) {
  check_heads_view(x, "rope x");
  check_device(positions, "rope positions");
  check_device(inv_freq, "rope inv_freq");
  const int64_t tokens = x.shape[0], heads = x.shape[1], head_dim = x.shape[2];
  LOWBIT_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 1024,
                 "rope: head_dim must be even, <= 1024");
  LOWBIT_REQUIRE(positions.dtype == DType::i32 && positions.numel() == tokens,
                 "rope positions must be i32 [tokens]");
  LOWBIT_REQUIRE(inv_freq.dtype == DType::f32 && inv_freq.numel() == head_dim / 2,
                 "rope inv_freq must be f32 [head_dim / 2]");
  if (tokens == 0) return;
  LOWBIT_REQUIRE(tokens <= INT32_MAX && heads <= 4096, "rope: too many tokens or heads");
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(rope_kernel<T>, dim3(static_cast<unsigned>(tokens)), dim3(256), 0, stream,
                          x.as<T>(), x.strides[0], static_cast<int>(heads), static_cast<int>(head_dim),
                          positions.as<const int32_t>(), inv_freq.as<const float>(),
                          style == RopeStyle::interleaved);
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

void qkv_to_attention_inputs(const TensorView& qkv, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                             const TensorView* q_norm, const TensorView* k_norm, float eps,
                             const TensorView& positions, const TensorView& inv_freq, RopeStyle style,
                             const TensorView& q_out, const TensorView& k_out, const TensorView& v_out,
                             cudaStream_t stream) {
  check_device(qkv, "qkv_to_attention_inputs qkv");
  check_device(positions, "qkv_to_attention_inputs positions");
  check_device(inv_freq, "qkv_to_attention_inputs inv_freq");
  check_device(q_out, "qkv_to_attention_inputs q_out");
  check_device(k_out, "qkv_to_attention_inputs k_out");
  check_device(v_out, "qkv_to_attention_inputs v_out");
  LOWBIT_REQUIRE(num_heads > 0 && num_kv_heads > 0 && num_heads <= 4096 && num_kv_heads <= 4096,
                 "qkv_to_attention_inputs: num_heads and num_kv_heads must be in [1, 4096], got ", num_heads,
                 " and ", num_kv_heads);
  LOWBIT_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= kQkvMaxHeadDim,
                 "qkv_to_attention_inputs: head_dim must be even and in [2, ", kQkvMaxHeadDim, "], got ",
                 head_dim);
  const int64_t width = (num_heads + 2 * num_kv_heads) * head_dim;
  LOWBIT_REQUIRE(qkv.rank == 2 && qkv.strides[1] == 1 && qkv.strides[0] >= qkv.shape[1],
                 "qkv_to_attention_inputs qkv must be [tokens, width] with unit column stride, got ",
                 qkv.shape_string());
  LOWBIT_REQUIRE(qkv.shape[1] == width, "qkv_to_attention_inputs qkv has ", qkv.shape[1],
                 " columns, expected (num_heads + 2 * num_kv_heads) * head_dim = ", width);
  LOWBIT_REQUIRE(qkv.dtype == DType::f32 || qkv.dtype == DType::f16 || qkv.dtype == DType::bf16,
                 "qkv_to_attention_inputs qkv must be f32, f16 or bf16, not ", dtype_name(qkv.dtype));
  const int64_t tokens = qkv.shape[0];
  for (const TensorView* w : {q_norm, k_norm}) {
    if (w == nullptr) continue;
    check_device(*w, "qkv_to_attention_inputs q/k norm weight");
    LOWBIT_REQUIRE(w->rank == 1 && w->shape[0] == head_dim,
                   "qkv_to_attention_inputs q/k norm weight must be [head_dim], got ", w->shape_string());
    check_float_dtype(*w, qkv.dtype, "qkv_to_attention_inputs q/k norm weight");
  }
  LOWBIT_REQUIRE(positions.dtype == DType::i32 && positions.rank == 1 && positions.shape[0] == tokens,
                 "qkv_to_attention_inputs positions must be i32 [tokens]");
  LOWBIT_REQUIRE(inv_freq.dtype == DType::f32 && inv_freq.numel() == head_dim / 2,
                 "qkv_to_attention_inputs inv_freq must be f32 [head_dim / 2]");
  check_rows(q_out, tokens, num_heads * head_dim, "qkv_to_attention_inputs q_out");
  check_rows(k_out, tokens, num_kv_heads * head_dim, "qkv_to_attention_inputs k_out");
  check_rows(v_out, tokens, num_kv_heads * head_dim, "qkv_to_attention_inputs v_out");
  check_float_dtype(q_out, DType::f32, "qkv_to_attention_inputs q_out");
  check_float_dtype(k_out, DType::f32, "qkv_to_attention_inputs k_out");
  check_float_dtype(v_out, DType::f32, "qkv_to_attention_inputs v_out");
  if (tokens == 0) return;
  LOWBIT_REQUIRE(tokens <= INT32_MAX, "qkv_to_attention_inputs: too many tokens");
  const int64_t vectors = num_heads + 2 * num_kv_heads;
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>((vectors + kQkvWarps - 1) / kQkvWarps));
  dispatch_float(qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(
        qkv_to_attention_inputs_kernel<T>, dim3(grid), dim3(kQkvWarps * 32), 0, stream, qkv.as<const T>(),
        qkv.strides[0], static_cast<int>(num_heads), static_cast<int>(num_kv_heads),
        static_cast<int>(head_dim), q_norm != nullptr ? q_norm->as<const T>() : nullptr,
        k_norm != nullptr ? k_norm->as<const T>() : nullptr, eps, positions.as<const int32_t>(),
        inv_freq.as<const float>(), style == RopeStyle::interleaved, q_out.as<float>(), k_out.as<float>(),
        v_out.as<float>());
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out, cudaStream_t stream) {
  check_device(gate, "silu_mul gate");
  check_device(up, "silu_mul up");
  check_device(out, "silu_mul out");
  LOWBIT_REQUIRE(gate.rank == 2 && up.rank == 2 && gate.shape == up.shape && gate.strides == up.strides &&
                     gate.strides[1] == 1 && gate.strides[0] >= gate.shape[1],
                 "silu_mul gate and up must be [tokens, width] with the same unit-column strides");
  const int64_t tokens = gate.shape[0], width = gate.shape[1];
  check_rows(out, tokens, width, "silu_mul out");
  check_float_dtype(up, gate.dtype, "silu_mul up");
  check_float_dtype(out, gate.dtype, "silu_mul out");
  if (tokens == 0 || width == 0) return;
  dispatch_float(gate.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(silu_mul_kernel<T>, dim3(grid_1d(tokens * width, 256)), dim3(256), 0, stream,
                          gate.as<const T>(), up.as<const T>(), gate.strides[0], tokens, width, out.as<T>());
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

void embedding(const TensorView& table, const TensorView& ids, const TensorView& out, cudaStream_t stream) {
  check_device(table, "embedding table");
  check_device(ids, "embedding ids");
  check_device(out, "embedding out");
  LOWBIT_REQUIRE(table.rank == 2 && table.is_contiguous(), "embedding table must be contiguous [vocab, dim]");
  const int64_t vocab = table.shape[0], dim = table.shape[1];
  LOWBIT_REQUIRE(ids.dtype == DType::i32, "embedding ids must be i32");
  const int64_t tokens = ids.numel();
  check_rows(out, tokens, dim, "embedding out");
  check_float_dtype(out, table.dtype, "embedding out");
  if (tokens == 0) return;
  LOWBIT_REQUIRE(tokens <= INT32_MAX, "embedding: too many tokens");
  dispatch_float(table.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(embedding_kernel<T>, dim3(static_cast<unsigned>(tokens)), dim3(256), 0, stream,
                          table.as<const T>(), vocab, dim, ids.as<const int32_t>(), out.as<T>());
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

void argmax(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  check_device(x, "argmax x");
  check_device(out, "argmax out");
  LOWBIT_REQUIRE(x.rank == 2 && x.is_contiguous(), "argmax x must be contiguous [rows, width]");
  const int64_t rows = x.shape[0], width = x.shape[1];
  LOWBIT_REQUIRE(width > 0 && width <= INT32_MAX, "argmax: width must be in [1, 2^31)");
  LOWBIT_REQUIRE(out.dtype == DType::i32 && out.numel() == rows, "argmax out must be i32 [rows]");
  if (rows == 0) return;
  LOWBIT_REQUIRE(rows <= INT32_MAX, "argmax: too many rows");
  dispatch_float(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    cuda::launch_with_pdl(argmax_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(1024), 0, stream,
                          x.as<const T>(), width, out.as<int32_t>());
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace lowbit::ops
