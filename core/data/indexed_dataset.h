// indexed_dataset.h: Megatron's indexed dataset (.bin + .idx), memory-mapped, and its writer.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt {

// Every problem with a data file; the message names the file and what is wrong with it.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Megatron's dtype codes in the .idx header.
enum class TokenDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };
size_t token_dtype_size(TokenDType t);

// A read-only, memory-mapped view of PREFIX.idx and PREFIX.bin. Validates the header, the sizes and
// every offset against the .bin size on open; throws DataError naming the file.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t num_tokens() const { return total_tokens_; }
  std::span<const int32_t> sequence_lengths() const { return lengths_; }
  std::span<const int64_t> sequence_offsets() const { return offsets_; }   // bytes into .bin
  std::span<const int64_t> document_index() const { return doc_index_; }   // D + 1 entries, [0] = 0, [D] = N
  // Tokens [begin, begin + out.size()) of sequence i, converted to int32.
  void read(int64_t sequence, int64_t begin, std::span<int32_t> out) const;

 private:
  std::string prefix_;
  TokenDType dtype_ = TokenDType::u16;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> doc_index_;
  int64_t total_tokens_ = 0;
  const uint8_t* bin_ = nullptr;  // mapped .bin
  size_t bin_bytes_ = 0;
};

// Writes PREFIX.bin / PREFIX.idx. Each add_document() call adds one document made of one or more sequences.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype);
  void add_document(const std::vector<std::vector<int64_t>>& sequences);
  void add_document(std::span<const int32_t> tokens);  // a one-sequence document
  // Writes the .idx; files go to PREFIX.*.tmp first and are renamed into place here.
  void finish();

 private:
  std::string prefix_;
  TokenDType dtype_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  std::vector<uint8_t> bin_;
};

}  // namespace mt
