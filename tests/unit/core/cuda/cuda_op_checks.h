// cuda_op_checks.h: what the CUDA op tests (test_cuda_ops.*.cpp) share: a tensor on both devices (Both), the
// comparisons of the GPU result with the CPU reference, and the views at an offset that select the kernels' vector
// and scalar forms.
//
// Each test is skipped when no GPU can run it: in a build without the CUDA backend, or when no device is
// visible. Outputs that an op writes (rather than accumulates into) are filled with NaN on the GPU first, so
// an element the kernel forgets to write fails the comparison.
//
// Tolerances (from the issue): max_i |gpu_i - cpu_i| / max_i |cpu_i| within 1e-5 for fp32, 1e-2 for bf16 and
// 5e-3 for fp16 (about two units in the last place of a half result, which a different fp32 summation order
// can flip once). Dropout masks are exact: both sides draw the same Philox numbers, so fp32 outputs must equal
// the CPU's element for element (bit for bit, the sign of a dropped element's zero aside).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor/tensor.h"
#include "tests/unit/gpu_test.h"
#include "tests/unit/op_test_util.h"

namespace mt::test {

// Sets MEGATRAIN_ATTENTION for one scope (ctest runs each test in its own process; this keeps gtest runs of
// the whole binary clean too).
class AttentionModeScope {
 public:
  explicit AttentionModeScope(const char* mode) {
    if (const char* v = std::getenv("MEGATRAIN_ATTENTION")) saved_ = v;
    ::setenv("MEGATRAIN_ATTENTION", mode, 1);
  }
  ~AttentionModeScope() {
    if (saved_.empty())
      ::unsetenv("MEGATRAIN_ATTENTION");
    else
      ::setenv("MEGATRAIN_ATTENTION", saved_.c_str(), 1);
  }

 private:
  std::string saved_;
};

inline constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};

inline double tol_for(DType dt) {
  switch (dt) {
    case DType::bf16:
      return 1e-2;
    case DType::f16:
      return 5e-3;
    default:
      return 1e-5;
  }
}

// max_i |got_i - want_i| / max_i |want_i|. An element that is not finite on either side must be the same
// value on both (NaN on both, or the same infinity); otherwise, a NaN-poisoned element the op never wrote
// included, the error is infinite.
inline double max_rel_err(const Vec& got, const Vec& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || got[i] == want[i];
      if (!same) return std::numeric_limits<double>::infinity();
      continue;
    }
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / std::max(scale, 1e-30);
}

// One tensor on the host and the same values on the GPU; an op runs on each through `kDevices`.
struct Both {
  Tensor cpu, gpu;
};
inline constexpr Tensor Both::*kDevices[] = {&Both::cpu, &Both::gpu};

inline Both both(const Vec& v, Shape shape, DType dt) {
  Tensor h = make(v, std::move(shape), dt);
  return {h, h.to(Device::cuda)};
}

inline Both both_ints(const std::vector<int32_t>& ids, Shape shape) {
  Tensor h = Tensor::from_ints(ids, std::move(shape));
  return {h, h.to(Device::cuda)};
}

// An output the op writes: NaN everywhere on both devices.
// Position ids (B, T) of samples cut into documents of the given lengths, the last one filling the sample.
inline Both document_positions(const std::vector<std::vector<int64_t>>& docs, int64_t T) {
  std::vector<int32_t> v;
  for (const auto& sample : docs) {
    int64_t t = 0;
    for (int64_t len : sample)
      for (int64_t k = 0; k < len && t < T; ++k, ++t) v.push_back(static_cast<int32_t>(k));
    for (int64_t k = 0; t < T; ++k, ++t) v.push_back(static_cast<int32_t>(k));  // a last document to the end
  }
  return both_ints(v, {static_cast<int64_t>(docs.size()), T});
}

inline Both poisoned(Shape shape, DType dt) {
  return both(Vec(static_cast<size_t>(shape_numel(shape)), std::numeric_limits<double>::quiet_NaN()), shape, dt);
}

inline void expect_match(const Both& t, double tol, const std::string& what) {
  EXPECT_LE(max_rel_err(values(t.gpu), values(t.cpu)), tol) << what << " (" << t.gpu.describe() << ")";
}

// The values of t on both devices are equal, element for element (as fp32; +0 and -0 count as equal, NaN as
// unequal).
inline void expect_exact(const Both& t, const std::string& what) {
  const std::vector<float> g = t.gpu.to_floats(), c = t.cpu.to_floats();
  ASSERT_EQ(g.size(), c.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == c[i]) && bad++ == 0) first = static_cast<int64_t>(i);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ, the first at " << first << " (gpu "
                    << (first >= 0 ? g[first] : 0.f) << ", cpu " << (first >= 0 ? c[first] : 0.f) << ")";
}

// The bytes of a GPU tensor, read back to the host.
inline std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor h = t.to(Device::cpu);
  std::vector<unsigned char> b(h.nbytes());
  if (!b.empty()) std::memcpy(b.data(), h.raw(), b.size());
  return b;
}

// ---- views at an offset (the 16-byte vector and scalar forms of the kernels) ------------------------
// The memory-bound kernels move 16-byte vectors (4 fp32, 8 bf16 or fp16 elements) where every pointer they
// read or write as vectors is 16-byte aligned and, for row kernels, the row length is a multiple of the vector
// width; otherwise their scalar form runs. Tests run ops on views at offset 0 of a fresh buffer (aligned: the
// vector form where the shape allows) and at an offset of one element (misaligned: the scalar form).

inline constexpr int64_t kViewOffsets[] = {0, 1};
inline const std::vector<int64_t> kTailSizes = {1, 7, 8, 9, 12, 13, 1000, 1003, 8 * 1024 + 5};
inline const std::vector<int64_t> kRowLengths = {8, 12, 13, 1000, 1003};

// The values v with the given shape, `offset` elements into a larger buffer, on both devices (a GPU buffer
// starts 256-byte aligned).
inline Both both_at(const Vec& v, const Shape& shape, DType dt, int64_t offset) {
  Vec buf(static_cast<size_t>(offset), 0.0);
  buf.insert(buf.end(), v.begin(), v.end());
  const int64_t total = static_cast<int64_t>(buf.size());
  const Both flat = both(buf, {total}, dt);
  return {flat.cpu.slice(offset, total).view(shape), flat.gpu.slice(offset, total).view(shape)};
}

// An output the op writes, NaN everywhere, `offset` elements into a larger buffer on both devices.
inline Both poisoned_at(const Shape& shape, DType dt, int64_t offset) {
  return both_at(Vec(static_cast<size_t>(shape_numel(shape)), std::numeric_limits<double>::quiet_NaN()), shape, dt,
                 offset);
}

// The dtypes and offsets of a weight or bias (C) beside activations of dtype dt: dt (converted to an fp32
// workspace by the kernels, so aligned), and fp32 read in place, aligned or not.
inline std::vector<std::pair<DType, int64_t>> param_placements(DType dt) {
  return {{dt, 0}, {DType::f32, 0}, {DType::f32, 1}};
}

// The GPU results of the aligned and the misaligned run of one output are the same bytes.
inline void expect_same_bits(const std::vector<Tensor>& runs, const std::string& what) {
  ASSERT_EQ(runs.size(), 2u) << what;
  EXPECT_TRUE(bytes_of(runs[0]) == bytes_of(runs[1])) << what << ": the aligned and misaligned runs differ";
}

// The norm tests' shapes: `shapes`, then N = 1 and 7 rows of each of kRowLengths.
inline std::vector<std::pair<int64_t, int64_t>> norm_shapes(std::vector<std::pair<int64_t, int64_t>> shapes) {
  for (int64_t C : kRowLengths)
    for (int64_t N : {1, 7}) shapes.emplace_back(N, C);
  return shapes;
}

// Every case of the norm tests: each (N, C) of `shapes`, each dtype, the activations at each view offset, the
// weight (and bias) at each placement: run(N, C, dt, off, w_dt, w_off, a description).
template <class Run>
inline void for_each_norm_case(const std::vector<std::pair<int64_t, int64_t>>& shapes, Run run) {
  for (const auto& [N, C] : shapes)
    for (DType dt : kFloatTypes)
      for (int64_t off : kViewOffsets)
        for (const auto& [w_dt, w_off] : param_placements(dt))
          run(N, C, dt, off, w_dt, w_off,
              str(" ", N, "x", C, " ", dtype_name(dt), " at offset ", off, ", weight ", dtype_name(w_dt), " at offset ",
                  w_off));
}

}  // namespace mt::test
