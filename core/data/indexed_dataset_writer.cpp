// indexed_dataset_writer.cpp: writes a Megatron .bin/.idx pair through temporary files renamed into place.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/data/indexed_dataset.h"

namespace mt {

namespace {

constexpr size_t kFlushBytes = size_t{1} << 20;

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

void write_all(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n)
    throw DataError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

// Flushes, syncs and closes f; throws naming path on any failure.
void close_synced(std::FILE*& f, const std::string& path) {
  bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  int e = errno;
  ok = (std::fclose(f) == 0) && ok;
  f = nullptr;
  if (!ok) throw DataError(fmt::format("{}: write failed: {}", path, std::strerror(e ? e : errno)));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  token_dtype_size(dtype);  // rejects codes outside 1..8
  const std::string tmp = prefix_ + ".bin.tmp";
  bin_file_ = std::fopen(tmp.c_str(), "wb");
  if (!bin_file_) throw DataError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  bin_.reserve(kFlushBytes + 4096);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finished_) discard();
}

void IndexedDatasetWriter::discard() {
  if (bin_file_) std::fclose(bin_file_);
  bin_file_ = nullptr;
  std::remove((prefix_ + ".bin.tmp").c_str());
  std::remove((prefix_ + ".idx.tmp").c_str());
}

void IndexedDatasetWriter::append(const void* bytes, size_t n) {
  if (!bin_file_) throw DataError(fmt::format("{}: writer already finished", prefix_));
  const auto* b = static_cast<const uint8_t*>(bytes);
  bin_.insert(bin_.end(), b, b + n);
  if (bin_.size() >= kFlushBytes) {
    write_all(bin_file_, bin_.data(), bin_.size(), prefix_ + ".bin.tmp");
    bin_.clear();
  }
}

void IndexedDatasetWriter::add_sequence(std::span<const int64_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw DataError(fmt::format("{}: a sequence of {} tokens exceeds the int32 length field", prefix_, tokens.size()));
  std::vector<uint8_t> enc;
  enc.reserve(tokens.size() * token_dtype_size(dtype_));
  for (int64_t v : tokens) encode(enc, dtype_, v, prefix_);
  append(enc.data(), enc.size());
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  std::vector<int64_t> wide(tokens.begin(), tokens.end());
  add_sequence(std::span<const int64_t>(wide));
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
  if (finished_ || !bin_file_) throw DataError(fmt::format("{}: writer already finished", prefix_));
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  try {
    write_all(bin_file_, bin_.data(), bin_.size(), bin_tmp);
    bin_.clear();
    close_synced(bin_file_, bin_tmp);

    std::vector<uint8_t> idx;
    const uint64_t n = lengths_.size();
    idx.reserve(34 + 12 * n + 8 * doc_index_.size());
    const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
    idx.insert(idx.end(), magic, magic + 9);
    put<uint64_t>(idx, 1);
    put<uint8_t>(idx, static_cast<uint8_t>(dtype_));
    put<uint64_t>(idx, n);
    put<uint64_t>(idx, doc_index_.size());  // Megatron writes len(document_indices): documents + 1
    for (int32_t len : lengths_) put<int32_t>(idx, len);
    int64_t offset = 0;
    const int64_t item = static_cast<int64_t>(token_dtype_size(dtype_));
    for (int32_t len : lengths_) {
      put<int64_t>(idx, offset);
      offset += len * item;
    }
    for (int64_t d : doc_index_) put<int64_t>(idx, d);

    std::FILE* f = std::fopen(idx_tmp.c_str(), "wb");
    if (!f) throw DataError(fmt::format("{}: cannot create: {}", idx_tmp, std::strerror(errno)));
    try {
      write_all(f, idx.data(), idx.size(), idx_tmp);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    close_synced(f, idx_tmp);

    // Remove the old index first: a crash between the two renames then leaves a pair without .idx (an
    // error on open), never a new .bin read through an old .idx.
    const std::string idx_path = prefix_ + ".idx", bin_path = prefix_ + ".bin";
    if (std::remove(idx_path.c_str()) != 0 && errno != ENOENT)
      throw DataError(fmt::format("{}: cannot replace: {}", idx_path, std::strerror(errno)));
    if (std::rename(bin_tmp.c_str(), bin_path.c_str()) != 0)
      throw DataError(fmt::format("{}: cannot rename to {}: {}", bin_tmp, bin_path, std::strerror(errno)));
    if (std::rename(idx_tmp.c_str(), idx_path.c_str()) != 0)
      throw DataError(fmt::format("{}: cannot rename to {}: {}", idx_tmp, idx_path, std::strerror(errno)));
  } catch (...) {
    discard();
    finished_ = true;
    throw;
  }
  finished_ = true;
}

}  // namespace mt
