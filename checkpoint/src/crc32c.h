// CRC-32C (Castagnoli) of byte ranges: SSE4.2 instructions when the running
// CPU has them (chosen at run time, never at build time), a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kolos::checkpoint::detail {

// Continues a CRC: crc32c(crc32c(0, a), b) == crc32c(0, a ++ b).
uint32_t crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace kolos::checkpoint::detail
