// indexed_dataset_writer.cpp: writes a Megatron .bin/.idx pair through temporary files renamed into place.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/data/indexed_dataset.h"
#include "core/io/crc.h"
#include "core/io/file_io.h"

namespace mt {

namespace {

constexpr size_t kFlushBytes = size_t{1} << 20;
constexpr size_t kEncodeBlock = size_t{1} << 16;  // tokens

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

// Appends token v in the dtype's encoding, or throws when it is not exactly representable.
void encode(std::vector<uint8_t>& out, TokenDType t, int64_t v, const std::string& prefix) {
  auto check = [&](int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw DataError(fmt::format("{}: token {} does not fit the dataset dtype {} (range [{}, {}])", prefix, v,
                                  token_dtype_name(t), lo, hi));
  };
  switch (t) {
    case TokenDType::u8:
      check(0, 255);
      put<uint8_t>(out, static_cast<uint8_t>(v));
      break;
    case TokenDType::i8:
      check(-128, 127);
      put<int8_t>(out, static_cast<int8_t>(v));
      break;
    case TokenDType::i16:
      check(-32768, 32767);
      put<int16_t>(out, static_cast<int16_t>(v));
      break;
    case TokenDType::u16:
      check(0, 65535);
      put<uint16_t>(out, static_cast<uint16_t>(v));
      break;
    case TokenDType::i32:
      check(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
      put<int32_t>(out, static_cast<int32_t>(v));
      break;
    case TokenDType::i64:
      put<int64_t>(out, v);
      break;
    case TokenDType::f32:
      check(-(int64_t{1} << 24), int64_t{1} << 24);
      put<float>(out, static_cast<float>(v));
      break;
    case TokenDType::f64:
      check(-(int64_t{1} << 53), int64_t{1} << 53);
      put<double>(out, static_cast<double>(v));
      break;
  }
}

// Encodes one sequence of int64_t or int32_t tokens a block at a time into `append` (a long document's tokens are
// never copied whole: one 50 MB line is 46M tokens) and records its length.
template <typename T, typename Append>
void encode_sequence(std::span<const T> tokens, TokenDType t, const std::string& prefix, std::vector<int32_t>& lengths,
                     int64_t& total, Append&& append) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw DataError(fmt::format("{}: a sequence of {} tokens exceeds the int32 length field", prefix, tokens.size()));
  std::vector<uint8_t> enc;
  for (size_t at = 0; at < tokens.size(); at += kEncodeBlock) {
    enc.clear();
    for (int64_t v : tokens.subspan(at, std::min(kEncodeBlock, tokens.size() - at))) encode(enc, t, v, prefix);
    append(enc.data(), enc.size());
  }
  lengths.push_back(static_cast<int32_t>(tokens.size()));
  total += static_cast<int64_t>(tokens.size());
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype, int64_t checksum_chunk_bytes)
    : prefix_(prefix), dtype_(dtype), bin_crc_(checksum_chunk_bytes) {
  token_dtype_size(dtype);  // rejects codes outside 1..8
  // Tokens go to PREFIX.bin.tmp until finish().
  bin_file_ = std::make_unique<io::AtomicFile>(prefix_ + ".bin");
  bin_.reserve(kFlushBytes + 4096);
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;  // an unfinished .bin.tmp goes with its AtomicFile

void IndexedDatasetWriter::append(const void* bytes, size_t n) {
  if (!bin_file_) throw DataError(fmt::format("{}: writer already finished", prefix_));
  const auto* b = static_cast<const uint8_t*>(bytes);
  bin_.insert(bin_.end(), b, b + n);
  if (bin_.size() >= kFlushBytes) flush();
}

void IndexedDatasetWriter::flush() {
  bin_file_->write(bin_.data(), bin_.size());
  bin_crc_.update(bin_.data(), bin_.size());
  bin_.clear();
}

void IndexedDatasetWriter::add_sequence(std::span<const int64_t> tokens) {
  encode_sequence(tokens, dtype_, prefix_, lengths_, tokens_, [this](const uint8_t* p, size_t n) { append(p, n); });
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  encode_sequence(tokens, dtype_, prefix_, lengths_, tokens_, [this](const uint8_t* p, size_t n) { append(p, n); });
}

void IndexedDatasetWriter::add_document(const std::vector<std::vector<int64_t>>& sequences) {
  for (const auto& s : sequences) add_sequence(std::span<const int64_t>(s));
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  add_sequence(tokens);
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::finish() {
  stage();
  commit();
}

void IndexedDatasetWriter::stage() {
  if (!bin_file_) throw DataError(fmt::format("{}: writer already finished", prefix_));
  flush();
  // Taken out: whatever happens below the writer is finished, and on a throw the temporaries are removed.
  std::unique_ptr<io::AtomicFile> bin = std::move(bin_file_);

  std::vector<uint8_t> idx_bytes;
  const uint64_t n = lengths_.size();
  idx_bytes.reserve(34 + 12 * n + 8 * doc_index_.size());
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
  idx_bytes.insert(idx_bytes.end(), magic, magic + 9);
  put<uint64_t>(idx_bytes, 1);
  put<uint8_t>(idx_bytes, static_cast<uint8_t>(dtype_));
  put<uint64_t>(idx_bytes, n);
  put<uint64_t>(idx_bytes, doc_index_.size());  // Megatron writes len(document_indices): documents + 1
  for (int32_t len : lengths_) put<int32_t>(idx_bytes, len);
  int64_t offset = 0;
  const int64_t item = static_cast<int64_t>(token_dtype_size(dtype_));
  for (int32_t len : lengths_) {
    put<int64_t>(idx_bytes, offset);
    offset += len * item;
  }
  for (int64_t d : doc_index_) put<int64_t>(idx_bytes, d);
  auto idx = std::make_unique<io::AtomicFile>(prefix_ + ".idx");
  idx->write(idx_bytes.data(), idx_bytes.size());
  auto sums = std::make_unique<io::AtomicFile>(dataset_checksums_path(prefix_));
  sums->write(format_dataset_checksums({.chunk_bytes = bin_crc_.chunk_bytes(),
                                        .idx_bytes = static_cast<int64_t>(idx_bytes.size()),
                                        .idx_crc = crc32c(idx_bytes.data(), idx_bytes.size()),
                                        .bin_bytes = bin_crc_.bytes(),
                                        .bin_chunks = bin_crc_.chunks()}));

  // All synced before any is renamed. Remove the old index and checksums first: a crash between the renames then
  // leaves a pair without .idx (an error on open) or without checksums (read unchecked), never a new .bin read
  // through an old .idx or checked against old checksums.
  bin->sync();
  idx->sync();
  sums->sync();
  staged_bin_ = std::move(bin);
  staged_idx_ = std::move(idx);
  staged_sums_ = std::move(sums);
}

void IndexedDatasetWriter::commit() {
  if (!staged_bin_) throw DataError(fmt::format("{}: writer not staged (call stage() first)", prefix_));
  const std::unique_ptr<io::AtomicFile> bin = std::move(staged_bin_), idx = std::move(staged_idx_),
                                        sums = std::move(staged_sums_);
  for (const std::string& old : {idx->path(), sums->path()})
    if (std::remove(old.c_str()) != 0 && errno != ENOENT)
      throw DataError(fmt::format("{}: cannot replace: {}", old, std::strerror(errno)));
  bin->commit();
  idx->commit();
  sums->commit();
}

}  // namespace mt
