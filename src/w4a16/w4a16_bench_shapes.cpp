#include "lowbit/w4a16/w4a16_bench.h"

namespace lowbit {

namespace {
// The nine layer shapes (K x N) of the peer anchors: square layers and the
// projections of Qwen3-14B and Llama-3-70B.
constexpr W4A16BenchShape kShapes[] = {
    {"sq4096", 4096, 4096},      {"sq8192", 8192, 8192},          {"sq16384", 16384, 16384},
    {"qwen3-qkv", 5120, 7168},   {"qwen3-o", 5120, 5120},         {"qwen3-gateup", 5120, 34816},
    {"qwen3-down", 17408, 5120}, {"llama70-gateup", 8192, 57344}, {"llama70-down", 28672, 8192}};
}  // namespace

std::span<const W4A16BenchShape> w4a16_bench_shapes() { return kShapes; }

}  // namespace lowbit
