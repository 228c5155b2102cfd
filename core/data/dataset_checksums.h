// dataset_checksums.h: PREFIX.crc32c, the optional checksum file beside an indexed dataset: the CRC-32C of every
// chunk (64 MiB) of PREFIX.bin and of the whole PREFIX.idx, so that a flipped bit or a partial copy is found
// instead of trained on. The pair itself stays Megatron's, byte for byte; a dataset without the file (older
// data, Megatron's own) is read unchecked. The text format (one record a line, '#' lines are comments):
//   format megatrain-dataset-crc32c 1
//   chunk_bytes 67108864
//   idx BYTES CRC          the .idx: its size and CRC-32C (8 hex digits)
//   bin BYTES CHUNKS       the .bin: its size and ceil(BYTES / chunk_bytes) chunks, then one line each:
//   chunk I CRC            chunk I = bytes [I * chunk_bytes, min((I + 1) * chunk_bytes, BYTES))
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

constexpr int64_t kChecksumChunkBytes = int64_t{64} << 20;

struct DatasetChecksums {
  int64_t chunk_bytes = kChecksumChunkBytes;
  int64_t idx_bytes = 0;
  uint32_t idx_crc = 0;
  int64_t bin_bytes = 0;
  std::vector<uint32_t> bin_chunks;  // one CRC-32C per chunk, the last one possibly short

  bool operator==(const DatasetChecksums&) const = default;
};

// The CRC-32C of each chunk of a byte stream that comes in pieces of any size.
class ChunkedCrc {
 public:
  explicit ChunkedCrc(int64_t chunk_bytes = kChecksumChunkBytes);
  void update(const void* data, size_t bytes);
  int64_t bytes() const { return total_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  std::vector<uint32_t> chunks() const;  // the finished chunks and the partial last one

 private:
  int64_t chunk_bytes_;
  int64_t total_ = 0, in_chunk_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint32_t> done_;
};

std::string dataset_checksums_path(const std::string& prefix);  // PREFIX.crc32c
std::string format_dataset_checksums(const DatasetChecksums& sums);
// Throws DataError "PATH:LINE: ..." naming what is malformed and what was expected.
DatasetChecksums parse_dataset_checksums(std::string_view text, const std::string& path);

// Checks PREFIX.idx and PREFIX.bin against PREFIX.crc32c. Returns false, checking nothing, when there is no such
// file; throws DataError for a malformed one, and for a file whose size or content differs: it names the file,
// and for the .bin the chunk and its byte range (and how many chunks differ in all).
bool verify_dataset_checksums(const std::string& prefix);
// verify_dataset_checksums as `data inspect --verify` reports it: a line saying what matched, or that there is no
// checksum file (not an error: Megatron's own datasets have none).
std::string verify_dataset_report(const std::string& prefix);

}  // namespace mt
