// Forced K splits for a decode step's single-row GEMMs, by the role of the
// layer they multiply: what `lowbit bench model --gemv-splits qkv=4,down=12`
// and CudaEngineOptions::decode_gemv_splits take.
//
// Why: the gemv split rule (gemv_split_rule) was tuned on GEMMs timed one
// at a time, and a split that is faster alone can be slower inside a whole
// decode step, where each GEMM overlaps the kernels beside it
// (docs/engine.md, v28; Qwen3-14B's qkv: split 4 13% faster alone than the
// rule's 5, v43). These overrides let one binary time the step both ways.
#pragma once

#include <array>
#include <map>
#include <string>
#include <string_view>

namespace lowbit::engine {

// The single-row GEMMs of a decoder layer, and the lm_head.
inline constexpr std::array<std::string_view, 5> kDecodeGemmRoles = {"qkv", "o", "gate_up", "down", "lm_head"};

// The largest split accepted (the gemv kernel clamps a split to the GEMM's
// k-iterations, K / 64).
inline constexpr int kMaxDecodeGemvSplit = 1024;

// Throws Error(invalid_argument) unless role is one of kDecodeGemmRoles and
// split is 1..kMaxDecodeGemvSplit: the check of the parser and of
// CudaEngineOptions::decode_gemv_splits.
void check_decode_gemv_split(std::string_view role, int split);

// Parses "role=split[,role=split...]": roles from kDecodeGemmRoles, each at
// most once, splits 1..kMaxDecodeGemvSplit. An empty text gives an empty map.
// Throws Error(invalid_argument) naming the entry and what was expected.
std::map<std::string, int> parse_decode_gemv_splits(std::string_view text);

// "qkv=4,down=12" (roles in kDecodeGemmRoles' order): the inverse of the parser.
std::string format_decode_gemv_splits(const std::map<std::string, int>& splits);

}  // namespace lowbit::engine
