// CUDA kernels of layer_ops_cuda.h. Each is one pass over its bytes with fp32
// arithmetic; the per-row ones use one CTA per row and a block reduction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/cuda/check.h"
#include "lowbit/ops/layer_ops_cuda.h"

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

constexpr int kRowThreads = 256;

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

template <typename T>
__global__ void rms_norm_kernel(const T* x, const T* w, float eps, T* y, int64_t dim) {
  __shared__ float scratch[32];
  const T* row = x + blockIdx.x * dim;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_float(row[i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
  T* out = y + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    out[i] = from_float<T>(to_float(row[i]) * inv_rms * to_float(w[i]));
  }
}

// The residual is rounded to T when stored, and the norm is taken of the
// stored value, so that what the next layer adds to is what was normalized.
template <typename T>
__global__ void add_rms_norm_kernel(T* residual, const T* x, const T* w, float eps, T* y, int64_t dim) {
  __shared__ float scratch[32];
  T* res = residual + blockIdx.x * dim;
  const T* in = x + blockIdx.x * dim;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const T stored = from_float<T>(to_float(res[i]) + to_float(in[i]));
    res[i] = stored;
    const float v = to_float(stored);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
  T* out = y + blockIdx.x * dim;
  // Each thread re-reads only the elements it wrote above: no barrier needed.
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    out[i] = from_float<T>(to_float(res[i]) * inv_rms * to_float(w[i]));
  }
}

// One warp per head vector (head_dim <= 1024 values, 32 per lane at most).
template <typename T>
__global__ void head_rms_norm_kernel(T* x, int64_t token_stride, int heads, int head_dim, const T* w,
                                     float eps) {
  const int head = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  if (head >= heads) return;
  const int lane = threadIdx.x % 32;
  T* v = x + blockIdx.x * token_stride + static_cast<int64_t>(head) * head_dim;
  float sum_sq = 0.0f;
  for (int i = lane; i < head_dim; i += 32) {
    const float f = to_float(v[i]);
    sum_sq += f * f;
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(head_dim) + eps);
  for (int i = lane; i < head_dim; i += 32) v[i] = from_float<T>(to_float(v[i]) * inv_rms * to_float(w[i]));
}

template <typename S, typename D>
__global__ void convert_rows_kernel(const S* src, int64_t src_stride, int64_t rows, int64_t cols, D* dst) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[e] = from_float<D>(to_float(src[(e / cols) * src_stride + e % cols]));
  }
}

// One CTA per token; a thread per (head, pair). The angle is pos * inv_freq in
// fp32 as HF transformers computes it; sincosf (not the fast __sincosf) keeps
// full accuracy for the large angles of long contexts.
template <typename T>
__global__ void rope_kernel(T* x, int64_t token_stride, int heads, int head_dim, const int32_t* positions,
                            const float* inv_freq, bool interleaved) {
  const int half = head_dim / 2;
  const float pos = static_cast<float>(positions[blockIdx.x]);
  T* token = x + blockIdx.x * token_stride;
  for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int h = p / half, i = p % half;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    T* v = token + h * head_dim;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = to_float(v[a]), x1 = to_float(v[b]);
    v[a] = from_float<T>(x0 * c - x1 * s);
    v[b] = from_float<T>(x1 * c + x0 * s);
  }
}

template <typename T>
__global__ void silu_mul_kernel(const T* gate, const T* up, int64_t row_stride, int64_t tokens, int64_t width,
                                T* out) {
  const int64_t n = tokens * width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / width, i = e % width;
    const float g = to_float(gate[t * row_stride + i]);
    out[e] = from_float<T>(g / (1.0f + expf(-g)) * to_float(up[t * row_stride + i]));
  }
}

template <typename T>
__global__ void embedding_kernel(const T* table, int64_t vocab, int64_t dim, const int32_t* ids, T* out) {
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
    rms_norm_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
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
    add_rms_norm_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        residual.as<T>(), x.as<const T>(), w.as<const T>(), eps, y.as<T>(), dim);
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
    head_rms_norm_kernel<T><<<grid, kWarps * 32, 0, stream>>>(
        x.as<T>(), x.strides[0], static_cast<int>(heads), static_cast<int>(head_dim), w.as<const T>(), eps);
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
      convert_rows_kernel<S, D><<<grid_1d(rows * cols, 256), 256, 0, stream>>>(
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
    rope_kernel<T><<<static_cast<unsigned>(tokens), 256, 0, stream>>>(
        x.as<T>(), x.strides[0], static_cast<int>(heads), static_cast<int>(head_dim),
        positions.as<const int32_t>(), inv_freq.as<const float>(), style == RopeStyle::interleaved);
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
    silu_mul_kernel<T><<<grid_1d(tokens * width, 256), 256, 0, stream>>>(
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
    embedding_kernel<T><<<static_cast<unsigned>(tokens), 256, 0, stream>>>(
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
    argmax_kernel<T>
        <<<static_cast<unsigned>(rows), 1024, 0, stream>>>(x.as<const T>(), width, out.as<int32_t>());
    LOWBIT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace lowbit::ops
