#include "lowbit/w4a16/w4a16_layout.h"

#include <cmath>
#include <mutex>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/parallel.h"
#include "lowbit/formats/convert.h"

namespace lowbit {
namespace {

using formats::HostTensor;
using formats::PackedLinear;
using formats::QuantizedLinear;
using formats::ZeroPoint;

// Row (within a 64-row k-iteration) and column (within a 16-column warp strip)
// of nibble `slot` of word `word` of lane `lane`: the inverse of the table in
// w4a16_layout.h.
struct SlotPosition {
  int row;
  int col;
};
constexpr SlotPosition slot_position(int lane, int word, int slot) {
  const int g = lane / 4, t = lane % 4;
  const int pair = slot % 4;          // which register pair
  const int half = slot / 4;          // low (0) or high (1) half: row 2t or 2t+1
  const int row = 16 * word + 2 * t + half + (pair % 2 == 1 ? 8 : 0);
  const int col = g + (pair >= 2 ? 8 : 0);
  return {row, col};
}

uint16_t to_act_bits(float v, DType act) {
  return act == DType::f16 ? float_to_f16(v).bits : float_to_bf16(v).bits;
}
float from_act_bits(uint16_t b, DType act) {
  return act == DType::f16 ? f16_to_float(f16::from_bits(b)) : bf16_to_float(bf16::from_bits(b));
}

DType act_dtype_of_layout(const std::string& name) {
  if (name == "w4a16_tiled_f16") return DType::f16;
  if (name == "w4a16_tiled_bf16") return DType::bf16;
  fail(ErrorKind::invalid_argument, "layout '", name, "' is not a W4A16 tiled layout: expected ",
       "w4a16_tiled_f16 or w4a16_tiled_bf16");
}

}  // namespace

const char* w4a16_layout_name(DType act_dtype) {
  if (act_dtype == DType::f16) return "w4a16_tiled_f16";
  if (act_dtype == DType::bf16) return "w4a16_tiled_bf16";
  fail_argument("act_dtype", dtype_name(act_dtype), "f16 or bf16 activations");
}

void register_w4a16_layouts() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (DType act : {DType::f16, DType::bf16}) {
      formats::LayoutCodec codec;
      codec.name = w4a16_layout_name(act);
      codec.description = std::string("lowbit's tiled layout for the CUDA W4A16 GEMM, ") +
                          dtype_name(act) + " activations (see lowbit/w4a16/w4a16_layout.h)";
      codec.pack = [act](const QuantizedLinear& layer) { return pack_w4a16_tiled(layer, act); };
      codec.unpack = [](const PackedLinear& packed) { return unpack_w4a16_tiled(packed); };
      formats::register_layout(std::move(codec));
    }
  });
}

PackedLinear pack_w4a16_tiled(const QuantizedLinear& input, DType act, bool allow_rounding) {
  register_w4a16_layouts();
  const char* layout = w4a16_layout_name(act);
  input.validate();
  // Act-order layers are stored with their rows sorted by group, so that a
  // k-iteration reads one contiguous run of scales; the kernel gathers the
  // activations through `perm` instead.
  formats::SortedRows sorted_rows = formats::sort_rows_by_group(input);
  const QuantizedLinear& layer = sorted_rows.sorted;
  const bool act_order = !input.has_trivial_g_idx();

  const int64_t K = layer.K, N = layer.N;
  const int64_t Kp = w4a16_padded_k(K), Np = w4a16_padded_n(N);
  const int64_t I = Kp / kW4A16TileK, NB = Np / kW4A16TileN;
  const int64_t rows_per_group = layer.group_size == -1 ? Kp : layer.group_size;
  const int64_t Gp = Kp / rows_per_group;

  PackedLinear packed;
  packed.layout = layout;
  packed.K = K;
  packed.N = N;
  packed.group_size = layer.group_size;
  packed.zero_point = layer.zero_point;

  HostTensor qweight = HostTensor::make(DType::u32, {I, NB, kW4A16WarpsPerBlock, 32, 4});
  auto words = qweight.span<uint32_t>();
  parallel_for(0, NB * I, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t nb = bi / I, i = bi % I;
      for (int w = 0; w < kW4A16WarpsPerBlock; ++w)
        for (int lane = 0; lane < 32; ++lane)
          for (int word = 0; word < 4; ++word) {
            uint32_t packed_word = 0;
            for (int slot = 0; slot < 8; ++slot) {
              const SlotPosition p = slot_position(lane, word, slot);
              const int64_t k = i * kW4A16TileK + p.row;
              const int64_t n = nb * kW4A16TileN + w * 16 + p.col;
              const uint32_t code = (k < K && n < N) ? layer.codes[static_cast<size_t>(k * N + n)] : 0u;
              packed_word |= code << (4 * slot);
            }
            words[static_cast<size_t>(((((i * NB + nb) * kW4A16WarpsPerBlock + w) * 32) + lane) * 4 + word)] =
                packed_word;
          }
    }
  });

  HostTensor scale_zero = HostTensor::make(DType::u32, {Gp, Np});
  auto sz = scale_zero.span<uint32_t>();
  const int64_t G = layer.num_groups();
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n) {
      const size_t src = static_cast<size_t>(g * N + n);
      const float s = f16_to_float(layer.scales[src]);
      float zterm = 8.0f;
      if (layer.zero_point == ZeroPoint::integer) zterm = layer.zeros[src];
      if (layer.zero_point == ZeroPoint::float_min) zterm = layer.mins[src];
      const uint16_t s_bits = to_act_bits(s, act);
      const uint16_t z_bits = to_act_bits(zterm, act);
      if (!allow_rounding && layer.zero_point == ZeroPoint::float_min && from_act_bits(z_bits, act) != zterm)
        fail(ErrorKind::invalid_argument, "group ", g, ", column ", n, ": offset m = ", zterm,
             " is not a ", dtype_name(act), " value: pass allow_rounding to round it");
      sz[static_cast<size_t>(g * Np + n)] = static_cast<uint32_t>(s_bits) | (static_cast<uint32_t>(z_bits) << 16);
    }
  packed.tensors["qweight"] = std::move(qweight);
  packed.tensors["scale_zero"] = std::move(scale_zero);
  if (act_order) {
    HostTensor perm = HostTensor::make(DType::i32, {K});
    std::copy(sorted_rows.perm.begin(), sorted_rows.perm.end(), perm.span<int32_t>().begin());
    packed.tensors["perm"] = std::move(perm);
  }
  return packed;
}

QuantizedLinear unpack_w4a16_tiled(const PackedLinear& packed) {
  const DType act = act_dtype_of_layout(packed.layout);
  const int64_t K = packed.K, N = packed.N;
  const int64_t Kp = w4a16_padded_k(K), Np = w4a16_padded_n(N);
  const int64_t I = Kp / kW4A16TileK, NB = Np / kW4A16TileN;
  const HostTensor& qweight = packed.tensor("qweight");
  const HostTensor& scale_zero = packed.tensor("scale_zero");
  const int64_t rows_per_group = packed.group_size == -1 ? Kp : packed.group_size;
  if (qweight.dtype != DType::u32 || qweight.numel() != NB * I * kW4A16WarpsPerBlock * 32 * 4)
    fail(ErrorKind::format, packed.layout, ": qweight is ", qweight.describe(), ": expected u32 [", I, ", ", NB,
         ", 4, 32, 4] for K = ", K, ", N = ", N);
  if (scale_zero.dtype != DType::u32 || scale_zero.numel() != (Kp / rows_per_group) * Np)
    fail(ErrorKind::format, packed.layout, ": scale_zero is ", scale_zero.describe(), ": expected u32 [",
         Kp / rows_per_group, ", ", Np, "]");

  QuantizedLinear layer = QuantizedLinear::allocate(K, N, packed.group_size, packed.zero_point);
  const auto words = qweight.span<uint32_t>();
  for (int64_t bi = 0; bi < NB * I; ++bi) {
    const int64_t nb = bi / I, i = bi % I;
    for (int w = 0; w < kW4A16WarpsPerBlock; ++w)
      for (int lane = 0; lane < 32; ++lane)
        for (int word = 0; word < 4; ++word) {
          const uint32_t packed_word =
              words[static_cast<size_t>(((((i * NB + nb) * kW4A16WarpsPerBlock + w) * 32) + lane) * 4 + word)];
          for (int slot = 0; slot < 8; ++slot) {
            const SlotPosition p = slot_position(lane, word, slot);
            const int64_t k = i * kW4A16TileK + p.row;
            const int64_t n = nb * kW4A16TileN + w * 16 + p.col;
            if (k < K && n < N) layer.codes[static_cast<size_t>(k * N + n)] = (packed_word >> (4 * slot)) & 0xFu;
          }
        }
  }
  const auto sz = scale_zero.span<uint32_t>();
  for (int64_t g = 0; g < layer.num_groups(); ++g)
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t v = sz[static_cast<size_t>(g * Np + n)];
      const size_t dst = static_cast<size_t>(g * N + n);
      layer.scales[dst] = float_to_f16(from_act_bits(static_cast<uint16_t>(v & 0xFFFFu), act));
      const float zterm = from_act_bits(static_cast<uint16_t>(v >> 16), act);
      if (packed.zero_point == ZeroPoint::integer) layer.zeros[dst] = static_cast<uint8_t>(zterm);
      if (packed.zero_point == ZeroPoint::float_min) layer.mins[dst] = zterm;
    }
  if (packed.has("perm")) {
    // Undo the sort: sorted row i is original row perm[i].
    const auto perm = packed.tensor("perm").span<int32_t>();
    QuantizedLinear original = layer;
    original.g_idx.assign(static_cast<size_t>(K), 0);
    for (int64_t i = 0; i < K; ++i) {
      const int64_t k = perm[static_cast<size_t>(i)];
      LOWBIT_CHECK_ARG(k >= 0 && k < K, "perm", k, "a permutation of 0..K-1");
      std::copy_n(&layer.codes[static_cast<size_t>(i * N)], N, &original.codes[static_cast<size_t>(k * N)]);
      original.g_idx[static_cast<size_t>(k)] = static_cast<int32_t>(packed.group_size > 0 ? i / packed.group_size : 0);
    }
    layer = std::move(original);
  }
  layer.validate();
  return layer;
}

}  // namespace lowbit
