// The generation loop over a Backend: prefill every prompt in one forward
// call (their rows stacked), then decode one token per live sequence per
// call (batched decode), sampling each sequence independently, until
// max_tokens or a stop token. Timing separates prefill from decode.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "lowbit/engine/backend.h"
#include "lowbit/engine/sampler.h"

namespace lowbit::engine {

struct GenerateOptions {
  int64_t max_tokens = 128;          // new tokens per sequence
  SamplingOptions sampling;          // sequence i samples with seed sampling.seed + i
  std::vector<int32_t> stop_tokens;  // generation of a sequence ends after one of these
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // generated tokens per prompt (stop token included)
  int64_t prompt_tokens = 0;                 // all prompts together
  int64_t generated_tokens = 0;              // all sequences together
  int64_t decode_steps = 0;                  // forward calls after the prefill
  double prefill_seconds = 0;                // the prefill call (first token's logits included)
  double decode_seconds = 0;                 // every later call
  int64_t kv_bytes = 0;                      // cache bytes at the end
  int64_t kv_tokens = 0;                     // tokens in the cache at the end (all sequences)
};

// Called for each new token of sequence `index` (the prompt's position);
// return false to stop that sequence.
using TokenCallback = std::function<bool(size_t index, int32_t token)>;

// Runs the prompts (each non-empty) to completion; releases the sequences it
// created at the end.
GenerateResult generate(Backend& backend, std::span<const std::vector<int32_t>> prompts, const GenerateOptions& options,
                        const TokenCallback& on_token = {});

// A two-token prefill and one decode step of `token` on a scratch sequence,
// released afterwards: a backend's first calls pay one-time costs (CUDA
// loads each kernel's module at its first launch, workspaces are allocated:
// ~100 ms on an H100), which would otherwise be counted as the first
// prompt's prefill time. Needs room for one more sequence of 3 tokens; the
// backend is left as it was (no sequence, the same results after).
void warm_up(Backend& backend, int32_t token);

}  // namespace lowbit::engine
