// test_checkpoint.cpp: the checkpoint format, its commit protocol, the save directory and the reader (the
// Hugging Face export is tests/unit/core/hf/test_hf_export.cpp; `megatrain ckpt`, tests/unit/app/cli/).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/checkpoint/save_dir.h"
#include "tests/unit/core/checkpoint/checkpoint_fixture.h"
#include "tests/unit/file_text.h"

namespace fs = std::filesystem;
using namespace mt;
using namespace mt::ckpt_test;

namespace {

using testing_util::slurp;
using testing_util::spit;

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

// A LoRA run records its base checkpoint's stored_checksum to notice a base replaced at the same path: equal for a
// copy (and for other state or other tensors than the prefix's), different for other weights, dtypes or slicing.
TEST_F(CheckpointTest, StoredChecksumIdentifiesTheStoredTensors) {
  auto save = [&](const std::string& dir, int64_t iteration, float base, DType dtype, bool halves) {
    std::vector<TensorSlice> t = {{"opt.m", {4}, {}, make({4}, DType::f32, base * 2)}};
    if (halves) {
      t.push_back({"model.w", {4, 2}, {0, 0}, make({2, 2}, dtype, base)});
      t.push_back({"model.w", {4, 2}, {2, 0}, make({2, 2}, dtype, base + 1)});
    } else {
      t.push_back({"model.w", {4, 2}, {}, make({4, 2}, dtype, base)});
    }
    return CheckpointReader(save_checkpoint(dir, state_at(iteration), t, 0));
  };
  const CheckpointReader a = save(save_, 1, 0.f, DType::f32, false);
  fs::copy(a.dir(), root_ + "/copy", fs::copy_options::recursive);
  const uint32_t w = a.stored_checksum("model.");
  EXPECT_EQ(CheckpointReader(root_ + "/copy").stored_checksum("model."), w);
  EXPECT_EQ(save(root_ + "/b", 7, 0.f, DType::f32, false).stored_checksum("model."), w);   // other state only
  EXPECT_NE(a.stored_checksum(), w);                                                       // opt.m counts too
  EXPECT_NE(save(root_ + "/c", 1, 0.5f, DType::f32, false).stored_checksum("model."), w);  // other weights
  EXPECT_NE(save(root_ + "/d", 1, 0.f, DType::bf16, false).stored_checksum("model."), w);  // another dtype
  EXPECT_NE(save(root_ + "/e", 1, 0.f, DType::f32, true).stored_checksum("model."), w);    // sliced otherwise
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

// The message of check_save_dir_writable(dir) as the unprivileged user nobody (65534): permission bits do not bind
// root, so there the check runs in a child that drops to nobody first.
std::string save_dir_error_as_nobody(const std::string& dir) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    if (::setgid(65534) != 0 || ::setuid(65534) != 0)
      msg = "cannot drop to nobody";
    else
      msg = error_of([&] { check_save_dir_writable(dir); });
    const ssize_t n = ::write(fds[1], msg.data(), msg.size());
    ::_exit(n == static_cast<ssize_t>(msg.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return msg;
}

TEST_F(CheckpointTest, ReadOnlySaveDirFailsEarly) {
  fs::create_directories(save_);
  ::chmod(save_.c_str(), 0555);
  std::string msg;
  if (::geteuid() != 0) {
    msg = error_of([&] { check_save_dir_writable(save_); });
  } else {
    // nobody must reach the directory: every folder above it in the test's root lets others through.
    for (fs::path p = save_; p != fs::path(root_).parent_path(); p = p.parent_path())
      if (p != fs::path(save_)) ::chmod(p.c_str(), 0755);
    msg = save_dir_error_as_nobody(save_);
  }
  EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not writable"), std::string::npos) << msg;  // the probe's write, not the path's traversal
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

TEST_F(CheckpointTest, KeepLastLeavesACheckpointAReaderHoldsUntilALaterSave) {
  save_checkpoint(save_, state_at(10), {}, 1);
  {
    const CheckpointReader held = open_checkpoint(save_);  // what `eval` on a live run's save_dir does
    EXPECT_EQ(held.dir(), save_ + "/iter_0000010");
    save_checkpoint(save_, state_at(20), {}, 1);
    save_checkpoint(save_, state_at(30), {}, 1);
    EXPECT_EQ(listing(save_), (std::vector<std::string>{"iter_0000010", "iter_0000030", "latest"}));
    EXPECT_EQ(held.state().iteration, 10);
  }
  save_checkpoint(save_, state_at(40), {}, 1);  // released: the next save removes it
  EXPECT_EQ(listing(save_), (std::vector<std::string>{"iter_0000040", "latest"}));
  EXPECT_EQ(open_checkpoint(save_).state().iteration, 40);
}

TEST_F(CheckpointTest, OpeningACheckpointThatIsGoneSaysWhy) {
  save_checkpoint(save_, state_at(10), {}, 0);
  // A checkpoint named directly that vanished between finding and holding it: the lease says it is gone.
  fs::remove_all(save_ + "/iter_0000010");
  EXPECT_THROW(ckpt::CheckpointLease(save_ + "/iter_0000010"), CheckpointRemoved);
  // `latest` naming a missing checkpoint, the same at every look: no race with a newer save, refused at once.
  std::string msg = error_of([&] { open_checkpoint(save_); });
  EXPECT_NE(msg.find("latest: names"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  msg = error_of([&] { open_checkpoint(root_ + "/nothing"); });
  EXPECT_NE(msg.find("no checkpoint there"), std::string::npos) << msg;
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

}  // namespace
