// GGUF tensor types -> fp32, and Q4_0/Q4_1 -> QuantizedLinear.
//
// Each block decoder follows ggml's block layout (ggml-common.h) and its
// reference dequantization order of operations, so that the floats are the
// ones ggml itself produces (the products of an f16 scale and a small integer
// are exact in fp32; the K-quants form d*scale first, then that times q, then
// subtract the min, and we do the same).
#include <cstring>
#include <limits>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/parallel.h"
#include "lowbit/formats/float_zero.h"
#include "lowbit/gguf/gguf_file.h"

namespace lowbit::gguf {

namespace {

using u8 = uint8_t;

float h2f(const u8* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return f16_to_float(f16::from_bits(b));
}

// Q4_0: { f16 d; u8 qs[16]; } w = d*(q - 8), q = low nibbles then high nibbles.
void dq_q4_0(const u8* b, float* y) {
  const float d = h2f(b);
  const u8* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: { f16 d; f16 m; u8 qs[16]; } w = d*q + m.
void dq_q4_1(const u8* b, float* y) {
  const float d = h2f(b), m = h2f(b + 2);
  const u8* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0: { f16 d; u8 qh[4]; u8 qs[16]; } fifth bit of element j in bit j of qh.
void dq_q5_0(const u8* b, float* y) {
  const float d = h2f(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const u8* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) << 4 & 0x10);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>(((qs[j] & 0xF) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}

// Q5_1: { f16 d; f16 m; u8 qh[4]; u8 qs[16]; } w = d*q + m.
void dq_q5_1(const u8* b, float* y) {
  const float d = h2f(b), m = h2f(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const u8* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) << 4 & 0x10);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>((qs[j] & 0xF) | h0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
  }
}

// Q8_0: { f16 d; i8 qs[32]; }; Q8_1 has a second f16 (the sum) before qs.
template <int kHeader>
void dq_q8(const u8* b, float* y) {
  const float d = h2f(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[kHeader + j])) * d;
}

// Q2_K: { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; } 16 sub-blocks of 16,
// each with a 4-bit scale (low nibble) and 4-bit min (high nibble).
void dq_q2_k(const u8* b, float* y) {
  const u8* scales = b;
  const u8* q = b + 16;
  const float d = h2f(b + 80), dmin = h2f(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const u8 sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
      }
      shift += 2;
    }
    q += 32;
  }
}

// Q3_K: { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; } 16 sub-blocks of
// 16 with 6-bit signed scales (offset 32) packed in 12 bytes; the third bit of
// q comes from hmask, set meaning "no -4".
void dq_q3_k(const u8* b, float* y) {
  const u8* hm = b;
  const u8* q = b + 32;
  const float d_all = h2f(b + 108);
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  int is = 0;
  u8 m = 1;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const int qv = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(qv);
        }
      }
      shift += 2;
      m = static_cast<u8>(m << 1);
    }
    q += 32;
  }
}

// The 6-bit scale and min of sub-block j of Q4_K/Q5_K, packed in 12 bytes.
void scale_min_k4(int j, const u8* q, u8& d, u8& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<u8>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<u8>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; } 8 sub-blocks of 32.
void dq_q4_k(const u8* b, float* y) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const u8* sc = b + 4;
  const u8* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
    u8 s, m;
    scale_min_k4(is, sc, s, m);
    const float d1 = d * s, m1 = dmin * m;
    scale_min_k4(is + 1, sc, s, m);
    const float d2 = d * s, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
  }
}

// Q5_K: { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }.
void dq_q5_k(const u8* b, float* y) {
  const float d = h2f(b), dmin = h2f(b + 2);
  const u8* sc = b + 4;
  const u8* qh = b + 16;
  const u8* ql = b + 48;
  u8 u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
    u8 s, m;
    scale_min_k4(is, sc, s, m);
    const float d1 = d * s, m1 = dmin * m;
    scale_min_k4(is + 1, sc, s, m);
    const float d2 = d * s, m2 = dmin * m;
    for (int l = 0; l < 32; ++l)
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    ql += 32;
    u1 = static_cast<u8>(u1 << 2);
    u2 = static_cast<u8>(u2 << 2);
  }
}

// Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } 16 sub-blocks of 16,
// q = 4 low bits from ql, 2 high bits from qh, minus 32.
void dq_q6_k(const u8* b, float* y) {
  const u8* ql = b;
  const u8* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h2f(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q8_K: { f32 d; i8 qs[256]; i16 bsums[16]; }.
void dq_q8_k(const u8* b, float* y) {
  float d;
  std::memcpy(&d, b, 4);
  for (int j = 0; j < 256; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[4 + j]));
}

template <typename T, typename Convert>
void dq_scalar(const u8* b, float* y, Convert convert) {
  T v;
  std::memcpy(&v, b, sizeof(T));
  *y = convert(v);
}

using BlockFn = void (*)(const u8*, float*);

BlockFn block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return [](const u8* b, float* y) { std::memcpy(y, b, 4); };
    case GgmlType::F16: return [](const u8* b, float* y) { *y = h2f(b); };
    case GgmlType::BF16:
      return [](const u8* b, float* y) {
        uint16_t v;
        std::memcpy(&v, b, 2);
        *y = bf16_to_float(bf16::from_bits(v));
      };
    case GgmlType::F64:
      return [](const u8* b, float* y) { dq_scalar<double>(b, y, [](double v) { return static_cast<float>(v); }); };
    case GgmlType::I8:
      return [](const u8* b, float* y) { dq_scalar<int8_t>(b, y, [](int8_t v) { return static_cast<float>(v); }); };
    case GgmlType::I16:
      return [](const u8* b, float* y) { dq_scalar<int16_t>(b, y, [](int16_t v) { return static_cast<float>(v); }); };
    case GgmlType::I32:
      return [](const u8* b, float* y) { dq_scalar<int32_t>(b, y, [](int32_t v) { return static_cast<float>(v); }); };
    case GgmlType::Q4_0: return dq_q4_0;
    case GgmlType::Q4_1: return dq_q4_1;
    case GgmlType::Q5_0: return dq_q5_0;
    case GgmlType::Q5_1: return dq_q5_1;
    case GgmlType::Q8_0: return dq_q8<2>;
    case GgmlType::Q8_1: return dq_q8<4>;
    case GgmlType::Q2_K: return dq_q2_k;
    case GgmlType::Q3_K: return dq_q3_k;
    case GgmlType::Q4_K: return dq_q4_k;
    case GgmlType::Q5_K: return dq_q5_k;
    case GgmlType::Q6_K: return dq_q6_k;
    case GgmlType::Q8_K: return dq_q8_k;
    default: return nullptr;
  }
}

BlockFn checked_decoder(const GgufFile& file, const TensorInfo& info) {
  const BlockFn fn = block_decoder(info.type);
  if (fn == nullptr)
    fail(ErrorKind::unsupported, "GGUF file '", file.path().string(), "': tensor '", info.name,
         "' has type ", ggml_type_name(info.type),
         ", which lowbit cannot dequantize (supported: F32 F16 BF16 F64 I8 I16 I32 Q4_0 Q4_1 "
         "Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K)");
  return fn;
}

}  // namespace

bool can_dequantize(GgmlType type) { return block_decoder(type) != nullptr; }

void dequantize_rows_to_f32(const GgufFile& file, const TensorInfo& info, int64_t row_begin,
                            int64_t row_end, std::span<float> out) {
  const BlockFn fn = checked_decoder(file, info);
  const int64_t rows = info.num_rows();
  LOWBIT_CHECK_ARG(row_begin >= 0 && row_begin <= row_end && row_end <= rows, "rows",
                   std::to_string(row_begin) + ".." + std::to_string(row_end),
                   "a range inside 0.." + std::to_string(rows) + " of tensor '" + info.name + "'");
  const int64_t ne0 = info.shape[0];
  if (static_cast<int64_t>(out.size()) != (row_end - row_begin) * ne0)
    fail_argument("out.size()", out.size(),
                  "(row_end - row_begin) * ne0 = " + std::to_string((row_end - row_begin) * ne0));
  const auto* traits = ggml_type_traits(static_cast<uint32_t>(info.type));
  const int64_t bs = traits->block_size, ts = traits->type_size;
  const int64_t blocks_per_row = ne0 / bs;
  const auto* base = reinterpret_cast<const u8*>(file.tensor_bytes(info).data());
  // Rows are independent: split them over threads when there is enough work
  // (the grain keeps each chunk near 64k elements).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(ne0, 1));
  parallel_for(row_begin, row_end, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const u8* src = base + r * blocks_per_row * ts;
      float* dst = out.data() + (r - row_begin) * ne0;
      for (int64_t blk = 0; blk < blocks_per_row; ++blk) fn(src + blk * ts, dst + blk * bs);
    }
  });
}

std::vector<float> dequantize_to_f32(const GgufFile& file, const TensorInfo& info) {
  (void)checked_decoder(file, info);  // fail before allocating for an unsupported type
  std::vector<float> out(static_cast<size_t>(info.numel()));
  dequantize_rows_to_f32(file, info, 0, info.num_rows(), out);
  return out;
}

bool maps_to_quantized_linear(GgmlType type) {
  return type == GgmlType::Q4_1 || type == GgmlType::Q4_0;
}

formats::QuantizedLinear to_quantized_linear(const GgufFile& file, const TensorInfo& info) {
  const std::string where = "GGUF file '" + file.path().string() + "': tensor '" + info.name + "'";
  if (!maps_to_quantized_linear(info.type))
    fail(ErrorKind::unsupported, where, " has type ", ggml_type_name(info.type),
         ": only Q4_1 and Q4_0 map exactly onto a 4-bit QuantizedLinear (dequantize_to_f32 and "
         "requantize the others)");
  if (info.shape.size() != 2)
    fail(ErrorKind::format, where, " has ", info.shape.size(),
         " dimensions: a linear layer weight has 2 ([in, out] in ggml order)");
  const int64_t K = info.shape[0], N = info.shape[1];
  if (K <= 0 || N <= 0 || K % 32 != 0)
    fail(ErrorKind::format, where, " has shape [", K, ", ", N,
         "]: expected positive extents with ne0 a multiple of 32");
  const auto bytes = file.tensor_bytes(info);
  const int64_t B = K / 32;
  if (info.type == GgmlType::Q4_1) {
    std::vector<formats::BlockQ4_1> blocks(static_cast<size_t>(N * B));
    std::memcpy(blocks.data(), bytes.data(), blocks.size() * sizeof(formats::BlockQ4_1));
    try {
      return formats::unpack_q4_1(blocks, K, N);
    } catch (const Error& e) {
      fail(e.kind(), where, ": ", e.what());
    }
  }
  // Q4_0: { f16 d; u8 qs[16]; } w = d*(q - 8): lowbit's symmetric convention exactly.
  formats::QuantizedLinear q =
      formats::QuantizedLinear::allocate(K, N, 32, formats::ZeroPoint::symmetric);
  const auto* base = reinterpret_cast<const u8*>(bytes.data());
  parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < B; ++b) {
        const u8* blk = base + (n * B + b) * 18;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        q.scales[static_cast<size_t>(b * N + n)] = f16::from_bits(d);
        for (int j = 0; j < 16; ++j) {
          q.codes[static_cast<size_t>((b * 32 + j) * N + n)] = static_cast<uint8_t>(blk[2 + j] & 0xF);
          q.codes[static_cast<size_t>((b * 32 + j + 16) * N + n)] = static_cast<uint8_t>(blk[2 + j] >> 4);
        }
      }
  });
  try {
    q.validate();
  } catch (const Error& e) {
    fail(e.kind(), where, ": ", e.what());
  }
  return q;
}

}  // namespace lowbit::gguf
