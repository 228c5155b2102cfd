// crc32c.cpp: CRC-32C with one 256-entry table. Debian has no maintained CRC-32C library package (no
// libcrc32c-dev in bookworm), and event records are a few dozen bytes each, so byte-at-a-time is plenty.
#include "core/io/crc32c.h"

#include <array>

namespace mt {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~0u;
  while (bytes--) c = kTable[(c ^ *p++) & 0xffu] ^ (c >> 8);
  return ~c;
}

}  // namespace mt
