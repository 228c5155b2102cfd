// crc32.cpp: CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), slicing-by-8 tables.
#include <array>

#include "core/checkpoint/checkpoint.h"

namespace mt {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

// `seed` is a previous result, so crc32(b, n2, crc32(a, n1)) is the CRC of a followed by b.
uint32_t crc32(const void* data, size_t bytes, uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~seed;
  while (bytes >= 8) {  // little-endian word order, byte by byte so alignment never matters
    uint32_t lo = c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^ kTables[4][lo >> 24] ^
        kTables[3][p[4]] ^ kTables[2][p[5]] ^ kTables[1][p[6]] ^ kTables[0][p[7]];
    p += 8;
    bytes -= 8;
  }
  while (bytes--) c = kTables[0][(c ^ *p++) & 0xffu] ^ (c >> 8);
  return ~c;
}

}  // namespace mt
