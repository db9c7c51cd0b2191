// CRC-32 as zlib, PNG and Ethernet compute it (reflected polynomial
// 0xEDB88320, initial value and final xor 0xFFFFFFFF), so that a checksum in
// a lowbit file can be checked with `python3 -c "import zlib; zlib.crc32(...)"`.
// Check value: crc32("123456789") = 0xCBF43926.
#pragma once

#include <cstdint>
#include <span>

namespace lowbit::ans {

// The CRC of `bytes` continuing from `crc` (the CRC of the bytes before them;
// 0 for none), so crc32(b, crc32(a)) == crc32(a ++ b).
uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc = 0);

}  // namespace lowbit::ans
