// Where the peer anchors (../shared/anchors: cuBLAS, Marlin, torch SDPA, the
// copy) were measured: an NVIDIA H100. A benchmark that prints the anchors'
// numbers beside its own asks this first, so that on any other GPU it says
// that the two columns come from two GPUs. scripts/bench_torch_peers.py
// times the peers that torch can run on the GPU at hand.
#pragma once

#include <string>

namespace lowbit::bench {

inline constexpr const char* kAnchorsGpu = "H100";

// Whether a device of this name (cudaDeviceProp::name) is the anchors' GPU.
inline bool is_anchors_gpu(const std::string& device_name) {
  return device_name.find(kAnchorsGpu) != std::string::npos;
}

}  // namespace lowbit::bench
