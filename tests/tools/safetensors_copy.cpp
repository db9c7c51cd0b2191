// safetensors_copy IN OUT: reads IN with lowbit's SafetensorsFile and writes
// every tensor and the metadata to OUT with SafetensorsWriter (no copy of the
// tensor bytes is made: the writer streams them from IN's mapping).
// Driven by tests/python/test_safetensors_compat.py to check our reader and
// writer against the Python safetensors package.
// Exit codes: 0 success, 1 any error (message on stderr), 2 usage.
#include <exception>
#include <iostream>

#include "lowbit/core/error.h"
#include "lowbit/io/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors_copy IN OUT\n";
    return 2;
  }
  try {
    const auto in = lowbit::io::SafetensorsFile::open(argv[1]);
    lowbit::io::SafetensorsWriter out;
    for (const auto& t : in.tensors()) out.add(t.name, t.dtype, t.shape, in.bytes(t));
    if (in.has_metadata()) out.set_metadata(in.metadata());
    out.write(argv[2]);
  } catch (const lowbit::Error& e) {
    std::cerr << "safetensors_copy: " << lowbit::error_kind_name(e.kind()) << ": " << e.what()
              << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "safetensors_copy: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
