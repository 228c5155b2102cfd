// test_data.cpp: the data layer: Megatron .bin/.idx reading and writing, token streams, the seeded sample
// order, document splits, `data prepare` / `data inspect`.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "tests/unit/temp_dir.h"
#include <sys/stat.h>
#include <stdlib.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/data/blend.h"
#include "core/data/dataset_checksums.h"
#include "core/data/gpt_dataset.h"
#include "core/data/indexed_dataset.h"
#include "core/data/json_line.h"
#include "core/data/prepare.h"
#include "core/tokenizer/tokenizer.h"
#include "core/base/rng.h"
#include "core/io/crc.h"
#include "core/io/file_io.h"
#include "tests/unit/source_root.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

using testing_util::TempDir;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

template <typename T>
void patch(std::vector<uint8_t>& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

// Runs f, expects a DataError whose message contains every one of `parts`.
template <typename F>
void expect_data_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a DataError containing '" << parts.front() << "'";
  } catch (const DataError& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

using Doc = std::vector<std::vector<int64_t>>;

// All tokens of sequence s of d.
std::vector<int64_t> sequence_tokens(const IndexedDataset& d, int64_t s) {
  std::vector<int32_t> buf(static_cast<size_t>(d.sequence_lengths()[s]));
  d.read(s, 0, buf);
  return std::vector<int64_t>(buf.begin(), buf.end());
}

// The dataset's documents as lists of sequences.
std::vector<Doc> all_documents(const IndexedDataset& d) {
  std::vector<Doc> docs;
  auto index = d.document_index();
  for (int64_t doc = 0; doc < d.num_documents(); ++doc) {
    Doc out;
    for (int64_t s = index[doc]; s < index[doc + 1]; ++s) out.push_back(sequence_tokens(d, s));
    docs.push_back(out);
  }
  return docs;
}

// Documents with tokens spread over [lo, hi], the ends included; several multi-sequence documents.
std::vector<Doc> sample_documents(int64_t lo, int64_t hi) {
  std::vector<Doc> docs = {{{lo, hi, 0, 1}}, {{2, 3}, {hi}, {lo, lo + 1, 5}}, {{7}}, {{hi - 1}, {}, {4, 4}}};
  for (auto& doc : docs)
    for (auto& seq : doc)
      for (auto& t : seq) t = std::clamp(t, lo, hi);
  return docs;
}

// ------------------------------------------------------------------------------------------------ format

TEST(IndexedDataset, RoundTripsEveryDtype) {
  TempDir dir;
  struct Case {
    TokenDType dtype;
    int64_t lo, hi;
  };
  const Case cases[] = {{TokenDType::u8, 0, 255},
                        {TokenDType::i8, -128, 127},
                        {TokenDType::i16, -32768, 32767},
                        {TokenDType::i32, INT32_MIN, INT32_MAX},
                        {TokenDType::i64, INT32_MIN, INT32_MAX},
                        {TokenDType::f64, INT32_MIN, INT32_MAX},
                        {TokenDType::f32, -(1 << 24), 1 << 24},
                        {TokenDType::u16, 0, 65535}};
  for (const Case& c : cases) {
    SCOPED_TRACE(token_dtype_name(c.dtype));
    const std::string prefix = dir / fmt::format("rt{}", static_cast<int>(c.dtype));
    const std::vector<Doc> docs = sample_documents(c.lo, c.hi);
    IndexedDatasetWriter w(prefix, c.dtype);
    for (const Doc& d : docs) w.add_document(d);
    w.finish();
    EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
    EXPECT_FALSE(fs::exists(prefix + ".idx.tmp"));

    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), c.dtype);
    EXPECT_EQ(ds.num_documents(), 4);
    EXPECT_EQ(ds.num_sequences(), 8);
    EXPECT_EQ(ds.num_tokens(), 4 + 6 + 1 + 3);
    EXPECT_EQ(std::vector<int64_t>(ds.document_index().begin(), ds.document_index().end()),
              (std::vector<int64_t>{0, 1, 4, 5, 8}));
    EXPECT_EQ(fs::file_size(prefix + ".bin"), 14 * token_dtype_size(c.dtype));
    EXPECT_EQ(all_documents(ds), docs);
    // A read from the middle of a sequence.
    std::vector<int32_t> mid(2);
    ds.read(3, 1, mid);
    EXPECT_EQ(mid, (std::vector<int32_t>{static_cast<int32_t>(std::clamp<int64_t>(c.lo + 1, c.lo, c.hi)), 5}));
    EXPECT_THROW(ds.read(3, 2, mid), std::out_of_range);
  }
}

TEST(IndexedDataset, WriterProducesTheExactMegatronBytes) {
  TempDir dir;
  const std::string prefix = dir / "tiny";
  IndexedDatasetWriter w(prefix, TokenDType::u16);
  w.add_document(Doc{{1, 2, 3}, {4}});
  const std::vector<int32_t> second = {5, 6};
  w.add_document(std::span<const int32_t>(second));
  w.finish();

  // Built by hand from the spec: 2 documents -> 3 document-index entries, as Megatron's
  // _IndexWriter writes len(document_indices) with its leading 0.
  const std::vector<uint8_t> idx = {
      'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,           // magic
      1,   0,   0,   0,   0,   0,   0,   0,              // version 1
      8,                                                 // dtype code: uint16
      3,   0,   0,   0,   0,   0,   0,   0,              // 3 sequences
      3,   0,   0,   0,   0,   0,   0,   0,              // 3 document-index entries
      3,   0,   0,   0,   1,   0,   0,   0, 2, 0, 0, 0,  // lengths (i32)
      0,   0,   0,   0,   0,   0,   0,   0,              // pointers (i64, bytes): 0
      6,   0,   0,   0,   0,   0,   0,   0,              //   6
      8,   0,   0,   0,   0,   0,   0,   0,              //   8
      0,   0,   0,   0,   0,   0,   0,   0,              // document index (i64): 0
      2,   0,   0,   0,   0,   0,   0,   0,              //   2
      3,   0,   0,   0,   0,   0,   0,   0,              //   3
  };
  EXPECT_EQ(read_bytes(prefix + ".idx"), idx);
  EXPECT_EQ(read_bytes(prefix + ".bin"), (std::vector<uint8_t>{1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0}));
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.document_index().size(), 3u);
}

// Reads the expected tokens written beside each pair by tests/data/write_indexed.py.
std::vector<Doc> read_expected(const std::string& path) {
  std::ifstream in(path);
  std::vector<Doc> docs;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word;
    ls >> word;
    if (word == "doc") {
      docs.emplace_back();
    } else if (word == "seq") {
      size_t n = 0;
      ls >> n;
      std::vector<int64_t> seq(n);
      for (auto& t : seq) ls >> t;
      docs.back().push_back(seq);
    }
  }
  return docs;
}

TEST(IndexedDataset, ReadsPairsFromAnIndependentPythonWriter) {
  if (std::system("python3 -c pass > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found: cannot run "
                 << "tests/data/write_indexed.py";
  TempDir dir;
  const std::string cmd = fmt::format("python3 '{}/tests/data/write_indexed.py' '{}'",
                                      testing_util::source_root().string(), dir.path().string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (int code = 1; code <= 8; ++code) {
    SCOPED_TRACE(fmt::format("dtype code {}", code));
    const std::string prefix = dir / fmt::format("code{}", code);
    const std::vector<Doc> expected = read_expected(prefix + ".expected");
    ASSERT_EQ(expected.size(), 6u);
    IndexedDataset ds(prefix);
    EXPECT_EQ(static_cast<int>(ds.dtype()), code);
    EXPECT_EQ(ds.num_documents(), 6);
    EXPECT_EQ(ds.num_sequences(), 11);
    EXPECT_EQ(all_documents(ds), expected);
    // Our writer reproduces the independent writer's files byte for byte.
    const std::string ours = dir / fmt::format("ours{}", code);
    IndexedDatasetWriter w(ours, static_cast<TokenDType>(code));
    for (const Doc& d : expected) w.add_document(d);
    w.finish();
    EXPECT_EQ(read_bytes(ours + ".idx"), read_bytes(prefix + ".idx"));
    EXPECT_EQ(read_bytes(ours + ".bin"), read_bytes(prefix + ".bin"));
  }
}

// A valid u16 pair with 2 documents (3 sequences) to corrupt.
std::string write_small(const TempDir& dir, const std::string& name) {
  const std::string prefix = dir / name;
  IndexedDatasetWriter w(prefix, TokenDType::u16);
  w.add_document(Doc{{1, 2, 3}, {4}});
  w.add_document(Doc{{5, 6}});
  w.finish();
  return prefix;
}

TEST(IndexedDataset, BadFilesNameTheFileAndTheProblem) {
  TempDir dir;
  {
    const std::string p = write_small(dir, "nobin");
    fs::remove(p + ".bin");
    expect_data_error([&] { IndexedDataset d(p); }, {p + ".bin", "cannot open"});
  }
  {
    const std::string p = write_small(dir, "noidx");
    fs::remove(p + ".idx");
    expect_data_error([&] { IndexedDataset d(p); }, {p + ".idx", "cannot open"});
  }
  expect_data_error([&] { IndexedDataset d(dir / "absent"); }, {dir / "absent.idx"});

  auto corrupt = [&](const std::string& name, auto edit, std::vector<std::string> parts) {
    SCOPED_TRACE(name);
    const std::string p = write_small(dir, name);
    std::vector<uint8_t> idx = read_bytes(p + ".idx");
    edit(idx);
    write_bytes(p + ".idx", idx);
    parts.insert(parts.begin(), p + ".idx");
    expect_data_error([&] { IndexedDataset d(p); }, parts);
  };
  corrupt("magic", [](auto& b) { b[3] = 'X'; }, {"bad magic"});
  corrupt("version", [](auto& b) { patch<uint64_t>(b, 9, 2); }, {"unsupported version 2"});
  corrupt("dtype0", [](auto& b) { b[17] = 0; }, {"unsupported dtype code 0"});
  corrupt("dtype9", [](auto& b) { b[17] = 9; }, {"unsupported dtype code 9"});
  corrupt("short_header", [](auto& b) { b.resize(20); }, {"truncated", "20 bytes"});
  // Header: 34 bytes, then 3 * 4 + 3 * 8 + 3 * 8 = 60: 94 bytes in all.
  corrupt("truncated", [](auto& b) { b.resize(90); }, {"truncated", "3 sequences", "holds 90 bytes, need 94"});
  corrupt("huge_count", [](auto& b) { patch<uint64_t>(b, 18, uint64_t{1} << 60); }, {"truncated"});
  corrupt("zero_docs", [](auto& b) { patch<uint64_t>(b, 26, 0); }, {"document index is empty"});
  // Document index entries sit at 34 + 12 + 24 = 70.
  corrupt("doc_order", [](auto& b) { patch<int64_t>(b, 78, 4); }, {"not monotonic"});
  corrupt("doc_end", [](auto& b) { patch<int64_t>(b, 86, 2); }, {"ends at 2", "3 sequences"});
  corrupt("doc_start", [](auto& b) { patch<int64_t>(b, 70, 1); }, {"starts at 1"});
  // Pointers at 46: the second sequence should start at byte 6.
  corrupt("pointer", [](auto& b) { patch<int64_t>(b, 54, 7); }, {"pointers do not match", "sequence 1"});
  corrupt("neg_length", [](auto& b) { patch<int32_t>(b, 34, -1); }, {"negative length"});
  {
    const std::string p = write_small(dir, "shortbin");
    fs::resize_file(p + ".bin", 11);
    expect_data_error([&] { IndexedDataset d(p); }, {p + ".bin", "truncated", "needs 12 bytes", "holds 11"});
  }
}

TEST(IndexedDataset, ReadRejectsTokensOutsideInt32) {
  TempDir dir;
  const std::string p = dir / "wide";
  IndexedDatasetWriter w(p, TokenDType::i64);
  w.add_document(Doc{{1, int64_t{1} << 40, 3}});
  w.finish();
  IndexedDataset ds(p);
  std::vector<int32_t> one(1);
  ds.read(0, 2, one);
  EXPECT_EQ(one[0], 3);
  std::vector<int32_t> all(3);
  expect_data_error([&] { ds.read(0, 0, all); }, {p + ".bin", "sequence 0 token 1", "1099511627776"});

  const std::string f = dir / "nan";
  IndexedDatasetWriter wf(f, TokenDType::f64);
  wf.add_document(Doc{{1, 2}});
  wf.finish();
  std::vector<uint8_t> bin = read_bytes(f + ".bin");
  patch<double>(bin, 8, std::nan(""));
  write_bytes(f + ".bin", bin);
  IndexedDataset fd(f);
  std::vector<int32_t> two(2);
  expect_data_error([&] { fd.read(0, 0, two); }, {f + ".bin", "token 1"});
}

// A float token file (dtype codes 6 and 7) holding 1.5 used to be read as token 1.
TEST(IndexedDataset, ReadRejectsFractionalFloatTokens) {
  TempDir dir;
  for (TokenDType t : {TokenDType::f32, TokenDType::f64}) {
    const std::string f = dir / (t == TokenDType::f32 ? "f32" : "f64");
    IndexedDatasetWriter w(f, t);
    w.add_document(Doc{{1, 2, 3}});
    w.finish();
    std::vector<uint8_t> bin = read_bytes(f + ".bin");
    if (t == TokenDType::f32)
      patch<float>(bin, 4, 1.5f);
    else
      patch<double>(bin, 8, 1.5);
    write_bytes(f + ".bin", bin);
    IndexedDataset ds(f);
    std::vector<int32_t> one(1), all(3);
    ds.read(0, 0, one);  // whole values still read
    EXPECT_EQ(one[0], 1);
    expect_data_error([&] { ds.read(0, 0, all); }, {f + ".bin", "sequence 0 token 1", "1.5", "not a whole token id"});
  }
}

// A FIFO named PREFIX.idx or PREFIX.bin used to block the open forever.
TEST(IndexedDataset, FifoInsteadOfAFileIsRefusedAtOnce) {
  TempDir dir;
  const std::string p = write_small(dir, "pipe");
  for (const char* ext : {".idx", ".bin"}) {
    const std::string path = p + ext;
    const std::vector<uint8_t> keep = read_bytes(path);
    fs::remove(path);
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    expect_data_error([&] { IndexedDataset ds(p); }, {path, "not a regular file"});
    fs::remove(path);
    write_bytes(path, keep);
  }
}

TEST(IndexedDatasetWriter, RejectsTokensTheDtypeCannotHold) {
  TempDir dir;
  IndexedDatasetWriter w(dir / "u8", TokenDType::u8);
  expect_data_error([&] { w.add_document(Doc{{1, 256}}); }, {"256", "uint8"});
  IndexedDatasetWriter f(dir / "f32", TokenDType::f32);
  expect_data_error([&] { f.add_document(Doc{{(1 << 24) + 1}}); }, {"float32"});
}

TEST(IndexedDatasetWriter, UnfinishedWriterLeavesTheOldPairAlone) {
  TempDir dir;
  const std::string p = write_small(dir, "keep");
  const auto idx = read_bytes(p + ".idx"), bin = read_bytes(p + ".bin");
  {
    IndexedDatasetWriter w(p, TokenDType::u8);
    w.add_document(Doc{{9, 9, 9}});
    EXPECT_TRUE(fs::exists(p + ".bin.tmp"));
  }  // destroyed before finish()
  EXPECT_FALSE(fs::exists(p + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(p + ".idx.tmp"));
  EXPECT_EQ(read_bytes(p + ".idx"), idx);
  EXPECT_EQ(read_bytes(p + ".bin"), bin);
  try {  // the file_io helper's own FileError, naming the temporary
    IndexedDatasetWriter w(dir / "no/such/dir/x", TokenDType::u8);
    ADD_FAILURE() << "created a writer in a missing directory";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.bin.tmp"), std::string::npos) << e.what();
  }
}

// A caller that handles "a file problem" catches FileError: the data files' errors are among them.
TEST(IndexedDataset, ADataErrorIsAFileError) {
  TempDir dir;
  try {
    IndexedDataset d(dir / "missing");
    ADD_FAILURE() << "opened a missing dataset";
  } catch (const FileError& e) {
    EXPECT_NE(dynamic_cast<const DataError*>(&e), nullptr) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir / "missing"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------------------------ checksums

// Options that prepare dir/a.txt, written with `text`, into dir/out (byte tokenizer).
PrepareOptions text_to_out(const TempDir& dir, const std::string& text) {
  write_text(dir / "a.txt", text);
  PrepareOptions opt;
  opt.inputs = {dir / "a.txt"};
  opt.output_prefix = dir / "out";
  return opt;
}

// A flipped bit in a .bin trained silently: the format has no checksum (issue 30, item 13). PREFIX.crc32c now
// holds one per chunk of the .bin and one of the .idx.
TEST(DatasetChecksums, PrepareWritesThemAndTheyMatchThePair) {
  TempDir dir;
  const PrepareOptions opt = text_to_out(dir, "first document\n\nsecond one\n");
  prepare_dataset(opt);
  const std::string path = dataset_checksums_path(opt.output_prefix);
  ASSERT_TRUE(fs::exists(path));
  const DatasetChecksums sums = parse_dataset_checksums(io::read_text_file(path), path);
  const std::vector<uint8_t> bin = read_bytes(opt.output_prefix + ".bin"), idx = read_bytes(opt.output_prefix + ".idx");
  EXPECT_EQ(sums.chunk_bytes, kChecksumChunkBytes);
  EXPECT_EQ(sums.bin_bytes, static_cast<int64_t>(bin.size()));
  EXPECT_EQ(sums.bin_chunks, std::vector<uint32_t>{crc32c(bin.data(), bin.size())});
  EXPECT_EQ(sums.idx_bytes, static_cast<int64_t>(idx.size()));
  EXPECT_EQ(sums.idx_crc, crc32c(idx.data(), idx.size()));
  EXPECT_TRUE(verify_dataset_checksums(opt.output_prefix));
  EXPECT_NE(verify_dataset_report(opt.output_prefix).find("match " + path), std::string::npos);
}

// The writer's chunks: 100 u16 tokens are 200 bytes, 13 chunks of 16 (the last one 8 bytes).
std::string write_chunked(const TempDir& dir, const std::string& name) {
  const std::string prefix = dir / name;
  IndexedDatasetWriter w(prefix, TokenDType::u16, 16);
  std::vector<int64_t> tokens(100);
  std::iota(tokens.begin(), tokens.end(), 1);
  w.add_document(Doc{tokens});
  w.finish();
  return prefix;
}

TEST(DatasetChecksums, AFlippedBitIsFoundAndItsChunkNamed) {
  TempDir dir;
  const std::string prefix = write_chunked(dir, "d");
  const DatasetChecksums sums = parse_dataset_checksums(io::read_text_file(prefix + ".crc32c"), "x");
  EXPECT_EQ(sums.bin_chunks.size(), 13u);
  EXPECT_TRUE(verify_dataset_checksums(prefix));

  std::vector<uint8_t> bin = read_bytes(prefix + ".bin");
  bin[100] ^= 0x04;  // chunk 6: bytes 96..111
  write_bytes(prefix + ".bin", bin);
  expect_data_error([&] { verify_dataset_checksums(prefix); },
                    {prefix + ".bin: chunk 6 (bytes 96..111) has CRC-32C", prefix + ".crc32c records",
                     "corrupt (1 of 13 chunks of 16 bytes differ)"});
  bin[199] ^= 0x80;  // and the short last chunk 12: bytes 192..199
  write_bytes(prefix + ".bin", bin);
  expect_data_error([&] { verify_dataset_checksums(prefix); }, {"chunk 6 (bytes 96..111)", "2 of 13 chunks"});
  expect_data_error([&] { verify_dataset_report(prefix); }, {"chunk 6"});

  bin.pop_back();
  write_bytes(prefix + ".bin", bin);
  expect_data_error([&] { verify_dataset_checksums(prefix); },
                    {prefix + ".bin: 199 bytes, but " + prefix + ".crc32c records 200"});

  const std::string other = write_chunked(dir, "e");
  std::vector<uint8_t> idx = read_bytes(other + ".idx");
  idx[20] ^= 0x01;  // a bit of the sequence count
  write_bytes(other + ".idx", idx);
  expect_data_error([&] { verify_dataset_checksums(other); }, {other + ".idx: CRC-32C", "the index is corrupt"});
}

// Megatron's own datasets, and ours from before, have no checksum file: read unchecked, as before.
TEST(DatasetChecksums, AMissingFileIsAccepted) {
  TempDir dir;
  const std::string prefix = write_chunked(dir, "d");
  fs::remove(prefix + ".crc32c");
  EXPECT_FALSE(verify_dataset_checksums(prefix));
  EXPECT_NE(verify_dataset_report(prefix).find("none: no " + prefix + ".crc32c"), std::string::npos);
  EXPECT_EQ(IndexedDataset(prefix).num_tokens(), 100);
}

TEST(DatasetChecksums, AMalformedFileIsRefusedNamingItsLine) {
  TempDir dir;
  const std::string prefix = write_chunked(dir, "d");
  const std::string path = prefix + ".crc32c", good = io::read_text_file(path);
  const DatasetChecksums sums = parse_dataset_checksums(good, path);
  EXPECT_EQ(parse_dataset_checksums(format_dataset_checksums(sums), path), sums);
  // The good file: a comment on line 1, format on 2, chunk_bytes 3, idx 4, bin 5, chunks 0..12 on 6..18.
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const struct {
    std::string text, expected;
  } cases[] = {
      {"", "ends early: expected 'format megatrain-dataset-crc32c 1'"},
      {edited("dataset-crc32c 1", "dataset-crc32c 2"), ":2: expected 'format megatrain-dataset-crc32c 1'"},
      {edited("chunk_bytes 16", "chunk_bytes 0"), ":3: '0' is not a whole number of at least 1"},
      {edited("chunk_bytes 16", "chunk_bytes 16k"), ":3: '16k' is not a whole number"},
      {edited("idx ", "idx 12 "), ":4: expected 'idx BYTES CRC', got 'idx 12 "},
      {edited("bin 200 13", "bin 200 12"), ":5: 12 chunks of 16 bytes cannot hold 200 bytes (that takes 13)"},
      {edited("chunk 3 ", "chunk 4 "), ":9: expected chunk 3, got chunk 4"},
      {edited("chunk 5 ", "chunk 5 zz"), ":11: 'zz"},
      {good + "chunk 13 00000000\n", ":19: unexpected 'chunk 13 00000000' after the last chunk"},
      {good.substr(0, good.find("chunk 12 ")), "ends early: expected 'chunk 12 CRC' after line 17"},
  };
  for (const auto& c : cases) {
    write_text(path, c.text);
    expect_data_error([&] { verify_dataset_checksums(prefix); }, {path, c.expected, "malformed checksum file"});
  }
}

// ------------------------------------------------------------------------------------------------ samples

// Two datasets whose documents hold consecutive numbers 0, 1, 2, ... in file order.
struct CountingData {
  std::shared_ptr<const IndexedDataset> a, b;
  explicit CountingData(const TempDir& dir) {
    int64_t next = 0;
    auto run = [&](int64_t n) {
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (auto& t : v) t = next++;
      return v;
    };
    IndexedDatasetWriter wa(dir / "a", TokenDType::i32);
    wa.add_document(Doc{run(5), run(3)});  // doc 0: 0..7
    wa.add_document(Doc{run(1)});          // doc 1: 8
    wa.add_document(Doc{{}, run(6)});      // doc 2: 9..14 (after an empty sequence)
    wa.finish();
    IndexedDatasetWriter wb(dir / "b", TokenDType::u16);
    wb.add_document(Doc{run(10)});  // doc 0: 15..24
    wb.add_document(Doc{run(7)});   // doc 1: 25..31
    wb.finish();
    a = std::make_shared<const IndexedDataset>(dir / "a");
    b = std::make_shared<const IndexedDataset>(dir / "b");
  }
};

TEST(TokenStream, SampleJIsTokensJSToJSPlusS) {
  TempDir dir;
  CountingData data(dir);
  auto stream = std::make_shared<const TokenStream>(std::vector<TokenStream::Part>{{data.a, 0, 3}, {data.b, 0, 2}});
  ASSERT_EQ(stream->num_tokens(), 32);
  for (int64_t S : {1, 3, 4, 7, 31}) {
    GptDataset ds(stream, S, 1234, /*shuffle=*/false);
    EXPECT_EQ(ds.samples_per_epoch(), 31 / S);
    std::vector<int32_t> out(static_cast<size_t>(S + 1));
    for (int64_t j = 0; j < ds.samples_per_epoch(); ++j) {
      ds.sample(j, out);
      for (int64_t t = 0; t <= S; ++t) ASSERT_EQ(out[t], j * S + t) << "S=" << S << " j=" << j;
    }
    // Epoch 1 without shuffle repeats epoch 0.
    ds.sample(ds.samples_per_epoch(), out);
    EXPECT_EQ(out[0], 0);
  }
  std::vector<int32_t> too_long(33);
  EXPECT_THROW(GptDataset(stream, 32, 1, false).sample(0, too_long), DataError);
}

TEST(TokenStream, DocumentRangesSelectTheirTokens) {
  TempDir dir;
  CountingData data(dir);
  TokenStream s({{data.a, 1, 3}, {data.b, 1, 2}});  // 8, 9..14, 25..31
  ASSERT_EQ(s.num_tokens(), 14);
  std::vector<int32_t> all(14);
  s.read(0, all);
  EXPECT_EQ(all, (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14, 25, 26, 27, 28, 29, 30, 31}));
  std::vector<int32_t> tail(3);
  s.read(6, tail);
  EXPECT_EQ(tail, (std::vector<int32_t>{14, 25, 26}));
  EXPECT_THROW(s.read(12, tail), std::out_of_range);
  EXPECT_THROW(TokenStream({{data.a, 2, 4}}), DataError);
  EXPECT_EQ(TokenStream({{data.a, 1, 1}}).num_tokens(), 0);
}

// data.sft_packing: pad: sample j is sequence j of the stream (empty sequences hold none), cut at S + 1 tokens,
// padded with 0.
TEST(GptDataset, SequenceCutGivesOneSequencePerSamplePadded) {
  TempDir dir;
  CountingData data(dir);
  auto stream = std::make_shared<const TokenStream>(
      std::vector<TokenStream::Part>{{data.a, 0, 3}, {data.b, 0, 2}});  // 0..4 | 5..7 | 8 | 9..14 | 15..24 | 25..31
  GptDataset ds(stream, 5, 1, false, GptDataset::Cut::sequences);
  ASSERT_EQ(ds.samples_per_epoch(), 6);
  std::vector<int32_t> out(6);
  const std::vector<std::vector<int32_t>> want = {{0, 1, 2, 3, 4, 0},       {5, 6, 7, 0, 0, 0},
                                                  {8, 0, 0, 0, 0, 0},       {9, 10, 11, 12, 13, 14},
                                                  {15, 16, 17, 18, 19, 20}, {25, 26, 27, 28, 29, 30}};
  for (int64_t j = 0; j < 6; ++j) {
    ds.sample(j, out);
    EXPECT_EQ(out, want[static_cast<size_t>(j)]) << "sample " << j;
  }
  GptDataset shuffled(stream, 5, 1, true, GptDataset::Cut::sequences);
  std::vector<int32_t> firsts;
  for (int64_t j = 0; j < 6; ++j) {
    shuffled.sample(j, out);
    firsts.push_back(out[0]);
  }
  std::sort(firsts.begin(), firsts.end());
  EXPECT_EQ(firsts, (std::vector<int32_t>{0, 5, 8, 9, 15, 25}));  // a permutation of the sequences
}

// data.sft_packing: pack: each token's position within its sequence (document), from 0 at the sample's start
// (a document begun in an earlier sample continues at 0) and at every sequence start inside the sample.
TEST(GptDataset, PackedSamplePositionsRestartAtEveryDocument) {
  TempDir dir;
  CountingData data(dir);
  auto stream = std::make_shared<const TokenStream>(
      std::vector<TokenStream::Part>{{data.a, 0, 3}, {data.b, 0, 2}});  // 0..4 | 5..7 | 8 | 9..14 | 15..24 | 25..31
  GptDataset ds(stream, 5, 1, false);
  ASSERT_EQ(ds.samples_per_epoch(), 6);
  const std::vector<std::vector<int32_t>> want = {{0, 1, 2, 3, 4, 0}, {0, 1, 2, 0, 0, 1}, {0, 1, 2, 3, 4, 0},
                                                  {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 0}, {0, 1, 2, 3, 4, 5}};
  std::vector<int32_t> pos(6), tok(6);
  for (int64_t j = 0; j < 6; ++j) {
    ds.sample_positions(j, pos);
    EXPECT_EQ(pos, want[static_cast<size_t>(j)]) << "sample " << j;
  }
  // Shuffled, the positions follow their sample: a 0 inside a sample is a sequence start (its token value, in
  // this counting data, one of 5, 8, 9, 15, 25).
  GptDataset shuffled(stream, 5, 7, true);
  for (int64_t j = 0; j < 6; ++j) {
    shuffled.sample(j, tok);
    shuffled.sample_positions(j, pos);
    for (size_t t = 1; t < 6; ++t) {
      const bool start = tok[t] == 5 || tok[t] == 8 || tok[t] == 9 || tok[t] == 15 || tok[t] == 25;
      EXPECT_EQ(pos[t], start ? 0 : pos[t - 1] + 1) << "sample " << j << " token " << t;
    }
  }
  // One document per sample (cut = sequences): 0..S.
  GptDataset padded(stream, 5, 1, false, GptDataset::Cut::sequences);
  padded.sample_positions(1, pos);
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(stream->read_positions(30, pos), std::out_of_range);
}

TEST(GptDataset, SeededShuffleIsAPermutationFixedBySeedAndEpoch) {
  TempDir dir;
  const std::string p = dir / "big";
  IndexedDatasetWriter w(p, TokenDType::i32);
  std::vector<int64_t> doc(1001);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int64_t>(i);
  w.add_document(Doc{doc});
  w.finish();
  auto stream = std::make_shared<const TokenStream>(
      std::vector<TokenStream::Part>{{std::make_shared<const IndexedDataset>(p), 0, 1}});
  const int64_t S = 4;
  GptDataset a(stream, S, 1234, true), b(stream, S, 1234, true), other_seed(stream, S, 99, true);
  const int64_t n = a.samples_per_epoch();
  ASSERT_EQ(n, 250);

  auto epoch_order = [&](const GptDataset& d, int64_t epoch) {
    std::vector<int64_t> order;
    std::vector<int32_t> out(S + 1);
    for (int64_t i = 0; i < n; ++i) {
      d.sample(epoch * n + i, out);
      EXPECT_EQ(out[0] % S, 0);
      EXPECT_EQ(out[S], out[0] + S);
      order.push_back(out[0] / S);
      EXPECT_EQ(order.back(), d.stream_sample(epoch * n + i));
    }
    return order;
  };
  const auto e0 = epoch_order(a, 0), e1 = epoch_order(a, 1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(e0, identity);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, epoch_order(b, 0));
  EXPECT_EQ(e1, epoch_order(b, 1));
  EXPECT_NE(e0, epoch_order(other_seed, 0));
  // Going back to an earlier epoch rebuilds the same order.
  EXPECT_EQ(e0, epoch_order(a, 0));
  EXPECT_EQ(a.epoch_permutation(1), e1);
}

TEST(GptDataset, ShuffledOrderIsPinned) {
  // Pins the Fisher-Yates construction (draw i = random_u64_at(seed, stream_id("data.shuffle") + epoch, i),
  // j = high 64 bits of draw * (i + 1)) against an order computed here independently.
  TempDir dir;
  const std::string p = dir / "pin";
  IndexedDatasetWriter w(p, TokenDType::i32);
  w.add_document(Doc{std::vector<int64_t>(17, 1)});
  w.finish();
  auto stream = std::make_shared<const TokenStream>(
      std::vector<TokenStream::Part>{{std::make_shared<const IndexedDataset>(p), 0, 1}});
  GptDataset ds(stream, 2, 7, true);
  ASSERT_EQ(ds.samples_per_epoch(), 8);
  for (int64_t epoch : {0, 3}) {
    std::vector<int64_t> perm = {0, 1, 2, 3, 4, 5, 6, 7};
    for (uint64_t i = 7; i > 0; --i) {
      const uint64_t r = random_u64_at(7, stream_id("data.shuffle") + static_cast<uint64_t>(epoch), i);
      std::swap(perm[i], perm[static_cast<size_t>((static_cast<unsigned __int128>(r) * (i + 1)) >> 64)]);
    }
    EXPECT_EQ(ds.epoch_permutation(epoch), perm);
  }
}

TEST(SyntheticDataset, IsDeterministicAndInRange) {
  SyntheticDataset a(50, 16, 3), b(50, 16, 3), c(50, 16, 4);
  std::vector<int32_t> x(17), y(17), z(17);
  a.sample(5, x);
  b.sample(5, y);
  c.sample(5, z);
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  for (int32_t t : x) EXPECT_TRUE(t >= 0 && t < 50);
  a.sample(6, y);
  EXPECT_NE(x, y);
}

TEST(SplitRanges, FollowsMegatronCoresRule) {
  using R = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(split_ranges(1000, {969, 30, 1}), (R{{0, 969}, {969, 999}, {999, 1000}}));
  EXPECT_EQ(split_ranges(1000, {90, 9, 1}), (R{{0, 900}, {900, 990}, {990, 1000}}));
  // Bookends 0, 1/3, 2/3, 1: round(3.33) = 3, round(6.67) = 7 (the old shifted rule gave 4 and 7).
  EXPECT_EQ(split_ranges(10, {1, 1, 1}), (R{{0, 3}, {3, 7}, {7, 10}}));
  // Python rounds half to even: round(2.5) = 2.
  EXPECT_EQ(split_ranges(5, {1, 1}), (R{{0, 2}, {2, 5}, {5, 5}}));
  EXPECT_EQ(split_ranges(7, {1}), (R{{0, 7}, {7, 7}, {7, 7}}));
  EXPECT_EQ(split_ranges(100, {98, 2, 0}), (R{{0, 98}, {98, 100}, {100, 100}}));
  EXPECT_EQ(split_ranges(0, {969, 30, 1}), (R{{0, 0}, {0, 0}, {0, 0}}));
  EXPECT_EQ(split_ranges(3, {0, 1, 1}), (R{{0, 0}, {0, 2}, {2, 3}}));
  EXPECT_THROW(split_ranges(10, {1, 1, 1, 1}), std::invalid_argument);
  EXPECT_THROW(split_ranges(10, {1, -1}), std::invalid_argument);
  EXPECT_THROW(split_ranges(10, {0, 0}), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------------ JSON

TEST(JsonLine, DecodesEscapesAndUnicode) {
  EXPECT_EQ(json_string_field(R"({"text": "a\"b\\c\/d\n\t\b\f\r"})", "text"), "a\"b\\c/d\n\t\b\f\r");
  EXPECT_EQ(json_string_field(R"({"text":"\u00e9\u20AC\ud83d\ude00 é€😀"})", "text"),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  EXPECT_EQ(
      json_string_field(R"(  {"id": [1, -2.5e3, {"text": "no"}], "ok": true, "n": null, "text": "yes"} )", "text"),
      "yes");
  EXPECT_EQ(json_string_field(R"({"text": "first", "text": "last"})", "text"), "last");
  EXPECT_EQ(json_string_field(R"({"body": "x"})", "text"), std::nullopt);
  EXPECT_EQ(json_string_field(R"({})", "text"), std::nullopt);
  EXPECT_EQ(json_string_field(R"({"text": "\u0000"})", "text"), std::string(1, '\0'));
}

TEST(JsonLine, RejectsMalformedLines) {
  for (const char* bad :
       {R"({"text": "a\x"})", R"({"text": "\ud83d"})", R"({"text": "\ude00"})", R"({"text": "\ud83d\u0041"})",
        R"({"text": "abc)", R"({"text": "a"} x)", R"(["text"])", R"({"text": 3})", R"({"text" "a"})",
        R"({"a": 01, "text": "x"})", R"({"a": tru})", R"({"a": [1,], "text": "x"})", "{\"text\": \"tab\there\"}",
        R"({"text": "\u12"})", "", R"({"a": 1,})"}) {
    EXPECT_THROW(json_string_field(bad, "text"), JsonError) << bad;
  }
  try {
    json_string_field(R"({"text": 3})", "text");
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("column 10"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------------------------ prepare

std::vector<int64_t> bytes_of(const std::string& s, bool eod = true) {
  std::vector<int64_t> v;
  for (unsigned char c : s) v.push_back(c);
  if (eod) v.push_back(256);
  return v;
}

TEST(Prepare, TextAndJsonLinesBecomeByteDocumentsWithEod) {
  TempDir dir;
  write_text(dir / "a.txt", "\n\nHello\nworld\n\n\n  \nSecond para\r\nline two\r\n\r\nlast");
  write_text(dir / "b.jsonl",
             "{\"text\": \"tab\\there \\\"q\\\" \\\\ \\/\", \"id\": 1}\n"
             "\n"
             "{\"meta\": {\"text\": 0}, \"text\": \"\\u00e9\\ud83d\\ude00 \xC3\xA9\"}\n"
             "{\"text\": \"\"}\n");
  PrepareOptions opt;
  opt.inputs = {dir / "a.txt", dir / "b.jsonl"};
  opt.output_prefix = dir / "out/corpus";  // the directory is created
  const PrepareStats stats = prepare_dataset(opt);
  EXPECT_EQ(stats.files, 2);
  EXPECT_EQ(stats.documents, 6);
  EXPECT_EQ(stats.vocab_size, 257);
  EXPECT_EQ(stats.dtype, TokenDType::u16);

  IndexedDataset ds(opt.output_prefix);
  EXPECT_EQ(ds.dtype(), TokenDType::u16);
  const std::vector<Doc> expected = {{bytes_of("Hello\nworld")},
                                     {bytes_of("Second para\nline two")},
                                     {bytes_of("last")},
                                     {bytes_of("tab\there \"q\" \\ /")},
                                     {bytes_of("\xC3\xA9\xF0\x9F\x98\x80 \xC3\xA9")},
                                     {bytes_of("")}};
  EXPECT_EQ(all_documents(ds), expected);
  EXPECT_EQ(stats.tokens, ds.num_tokens());

  const std::string report = inspect_dataset(opt.output_prefix, 2);
  EXPECT_NE(report.find("uint16"), std::string::npos) << report;
  EXPECT_NE(report.find("documents   6"), std::string::npos) << report;
  EXPECT_NE(report.find("min 1 / mean"), std::string::npos) << report;
  EXPECT_NE(report.find("Hello\\nworld<eod>"), std::string::npos) << report;
  EXPECT_NE(report.find("Second para"), std::string::npos) << report;

  // Without EOD the empty JSON document has no tokens and is skipped.
  opt.append_eod = false;
  opt.output_prefix = dir / "noeod";
  const PrepareStats s2 = prepare_dataset(opt);
  EXPECT_EQ(s2.documents, 5);
  EXPECT_EQ(s2.empty_skipped, 1);
  EXPECT_EQ(all_documents(IndexedDataset(opt.output_prefix))[0], Doc{bytes_of("Hello\nworld", false)});
}

TEST(Prepare, ErrorsNameTheFileAndLineAndWriteNothing) {
  TempDir dir;
  write_text(dir / "ok.jsonl", "{\"text\": \"fine\"}\n");
  write_text(dir / "nokey.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text here\"}\n");
  write_text(dir / "broken.json", "{\"text\": \"fine\"}\n\n{\"text\": \"unterminated}\n");
  PrepareOptions opt;
  opt.output_prefix = dir / "out";

  opt.inputs = {dir / "ok.jsonl", dir / "nokey.jsonl"};
  expect_data_error([&] { prepare_dataset(opt); }, {dir / "nokey.jsonl:2", "\"text\""});
  opt.inputs = {dir / "broken.json"};
  expect_data_error([&] { prepare_dataset(opt); }, {dir / "broken.json:3", "unterminated string"});
  opt.inputs = {dir / "ok.jsonl", dir / "missing.txt"};
  expect_data_error([&] { prepare_dataset(opt); }, {dir / "missing.txt", "not found"});
  opt.inputs = {dir.path().string()};
  expect_data_error([&] { prepare_dataset(opt); }, {"not a regular file"});
  write_text(dir / "blank.txt", "\n  \n\n");
  opt.inputs = {dir / "blank.txt"};
  expect_data_error([&] { prepare_dataset(opt); }, {"no documents"});
  for (const char* f : {"out.bin", "out.idx", "out.bin.tmp", "out.idx.tmp"}) EXPECT_FALSE(fs::exists(dir / f)) << f;

  opt.inputs = {dir / "ok.jsonl"};
  try {
    parse_tokenizer_kind("wordpiece");
    ADD_FAILURE() << "unknown tokenizer accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tokenizer 'wordpiece' (supported: byte, gpt2, hf, sentencepiece)"),
              std::string::npos)
        << e.what();
  }
  // A JSONL key other than "text".
  opt.json_key = "body";
  opt.inputs = {dir / "nokey.jsonl"};
  expect_data_error([&] { prepare_dataset(opt); }, {dir / "nokey.jsonl:1", "\"body\""});
}

// An existing dataset was replaced without a word, even when it was the input (issue 30, item 3).
TEST(Prepare, AnExistingOutputIsRefusedUnlessOverwriteAndAnInputAlways) {
  TempDir dir;
  PrepareOptions opt = text_to_out(dir, "first\n\nsecond\n");
  prepare_dataset(opt);
  const std::vector<uint8_t> bin = read_bytes(dir / "out.bin"), idx = read_bytes(dir / "out.idx");

  write_text(dir / "b.txt", "other\n");
  opt.inputs = {dir / "b.txt"};
  expect_data_error([&] { prepare_dataset(opt); },
                    {"data prepare: " + (dir / "out.bin") + " already exists; pass --overwrite to replace it"});
  EXPECT_EQ(read_bytes(dir / "out.bin"), bin);
  fs::remove(dir / "out.bin");  // the index alone is refused too
  expect_data_error([&] { prepare_dataset(opt); }, {dir / "out.idx", "already exists"});
  EXPECT_EQ(read_bytes(dir / "out.idx"), idx);
  opt.overwrite = true;
  EXPECT_EQ(prepare_dataset(opt).documents, 1);
  EXPECT_EQ(all_documents(IndexedDataset(opt.output_prefix)).size(), 1u);

  // An output file that is an input is refused even with overwrite, however the input is spelled.
  write_bytes(dir / "in.bin", {'t', 'e', 'x', 't'});
  opt.inputs = {dir / "b.txt", dir / "sub/../in.bin"};
  fs::create_directories(dir / "sub");
  opt.output_prefix = dir / "in";
  expect_data_error([&] { prepare_dataset(opt); }, {"data prepare: the output " + (dir / "in.bin") + " is the input " +
                                                    (dir / "sub/../in.bin") + "; writing it would destroy the input"});
  fs::create_symlink(dir / "b.txt", dir / "link.tokenizer.yaml");
  opt.output_prefix = dir / "link";
  expect_data_error([&] { prepare_dataset(opt); }, {dir / "link.tokenizer.yaml", "is the input " + (dir / "b.txt")});
  EXPECT_EQ(read_bytes(dir / "in.bin"), (std::vector<uint8_t>{'t', 'e', 'x', 't'}));
}

// ------------------------------------------------------------------------------------------------ splits and blends
// Golden values from tests/interop/megatron_split_blend_reference.py, a copy in behaviour of megatron-core 0.16.1's
// split and blend rules (the script names the source files).

struct SplitGolden {
  std::vector<double> weights;
  int64_t n;
  std::array<int64_t, 6> ranges;
};
struct BlendGolden {
  std::vector<double> weights;
  int64_t target;
  std::vector<int64_t> sizes, counts, first;
  std::vector<double> normalized;  // normalize(normalize(weights)), as BlendedDataset holds them
};

TEST(SplitRanges, MatchesMegatronCoreGoldenValues) {
  const std::vector<SplitGolden> splits = {
#define MT_SPLIT_GOLDEN
#include "megatron_split_golden.inc"
#undef MT_SPLIT_GOLDEN
  };
  ASSERT_GT(splits.size(), 500u);
  for (const SplitGolden& g : splits) {
    auto r = split_ranges(g.n, g.weights);
    const std::array<int64_t, 6> got = {r[0].first, r[0].second, r[1].first, r[1].second, r[2].first, r[2].second};
    EXPECT_EQ(got, g.ranges) << "split [" << fmt::format("{}", fmt::join(g.weights, ", ")) << "] of " << g.n;
  }
}

TEST(Blend, MatchesMegatronCoreGoldenValues) {
  const std::vector<BlendGolden> blends = {
#define MT_BLEND_GOLDEN
#include "megatron_split_golden.inc"
#undef MT_BLEND_GOLDEN
  };
  ASSERT_GE(blends.size(), 6u);
  for (const BlendGolden& g : blends) {
    SCOPED_TRACE(fmt::format("blend [{}] of {}", fmt::join(g.weights, ", "), g.target));
    const std::vector<double> w = normalize_blend_weights(g.weights);
    EXPECT_EQ(blend_sizes(w, g.target), g.sizes);
    const std::vector<double> w2 = normalize_blend_weights(w);
    ASSERT_EQ(w2.size(), g.normalized.size());
    for (size_t i = 0; i < w2.size(); ++i) EXPECT_EQ(w2[i], g.normalized[i]) << "weight " << i;  // bit-exact
    BlendIndex index(w2);
    const int64_t size = std::accumulate(g.sizes.begin(), g.sizes.end(), int64_t{0});
    EXPECT_EQ(index.counts(size), g.counts);
    for (size_t i = 0; i < g.first.size(); ++i) EXPECT_EQ(index.at(static_cast<int64_t>(i)).first, g.first[i]) << i;
  }
}

TEST(Blend, IndexIsTheGreedyRuleAcrossBlocks) {
  // at() decodes blocks of kBlock from checkpoints; it must agree with one straight pass, in any access order.
  const std::vector<double> w = normalize_blend_weights({0.3, 0.2, 0.5});
  const int64_t n = 3 * BlendIndex::kBlock + 17;
  std::vector<int64_t> taken(3, 0);
  std::vector<std::pair<int, int64_t>> want;
  for (int64_t g = 0; g < n; ++g) {
    const double x = std::max(static_cast<double>(g), 1.0);
    int best = 0;
    for (int d = 1; d < 3; ++d)
      if (w[d] * x - static_cast<double>(taken[d]) > w[best] * x - static_cast<double>(taken[best])) best = d;
    want.emplace_back(best, taken[best]++);
  }
  BlendIndex index(w);
  for (int64_t g = n - 1; g >= 0; g -= 997) EXPECT_EQ(index.at(g), want[static_cast<size_t>(g)]) << g;
  for (int64_t g = 0; g < n; ++g) ASSERT_EQ(index.at(g), want[static_cast<size_t>(g)]) << g;
  EXPECT_EQ(index.counts(n), taken);
  EXPECT_THROW(normalize_blend_weights({0.5, 0}), std::invalid_argument);
  EXPECT_THROW(normalize_blend_weights({}), std::invalid_argument);
  // Weights whose sum overflows made every share 0 (issue 30, item 12): refused.
  EXPECT_THROW(normalize_blend_weights({1e308, 1e308}), std::invalid_argument);
}

TEST(TokenStream, SequenceRangesCutInsideDocuments) {
  // megatron-core splits GPT data by sequence: a part of sequences [2, 5) starts and ends inside documents.
  TempDir dir;
  IndexedDatasetWriter w(dir / "m", TokenDType::u16);
  w.add_document(Doc{{1, 2}, {3}});     // sequences 0, 1
  w.add_document(Doc{{4, 5}, {6, 7}});  // sequences 2, 3
  w.add_document(Doc{{8}, {9, 10}});    // sequences 4, 5
  w.finish();
  auto d = std::make_shared<const IndexedDataset>(dir / "m");
  TokenStream stream({{d, 2, 5, TokenStream::Unit::sequences}});
  ASSERT_EQ(stream.num_tokens(), 5);
  std::vector<int32_t> out(5);
  stream.read(0, out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 5, 6, 7, 8}));
  EXPECT_THROW(TokenStream({{d, 2, 7, TokenStream::Unit::sequences}}), DataError);
}

}  // namespace
}  // namespace mt
