// crc.h: the two CRCs of the file formats: CRC-32 (IEEE 802.3, zlib's), the checkpoints' (their data files and
// metadata), and CRC-32C (Castagnoli), the checksum of TFRecord framing (TensorBoard event files) and of the dataset
// checksum sidecar (core/data/dataset_checksums.h). One table code serves both.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mt {

// CRC-32 (reflected polynomial 0xEDB88320); crc32("123456789") = 0xCBF43926. `seed` is a previous result, so
// crc32(b, n2, crc32(a, n1)) is the CRC of a followed by b.
uint32_t crc32(const void* data, size_t bytes, uint32_t seed = 0);

// CRC-32C of `bytes` bytes (reflected polynomial 0x82F63B78); crc32c("123456789") = 0xE3069283.
uint32_t crc32c(const void* data, size_t bytes);
// The CRC-32C of the bytes whose CRC-32C is `crc` followed by these: crc32c_extend(crc32c(a), b) = crc32c(a + b),
// crc32c_extend(0, b) = crc32c(b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t bytes);
// The same CRC by the table code alone (where the CPU has SSE4.2, crc32c uses its instruction): for the tests.
uint32_t crc32c_portable(const void* data, size_t bytes);

// TFRecord's masked form of a CRC-32C (a CRC stored beside the bytes it covers is rotated and offset so
// that a CRC of data that holds CRCs stays well distributed).
inline uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

}  // namespace mt
