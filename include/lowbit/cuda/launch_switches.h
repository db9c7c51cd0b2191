// The launch switches a process runs its kernels with: the L2 streaming
// windows (LOWBIT_L2_STREAMING, lowbit/cuda/pdl.cuh) and programmatic
// dependent launch (LOWBIT_PDL). Both move the timings, so the GPU
// benchmarks print them and record them in every JSON row.
#pragma once

#include "lowbit/bench/json_rows.h"

namespace lowbit::cuda {

struct LaunchSwitches {
  bool l2_streaming;  // LOWBIT_L2_STREAMING is not "0" and the device has access-policy windows
  bool pdl;           // pdl_enabled()
};

// For the current device.
LaunchSwitches launch_switches();

// Whether the environment variable `name` is "0": the switches that turn a
// default of the launches or kernels off, to measure without it
// (LOWBIT_PDL, LOWBIT_L2_STREAMING, LOWBIT_WGMMA_SCALE_AFTER).
bool switched_off_by_env(const char* name);

// Prints "launch switches: ..." on one line and makes `json` (when not null)
// add "l2_streaming" and "pdl" to every row it writes from now on.
void announce_launch_switches(bench::JsonRowsWriter* json);

}  // namespace lowbit::cuda
