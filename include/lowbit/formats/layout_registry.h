// The repack seam: named packed layouts of a 4-bit linear layer, each a codec
// to and from the canonical QuantizedLinear. The GPU GEMM registers its own
// tiled layout here; anything can then be repacked into it.
//
// Layout facts this header relies on:
//  - A PackedLinear is data: tensors named as checkpoints name them
//    ("qweight", "qzeros", "scales", "g_idx", "mins", "blocks") plus the
//    metadata a checkpoint keeps in its config (K, N, group_size, and the
//    zero-point convention).
//  - `zero_point` records the canonical convention of the layer that was
//    packed; unpack() converts back to it (exactly, or throws), so
//    unpack(pack(layer, L)) == layer for every layout L that accepts the layer.
//  - Built-in layouts (tensor shapes, G = num_groups):
//      "gptq"       qweight i32 [K/8, N], qzeros i32 [G, N/8] (v1: z - 1),
//                   scales f16 [G, N], g_idx i32 [K]            (gptq.h)
//      "gptq_v2"    the same with qzeros storing z               (gptq.h)
//      "awq"        qweight i32 [K, N/8], qzeros i32 [G, N/8],
//                   scales f16 [G, N]; no act-order              (awq.h)
//      "float_zero" qweight i32 [K/8, N], scales f16 [G, N],
//                   mins f32 [G, N], g_idx i32 [K] if act-order  (float_zero.h)
//      "q4_1"       blocks u8 [N, K/32, 20] (BlockQ4_1), group 32 (float_zero.h)
//    Layouts with integer zeros accept float_min layers whose mins are exactly
//    -(s*z); layouts with mins accept integer layers (m = -(s*z)).
//  - Codecs are registered in one function-local static registry that adds
//    the built-ins on first use, so nothing depends on the static
//    initialisation order of translation units in the static library.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/formats/host_tensor.h"
#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

struct PackedLinear {
  std::string layout;  // a registered layout name
  int64_t K = 0;
  int64_t N = 0;
  int group_size = 128;
  ZeroPoint zero_point = ZeroPoint::integer;
  std::map<std::string, HostTensor> tensors;

  // The tensor called `name`; Error(format) naming the layout and the
  // tensors present when it is missing.
  const HostTensor& tensor(const std::string& name) const;
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  // Bytes of all tensors together (what a kernel reads).
  size_t nbytes() const;
};

struct LayoutCodec {
  std::string name;
  std::string description;
  std::function<PackedLinear(const QuantizedLinear&)> pack;
  std::function<QuantizedLinear(const PackedLinear&)> unpack;
};

// Adds a layout. Error(invalid_argument) for an empty name, missing functions,
// or a name already registered. Thread-safe.
void register_layout(LayoutCodec codec);
// The codec called `name`; Error(invalid_argument) listing the known names
// when there is none. The reference stays valid for the program's lifetime.
const LayoutCodec& find_layout(std::string_view name);
// Registered names, sorted.
std::vector<std::string> layout_names();

// Validates `layer` and packs it with the named codec.
PackedLinear pack(const QuantizedLinear& layer, std::string_view layout);
// Unpacks with the codec named by packed.layout, then validates the result.
QuantizedLinear unpack(const PackedLinear& packed);
// unpack, then pack into `target`.
PackedLinear repack(const PackedLinear& packed, std::string_view target);

}  // namespace lowbit::formats
