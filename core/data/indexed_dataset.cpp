// indexed_dataset.cpp: opening, validating and reading a Megatron .bin/.idx pair.
#include "core/data/indexed_dataset.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace mt {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, N, D + 1

// MappedFile::open, refusing anything but a regular file, with its errors rethrown as DataError.
MappedFile map_data_file(const std::string& path) {
  try {
    return MappedFile::open(path, {.require_regular_file = true});
  } catch (const MapFileError& e) {
    switch (e.step()) {
      case MapFileError::Step::open:
        throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(e.err())));
      case MapFileError::Step::stat:
        throw DataError(fmt::format("{}: cannot stat: {}", path, std::strerror(e.err())));
      case MapFileError::Step::not_regular_file:
        throw DataError(fmt::format("{}: not a regular file", path));
      case MapFileError::Step::mmap:
        throw DataError(fmt::format("{}: cannot mmap: {}", path, std::strerror(e.err())));
    }
    throw DataError(e.what());
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\')
      s += static_cast<char>(p[i]);
    else
      s += fmt::format("\\x{:02x}", p[i]);
  }
  return s;
}

// Converts n tokens of type T at p to int32, checking that each fits.
template <typename T>
void convert(const uint8_t* p, int32_t* out, int64_t n, const std::string& prefix, int64_t seq, int64_t begin) {
  for (int64_t i = 0; i < n; ++i) {
    T v = load<T>(p + i * sizeof(T));
    if constexpr (sizeof(T) < 4 || (sizeof(T) == 4 && std::is_integral_v<T>)) {
      out[i] = static_cast<int32_t>(v);
    } else {
      // i64, f32, f64: check the range (NaN fails both comparisons).
      constexpr double lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      double d = static_cast<double>(v);
      if (!(d >= lo && d <= hi))
        throw DataError(fmt::format("{}.bin: sequence {} token {} is {}, which does not fit an int32 token id", prefix,
                                    seq, begin + i, v));
      // A float dtype (codes 6 and 7) may hold only whole token ids: 1.5 is not a token, never truncated to 1.
      if (d != std::trunc(d))
        throw DataError(fmt::format("{}.bin: sequence {} token {} is {}, which is not a whole token id ({} data)",
                                    prefix, seq, begin + i, v, std::is_same_v<T, float> ? "float32" : "float64"));
      out[i] = static_cast<int32_t>(v);
    }
  }
}

}  // namespace

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";

  // --- the index ---
  {
    const MappedFile idx = map_data_file(idx_path);  // only while the index is copied out
    const uint8_t* p = idx.data();
    const size_t size = idx.size();
    auto bad = [&](const std::string& what) { return DataError(fmt::format("{}: {}", idx_path, what)); };
    if (size < sizeof(kMagic) || std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
      throw bad(fmt::format("not a Megatron indexed dataset: bad magic '{}' (expected 'MMIDIDX\\x00\\x00')",
                            printable(p, std::min(size, sizeof(kMagic)))));
    if (size < kHeaderBytes)
      throw bad(fmt::format("truncated: file holds {} bytes, the header alone needs {}", size, kHeaderBytes));
    const uint64_t version = load<uint64_t>(p + 9);
    if (version != 1) throw bad(fmt::format("unsupported version {} (only version 1 is supported)", version));
    const uint8_t code = p[17];
    if (code < 1 || code > 8)
      throw bad(
          fmt::format("unsupported dtype code {} (supported: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, "
                      "6 float64, 7 float32, 8 uint16)",
                      code));
    dtype_ = static_cast<TokenDType>(code);
    const uint64_t n = load<uint64_t>(p + 18);
    const uint64_t doc_entries = load<uint64_t>(p + 26);
    // Both counts are bounded by the file size before any multiplication, so nothing overflows.
    const bool fits = n <= size && doc_entries <= size;
    const uint64_t need = fits ? kHeaderBytes + 12 * n + 8 * doc_entries : 0;
    if (!fits || need > size)
      throw bad(
          fmt::format("truncated: header says {} sequences and {} document-index entries, file holds {} "
                      "bytes, need {}",
                      n, doc_entries, size, fits ? fmt::format("{}", need) : std::string("more than the file holds")));
    if (doc_entries == 0) throw bad("the document index is empty (it needs at least the leading 0)");

    lengths_.resize(n);
    offsets_.resize(n);
    doc_index_.resize(doc_entries);
    const uint8_t* q = p + kHeaderBytes;
    if (n > 0) {
      std::memcpy(lengths_.data(), q, 4 * n);
      std::memcpy(offsets_.data(), q + 4 * n, 8 * n);
    }
    std::memcpy(doc_index_.data(), q + 12 * n, 8 * doc_entries);
  }

  const int64_t item = static_cast<int64_t>(token_dtype_size(dtype_));
  const int64_t n = num_sequences();
  int64_t expected_offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (lengths_[i] < 0)
      throw DataError(fmt::format("{}.idx: sequence {} has negative length {}", prefix_, i, lengths_[i]));
    if (offsets_[i] != expected_offset)
      throw DataError(
          fmt::format("{}.idx: sequence pointers do not match the lengths: sequence {} starts at byte "
                      "{}, but the lengths before it put it at byte {}",
                      prefix_, i, offsets_[i], expected_offset));
    expected_offset += static_cast<int64_t>(lengths_[i]) * item;
    total_tokens_ += lengths_[i];
  }
  if (doc_index_.front() != 0)
    throw DataError(fmt::format("{}.idx: the document index starts at {}, not 0", prefix_, doc_index_.front()));
  if (doc_index_.back() != n)
    throw DataError(fmt::format("{}.idx: the document index ends at {}, but there are {} sequences", prefix_,
                                doc_index_.back(), n));
  for (size_t d = 1; d < doc_index_.size(); ++d)
    if (doc_index_[d] < doc_index_[d - 1])
      throw DataError(fmt::format("{}.idx: the document index is not monotonic: entry {} is {} after {}", prefix_, d,
                                  doc_index_[d], doc_index_[d - 1]));

  // --- the tokens ---
  bin_ = map_data_file(bin_path);
  if (static_cast<uint64_t>(expected_offset) > bin_.size())
    throw DataError(fmt::format("{}: truncated: the index needs {} bytes ({} tokens of {}), file holds {}", bin_path,
                                expected_offset, total_tokens_, token_dtype_name(dtype_), bin_.size()));
}

void IndexedDataset::read(int64_t sequence, int64_t begin, std::span<int32_t> out) const {
  const int64_t count = static_cast<int64_t>(out.size());
  if (sequence < 0 || sequence >= num_sequences() || begin < 0 || begin + count > lengths_[sequence])
    throw std::out_of_range(fmt::format("{}: read of tokens [{}, {}) of sequence {} is out of range", prefix_, begin,
                                        begin + count, sequence));
  if (count == 0) return;
  const size_t item = token_dtype_size(dtype_);
  const uint8_t* p = bin_.data() + offsets_[sequence] + begin * static_cast<int64_t>(item);
  int32_t* o = out.data();
  switch (dtype_) {
    case TokenDType::u8:
      convert<uint8_t>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::i8:
      convert<int8_t>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::i16:
      convert<int16_t>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::u16:
      convert<uint16_t>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::i32:
      convert<int32_t>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::i64:
      convert<int64_t>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::f32:
      convert<float>(p, o, count, prefix_, sequence, begin);
      break;
    case TokenDType::f64:
      convert<double>(p, o, count, prefix_, sequence, begin);
      break;
  }
}

}  // namespace mt
