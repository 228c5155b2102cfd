// test_checkpoint.cpp: the checkpoint format, its commit protocol, the reader, the safetensors writer and
// the Hugging Face export.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "tests/unit/file_text.h"
#include "app/cli/commands.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/checkpoint/save_dir.h"
#include "app/train/checkpointing.h"
#include "app/train/train_state.h"
#include "core/hf/hf_export.h"
#include "core/hf/hf_tokenizer_export.h"
#include "core/hf/safetensors.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

// ---- helpers ------------------------------------------------------------------------------------------

std::vector<float> iota(int64_t n, float base, float step = 0.25f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

Tensor make(const Shape& shape, DType dtype, float base) {
  return Tensor::from_floats(iota(shape_numel(shape), base), shape, dtype);
}

// Row-major sub-block of a (R, K) value list.
std::vector<float> block(const std::vector<float>& all, int64_t K, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; ++c) out.push_back(all[r * K + c]);
  return out;
}

using testing_util::slurp;
using testing_util::spit;

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool has_tmp_entries(const std::string& dir) {
  for (const auto& n : listing(dir))
    if (n.rfind(".tmp.", 0) == 0) return true;
  return false;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

CheckpointState state_at(int64_t iteration) {
  CheckpointState s;
  s.iteration = iteration;
  s.config_yaml = "model:\n  num_layers: 2\n  hidden_size: 8\ntraining:\n  seed: 1234\n";
  s.values = {{"consumed_samples", std::to_string(iteration * 8)}, {"loss_scale", "65536"}, {"rng", "1234"}};
  return s;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = (fs::temp_directory_path() / ("mt_ckpt_" + std::to_string(::getpid()) + "_" + info->name())).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
    save_ = root_ + "/save";
  }
  void TearDown() override {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(root_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_directory()) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(root_, ec);
  }
  std::string latest() const { return slurp(save_ + "/latest"); }

  std::string root_, save_;
};

// ---- CRC and the basic round trip ----------------------------------------------------------------------

TEST(Crc32, MatchesTheIeeeCheckValueAndChains) {
  const char* s = "123456789";
  EXPECT_EQ(crc32(s, 9), 0xCBF43926u);
  EXPECT_EQ(crc32(s + 4, 5, crc32(s, 4)), 0xCBF43926u);
  EXPECT_EQ(crc32(s, 0), 0u);
  std::vector<unsigned char> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 7 + 3);
  uint32_t bytewise = 0;  // the slicing-by-8 loop agrees with byte-at-a-time chaining
  for (unsigned char c : big) bytewise = crc32(&c, 1, bytewise);
  EXPECT_EQ(crc32(big.data() + 1, big.size() - 1, crc32(big.data(), 1)), bytewise);
}

TEST_F(CheckpointTest, RoundTripsTensorsOfEveryDtypeAndTheState) {
  std::vector<TensorSlice> ts = {
      {"model.w", {3, 4}, {}, make({3, 4}, DType::f32, 1.f)},
      {"model.b", {5}, {}, make({5}, DType::bf16, -2.f)},
      {"model.h", {2, 3, 2}, {}, make({2, 3, 2}, DType::f16, 0.5f)},
      {"data.ids", {4}, {}, Tensor::from_ints(std::vector<int32_t>{7, -1, 1 << 30, 3}, {4})},
      {"data.count", {2}, {}, make({2}, DType::i64, 0.f)},
      {"scalar", {}, {}, Tensor::from_floats(std::vector<float>{3.5f}, {})},
  };
  ts[4].data.data<int64_t>()[1] = int64_t{1} << 40;
  CheckpointState st = state_at(100);
  std::string dir = save_checkpoint(save_, st, ts, 0);
  EXPECT_EQ(dir, save_ + "/iter_0000100");
  EXPECT_EQ(latest(), "iter_0000100\n");
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"metadata.yaml", "rank_00000.bin"}));

  CheckpointReader r(dir);
  EXPECT_EQ(r.state().iteration, 100);
  EXPECT_EQ(r.state().values, st.values);
  EXPECT_EQ(r.state().config_yaml, st.config_yaml);
  ASSERT_EQ(r.tensors().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo& info = r.tensors()[i];
    EXPECT_EQ(info.name, ts[i].name);
    EXPECT_EQ(info.dtype, ts[i].data.dtype());
    EXPECT_EQ(info.global_shape, ts[i].global_shape);
    Tensor back = Tensor::empty(ts[i].global_shape, info.dtype);
    r.read(info.name, back);
    EXPECT_EQ(std::memcmp(back.raw(), ts[i].data.raw(), back.nbytes()), 0) << info.name;
  }
  EXPECT_EQ(r.num_slices("model.w"), 1u);
  EXPECT_FALSE(r.has("model.nope"));
  EXPECT_NE(error_of([&] { r.info("model.nope"); }).find("model.nope"), std::string::npos);

  // Reads convert: f32 stored -> bf16 out rounds, bf16 stored -> f32 out is exact.
  Tensor as_bf16 = Tensor::empty({3, 4}, DType::bf16);
  r.read("model.w", as_bf16);
  auto w = iota(12, 1.f);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(as_bf16.to_floats()[i], round_to(DType::bf16, w[i]));
  Tensor as_f32 = Tensor::empty({5}, DType::f32);
  r.read("model.b", as_f32);
  EXPECT_EQ(as_f32.to_floats(), ts[1].data.to_floats());
  r.verify_all();
}

TEST_F(CheckpointTest, KeepsConfigTextThatALiteralBlockCannotHold) {
  for (std::string config : {std::string("  leading: spaces\n"), std::string("a: 1\n\n\n"), std::string(""),
                             std::string("no newline at end"), std::string("tab:\t\"quoted\" \\ back\n")}) {
    CheckpointState st = state_at(1);
    st.config_yaml = config;
    st.values["weird key: x"] = "value with : colon and 'quotes'\nand a newline";
    CheckpointReader r(save_checkpoint(save_, st, {}, 0));
    EXPECT_EQ(r.state().config_yaml, config);
    EXPECT_EQ(r.state().values, st.values);
  }
}

// ---- regions and slices --------------------------------------------------------------------------------

TEST_F(CheckpointTest, ReadsAnySubRegion) {
  auto all = iota(48, 0.f);
  save_checkpoint(save_, state_at(1), {{"t", {8, 6}, {}, Tensor::from_floats(all, {8, 6})}}, 0);
  CheckpointReader r(save_ + "/iter_0000001");
  Tensor part = Tensor::empty({3, 4}, DType::f32);
  r.read("t", part, {2, 1});
  EXPECT_EQ(part.to_floats(), block(all, 6, 2, 3, 1, 4));
  Tensor corner = Tensor::empty({1, 1}, DType::f32);
  r.read("t", corner, {7, 5});
  EXPECT_EQ(corner.item(), all[47]);
  Tensor outside = Tensor::empty({2, 6}, DType::f32);
  EXPECT_NE(error_of([&] { r.read("t", outside, {7, 0}); }).find("outside"), std::string::npos);
  Tensor wrong_rank = Tensor::empty({48}, DType::f32);
  EXPECT_NE(error_of([&] { r.read("t", wrong_rank); }).find("dimensions"), std::string::npos);
}

TEST_F(CheckpointTest, AssemblesRegionsFromRowBlocks) {
  auto all = iota(48, 0.f);
  std::vector<TensorSlice> ts = {
      {"t", {8, 6}, {0, 0}, Tensor::from_floats(block(all, 6, 0, 4, 0, 6), {4, 6})},
      {"t", {8, 6}, {4, 0}, Tensor::from_floats(block(all, 6, 4, 4, 0, 6), {4, 6}, DType::f32)},
  };
  CheckpointReader r(save_checkpoint(save_, state_at(2), ts, 0));
  ASSERT_EQ(r.tensors().size(), 1u);
  EXPECT_EQ(r.num_slices("t"), 2u);
  Tensor whole = Tensor::empty({8, 6}, DType::f32);
  r.read("t", whole);
  EXPECT_EQ(whole.to_floats(), all);
  Tensor across = Tensor::empty({4, 4}, DType::f32);  // rows 2..5 span both blocks
  r.read("t", across, {2, 1});
  EXPECT_EQ(across.to_floats(), block(all, 6, 2, 4, 1, 4));
  for (int64_t c0 : {0, 3}) {  // read back as column blocks
    Tensor col = Tensor::empty({8, 3}, DType::f32);
    r.read("t", col, {0, c0});
    EXPECT_EQ(col.to_floats(), block(all, 6, 0, 8, c0, 3));
  }
}

TEST_F(CheckpointTest, AssemblesRegionsFromColumnBlocksAndMixedDtypes) {
  auto all = iota(48, 0.f);
  std::vector<TensorSlice> ts = {
      {"t", {8, 6}, {0, 3}, Tensor::from_floats(block(all, 6, 0, 8, 3, 3), {8, 3}, DType::bf16)},
      {"t", {8, 6}, {0, 0}, Tensor::from_floats(block(all, 6, 0, 8, 0, 3), {8, 3}, DType::bf16)},
  };
  CheckpointReader r(save_checkpoint(save_, state_at(3), ts, 0));
  Tensor whole = Tensor::empty({8, 6}, DType::f32);
  r.read("t", whole);
  EXPECT_EQ(whole.to_floats(), all);  // quarter steps below 12 are exact in bf16
  for (int64_t r0 : {0, 4}) {
    Tensor rows = Tensor::empty({4, 6}, DType::f16);
    r.read("t", rows, {r0, 0});
    EXPECT_EQ(rows.to_floats(), block(all, 6, r0, 4, 0, 6));
  }
  // Two slices of one tensor must agree on dtype.
  ts[1].data = Tensor::from_floats(block(all, 6, 0, 8, 0, 3), {8, 3}, DType::f32);
  EXPECT_NE(error_of([&] { save_checkpoint(save_, state_at(4), ts, 0); }).find("elsewhere"), std::string::npos);
  EXPECT_FALSE(has_tmp_entries(save_));
}

TEST_F(CheckpointTest, RejectsRegionsTheSlicesDoNotCover) {
  auto all = iota(48, 0.f);
  CheckpointReader r(save_checkpoint(
      save_, state_at(1), {{"t", {8, 6}, {0, 0}, Tensor::from_floats(block(all, 6, 0, 4, 0, 6), {4, 6})}}, 0));
  Tensor top = Tensor::empty({4, 6}, DType::f32);
  r.read("t", top);
  EXPECT_EQ(top.to_floats(), block(all, 6, 0, 4, 0, 6));
  Tensor whole = Tensor::empty({8, 6}, DType::f32);
  std::string msg = error_of([&] { r.read("t", whole); });
  EXPECT_NE(msg.find("not fully covered"), std::string::npos) << msg;
  EXPECT_NE(msg.find("24 of 48"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, RejectsOverlappingOrOutOfBoundsSlices) {
  auto a = make({4, 6}, DType::f32, 0.f);
  std::string msg = error_of([&] {
    save_checkpoint(save_, state_at(1), {{"t", {8, 6}, {0, 0}, a}, {"t", {8, 6}, {2, 0}, a}}, 0);
  });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  msg = error_of([&] { save_checkpoint(save_, state_at(1), {{"t", {8, 6}, {6, 0}, a}}, 0); });
  EXPECT_NE(msg.find("outside the global shape"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(save_ + "/latest"));
  EXPECT_FALSE(has_tmp_entries(save_));
}

TEST_F(CheckpointTest, RanksWriteTheirOwnFilesAndRankZeroMerges) {
  auto all = iota(48, 0.f);
  std::string tmp = begin_checkpoint(save_, 9);
  write_rank_files(tmp, 1,
                   {{"t", {8, 6}, {4, 0}, Tensor::from_floats(block(all, 6, 4, 4, 0, 6), {4, 6})},
                    {"only1", {2}, {}, make({2}, DType::f32, 5.f)}});
  write_rank_files(tmp, 0, {{"t", {8, 6}, {0, 0}, Tensor::from_floats(block(all, 6, 0, 4, 0, 6), {4, 6})}});
  std::string dir = commit_checkpoint(save_, tmp, state_at(9), 2, 0);
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"metadata.yaml", "rank_00000.bin", "rank_00001.bin"}));
  CheckpointReader r(dir);
  EXPECT_EQ(r.tensors().at(0).name, "t");  // rank 0's tensors first
  Tensor whole = Tensor::empty({8, 6}, DType::f32);
  r.read("t", whole);
  EXPECT_EQ(whole.to_floats(), all);
  r.verify_all();

  // Ranks that disagree on a tensor's global shape cannot be merged.
  tmp = begin_checkpoint(save_, 10);
  write_rank_files(tmp, 0, {{"t", {8, 6}, {0, 0}, make({4, 6}, DType::f32, 0.f)}});
  write_rank_files(tmp, 1, {{"t", {8, 7}, {4, 0}, make({4, 7}, DType::f32, 0.f)}});
  std::string msg = error_of([&] { commit_checkpoint(save_, tmp, state_at(10), 2, 0); });
  EXPECT_NE(msg.find("rank_00001.index.yaml"), std::string::npos) << msg;
  abort_checkpoint(tmp);
  EXPECT_FALSE(has_tmp_entries(save_));
  EXPECT_EQ(latest(), "iter_0000009\n");
}

// ---- corruption and bad metadata -----------------------------------------------------------------------

TEST_F(CheckpointTest, FlippedByteIsAChecksumErrorNamingTheTensor) {
  std::string dir = save_checkpoint(
      save_, state_at(5),
      {{"model.a", {16}, {}, make({16}, DType::f32, 0.f)}, {"model.b", {4, 4}, {}, make({4, 4}, DType::f32, 100.f)}},
      0);
  // model.a fills bytes [0, 64); model.b starts at the next 64-byte boundary.
  std::string bin = slurp(dir + "/rank_00000.bin");
  ASSERT_EQ(bin.size(), 128u);
  bin[64 + 17] ^= 0x01;
  spit(dir + "/rank_00000.bin", bin);

  CheckpointReader r(dir);  // opening checks structure only
  Tensor a = Tensor::empty({16}, DType::f32);
  r.read("model.a", a);  // untouched slices still read
  Tensor b = Tensor::empty({2, 2}, DType::f32);
  std::string msg = error_of([&] { r.read("model.b", b, {1, 1}); });
  EXPECT_NE(msg.find("checksum mismatch in tensor model.b"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir + "/rank_00000.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  msg = error_of([&] { r.verify_all(); });
  EXPECT_NE(msg.find("model.b"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, TruncatedDataFileFailsOnOpen) {
  std::string dir = save_checkpoint(save_, state_at(5), {{"model.a", {100}, {}, make({100}, DType::f32, 0.f)}}, 0);
  fs::resize_file(dir + "/rank_00000.bin", 200);
  std::string msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find(dir + "/rank_00000.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  fs::remove(dir + "/rank_00000.bin");
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("data file missing"), std::string::npos) << msg;
}

// A caller that handles "a file problem" catches FileError: a checkpoint's errors are among them.
TEST_F(CheckpointTest, ACheckpointErrorIsAFileError) {
  try {
    CheckpointReader r(save_ + "/nowhere");
    ADD_FAILURE() << "opened a missing checkpoint";
  } catch (const FileError& e) {
    EXPECT_NE(dynamic_cast<const CheckpointError*>(&e), nullptr) << e.what();
    EXPECT_NE(std::string(e.what()).find(save_ + "/nowhere"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, MissingOrBadMetadataIsNamed) {
  std::string dir = save_checkpoint(save_, state_at(5), {{"model.a", {4, 2}, {}, make({4, 2}, DType::f32, 0.f)}}, 0);
  const std::string meta = dir + "/metadata.yaml";
  const std::string good = slurp(meta);
  auto expect_error = [&](const std::string& text, const std::string& needle, std::string file = "") {
    spit(meta, text);
    std::string msg = error_of([&] { CheckpointReader r(dir); });
    EXPECT_NE(msg.find(file.empty() ? meta : file), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  expect_error("tensors: [{{{ : ]\n", "invalid YAML");
  expect_error("- just\n- a list\n", "expected a YAML map");
  YAML::Node n = YAML::Load(good);
  // The structural checks hold for unsealed (older) files too; a sealed file's edits fail the checksum first.
  n.remove("metadata_crc32");
  auto edited = [&](auto&& edit) {
    YAML::Node c = YAML::Clone(n);
    edit(c);
    YAML::Emitter e;
    e << c;
    return std::string(e.c_str());
  };
  expect_error(edited([](YAML::Node& c) { c.remove("iteration"); }), "missing field 'iteration'");
  expect_error(edited([](YAML::Node& c) { c["format_version"] = 99; }), "format_version 99");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["dtype"] = "q7"; }), "unknown dtype");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["slices"][0].remove("crc32"); }), "crc32");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["slices"][0]["extent"][0] = 5; }),
               "outside the global shape");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["slices"][0]["extent"][1] = 1; }), "do not hold");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["slices"][0]["offset"] = 64; }), "truncated",
               dir + "/rank_00000.bin");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["slices"][0]["file"] = "../x.bin"; }), "bad data file name");
  expect_error(edited([](YAML::Node& c) { c["tensors"][0]["shape"] = "big"; }), "list of integers");

  fs::remove(meta);
  std::string msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find(meta + ": missing"), std::string::npos) << msg;
  msg = error_of([&] { CheckpointReader r(root_ + "/nowhere"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

// ---- the commit protocol -------------------------------------------------------------------------------

TEST_F(CheckpointTest, SaveDirUnderARegularFileFailsEarly) {
  // A parent that is a regular file fails for every user, root included.
  spit(root_ + "/file", "x");
  std::string msg = error_of([&] { check_save_dir_writable(root_ + "/file/ckpt"); });
  EXPECT_NE(msg.find(root_ + "/file/ckpt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Not a directory"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { save_checkpoint(root_ + "/file/ckpt", state_at(1), {}, 0); }).find("Not a directory"),
            std::string::npos);
  check_save_dir_writable(save_ + "/deeper/still");  // creates what is missing
  EXPECT_TRUE(fs::is_directory(save_ + "/deeper/still"));
  EXPECT_TRUE(listing(save_ + "/deeper/still").empty());  // the probe file is gone
}

TEST_F(CheckpointTest, ReadOnlySaveDirFailsEarly) {
  // Only meaningful where permission bits bind (not as root; the test above covers root).
  fs::create_directories(save_);
  ::chmod(save_.c_str(), 0500);
  if (::access(save_.c_str(), W_OK) == 0) GTEST_SKIP() << "running as root: permission bits do not bind";
  std::string msg = error_of([&] { check_save_dir_writable(save_); });
  EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
  EXPECT_NE(msg.find(save_), std::string::npos) << msg;
}

TEST_F(CheckpointTest, FailedSaveLeavesThePreviousCheckpointAndLatest) {
  auto small = make({4}, DType::f32, 1.f);
  save_checkpoint(save_, state_at(10), {{"model.a", {4}, {}, small}}, 0);
  auto previous_intact = [&] {
    EXPECT_EQ(latest(), "iter_0000010\n");
    CheckpointReader r(save_ + "/iter_0000010");
    r.verify_all();
    Tensor a = Tensor::empty({4}, DType::f32);
    r.read("model.a", a);
    EXPECT_EQ(a.to_floats(), small.to_floats());
    EXPECT_FALSE(has_tmp_entries(save_)) << ::testing::PrintToString(listing(save_));
  };

  // A file where the new checkpoint directory must go: fails after everything was written and verified.
  spit(save_ + "/iter_0000020", "in the way");
  std::string msg = error_of([&] { save_checkpoint(save_, state_at(20), {{"model.a", {4}, {}, small}}, 0); });
  EXPECT_NE(msg.find(save_ + "/iter_0000020"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
  previous_intact();
  fs::remove(save_ + "/iter_0000020");

  // The disk "fills up" midway through the data file (a file size limit binds even for root).
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tiny = old;
  tiny.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tiny), 0);
  msg = error_of([&] {
    save_checkpoint(save_, state_at(30), {{"model.big", {4096}, {}, make({4096}, DType::f32, 0.f)}}, 0);
  });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("rank_00000.bin: write failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
  EXPECT_NE(msg.find("iteration 30"), std::string::npos) << msg;
  previous_intact();
  EXPECT_FALSE(fs::exists(save_ + "/iter_0000030"));

  // Permission denied inside the save dir (only where permission bits bind).
  ::chmod(save_.c_str(), 0500);
  if (::access(save_.c_str(), W_OK) != 0) {
    msg = error_of([&] { save_checkpoint(save_, state_at(40), {{"model.a", {4}, {}, small}}, 0); });
    EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
    ::chmod(save_.c_str(), 0755);
    previous_intact();
  }
  ::chmod(save_.c_str(), 0755);
}

TEST_F(CheckpointTest, SavingAnExistingIterationReplacesIt) {
  save_checkpoint(save_, state_at(10), {{"model.a", {4}, {}, make({4}, DType::f32, 1.f)}}, 0);
  save_checkpoint(save_, state_at(10), {{"model.a", {4}, {}, make({4}, DType::f32, 9.f)}}, 0);
  EXPECT_EQ(listing(save_), (std::vector<std::string>{"iter_0000010", "latest"}));
  CheckpointReader r(save_ + "/iter_0000010");
  Tensor a = Tensor::empty({4}, DType::f32);
  r.read("model.a", a);
  EXPECT_EQ(a.to_floats(), iota(4, 9.f));
}

TEST_F(CheckpointTest, KeepLastRemovesTheOldest) {
  for (int64_t it : {10, 20, 30, 40}) save_checkpoint(save_, state_at(it), {}, 2);
  EXPECT_EQ(listing(save_), (std::vector<std::string>{"iter_0000030", "iter_0000040", "latest"}));
  // Never the one just written, even when it is the oldest.
  save_checkpoint(save_, state_at(5), {}, 2);
  EXPECT_EQ(listing(save_), (std::vector<std::string>{"iter_0000005", "iter_0000040", "latest"}));
  EXPECT_EQ(latest(), "iter_0000005\n");
  // keep_last = 0 keeps everything.
  for (int64_t it : {50, 60, 70}) save_checkpoint(save_, state_at(it), {}, 0);
  EXPECT_EQ(listing(save_).size(), 6u);
  // Iterations beyond seven digits still sort by number.
  save_checkpoint(save_, state_at(12345678), {}, 1);
  EXPECT_EQ(listing(save_), (std::vector<std::string>{"iter_12345678", "latest"}));
}

TEST_F(CheckpointTest, StaleTemporaryEntriesAreRemovedAtTheNextSave) {
  fs::create_directories(save_ + "/.tmp.iter_0000003.99999");
  spit(save_ + "/.tmp.iter_0000003.99999/rank_00000.bin", "half written");
  spit(save_ + "/.tmp.latest.99999", "iter_0000003\n");
  // A checkpoint renamed aside by a replacement that crashed is restored, not lost.
  fs::create_directories(save_ + "/.tmp.replaced.iter_0000002.99999");
  spit(save_ + "/.tmp.replaced.iter_0000002.99999/metadata.yaml", "x");
  // Without the save_dir's lock they may be another live run's: left alone.
  save_checkpoint(save_, state_at(4), {}, 0);
  EXPECT_TRUE(fs::exists(save_ + "/.tmp.iter_0000003.99999"));
  EXPECT_TRUE(fs::exists(save_ + "/.tmp.replaced.iter_0000002.99999"));
  // The run holding the lock takes them for a crash's leftovers.
  ckpt::SaveDirLock lock(save_);
  save_checkpoint(save_, state_at(5), {}, 0);
  EXPECT_EQ(listing(save_),
            (std::vector<std::string>{".lock", "iter_0000002", "iter_0000004", "iter_0000005", "latest"}));
}

// Two runs on one save_dir used to delete each other's temporary directories.
TEST_F(CheckpointTest, SaveDirLockRefusesASecondRunNamingThePid) {
  fs::create_directories(save_);
  // Another process's lock, as an flock on another open file description holding its pid.
  const int fd = ::open((save_ + "/.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);
  std::string msg = error_of([&] { ckpt::SaveDirLock lock(save_); });
  EXPECT_NE(msg.find(save_ + ": checkpoint.save_dir is in use by another run (pid 4242)"), std::string::npos) << msg;
  EXPECT_FALSE(ckpt::SaveDirLock::held(save_));
  ::close(fd);
  {
    ckpt::SaveDirLock lock(save_);
    EXPECT_TRUE(ckpt::SaveDirLock::held(save_));
    ckpt::SaveDirLock nested(save_);  // one process nests
    EXPECT_EQ(slurp(save_ + "/.lock"), std::to_string(::getpid()) + "\n");
  }
  EXPECT_FALSE(ckpt::SaveDirLock::held(save_));
}

// ---- hostile metadata -----------------------------------------------------------------------------------

TEST_F(CheckpointTest, MetadataIsSealedAndAnEditIsRefused) {
  std::string dir = save_checkpoint(save_, state_at(10), {{"model.a", {4}, {}, make({4}, DType::f32, 1.f)}}, 0);
  const std::string meta = dir + "/metadata.yaml", text = slurp(meta);
  const size_t line = text.rfind("metadata_crc32: 0x");
  ASSERT_NE(line, std::string::npos);
  EXPECT_EQ(text.substr(line), fmt::format("metadata_crc32: 0x{:08x}\n", crc32(text.data(), line)));
  std::string edited = text;
  edited.replace(edited.find("iteration: 10"), 13, "iteration: 11");
  spit(meta, edited);
  std::string msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("metadata.yaml: checksum mismatch"), std::string::npos) << msg;
  // An older checkpoint without the line loads (with a warning).
  spit(meta, text.substr(0, line));
  EXPECT_EQ(CheckpointReader(dir).state().iteration, 10);
  // The line must be the last one.
  spit(meta, text + "extra: 1\n");
  EXPECT_NE(error_of([&] { CheckpointReader r(dir); }).find("not the last line"), std::string::npos);
}

// An offset near 2^63 made offset + bytes overflow in the size checks (a segfault on read).
TEST_F(CheckpointTest, HugeOffsetsAndShapesAreRefusedWithoutOverflow) {
  std::string dir = save_checkpoint(save_, state_at(10), {{"model.a", {4}, {}, make({4}, DType::f32, 1.f)}}, 0);
  const std::string meta = dir + "/metadata.yaml";
  std::string text = slurp(meta);
  text = text.substr(0, text.rfind("metadata_crc32:"));  // an unsealed (old-style) file: the checks still hold
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  spit(meta, with("offset: 0,", "offset: 9223372036854775000,"));
  std::string msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("offset 9223372036854775000"), std::string::npos) << msg;
  spit(meta, with("offset: 0,", "offset: 4611686018427387904,"));
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  spit(meta, with("shape: [4]", "shape: [4611686018427387904]"));
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("needs more than"), std::string::npos) << msg;
  const std::string huge = "shape: [4, 4611686018427387904, 4611686018427387904]";
  std::string t = with("shape: [4]", huge);
  t.replace(t.find("start: [0]"), 10, "start: [0, 0, 0]");
  t.replace(t.find("extent: [4]"), 11, "extent: [4, 1, 1]");
  spit(meta, t);
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("needs more than"), std::string::npos) << msg;
}

// A save_dir whose `latest` is lost used to restart at iteration 0 silently (and its first save deleted an
// older good checkpoint).
TEST_F(CheckpointTest, ResumeWithoutLatestTakesTheNewestCompleteCheckpoint) {
  EXPECT_EQ(resolve_resume_checkpoint(save_), std::nullopt);
  for (int64_t it : {5, 10, 15})
    save_checkpoint(save_, state_at(it), {{"model.a", {4}, {}, make({4}, DType::f32, 1.f)}}, 0);
  EXPECT_EQ(resolve_resume_checkpoint(save_), save_ + "/iter_0000015");
  fs::remove(save_ + "/latest");
  EXPECT_EQ(resolve_resume_checkpoint(save_), save_ + "/iter_0000015");
  // The newest is incomplete (a data file lost): passed over for the next one.
  fs::remove(save_ + "/iter_0000015/rank_00000.bin");
  EXPECT_EQ(resolve_resume_checkpoint(save_), save_ + "/iter_0000010");
  // `latest` naming a missing checkpoint falls back the same way.
  spit(save_ + "/latest", "iter_0000099\n");
  EXPECT_EQ(resolve_resume_checkpoint(save_), save_ + "/iter_0000010");
  // None complete: an error, never a fresh start.
  fs::remove(save_ + "/iter_0000010/metadata.yaml");
  fs::remove(save_ + "/iter_0000005/rank_00000.bin");
  std::string msg = error_of([&] { resolve_resume_checkpoint(save_); });
  EXPECT_NE(msg.find("none of its checkpoints"), std::string::npos) << msg;
  EXPECT_NE(msg.find("refusing to start over"), std::string::npos) << msg;
  // A checkpoint directory itself resolves to itself.
  EXPECT_EQ(resolve_resume_checkpoint(save_ + "/iter_0000015"), save_ + "/iter_0000015");
}

// Edited state values (iteration, consumed samples, optimizer steps, a "nan" loss scale) used to resume silently.
TEST(TrainState, EveryValueIsCheckedNamingTheField) {
  CheckpointState s;
  s.iteration = 10;
  s.values = {{"consumed_samples", "80"},
              {"skipped_iters", "1"},
              {"nan_iters", "0"},
              {"optimizer_steps", "9"},
              {"loss_scale", "65536"},
              {"loss_scale_growth_tracker", "3"},
              {"loss_scale_hysteresis_tracker", "2"},
              {"seed", "1234"}};
  const app::TrainState r = app::TrainState::load(s, "ck");
  EXPECT_EQ(r.consumed_samples, 80);
  EXPECT_EQ(r.optimizer_steps, 9);
  EXPECT_EQ(r.loss_scaler.scale, 65536.0);
  EXPECT_EQ(r.loss_scaler.hysteresis_tracker, 2);
  EXPECT_EQ(r.seed, 1234);
  // save writes back exactly what load read.
  CheckpointState again;
  r.save(again);
  EXPECT_EQ(again.iteration, s.iteration);
  EXPECT_EQ(again.values, s.values);
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {"loss_scale", "nan", "'loss_scale' = 'nan' is not a finite number"},
      {"loss_scale", "inf", "'loss_scale' = 'inf' is not a finite number"},
      {"loss_scale", "-1", "'loss_scale' = -1 is not positive"},
      {"consumed_samples", "-8", "'consumed_samples' = -8 is negative"},
      {"consumed_samples", "5", "less than one sample per iteration"},
      {"optimizer_steps", "1.5", "'optimizer_steps' = '1.5' is not an integer"},
      {"optimizer_steps", "8", "'optimizer_steps' = 8 plus skipped_iters = 1 is not the iteration 10"},
      {"nan_iters", "11", "'nan_iters' = 11 is more than the iteration 10"},
      {"seed", "-1", "'seed' = -1 is negative"},
  };
  for (const auto& [key, value, part] : bad) {
    CheckpointState e = s;
    e.values[key] = value;
    std::string msg = error_of([&] { app::TrainState::load(e, "ck"); });
    EXPECT_NE(msg.find(part), std::string::npos) << key << "=" << value << ": " << msg;
  }
  CheckpointState missing = s;
  missing.values.erase("seed");
  EXPECT_NE(error_of([&] { app::TrainState::load(missing, "ck"); }).find("lacks state value 'seed'"),
            std::string::npos);
}

// A checkpoint of another model shape used to resume without a word.
TEST(ResumeState, ModelShapeDifferencesNameEachKey) {
  const std::string old_cfg =
      "model:\n  arch: gpt\n  num_layers: 2\n  hidden_size: 32\n  num_heads: 4\n"
      "  ffn_hidden_size: 128\n  max_position_embeddings: 32\n  vocab_size: 257\n"
      "  tie_embeddings: true\n  dropout: 0.1\n";
  EXPECT_TRUE(app::model_shape_differences(old_cfg, old_cfg, "ck").empty());
  std::string run = old_cfg;
  for (auto [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"num_layers: 2", "num_layers: 1"},
                                                        {"num_heads: 4", "num_heads: 8"},
                                                        {"vocab_size: 257", "vocab_size: 300"},
                                                        {"tie_embeddings: true", "tie_embeddings: false"},
                                                        {"dropout: 0.1", "dropout: 0"}})
    run.replace(run.find(from), from.size(), to);
  EXPECT_EQ(app::model_shape_differences(old_cfg, run, "ck"),
            (std::vector<std::string>{"model.num_layers: 2 -> 1", "model.num_heads: 4 -> 8",
                                      "model.vocab_size: 257 -> 300", "model.tie_embeddings: true -> false"}));
  EXPECT_NE(error_of([&] { app::model_shape_differences("", run, "ck"); }).find("no model section"), std::string::npos);
  // Key/value groups: 0 or absent means one per head, so an explicit 4 equals a checkpoint without the key, and a
  // Llama with other groups or another rotary base differs.
  const std::string llama = old_cfg + "  num_query_groups: 4\n";
  EXPECT_TRUE(app::model_shape_differences(old_cfg, llama, "ck").empty());
  std::string gqa = llama;
  gqa.replace(gqa.find("num_query_groups: 4"), 19, "num_query_groups: 2");
  EXPECT_EQ(app::model_shape_differences(old_cfg, gqa + "  rotary_base: 10000\n", "ck"),
            (std::vector<std::string>{"model.num_query_groups: 4 -> 2"}));  // an old checkpoint has no rotary_base
  EXPECT_EQ(app::model_shape_differences(gqa + "  rotary_base: 10000\n", gqa + "  rotary_base: 500000\n", "ck"),
            (std::vector<std::string>{"model.rotary_base: 10000 -> 500000"}));
  // auto (written since issue 30, item 8) is the 0 of older checkpoints.
  EXPECT_TRUE(
      app::model_shape_differences(old_cfg + "  num_query_groups: 0\n", old_cfg + "  num_query_groups: auto\n", "ck")
          .empty());
}

// Configs stored before issue 30 (item 8) wrote num_query_groups' default as 0, which a config file may no longer
// say: such a checkpoint still loads (export, generate, evaluate read it through whole_model_config).
TEST_F(CheckpointTest, StoredConfigsWithZeroDefaultsStillLoad) {
  const Config c = parse_config(
      "model:\n  arch: llama\n  num_layers: 2\n  hidden_size: 64\n  num_heads: 8\n  seq_length: 16\n"
      "  vocab_size: 257\ntraining:\n  train_iters: 10\noptimizer:\n  lr: 1.0e-3\ndata:\n  synthetic: true\n",
      "t.yaml", {}, 1);
  std::string old_yaml = to_yaml(c);
  const std::string now = "  num_query_groups: auto\n";
  ASSERT_NE(old_yaml.find(now), std::string::npos) << old_yaml;
  old_yaml.replace(old_yaml.find(now), now.size(), "  num_query_groups: 0\n");
  CheckpointState st = state_at(5);
  st.config_yaml = old_yaml;
  const std::string dir = save_checkpoint(save_, st, {}, 0);
  const Config back = app::whole_model_config(CheckpointReader(dir), dir, 1, "cpu");
  EXPECT_EQ(back.model.kv_heads(), 8);
  EXPECT_EQ(back.model.ffn_hidden_size, c.model.ffn_hidden_size);
}

TEST_F(CheckpointTest, ResolvesCheckpointPaths) {
  EXPECT_EQ(resolve_checkpoint(root_ + "/missing"), std::nullopt);
  fs::create_directories(save_);
  EXPECT_EQ(resolve_checkpoint(save_), std::nullopt);
  std::string dir = save_checkpoint(save_, state_at(7), {}, 0);
  EXPECT_EQ(resolve_checkpoint(save_), dir);
  EXPECT_EQ(resolve_checkpoint(dir), dir);
  save_checkpoint(save_, state_at(8), {}, 0);
  EXPECT_EQ(resolve_checkpoint(save_), save_ + "/iter_0000008");

  spit(save_ + "/latest", "iter_0000099\n");
  std::string msg = error_of([&] { resolve_checkpoint(save_); });
  EXPECT_NE(msg.find("iter_0000099"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  spit(save_ + "/latest", "\n");
  EXPECT_NE(error_of([&] { resolve_checkpoint(save_); }).find("empty"), std::string::npos);
  spit(root_ + "/plain", "x");
  EXPECT_NE(error_of([&] { resolve_checkpoint(root_ + "/plain"); }).find("not a directory"), std::string::npos);
}

// ---- safetensors ---------------------------------------------------------------------------------------

// Just enough JSON for a safetensors header.
struct Json {
  enum Kind { null, number, string, array, object } kind = null;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
  const Json& operator[](const std::string& k) const {
    for (const auto& [name, v] : fields)
      if (name == k) return v;
    throw std::out_of_range("no key " + k);
  }
  std::vector<int64_t> ints() const {
    std::vector<int64_t> out;
    for (const auto& i : items) out.push_back(static_cast<int64_t>(i.num));
    return out;
  }
};

struct JsonParser {
  const std::string& s;
  size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  void expect(char c) {
    ws();
    if (s.at(i) != c) throw std::runtime_error(std::string("json: expected ") + c + " at " + std::to_string(i));
    ++i;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (s.at(i) != '"') {
      if (s[i] == '\\') {
        ++i;
        char c = s.at(i);
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += s[i];
      }
      ++i;
    }
    ++i;
    return out;
  }
  Json value() {
    ws();
    Json j;
    char c = s.at(i);
    if (c == '{') {
      j.kind = Json::object;
      ++i;
      ws();
      if (s.at(i) == '}') return ++i, j;
      for (;;) {
        std::string k = str();
        expect(':');
        j.fields.emplace_back(k, value());
        ws();
        if (s.at(i++) == '}') return j;
      }
    }
    if (c == '[') {
      j.kind = Json::array;
      ++i;
      ws();
      if (s.at(i) == ']') return ++i, j;
      for (;;) {
        j.items.push_back(value());
        ws();
        if (s.at(i++) == ']') return j;
      }
    }
    for (const char* lit : {"true", "false", "null"}) {
      if (s.compare(i, std::strlen(lit), lit) == 0) {
        i += std::strlen(lit);
        j.kind = lit[0] == 'n' ? Json::null : Json::number;
        j.num = lit[0] == 't';
        return j;
      }
    }
    if (c == '"') {
      j.kind = Json::string;
      j.str = str();
      return j;
    }
    size_t used = 0;
    j.kind = Json::number;
    j.num = std::stod(s.substr(i), &used);
    i += used;
    return j;
  }
};

struct SafetensorsFile {
  Json header;
  std::string header_text;
  std::string data;  // the bytes after the header
  uint64_t header_len = 0;
  std::vector<float> floats(const std::string& name) const {
    const Json& t = header[name];
    auto off = t["data_offsets"].ints();
    const std::string& dt = t["dtype"].str;
    std::vector<float> out;
    for (int64_t p = off[0]; p < off[1];) {
      if (dt == "F32") {
        float f;
        std::memcpy(&f, data.data() + p, 4);
        out.push_back(f);
        p += 4;
      } else {
        uint16_t h;
        std::memcpy(&h, data.data() + p, 2);
        out.push_back(dt == "BF16" ? bf16_to_float(h) : f16_to_float(h));
        p += 2;
      }
    }
    return out;
  }
  Shape shape(const std::string& name) const { return header[name]["shape"].ints(); }
};

SafetensorsFile read_safetensors(const std::string& path) {
  std::string bytes = slurp(path);
  SafetensorsFile f;
  EXPECT_GE(bytes.size(), 8u);
  for (int k = 0; k < 8; ++k) f.header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[k])) << (8 * k);
  EXPECT_EQ((8 + f.header_len) % 8, 0u) << "data must start 8-byte aligned";
  f.header_text = bytes.substr(8, f.header_len);
  JsonParser p{f.header_text};
  f.header = p.value();
  p.ws();
  EXPECT_EQ(p.i, f.header_text.size()) << "only space padding may follow the header JSON";
  f.data = bytes.substr(8 + f.header_len);
  // Offsets tile the data exactly, as the safetensors loader demands.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, t] : f.header.fields)
    if (name != "__metadata__") ranges.emplace_back(t["data_offsets"].ints()[0], t["data_offsets"].ints()[1]);
  std::sort(ranges.begin(), ranges.end());
  int64_t end = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, end);
    end = e;
  }
  EXPECT_EQ(end, static_cast<int64_t>(f.data.size()));
  return f;
}

TEST_F(CheckpointTest, SafetensorsWriterLaysOutHeaderAndData) {
  std::vector<SafetensorsSpec> specs = {
      {"a.weight", DType::f32, {2, 3}}, {"b", DType::bf16, {5}}, {"c\"q", DType::f16, {1, 3}}};
  std::string path = root_ + "/x.safetensors";
  {
    SafetensorsWriter w(path, specs, {{"format", "pt"}});
    w.write(make({2, 3}, DType::f32, 1.f));
    w.write(make({5}, DType::f32, 2.f));  // converted to bf16 on the way
    w.write(make({1, 3}, DType::f16, -1.f));
    w.finish();
  }
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.header["__metadata__"]["format"].str, "pt");
  EXPECT_EQ(f.header["a.weight"]["dtype"].str, "F32");
  EXPECT_EQ(f.shape("a.weight"), (Shape{2, 3}));
  EXPECT_EQ(f.header["a.weight"]["data_offsets"].ints(), (std::vector<int64_t>{0, 24}));
  EXPECT_EQ(f.header["b"]["dtype"].str, "BF16");
  EXPECT_EQ(f.header["b"]["data_offsets"].ints(), (std::vector<int64_t>{24, 34}));
  EXPECT_EQ(f.header["c\"q"]["dtype"].str, "F16");
  EXPECT_EQ(f.data.size(), 40u);
  EXPECT_EQ(f.floats("a.weight"), iota(6, 1.f));
  EXPECT_EQ(f.floats("b"), iota(5, 2.f));
  EXPECT_EQ(f.floats("c\"q"), iota(3, -1.f));
  Tensor a = make({2, 3}, DType::f32, 1.f);
  EXPECT_EQ(std::memcmp(f.data.data(), a.raw(), 24), 0);

  // An unfinished writer leaves nothing behind; a wrong shape is refused.
  {
    SafetensorsWriter w(root_ + "/y.safetensors", specs);
    EXPECT_THROW(w.write(make({3, 2}, DType::f32, 0.f)), CheckpointError);
  }
  EXPECT_FALSE(fs::exists(root_ + "/y.safetensors"));
  EXPECT_FALSE(fs::exists(root_ + "/y.safetensors.tmp"));
}

// ---- Hugging Face export -------------------------------------------------------------------------------

struct TinyGpt {
  static constexpr int64_t L = 2, C = 8, H = 2, D = 4, F = 32, V = 11, Vpad = 16, P = 6;
  bool tied = true;
  std::map<std::string, std::pair<Shape, std::vector<float>>> params;  // "model.<name>" -> values

  explicit TinyGpt(bool tied_) : tied(tied_) {
    float base = 0;
    auto add = [&](const std::string& name, Shape s) {
      base += 1000.f;  // every element distinct across the model, exact in fp32
      params["model." + name] = {s, iota(shape_numel(s), base, 1.f)};
    };
    add("embedding.word_embeddings.weight", {Vpad, C});
    add("embedding.position_embeddings.weight", {P, C});
    for (int i = 0; i < L; ++i) {
      std::string p = "layers." + std::to_string(i) + ".";
      add(p + "ln1.weight", {C});
      add(p + "ln1.bias", {C});
      add(p + "attn.qkv.weight", {3 * C, C});
      add(p + "attn.qkv.bias", {3 * C});
      add(p + "attn.proj.weight", {C, C});
      add(p + "attn.proj.bias", {C});
      add(p + "ln2.weight", {C});
      add(p + "ln2.bias", {C});
      add(p + "mlp.fc1.weight", {F, C});
      add(p + "mlp.fc1.bias", {F});
      add(p + "mlp.fc2.weight", {C, F});
      add(p + "mlp.fc2.bias", {C});
    }
    add("final_ln.weight", {C});
    add("final_ln.bias", {C});
    if (!tied) add("lm_head.weight", {Vpad, C});
  }

  std::string config() const {
    return std::string(
               "model:\n  arch: gpt\n  num_layers: 2\n  hidden_size: 8\n  num_heads: 2\n  ffn_hidden_size: 0\n"
               "  seq_length: 6\n  max_position_embeddings: 0\n  vocab_size: 11\n  tie_embeddings: ") +
           (tied ? "true" : "false") +
           "\n  dropout: 0.1\n  attention_dropout: 0.05\n  layernorm_eps: 1.0e-05\n  init_std: 0.02\n"
           "training:\n  seed: 1\n";
  }

  // Saves the model (qkv weights as two row blocks, as two TP ranks would) plus an optimizer state.
  std::string save(const std::string& save_dir) const {
    std::vector<TensorSlice> ts;
    for (const auto& [name, p] : params) {
      const auto& [shape, v] = p;
      if (name.find("qkv.weight") != std::string::npos) {
        ts.push_back({name, shape, {0, 0}, Tensor::from_floats(block(v, C, 0, 12, 0, C), {12, C})});
        ts.push_back({name, shape, {12, 0}, Tensor::from_floats(block(v, C, 12, 12, 0, C), {12, C})});
      } else {
        ts.push_back({name, shape, {}, Tensor::from_floats(v, shape)});
      }
    }
    ts.push_back({"optimizer.exp_avg.final_ln.weight", {C}, {}, make({C}, DType::f32, 0.f)});
    CheckpointState st;
    st.iteration = 42;
    st.config_yaml = config();
    return save_checkpoint(save_dir, st, ts, 0);
  }
  const std::vector<float>& v(const std::string& name) const { return params.at("model." + name).second; }
};

void check_export(const TinyGpt& m, const SafetensorsFile& f, DType dtype) {
  using T = TinyGpt;
  auto r = [&](float x) { return round_to(dtype, x); };
  auto wte = f.floats("transformer.wte.weight");
  EXPECT_EQ(f.shape("transformer.wte.weight"), (Shape{T::V, T::C}));  // padding rows dropped
  for (int64_t i = 0; i < T::V * T::C; ++i) ASSERT_EQ(wte[i], r(m.v("embedding.word_embeddings.weight")[i]));
  EXPECT_EQ(f.shape("transformer.wpe.weight"), (Shape{T::P, T::C}));
  for (int l = 0; l < T::L; ++l) {
    std::string ours = "layers." + std::to_string(l) + ".", hf = "transformer.h." + std::to_string(l) + ".";
    auto ln = f.floats(hf + "ln_1.weight");
    for (int64_t i = 0; i < T::C; ++i) ASSERT_EQ(ln[i], r(m.v(ours + "ln1.weight")[i]));
    ASSERT_EQ(f.shape(hf + "attn.c_attn.weight"), (Shape{T::C, 3 * T::C}));
    auto qkv = m.v(ours + "attn.qkv.weight"), cat = f.floats(hf + "attn.c_attn.weight");
    auto qkvb = m.v(ours + "attn.qkv.bias"), catb = f.floats(hf + "attn.c_attn.bias");
    for (int64_t h = 0; h < T::H; ++h)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t d = 0; d < T::D; ++d) {
          int64_t row = (h * 3 + j) * T::D + d, col = j * T::C + h * T::D + d;
          ASSERT_EQ(catb[col], r(qkvb[row])) << "bias h=" << h << " j=" << j << " d=" << d;
          for (int64_t c = 0; c < T::C; ++c) ASSERT_EQ(cat[c * 3 * T::C + col], r(qkv[row * T::C + c]));
        }
    auto transposed = [&](const std::string& theirs, const std::string& mine, int64_t out, int64_t in) {
      ASSERT_EQ(f.shape(theirs), (Shape{in, out})) << theirs;
      auto t = f.floats(theirs);
      auto w = m.v(mine);
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) ASSERT_EQ(t[i * out + o], r(w[o * in + i])) << theirs;
    };
    transposed(hf + "attn.c_proj.weight", ours + "attn.proj.weight", T::C, T::C);
    transposed(hf + "mlp.c_fc.weight", ours + "mlp.fc1.weight", T::F, T::C);
    transposed(hf + "mlp.c_proj.weight", ours + "mlp.fc2.weight", T::C, T::F);
    auto b = f.floats(hf + "mlp.c_fc.bias");
    for (int64_t i = 0; i < T::F; ++i) ASSERT_EQ(b[i], r(m.v(ours + "mlp.fc1.bias")[i]));
  }
  EXPECT_EQ(f.floats("transformer.ln_f.bias").size(), static_cast<size_t>(T::C));
  size_t expected = 2 + 12 * T::L + 2 + (m.tied ? 0 : 1) + 1;  // + __metadata__
  EXPECT_EQ(f.header.fields.size(), expected);
  if (!m.tied) {
    EXPECT_EQ(f.shape("lm_head.weight"), (Shape{T::V, T::C}));
    EXPECT_EQ(f.floats("lm_head.weight")[T::V * T::C - 1], r(m.v("lm_head.weight")[T::V * T::C - 1]));
  } else {
    EXPECT_THROW(f.header["lm_head.weight"], std::out_of_range);
  }
}

TEST_F(CheckpointTest, HfExportDeinterleavesTransposesAndDropsPadding) {
  for (bool tied : {true, false}) {
    TinyGpt m(tied);
    std::string dir = m.save(save_);
    std::string out = root_ + (tied ? "/hf_tied" : "/hf_untied");
    export_hf_gpt2(CheckpointReader(dir), out);
    SafetensorsFile f = read_safetensors(out + "/model.safetensors");
    EXPECT_EQ(f.header["transformer.wte.weight"]["dtype"].str, "F32");
    check_export(m, f, DType::f32);

    JsonParser p{slurp(out + "/config.json")};
    Json cfg = p.value();
    EXPECT_EQ(cfg["model_type"].str, "gpt2");
    EXPECT_EQ(cfg["architectures"].items.at(0).str, "GPT2LMHeadModel");
    EXPECT_EQ(cfg["vocab_size"].num, 11);
    EXPECT_EQ(cfg["n_positions"].num, 6);
    EXPECT_EQ(cfg["n_embd"].num, 8);
    EXPECT_EQ(cfg["n_layer"].num, 2);
    EXPECT_EQ(cfg["n_head"].num, 2);
    EXPECT_EQ(cfg["n_inner"].num, 32);  // ffn_hidden_size 0 means 4 * hidden
    EXPECT_EQ(cfg["activation_function"].str, "gelu_new");
    EXPECT_EQ(cfg["layer_norm_epsilon"].num, 1e-5);
    EXPECT_EQ(cfg["resid_pdrop"].num, 0.1);
    EXPECT_EQ(cfg["attn_pdrop"].num, 0.05);
    EXPECT_EQ(cfg["initializer_range"].num, 0.02);
    EXPECT_EQ(cfg["bos_token_id"].num, 10);
    EXPECT_EQ(cfg["eos_token_id"].num, 10);
    EXPECT_EQ(
        slurp(out + "/config.json").find(tied ? "\"tie_word_embeddings\": true" : "\"tie_word_embeddings\": false") !=
            std::string::npos,
        true);
  }
}

TEST_F(CheckpointTest, HfExportRefusesAnIncompleteCheckpointBeforeWriting) {
  TinyGpt m(true);
  m.params.erase("model.layers.1.mlp.fc2.bias");
  std::string dir = m.save(save_);
  std::string out = root_ + "/hf";
  std::string msg = error_of([&] { export_hf_gpt2(CheckpointReader(dir), out); });
  EXPECT_NE(msg.find("model.layers.1.mlp.fc2.bias"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/config.json"));
}

// ---- the CLI -------------------------------------------------------------------------------------------

void run_cli(const std::string& args) {
  CLI::App root("megatrain");
  app::add_ckpt_commands(root);
  root.parse(args, false);
}

TEST_F(CheckpointTest, CliInspectsVerifiesAndExports) {
  TinyGpt m(false);
  m.save(save_);
  ::testing::internal::CaptureStdout();
  run_cli("ckpt inspect " + save_ + " --verify");
  std::string text = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(text.find("iteration: 42"), std::string::npos) << text;
  EXPECT_NE(text.find("model.layers.0.attn.qkv.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("[24, 8]"), std::string::npos) << text;
  EXPECT_NE(text.find("2 slices"), std::string::npos) << text;
  EXPECT_NE(text.find("verify: OK"), std::string::npos) << text;

  ::testing::internal::CaptureStdout();
  run_cli("ckpt export " + save_ + "/iter_0000042 --format hf --output " + root_ + "/hf --dtype bf16");
  text = ::testing::internal::GetCapturedStdout();
  SafetensorsFile f = read_safetensors(root_ + "/hf/model.safetensors");
  EXPECT_EQ(f.header["transformer.h.0.attn.c_attn.weight"]["dtype"].str, "BF16");
  check_export(m, f, DType::bf16);
  EXPECT_NE(slurp(root_ + "/hf/config.json").find("\"torch_dtype\": \"bfloat16\""), std::string::npos);

  // Corrupt one byte: inspect --verify fails, naming the tensor.
  std::string bin = save_ + "/iter_0000042/rank_00000.bin";
  std::string bytes = slurp(bin);
  bytes[bytes.size() - 3] ^= 0x40;
  spit(bin, bytes);
  ::testing::internal::CaptureStdout();
  std::string msg = error_of([&] { run_cli("ckpt inspect " + save_ + " --verify"); });
  ::testing::internal::GetCapturedStdout();
  EXPECT_NE(msg.find("checksum mismatch in tensor"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { run_cli("ckpt inspect " + root_ + "/empty_nothing"); }).find("no checkpoint"),
            std::string::npos);
  EXPECT_THROW(run_cli("ckpt export " + save_ + " --format onnx --output " + root_ + "/x"), CLI::ValidationError);
}

// A checkpoint records its data's tokenizer sidecar as tokenizer.yaml, and the HF export turns a byte sidecar
// into tokenizer.json (id i = byte i, eod 256 the special <|endoftext|>) and configs whose eos id is the eod.
TEST_F(CheckpointTest, HfExportCarriesTheDataTokenizer) {
  TinyGpt m(false);
  m.save(save_);
  const std::string ckpt_dir = save_ + "/iter_0000042";
  const std::string prefix = root_ + "/data";
  spit(tokenizer_sidecar_path(prefix), "kind: byte\nfiles: {}\nvocab_size: 257\neod: 256\n");
  app::write_checkpoint_tokenizer(ckpt_dir, {prefix});
  EXPECT_EQ(slurp(ckpt_dir + "/tokenizer.yaml"), slurp(tokenizer_sidecar_path(prefix)));
  app::write_checkpoint_tokenizer(root_, {root_ + "/no_sidecar"});  // no sidecar: nothing written
  EXPECT_FALSE(fs::exists(root_ + "/tokenizer.yaml"));

  // The tiny model's 11 ids cannot hold the byte tokenizer's 257: the CLI refuses.
  std::string msg = error_of([&] { run_cli("ckpt export " + ckpt_dir + " --format hf --output " + root_ + "/x"); });
  EXPECT_NE(msg.find("the tokenizer has 257 ids but the model's vocab_size is 11"), std::string::npos) << msg;

  const std::string out = root_ + "/hf";
  CheckpointReader r(ckpt_dir);
  export_hf_gpt2(r, out, DType::f32, HfSpecialIds{256, 256});
  const auto sidecar = read_tokenizer_sidecar_file(ckpt_dir + "/tokenizer.yaml");
  ASSERT_TRUE(sidecar.has_value());
  export_hf_tokenizer(*sidecar, out, 6);
  using nlohmann::json;
  const json tok = json::parse(slurp(out + "/tokenizer.json"));
  ASSERT_EQ(tok["model"]["vocab"].size(), 256u);
  EXPECT_EQ(tok["model"]["vocab"]["a"], 'a');
  EXPECT_EQ(tok["model"]["vocab"]["\xC4\xA0"], 32);  // GPT-2's byte-level 'Ġ' is the space byte
  EXPECT_EQ(tok["model"]["vocab"]["\xC4\x80"], 0);
  EXPECT_TRUE(tok["model"]["merges"].empty());
  EXPECT_EQ(tok["pre_tokenizer"]["use_regex"], false);
  EXPECT_EQ(tok["added_tokens"][0]["id"], 256);
  EXPECT_EQ(tok["added_tokens"][0]["content"], "<|endoftext|>");
  const json cfg = json::parse(slurp(out + "/tokenizer_config.json"));
  EXPECT_EQ(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["model_max_length"], 6);
  EXPECT_EQ(json::parse(slurp(out + "/special_tokens_map.json"))["eos_token"], "<|endoftext|>");
  for (const char* file : {"/generation_config.json", "/config.json"}) {
    const json j = json::parse(slurp(out + file));
    EXPECT_EQ(j["eos_token_id"], 256) << file;
    EXPECT_EQ(j["bos_token_id"], 256) << file;
  }
}

}  // namespace
