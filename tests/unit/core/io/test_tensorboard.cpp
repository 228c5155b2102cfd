// test_tensorboard.cpp: TensorBoard event files read back: TFRecord framing and its CRC-32C, the Event and
// Summary protobuf fields (decoded here by a separate small reader), and TensorBoard's own EventAccumulator.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/io/crc.h"
#include "core/io/tensorboard.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/source_root.h"
#include "tests/unit/temp_dir.h"

using namespace mt;

namespace {

// ---- an independent reader of the records and of the few protobuf fields written ----

struct Record {
  std::string data;
  bool length_crc_ok = false, data_crc_ok = false;
};

template <class U>
U little_endian(const std::string& s, size_t at) {
  U v = 0;
  for (size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<unsigned char>(s.at(at + i))) << (8 * i);
  return v;
}

std::vector<Record> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Record> out;
  size_t at = 0;
  while (at < bytes.size()) {
    Record r;
    const auto length = little_endian<uint64_t>(bytes, at);
    r.length_crc_ok = little_endian<uint32_t>(bytes, at + 8) == masked_crc32c(bytes.data() + at, 8);
    r.data = bytes.substr(at + 12, length);
    EXPECT_EQ(r.data.size(), length) << "a record is cut short";
    r.data_crc_ok = little_endian<uint32_t>(bytes, at + 12 + length) == masked_crc32c(r.data.data(), r.data.size());
    out.push_back(r);
    at += 12 + length + 4;
  }
  EXPECT_EQ(at, bytes.size()) << "bytes after the last record";
  return out;
}

// The fields of one message: field number -> raw value (varints and fixed values as integers, bytes as text).
struct Field {
  uint32_t number = 0, type = 0;
  uint64_t integer = 0;
  std::string bytes;
};

std::vector<Field> decode(const std::string& m) {
  std::vector<Field> fields;
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(m.at(at++));
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < m.size()) {
    const uint64_t key = varint();
    Field f{.number = static_cast<uint32_t>(key >> 3), .type = static_cast<uint32_t>(key & 7)};
    if (f.type == 0) {
      f.integer = varint();
    } else if (f.type == 1) {
      f.integer = little_endian<uint64_t>(m, at), at += 8;
    } else if (f.type == 5) {
      f.integer = little_endian<uint32_t>(m, at), at += 4;
    } else if (f.type == 2) {
      const uint64_t n = varint();
      f.bytes = m.substr(at, n), at += n;
    } else {
      ADD_FAILURE() << "unexpected wire type " << f.type;
      break;
    }
    fields.push_back(f);
  }
  return fields;
}

const Field* field(const std::vector<Field>& fs, uint32_t number) {
  for (const Field& f : fs)
    if (f.number == number) return &f;
  return nullptr;
}

struct Scalar {
  double wall_time = 0;
  int64_t step = 0;
  std::string tag;
  float value = 0;
};

// An Event holding one scalar Summary.Value: wall_time = 1, step = 2, summary = 5 {value = 1 {tag = 1,
// simple_value = 2}}.
Scalar scalar_of(const std::string& event) {
  const auto e = decode(event);
  Scalar s;
  if (const Field* w = field(e, 1)) s.wall_time = std::bit_cast<double>(w->integer);
  if (const Field* st = field(e, 2)) s.step = static_cast<int64_t>(st->integer);
  const Field* summary = field(e, 5);
  if (!summary) {
    ADD_FAILURE() << "no summary";
    return s;
  }
  const auto values = decode(summary->bytes);
  EXPECT_EQ(values.size(), 1u);
  const auto v = decode(field(values, 1)->bytes);
  s.tag = field(v, 1)->bytes;
  EXPECT_EQ(field(v, 2)->type, 5u);
  s.value = std::bit_cast<float>(static_cast<uint32_t>(field(v, 2)->integer));
  return s;
}

std::string only_file_in(const std::filesystem::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? "" : files[0];
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::string ramp(32, '\0');
  for (int i = 0; i < 32; ++i) ramp[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(ramp.data(), ramp.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c("", 0), 0u);
}

// The dataset checksums stream a .bin through crc32c_extend; where the CPU has SSE4.2 the CRC comes from its
// instruction, elsewhere from the tables: the two, and any split of the bytes, give the same CRC.
TEST(Crc32c, ExtendingAndBothImplementationsAgree) {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 7919u) >> 3);
  for (size_t begin : {0u, 1u, 3u, 8u})
    for (size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 500u, 991u}) {
      const char* p = bytes.data() + begin;
      EXPECT_EQ(crc32c(p, n), crc32c_portable(p, n)) << begin << " " << n;
      for (size_t cut : {size_t{0}, n / 3, n})
        EXPECT_EQ(crc32c_extend(crc32c(p, cut), p + cut, n - cut), crc32c(p, n)) << begin << " " << n << " " << cut;
    }
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xE3069283u);
}

TEST(TensorBoardWriter, RecordsReadBackWithTheirCrcsTagsStepsAndValues) {
  mt::testing_util::TempDir tmp("tensorboard");
  const std::string dir = tmp / "run/tb";  // created by the writer
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.scalar("lm-loss-training/loss", 1, 10.5f, 1700000000.25);
    w.scalar("learning-rate", 1, 3e-4f, 1700000000.25);
    w.scalar("lm-loss-training/loss", 2, 9.75f, 1700000001.5);
    w.scalar("big step", int64_t{1} << 40, -0.0f, 1700000002.0);
    w.scalar("step zero", 0, std::numeric_limits<float>::infinity(), 1700000003.0);
    w.flush();
  }
  EXPECT_EQ(path, only_file_in(dir));
  const std::string name = std::filesystem::path(path).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;

  const std::vector<Record> records = read_records(path);
  ASSERT_EQ(records.size(), 6u);
  for (const Record& r : records) EXPECT_TRUE(r.length_crc_ok && r.data_crc_ok);
  // The first record says which format follows, as TensorFlow's writers do.
  const auto first = decode(records[0].data);
  ASSERT_NE(field(first, 3), nullptr);
  EXPECT_EQ(field(first, 3)->bytes, "brain.Event:2");
  EXPECT_GT(std::bit_cast<double>(field(first, 1)->integer), 1.6e9);  // now, in seconds

  const Scalar a = scalar_of(records[1].data), b = scalar_of(records[2].data), c = scalar_of(records[3].data),
               d = scalar_of(records[4].data), e = scalar_of(records[5].data);
  EXPECT_EQ(a.tag, "lm-loss-training/loss");
  EXPECT_EQ(a.step, 1);
  EXPECT_EQ(a.value, 10.5f);
  EXPECT_EQ(a.wall_time, 1700000000.25);
  EXPECT_EQ(b.tag, "learning-rate");
  EXPECT_EQ(b.value, 3e-4f);
  EXPECT_EQ(c.step, 2);
  EXPECT_EQ(c.value, 9.75f);
  EXPECT_EQ(c.wall_time, 1700000001.5);
  EXPECT_EQ(d.tag, "big step");
  EXPECT_EQ(d.step, int64_t{1} << 40);
  EXPECT_TRUE(std::signbit(d.value));
  EXPECT_EQ(e.step, 0);  // left out, as proto3 does, and read back as 0
  EXPECT_TRUE(std::isinf(e.value));
}

TEST(TensorBoardWriter, EachWriterStartsItsOwnFile) {
  mt::testing_util::TempDir tmp("tensorboard");
  TensorBoardWriter a(tmp / "tb");
  TensorBoardWriter b(tmp / "tb");  // a resumed run in the same second
  EXPECT_NE(a.path(), b.path());
}

TEST(TensorBoardWriter, AnUncreatableDirectoryIsAnErrorNamingIt) {
  mt::testing_util::TempDir tmp("tensorboard");
  std::ofstream(tmp / "file") << "x";
  try {
    TensorBoardWriter w(tmp / "file/tb");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_CONTAINS(std::string(e.what()), tmp / "file/tb");
  }
}

// The tensorboard package's own reader, in the interop Python that scripts/python-env.sh makes in the build folder
// (build/interop-venv, beside this test's build/tests/; MEGATRAIN_INTEROP_PYTHON names another); skipped with a
// message without it.
TEST(TensorBoardWriter, EventAccumulatorReadsTheScalars) {
  const char* env = std::getenv("MEGATRAIN_INTEROP_PYTHON");
  std::error_code ec;
  const std::string python = env && *env
                                 ? std::string(env)
                                 : (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().parent_path() /
                                    "interop-venv" / "bin" / "python")
                                       .string();
  if (!std::filesystem::exists(python))
    GTEST_SKIP() << "no interop Python at " << python << " (scripts/python-env.sh makes it; scripts/test.sh does)";
  ASSERT_EQ(std::system((python + " -c 'import tensorboard'").c_str()), 0)
      << python << " cannot import tensorboard (scripts/python-env.sh installs tests/interop/requirements.txt)";
  mt::testing_util::TempDir tmp("tensorboard");
  {
    TensorBoardWriter w(tmp / "tb");
    for (int step = 1; step <= 3; ++step) {
      w.scalar("lm-loss-training/loss", step, 10.0f / static_cast<float>(step), 1700000000.0 + step);
      w.scalar("learning-rate", step, 1e-4f * static_cast<float>(step), 1700000000.0 + step);
    }
    w.flush();
  }
  const std::string out = tmp / "scalars.txt";
  const std::string cmd = python + " " + mt::testing_util::source_path("tests/interop/tensorboard_read.py") + " " +
                          (tmp / "tb") + " > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << cmd << "\n" << text;
  // EventAccumulator gives each value as the Python float of the stored float32, sorted by tag then step.
  std::istringstream lines(text);
  for (const char* tag : {"learning-rate", "lm-loss-training/loss"}) {
    for (int step = 1; step <= 3; ++step) {
      std::string got_tag;
      int64_t got_step = 0;
      double value = 0, wall_time = 0;
      ASSERT_TRUE(lines >> got_tag >> got_step >> value >> wall_time) << text;
      const float want =
          std::string(tag) == "learning-rate" ? 1e-4f * static_cast<float>(step) : 10.0f / static_cast<float>(step);
      EXPECT_EQ(got_tag, tag);
      EXPECT_EQ(got_step, step);
      EXPECT_EQ(value, static_cast<double>(want));
      EXPECT_EQ(wall_time, 1700000000.0 + step);
    }
  }
  std::string rest;
  EXPECT_FALSE(lines >> rest) << "more scalars than written: " << text;
}
