// gpu_test.h: what the GPU unit tests (test_cuda_ops.*.cpp, test_cuda_models.cpp) share: the fixture that skips
// a test unless a GPU can run it, str(...) and random token ids.
#pragma once
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/runtime.h"
#endif

namespace mt::test {

// Skips the test unless a GPU can run it: in a build without the CUDA backend, or when no device is visible.
// (Named for the CUDA op tests, the first to use it; the whole-model GPU tests keep the suite name they had there.)
class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(MEGATRAIN_WITH_CUDA)
    GTEST_SKIP() << "built without the CUDA backend";
#else
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
#endif
  }
};

template <class... Args>
inline std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// n ids uniform in [lo, hi).
inline std::vector<int32_t> rand_ids(int64_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace mt::test
