// checkpoint_fixture.h: what the checkpoint tests share: value lists, tensors, a checkpoint state, a fresh
// temporary root per test (CheckpointTest), and error_of (the message of the CheckpointError a call throws).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "tests/unit/file_text.h"

namespace mt::ckpt_test {

namespace fs = std::filesystem;

inline std::vector<float> iota(int64_t n, float base, float step = 0.25f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

inline Tensor make(const Shape& shape, DType dtype, float base) {
  return Tensor::from_floats(iota(shape_numel(shape), base), shape, dtype);
}

// Row-major sub-block of a (R, K) value list.
inline std::vector<float> block(const std::vector<float>& all, int64_t K, int64_t r0, int64_t nr, int64_t c0,
                                int64_t nc) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; ++c) out.push_back(all[r * K + c]);
  return out;
}

using testing_util::slurp;
using testing_util::spit;

inline std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline bool has_tmp_entries(const std::string& dir) {
  for (const auto& n : listing(dir))
    if (n.rfind(".tmp.", 0) == 0) return true;
  return false;
}

template <class F>
inline std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

inline CheckpointState state_at(int64_t iteration) {
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

}  // namespace mt::ckpt_test
