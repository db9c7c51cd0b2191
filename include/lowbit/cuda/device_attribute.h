// Device attributes that planners read on every call (SM count, L2 size),
// cached per (device, attribute) under a mutex. What it replaces, two plain
// statics holding "the last device asked for and its value", returned one
// device's value for another when two host threads planned for different
// GPUs (and was a data race even on one).
#pragma once

#include <cuda_runtime.h>

namespace lowbit::cuda {

// cudaDeviceGetAttribute(attr, device), asked of the runtime once per
// (device, attribute); safe to call from any host thread. Throws Error(cuda)
// when the runtime refuses (e.g. a bad device index).
int device_attribute(cudaDeviceAttr attr, int device);

}  // namespace lowbit::cuda
