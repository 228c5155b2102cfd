// op_test_util.h: what the op tests (test_ops.cpp, test_cuda_ops.cpp) share: random inputs that fp32 holds
// exactly, host tensors made from them, and the values of a tensor on any device, in double.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor/tensor.h"

namespace mt::test {

using Vec = std::vector<double>;

// n values uniform in [lo, hi), already representable in fp32 so the op and the reference see the same inputs.
inline Vec rand_vec(int64_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(dist(gen));
  return v;
}

// A host tensor holding v rounded to dt.
inline Tensor make(const Vec& v, Shape shape, DType dt = DType::f32) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_floats(f, std::move(shape), dt);
}

// The values of a tensor on any device.
inline Vec values(const Tensor& t) {
  std::vector<float> f = t.to_floats();
  return Vec(f.begin(), f.end());
}

}  // namespace mt::test
