// dataset_checksums.cpp: PREFIX.crc32c, written beside the pair by IndexedDatasetWriter, checked by `data inspect
// --verify` and at training start.
#include "core/data/dataset_checksums.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <stdexcept>

#include "core/data/indexed_dataset.h"
#include "core/io/crc.h"
#include "core/io/file_io.h"

namespace mt {

namespace {

constexpr std::string_view kFormatLine = "format megatrain-dataset-crc32c 1";
constexpr std::string_view kMalformed =
    "a malformed checksum file: rewrite it with `data prepare`, or remove it to read the dataset unchecked";

// The meaningful lines of the file (no blank or '#' lines), each split into words, with its line number.
struct Line {
  int64_t number = 0;
  std::vector<std::string> words;
};

std::vector<Line> records(std::string_view text) {
  std::vector<Line> out;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    std::istringstream words(line);
    Line l{n, {}};
    for (std::string w; words >> w;) l.words.push_back(w);
    if (!l.words.empty() && l.words[0][0] != '#') out.push_back(std::move(l));
  }
  return out;
}

// Reads the records in order; every problem names PATH:LINE, what was expected and what is there.
class Reader {
 public:
  Reader(std::string_view text, const std::string& path) : lines_(records(text)), path_(path) {}

  // The next record, which must be `keyword` followed by `args` words (spelled out in `shape` for the message).
  const Line& next(const std::string& keyword, size_t args, std::string_view shape) {
    if (at_ >= lines_.size())
      throw DataError(fmt::format("{}: ends early: expected '{}' after line {} ({})", path_, shape,
                                  lines_.empty() ? 0 : lines_.back().number, kMalformed));
    const Line& l = lines_[at_++];
    if (l.words[0] != keyword || l.words.size() != args + 1)
      throw error(l, fmt::format("expected '{}', got '{}'", shape, joined(l)));
    return l;
  }
  int64_t number(const Line& l, size_t i, int64_t min) const {
    const std::string& w = l.words[i];
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc() || end != w.data() + w.size() || v < min)
      throw error(l, fmt::format("'{}' is not a whole number of at least {}", w, min));
    return v;
  }
  uint32_t crc(const Line& l, size_t i) const {
    const std::string& w = l.words[i];
    uint32_t v = 0;
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v, 16);
    if (w.size() != 8 || ec != std::errc() || end != w.data() + w.size())
      throw error(l, fmt::format("'{}' is not a CRC-32C of 8 hex digits", w));
    return v;
  }
  void expect_end() const {
    if (at_ < lines_.size())
      throw error(lines_[at_], fmt::format("unexpected '{}' after the last chunk", joined(lines_[at_])));
  }
  DataError error(const Line& l, const std::string& what) const {
    return DataError(fmt::format("{}:{}: {} ({})", path_, l.number, what, kMalformed));
  }

 private:
  static std::string joined(const Line& l) {
    std::string s = l.words[0];
    for (size_t i = 1; i < l.words.size(); ++i) s += " " + l.words[i];
    return s;
  }
  std::vector<Line> lines_;
  size_t at_ = 0;
  std::string path_;
};

int64_t chunk_count(int64_t bytes, int64_t chunk_bytes) { return (bytes + chunk_bytes - 1) / chunk_bytes; }

MappedFile map_data_file(const std::string& path) {
  try {
    return MappedFile::open(path, MapOptions{.require_regular_file = true});
  } catch (const MapFileError& e) {
    throw DataError(e.what());
  }
}

void verify_idx(const std::string& path, const DatasetChecksums& sums, const std::string& sums_path) {
  const MappedFile idx = map_data_file(path);
  if (static_cast<int64_t>(idx.size()) != sums.idx_bytes)
    throw DataError(fmt::format("{}: {} bytes, but {} records {}: the file changed since its checksums were written",
                                path, idx.size(), sums_path, sums.idx_bytes));
  const uint32_t crc = crc32c(idx.data(), idx.size());
  if (crc != sums.idx_crc)
    throw DataError(fmt::format("{}: CRC-32C {:08x}, but {} records {:08x}: the index is corrupt", path, crc, sums_path,
                                sums.idx_crc));
}

void verify_bin(const std::string& path, const DatasetChecksums& sums, const std::string& sums_path) {
  const MappedFile bin = map_data_file(path);
  if (static_cast<int64_t>(bin.size()) != sums.bin_bytes)
    throw DataError(fmt::format("{}: {} bytes, but {} records {}: the file changed since its checksums were written",
                                path, bin.size(), sums_path, sums.bin_bytes));
  ChunkedCrc computed(sums.chunk_bytes);
  computed.update(bin.data(), bin.size());
  const std::vector<uint32_t> chunks = computed.chunks();
  std::vector<size_t> bad;
  for (size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i] != sums.bin_chunks[i]) bad.push_back(i);
  if (bad.empty()) return;
  const int64_t first = static_cast<int64_t>(bad[0]) * sums.chunk_bytes;
  const int64_t last = std::min(first + sums.chunk_bytes, sums.bin_bytes) - 1;
  throw DataError(
      fmt::format("{}: chunk {} (bytes {}..{}) has CRC-32C {:08x}, but {} records {:08x}: the data is "
                  "corrupt ({} of {} chunks of {} bytes differ)",
                  path, bad[0], first, last, chunks[bad[0]], sums_path, sums.bin_chunks[bad[0]], bad.size(),
                  chunks.size(), sums.chunk_bytes));
}

}  // namespace

ChunkedCrc::ChunkedCrc(int64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
  if (chunk_bytes < 1)
    throw std::invalid_argument(fmt::format("checksum chunk of {} bytes: must be at least 1", chunk_bytes));
}

void ChunkedCrc::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const size_t take = std::min(bytes, static_cast<size_t>(chunk_bytes_ - in_chunk_));
    crc_ = crc32c_extend(crc_, p, take);
    p += take;
    bytes -= take;
    total_ += static_cast<int64_t>(take);
    in_chunk_ += static_cast<int64_t>(take);
    if (in_chunk_ == chunk_bytes_) {
      done_.push_back(crc_);
      crc_ = 0;
      in_chunk_ = 0;
    }
  }
}

std::vector<uint32_t> ChunkedCrc::chunks() const {
  std::vector<uint32_t> out = done_;
  if (in_chunk_ > 0) out.push_back(crc_);
  return out;
}

std::string dataset_checksums_path(const std::string& prefix) { return prefix + ".crc32c"; }

std::string format_dataset_checksums(const DatasetChecksums& s) {
  std::string out = fmt::format(
      "# CRC-32C of the indexed dataset beside this file, per chunk of its .bin (megatrain docs/data.md)\n{}\n"
      "chunk_bytes {}\nidx {} {:08x}\nbin {} {}\n",
      kFormatLine, s.chunk_bytes, s.idx_bytes, s.idx_crc, s.bin_bytes, s.bin_chunks.size());
  for (size_t i = 0; i < s.bin_chunks.size(); ++i) out += fmt::format("chunk {} {:08x}\n", i, s.bin_chunks[i]);
  return out;
}

DatasetChecksums parse_dataset_checksums(std::string_view text, const std::string& path) {
  Reader r(text, path);
  const Line& format = r.next("format", 2, kFormatLine);
  if (format.words[1] != "megatrain-dataset-crc32c" || format.words[2] != "1")
    throw r.error(format, fmt::format("expected '{}'", kFormatLine));
  DatasetChecksums s;
  s.chunk_bytes = r.number(r.next("chunk_bytes", 1, "chunk_bytes BYTES"), 1, 1);
  const Line& idx = r.next("idx", 2, "idx BYTES CRC");
  s.idx_bytes = r.number(idx, 1, 0);
  s.idx_crc = r.crc(idx, 2);
  const Line& bin = r.next("bin", 2, "bin BYTES CHUNKS");
  s.bin_bytes = r.number(bin, 1, 0);
  const int64_t chunks = r.number(bin, 2, 0);
  if (chunks != chunk_count(s.bin_bytes, s.chunk_bytes))
    throw r.error(bin, fmt::format("{} chunks of {} bytes cannot hold {} bytes (that takes {})", chunks, s.chunk_bytes,
                                   s.bin_bytes, chunk_count(s.bin_bytes, s.chunk_bytes)));
  for (int64_t i = 0; i < chunks; ++i) {
    const Line& c = r.next("chunk", 2, fmt::format("chunk {} CRC", i));
    if (r.number(c, 1, 0) != i) throw r.error(c, fmt::format("expected chunk {}, got chunk {}", i, c.words[1]));
    s.bin_chunks.push_back(r.crc(c, 2));
  }
  r.expect_end();
  return s;
}

bool verify_dataset_checksums(const std::string& prefix) {
  const std::string path = dataset_checksums_path(prefix);
  if (io::path_kind(path) == io::PathKind::missing) return false;
  const DatasetChecksums sums = parse_dataset_checksums(io::read_text_file(path), path);
  verify_idx(prefix + ".idx", sums, path);
  verify_bin(prefix + ".bin", sums, path);
  return true;
}

}  // namespace mt

namespace mt {

std::string verify_dataset_report(const std::string& prefix) {
  const std::string path = dataset_checksums_path(prefix);
  if (!verify_dataset_checksums(prefix))
    return fmt::format("  checksums   none: no {} (Megatron's own or older data), nothing verified\n", path);
  return fmt::format("  checksums   {}.bin and {}.idx match {}\n", prefix, prefix, path);
}

}  // namespace mt
