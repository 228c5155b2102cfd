// indexed_dataset.h: Megatron's indexed dataset (.bin + .idx), memory-mapped, and its writer.
//
// .idx layout (little-endian, no padding; offsets in bytes):
//   0   char[9]  magic "MMIDIDX\0\0"
//   9   u64      version (1)
//   17  u8       dtype code (TokenDType)
//   18  u64      N, the number of sequences
//   26  u64      D + 1, the number of document-index entries (Megatron writes len(document_indices),
//                which holds a leading 0; so D documents have D + 1 entries)
//   34  i32[N]   sequence lengths in tokens
//       i64[N]   sequence byte offsets into .bin (contiguous: offset[i+1] = offset[i] + length[i] * size)
//       i64[D+1] document index: document d is sequences [doc[d], doc[d+1]); doc[0] = 0, doc[D] = N
//   (Megatron's multimodal variant appends i8[N] modes; trailing bytes are accepted and ignored.)
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/data/dataset_checksums.h"
#include "core/io/file_error.h"
#include "core/io/mapped_file.h"
#include "core/tokenizer/token_dtype.h"

namespace mt {
namespace io {
class AtomicFile;  // core/io/file_io.h
}

// A read-only, memory-mapped view of PREFIX.idx and PREFIX.bin. Validates the header, the sizes and
// every offset against the .bin size on open; throws DataError naming the file.
// The index arrays are copied out of the .idx (they are not aligned there); the tokens stay mapped.
// All methods are const and safe to call from several threads at once.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t num_tokens() const { return total_tokens_; }
  std::span<const int32_t> sequence_lengths() const { return lengths_; }
  std::span<const int64_t> sequence_offsets() const { return offsets_; }  // bytes into .bin
  std::span<const int64_t> document_index() const { return doc_index_; }  // D + 1 entries, [0] = 0, [D] = N
  // Tokens [begin, begin + out.size()) of sequence i, converted to int32. Float tokens are cast (they must
  // be finite and within int32); an i64 token outside int32 is a DataError naming the file and position.
  void read(int64_t sequence, int64_t begin, std::span<int32_t> out) const;

 private:
  std::string prefix_;
  TokenDType dtype_ = TokenDType::u16;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> doc_index_;
  int64_t total_tokens_ = 0;
  MappedFile bin_;  // the whole .bin, mapped
};

// Writes PREFIX.bin / PREFIX.idx and their checksums PREFIX.crc32c (dataset_checksums.h, one CRC-32C per
// `checksum_chunk_bytes` of the .bin). Each add_document() call adds one document made of one or more sequences.
// Tokens stream to PREFIX.bin.tmp as they come (only the index is held in memory); finish() writes
// PREFIX.idx.tmp and PREFIX.crc32c.tmp, fsyncs them and renames them into place, fsyncing the directory
// (io::AtomicFile); the old checksum file is removed before the pair is renamed, so none ever describes another
// pair. A writer
// destroyed before finish(), or whose finish() fails, removes its temporary files and leaves any existing
// PREFIX.bin / PREFIX.idx untouched. A failed write throws the FileError naming the file.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype, int64_t checksum_chunk_bytes = kChecksumChunkBytes);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Tokens must be representable in the dtype (DataError otherwise).
  void add_document(const std::vector<std::vector<int64_t>>& sequences);
  void add_document(std::span<const int32_t> tokens);  // a one-sequence document
  int64_t num_documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t num_tokens() const { return tokens_; }
  // Writes the .idx; files go to PREFIX.*.tmp first and are renamed into place here. Same as stage(); commit().
  void finish();
  // finish() in two steps, so that several datasets go in together (a token dataset and its loss mask): stage()
  // writes and fsyncs every temporary, renaming none; commit() renames them into place. A writer destroyed staged
  // but uncommitted removes its temporaries.
  void stage();
  void commit();

 private:
  void add_sequence(std::span<const int64_t> tokens);
  void add_sequence(std::span<const int32_t> tokens);
  void append(const void* bytes, size_t n);
  void flush();  // bin_ to bin_file_ and bin_crc_

  std::string prefix_;
  TokenDType dtype_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  std::vector<uint8_t> bin_;                  // encode buffer, flushed to bin_file_ when large
  std::unique_ptr<io::AtomicFile> bin_file_;  // PREFIX.bin.tmp; null once finished
  ChunkedCrc bin_crc_;                        // of the bytes written to bin_file_
  std::unique_ptr<io::AtomicFile> staged_bin_, staged_idx_, staged_sums_;  // between stage() and commit()
  int64_t tokens_ = 0;
};

}  // namespace mt
