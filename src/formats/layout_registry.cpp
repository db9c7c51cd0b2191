#include "lowbit/formats/layout_registry.h"

#include <cstring>
#include <mutex>
#include <sstream>

#include "lowbit/core/error.h"
#include "lowbit/formats/awq.h"
#include "lowbit/formats/convert.h"
#include "lowbit/formats/float_zero.h"
#include "lowbit/formats/gptq.h"
#include "packing.h"

namespace lowbit::formats {

const HostTensor& PackedLinear::tensor(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    std::ostringstream present;
    for (const auto& [key, value] : tensors) present << (present.tellp() > 0 ? ", " : "") << key;
    fail(ErrorKind::format, "packed layer (layout '", layout, "') has no tensor '", name,
         "': expected it among the tensors, which are: ",
         present.tellp() > 0 ? present.str() : std::string("(none)"));
  }
  return it->second;
}

size_t PackedLinear::nbytes() const {
  size_t total = 0;
  for (const auto& [name, t] : tensors) total += t.bytes.size();
  return total;
}

namespace {

// A float_min layer as integer zeros (exact, or throws); others unchanged.
QuantizedLinear with_integer_zeros(const QuantizedLinear& layer) {
  return layer.zero_point == ZeroPoint::float_min ? to_zero_point(layer, ZeroPoint::integer) : layer;
}

PackedLinear packed_header(const char* layout, const QuantizedLinear& layer) {
  PackedLinear p;
  p.layout = layout;
  p.K = layer.K;
  p.N = layer.N;
  p.group_size = layer.group_size;
  p.zero_point = layer.zero_point;
  return p;
}

// The unpacked layer in the convention the packed one records, after
// checking that its shape matches the metadata.
QuantizedLinear finish_unpack(QuantizedLinear q, const PackedLinear& p) {
  if (q.K != p.K || q.N != p.N || q.group_size != p.group_size)
    fail(ErrorKind::format, "packed layer (layout '", p.layout, "') has tensors giving K = ", q.K,
         ", N = ", q.N, ", group_size = ", q.group_size, ": expected the metadata K = ", p.K,
         ", N = ", p.N, ", group_size = ", p.group_size);
  return q.zero_point == p.zero_point ? q : to_zero_point(q, p.zero_point);
}

LayoutCodec gptq_codec(const char* name, GptqZeros convention) {
  LayoutCodec c;
  c.name = name;
  c.description = convention == GptqZeros::v1
                      ? "GPTQ (AutoGPTQ, checkpoint_format gptq): qweight i32 [K/8, N] packed "
                        "along K, qzeros i32 [G, N/8] storing z - 1, scales f16 [G, N], g_idx i32 [K]"
                      : "GPTQ v2 (GPTQModel, checkpoint_format gptq_v2): as gptq but qzeros store z";
  c.pack = [name, convention](const QuantizedLinear& layer) {
    PackedLinear p = packed_header(name, layer);
    GptqTensors t = pack_gptq(with_integer_zeros(layer), convention);
    p.tensors["qweight"] = std::move(t.qweight);
    p.tensors["qzeros"] = std::move(t.qzeros);
    p.tensors["scales"] = std::move(t.scales);
    p.tensors["g_idx"] = std::move(*t.g_idx);
    return p;
  };
  c.unpack = [convention](const PackedLinear& p) {
    GptqTensors t{p.tensor("qweight"), p.tensor("qzeros"), p.tensor("scales"), std::nullopt};
    if (p.has("g_idx")) t.g_idx = p.tensor("g_idx");
    return finish_unpack(
        unpack_gptq(t, convention, p.zero_point == ZeroPoint::symmetric, p.group_size), p);
  };
  return c;
}

LayoutCodec awq_codec() {
  LayoutCodec c;
  c.name = "awq";
  c.description =
      "AWQ (AutoAWQ GEMM): qweight i32 [K, N/8] packed along N in column order "
      "[0,2,4,6,1,3,5,7], qzeros i32 [G, N/8] storing z, scales f16 [G, N]; no act-order";
  c.pack = [](const QuantizedLinear& layer) {
    PackedLinear p = packed_header("awq", layer);
    AwqTensors t = pack_awq(with_integer_zeros(layer));
    p.tensors["qweight"] = std::move(t.qweight);
    p.tensors["qzeros"] = std::move(t.qzeros);
    p.tensors["scales"] = std::move(t.scales);
    return p;
  };
  c.unpack = [](const PackedLinear& p) {
    AwqTensors t{p.tensor("qweight"), p.tensor("qzeros"), p.tensor("scales")};
    return finish_unpack(unpack_awq(t, p.group_size), p);
  };
  return c;
}

LayoutCodec float_zero_codec() {
  LayoutCodec c;
  c.name = "float_zero";
  c.description =
      "lowbit float zero point: qweight i32 [K/8, N] packed as GPTQ, scales f16 [G, N], "
      "mins f32 [G, N] (w = s*q + m), g_idx i32 [K] when act-order";
  c.pack = [](const QuantizedLinear& layer) {
    PackedLinear p = packed_header("float_zero", layer);
    FloatZeroTensors t = pack_float_zero(layer);
    p.tensors["qweight"] = std::move(t.qweight);
    p.tensors["scales"] = std::move(t.scales);
    p.tensors["mins"] = std::move(t.mins);
    if (t.g_idx) p.tensors["g_idx"] = std::move(*t.g_idx);
    return p;
  };
  c.unpack = [](const PackedLinear& p) {
    FloatZeroTensors t{p.tensor("qweight"), p.tensor("scales"), p.tensor("mins"), std::nullopt};
    if (p.has("g_idx")) t.g_idx = p.tensor("g_idx");
    return finish_unpack(unpack_float_zero(t, p.group_size), p);
  };
  return c;
}

LayoutCodec q4_1_codec() {
  LayoutCodec c;
  c.name = "q4_1";
  c.description =
      "GGUF Q4_1: blocks u8 [N, K/32, 20] of {f16 d, f16 m, u8 qs[16]}, w = d*q + m, group size 32";
  c.pack = [](const QuantizedLinear& layer) {
    PackedLinear p = packed_header("q4_1", layer);
    const std::vector<BlockQ4_1> blocks = pack_q4_1(layer);
    HostTensor t = HostTensor::make(DType::u8, {layer.N, layer.K / kQ4_1BlockSize,
                                                static_cast<int64_t>(sizeof(BlockQ4_1))});
    std::memcpy(t.bytes.data(), blocks.data(), blocks.size() * sizeof(BlockQ4_1));
    p.tensors["blocks"] = std::move(t);
    return p;
  };
  c.unpack = [](const PackedLinear& p) {
    LOWBIT_CHECK_ARG(p.K > 0 && p.K % kQ4_1BlockSize == 0, "K", p.K, "a positive multiple of 32 for q4_1");
    const HostTensor& t = p.tensor("blocks");
    detail::check_tensor(t.view(), "blocks", DType::u8,
                         {p.N, p.K / kQ4_1BlockSize, static_cast<int64_t>(sizeof(BlockQ4_1))},
                         "N rows of K/32 blocks of 20 bytes");
    std::vector<BlockQ4_1> blocks(static_cast<size_t>(p.N * (p.K / kQ4_1BlockSize)));
    std::memcpy(blocks.data(), t.bytes.data(), t.bytes.size());
    return finish_unpack(unpack_q4_1(blocks, p.K, p.N), p);
  };
  return c;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, LayoutCodec, std::less<>> codecs;  // nodes never move: references stay valid

  Registry() {
    for (LayoutCodec c : {gptq_codec("gptq", GptqZeros::v1), gptq_codec("gptq_v2", GptqZeros::v2),
                          awq_codec(), float_zero_codec(), q4_1_codec()})
      codecs.emplace(c.name, std::move(c));
  }
};

Registry& registry() {
  static Registry r;  // built-ins registered on first use, thread-safe
  return r;
}

std::string known_names(const Registry& r) {
  std::string out;
  for (const auto& [name, codec] : r.codecs) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

void register_layout(LayoutCodec codec) {
  LOWBIT_CHECK_ARG(!codec.name.empty(), "codec.name", "\"\"", "a non-empty layout name");
  LOWBIT_CHECK_ARG(codec.pack && codec.unpack, "codec", codec.name,
                   "both a pack and an unpack function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.codecs.count(codec.name) != 0)
    fail(ErrorKind::invalid_argument, "invalid argument 'codec.name' = \"", codec.name,
         "\": a layout of that name is already registered; expected a new name (registered: ",
         known_names(r), ")");
  std::string name = codec.name;
  r.codecs.emplace(std::move(name), std::move(codec));
}

const LayoutCodec& find_layout(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.codecs.find(name);
  if (it == r.codecs.end())
    fail(ErrorKind::invalid_argument, "invalid argument 'layout' = \"", name,
         "\": no such layout; expected one of: ", known_names(r));
  return it->second;
}

std::vector<std::string> layout_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, codec] : r.codecs) names.push_back(name);
  return names;
}

PackedLinear pack(const QuantizedLinear& layer, std::string_view layout) {
  const LayoutCodec& codec = find_layout(layout);
  layer.validate();
  PackedLinear p = codec.pack(layer);
  p.layout = codec.name;
  return p;
}

QuantizedLinear unpack(const PackedLinear& packed) {
  const LayoutCodec& codec = find_layout(packed.layout);
  QuantizedLinear q = finish_unpack(codec.unpack(packed), packed);
  q.validate();
  return q;
}

PackedLinear repack(const PackedLinear& packed, std::string_view target) {
  return pack(unpack(packed), target);
}

}  // namespace lowbit::formats
