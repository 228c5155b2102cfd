// crc.cpp: CRC-32 and CRC-32C by slicing-by-8 tables of their polynomials; CRC-32C with the SSE4.2 crc32
// instruction where the CPU has it (x86-64; checked at run time). Debian has no maintained CRC-32C library package (no libcrc32c-dev in bookworm).
// The dataset checksums (core/data/dataset_checksums.h) run it over whole .bin files, so speed matters there.
#include "core/io/crc.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define MT_CRC32C_SSE42 1
#endif

namespace mt {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// For the reflected polynomial `poly`: tables[0] is the byte-at-a-time table; tables[k][b] advances tables[k-1][b]
// by one more zero byte.
constexpr Tables make_tables(uint32_t poly) {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? poly ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  return t;
}

constexpr Tables kCrc32 = make_tables(0xEDB88320u);
constexpr Tables kCrc32c = make_tables(0x82F63B78u);

// The state c is the inverted running CRC.
uint32_t extend_tables(const Tables& kTables, uint32_t c, const unsigned char* p, size_t bytes) {
  for (; bytes >= 8; p += 8, bytes -= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian hosts only, as the rest of the file formats
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^ kTables[4][lo >> 24] ^
        kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^ kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
  }
  while (bytes--) c = kTables[0][(c ^ *p++) & 0xffu] ^ (c >> 8);
  return c;
}

#ifdef MT_CRC32C_SSE42
__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t c, const unsigned char* p, size_t bytes) {
  uint64_t c64 = c;
  for (; bytes >= 8; p += 8, bytes -= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  while (bytes--) c = _mm_crc32_u8(c, *p++);
  return c;
}

const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
#ifdef MT_CRC32C_SSE42
  if (kHaveSse42) return ~extend_sse42(~crc, p, bytes);
#endif
  return ~extend_tables(kCrc32c, ~crc, p, bytes);
}

uint32_t crc32c(const void* data, size_t bytes) { return crc32c_extend(0, data, bytes); }

uint32_t crc32c_portable(const void* data, size_t bytes) {
  return ~extend_tables(kCrc32c, ~0u, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32(const void* data, size_t bytes, uint32_t seed) {
  return ~extend_tables(kCrc32, ~seed, static_cast<const unsigned char*>(data), bytes);
}

}  // namespace mt
