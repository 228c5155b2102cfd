// test_cuda_ops.cpp: every CUDA op (core/cuda/) against the CPU reference (core/cpu/) on the same random
// inputs, forward and backward, in every floating dtype, plus cross-device copies and the caching allocator.
//
// Each test is skipped when no GPU can run it: in a build without the CUDA backend, or when no device is
// visible. Outputs that an op writes (rather than accumulates into) are filled with NaN on the GPU first, so
// an element the kernel forgets to write fails the comparison.
//
// Tolerances (from the issue): max_i |gpu_i - cpu_i| / max_i |cpu_i| within 1e-5 for fp32, 1e-2 for bf16 and
// 5e-3 for fp16 (about two units in the last place of a half result, which a different fp32 summation order
// can flip once). Dropout masks are exact: both sides draw the same Philox numbers, so fp32 outputs must equal
// the CPU's element for element (bit for bit, the sign of a dropped element's zero aside).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor/ops.h"
#include "core/optim/optimizer.h"
#include "core/base/rng.h"
#include "core/tensor/tensor.h"
#include "models/gpt.h"
#include "tests/unit/op_test_util.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/attention_backend.h"
#include "core/cuda/runtime.h"
#endif

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values

constexpr DType kFloatTypes[] = {DType::f32, DType::bf16, DType::f16};

double tol_for(DType dt) {
  switch (dt) {
    case DType::bf16:
      return 1e-2;
    case DType::f16:
      return 5e-3;
    default:
      return 1e-5;
  }
}

// ---- helpers -------------------------------------------------------------------------------------

// Skips the test unless a GPU can run it.
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
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// n ids uniform in [lo, hi).
std::vector<int32_t> rand_ids(int64_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// max_i |got_i - want_i| / max_i |want_i|. An element that is not finite on either side must be the same
// value on both (NaN on both, or the same infinity); otherwise, a NaN-poisoned element the op never wrote
// included, the error is infinite.
double max_rel_err(const Vec& got, const Vec& want) {
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
constexpr Tensor Both::*kDevices[] = {&Both::cpu, &Both::gpu};

Both both(const Vec& v, Shape shape, DType dt) {
  Tensor h = make(v, std::move(shape), dt);
  return {h, h.to(Device::cuda)};
}

Both both_ints(const std::vector<int32_t>& ids, Shape shape) {
  Tensor h = Tensor::from_ints(ids, std::move(shape));
  return {h, h.to(Device::cuda)};
}

// An output the op writes: NaN everywhere on both devices.
Both poisoned(Shape shape, DType dt) {
  return both(Vec(static_cast<size_t>(shape_numel(shape)), std::numeric_limits<double>::quiet_NaN()), shape, dt);
}

void expect_match(const Both& t, double tol, const std::string& what) {
  EXPECT_LE(max_rel_err(values(t.gpu), values(t.cpu)), tol) << what << " (" << t.gpu.describe() << ")";
}

// The values of t on both devices are equal, element for element (as fp32; +0 and -0 count as equal, NaN as
// unequal).
void expect_exact(const Both& t, const std::string& what) {
  const std::vector<float> g = t.gpu.to_floats(), c = t.cpu.to_floats();
  ASSERT_EQ(g.size(), c.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == c[i]) && bad++ == 0) first = static_cast<int64_t>(i);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ, the first at " << first << " (gpu "
                    << (first >= 0 ? g[first] : 0.f) << ", cpu " << (first >= 0 ? c[first] : 0.f) << ")";
}

// The bytes of a GPU tensor, read back to the host.
std::vector<unsigned char> bytes_of(const Tensor& t) {
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

constexpr int64_t kViewOffsets[] = {0, 1};
const std::vector<int64_t> kTailSizes = {1, 7, 8, 9, 12, 13, 1000, 1003, 8 * 1024 + 5};
const std::vector<int64_t> kRowLengths = {8, 12, 13, 1000, 1003};

// The values v with the given shape, `offset` elements into a larger buffer, on both devices (a GPU buffer
// starts 256-byte aligned).
Both both_at(const Vec& v, const Shape& shape, DType dt, int64_t offset) {
  Vec buf(static_cast<size_t>(offset), 0.0);
  buf.insert(buf.end(), v.begin(), v.end());
  const int64_t total = static_cast<int64_t>(buf.size());
  const Both flat = both(buf, {total}, dt);
  return {flat.cpu.slice(offset, total).view(shape), flat.gpu.slice(offset, total).view(shape)};
}

// An output the op writes, NaN everywhere, `offset` elements into a larger buffer on both devices.
Both poisoned_at(const Shape& shape, DType dt, int64_t offset) {
  return both_at(Vec(static_cast<size_t>(shape_numel(shape)), std::numeric_limits<double>::quiet_NaN()), shape, dt,
                 offset);
}

// The dtypes and offsets of a weight or bias (C) beside activations of dtype dt: dt (converted to an fp32
// workspace by the kernels, so aligned), and fp32 read in place, aligned or not.
std::vector<std::pair<DType, int64_t>> param_placements(DType dt) {
  return {{dt, 0}, {DType::f32, 0}, {DType::f32, 1}};
}

// The GPU results of the aligned and the misaligned run of one output are the same bytes.
void expect_same_bits(const std::vector<Tensor>& runs, const std::string& what) {
  ASSERT_EQ(runs.size(), 2u) << what;
  EXPECT_TRUE(bytes_of(runs[0]) == bytes_of(runs[1])) << what << ": the aligned and misaligned runs differ";
}

// The norm tests' shapes: `shapes`, then N = 1 and 7 rows of each of kRowLengths.
std::vector<std::pair<int64_t, int64_t>> norm_shapes(std::vector<std::pair<int64_t, int64_t>> shapes) {
  for (int64_t C : kRowLengths)
    for (int64_t N : {1, 7}) shapes.emplace_back(N, C);
  return shapes;
}

// Every case of the norm tests: each (N, C) of `shapes`, each dtype, the activations at each view offset, the
// weight (and bias) at each placement: run(N, C, dt, off, w_dt, w_off, a description).
template <class Run>
void for_each_norm_case(const std::vector<std::pair<int64_t, int64_t>>& shapes, Run run) {
  for (const auto& [N, C] : shapes)
    for (DType dt : kFloatTypes)
      for (int64_t off : kViewOffsets)
        for (const auto& [w_dt, w_off] : param_placements(dt))
          run(N, C, dt, off, w_dt, w_off,
              str(" ", N, "x", C, " ", dtype_name(dt), " at offset ", off, ", weight ", dtype_name(w_dt), " at offset ",
                  w_off));
}

// ---- GEMM ----------------------------------------------------------------------------------------

struct GemmShape {
  int64_t M, K, N;
};

class CudaGemm : public CudaOps, public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(CudaGemm, MatchesCpuForEveryDtypeOutDtypeAndAlphaBeta) {
  const auto [ta, tb] = GetParam();
  uint32_t seed = 100;
  for (const GemmShape& s :
       {GemmShape{37, 29, 53}, GemmShape{1, 5, 3}, GemmShape{64, 96, 128}, GemmShape{130, 257, 67}}) {
    const int64_t M = s.M, K = s.K, N = s.N;
    for (DType dt : kFloatTypes) {
      const std::vector<DType> out_dtypes =
          dt == DType::f32 ? std::vector<DType>{DType::f32} : std::vector<DType>{dt, DType::f32};
      for (DType out_dt : out_dtypes)
        for (const auto& [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.5f, 0.75f}, std::pair{-1.25f, 1.f}}) {
          const Both a = both(rand_vec(M * K, ++seed), ta ? Shape{K, M} : Shape{M, K}, dt);
          const Both b = both(rand_vec(K * N, ++seed), tb ? Shape{N, K} : Shape{K, N}, dt);
          Both out = beta == 0.f ? poisoned({M, N}, out_dt) : both(rand_vec(M * N, ++seed), {M, N}, out_dt);
          const GemmOptions opt{.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta};
          for (auto d : kDevices) gemm(a.*d, b.*d, out.*d, opt);
          expect_match(out, tol_for(dt),
                       str("gemm ", M, "x", K, "x", N, " trans_a=", ta, " trans_b=", tb, " ", dtype_name(dt), " -> ",
                           dtype_name(out_dt), " alpha=", alpha, " beta=", beta));
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CudaGemm, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

// Row slices start at addresses aligned only to the element size; the GEMM must still pick a usable algorithm.
TEST_F(CudaOps, GemmOnUnalignedRowSlices) {
  const int64_t M = 21, K = 29, N = 37;
  for (DType dt : kFloatTypes) {
    const Both a = both(rand_vec((M + 1) * K, 200), {M + 1, K}, dt);
    const Both b = both(rand_vec((N + 1) * K, 201), {N + 1, K}, dt);
    Both out = both(rand_vec((M + 3) * N, 202), {M + 3, N}, dt);
    for (auto d : kDevices) {
      Tensor o = (out.*d).slice(3, M + 3);
      gemm((a.*d).slice(1, M + 1), (b.*d).slice(1, N + 1), o, {.trans_b = true, .alpha = 1.f, .beta = 0.5f});
    }
    expect_match(out, tol_for(dt), str("gemm on row slices, ", dtype_name(dt)));
  }
}

// K == 0 leaves beta * out (zeros for beta == 0, whatever out held); M == 0 or N == 0 is a no-op.
TEST_F(CudaOps, GemmWithEmptyDimensions) {
  const int64_t M = 7, N = 5;
  for (DType dt : kFloatTypes)
    for (bool ta : {false, true})
      for (float beta : {0.f, 0.5f, 1.f}) {
        const Both a = both({}, ta ? Shape{0, M} : Shape{M, 0}, dt), b = both({}, {0, N}, dt);
        Both out = beta == 0.f ? poisoned({M, N}, dt) : both(rand_vec(M * N, 210), {M, N}, dt);
        for (auto d : kDevices) gemm(a.*d, b.*d, out.*d, {.trans_a = ta, .alpha = 2.f, .beta = beta});
        expect_match(out, tol_for(dt), str("gemm with K = 0, ", dtype_name(dt), " beta=", beta));
      }
  for (DType dt : kFloatTypes) {
    Both empty_rows = poisoned({0, N}, dt), empty_cols = poisoned({M, 0}, dt);
    const Both a0 = both({}, {0, 3}, dt), b = both(rand_vec(3 * N, 211), {3, N}, dt);
    const Both a = both(rand_vec(M * 3, 212), {M, 3}, dt), b0 = both({}, {3, 0}, dt);
    for (auto d : kDevices) {
      gemm(a0.*d, b.*d, empty_rows.*d, {.beta = 1.f});
      gemm(a.*d, b0.*d, empty_cols.*d, {});
    }
    EXPECT_EQ(empty_rows.gpu.numel(), 0);
    EXPECT_EQ(empty_cols.gpu.numel(), 0);
  }
}

// ---- bias and elementwise ------------------------------------------------------------------------

TEST_F(CudaOps, AddBias) {
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{37, 53}, {4, 1024}})
    for (DType dt : kFloatTypes) {
      Both x = both(rand_vec(N * C, 300, -3, 3), {N, C}, dt);
      const Both bias = both(rand_vec(C, 301), {C}, dt);
      for (auto d : kDevices) add_bias(x.*d, bias.*d);
      expect_match(x, tol_for(dt), str("add_bias ", dtype_name(dt)));
    }
}

TEST_F(CudaOps, BiasBackwardAccumulates) {
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{300, 67}, {1024, 8}, {3, 2048}})
    for (DType dt : kFloatTypes) {
      const Both dout = both(rand_vec(N * C, 310), {N, C}, dt);
      Both dbias = both(rand_vec(C, 311, -5, 5), {C}, DType::f32);  // nonzero start: must be added to
      for (auto d : kDevices) bias_backward(dout.*d, dbias.*d);
      expect_match(dbias, tol_for(dt), str("bias_backward ", N, "x", C, " ", dtype_name(dt)));
    }
}

TEST_F(CudaOps, AddAndScale) {
  const int64_t N = 37, C = 129;
  for (DType dt : kFloatTypes) {
    const Both a = both(rand_vec(N * C, 320, -4, 4), {N, C}, dt), b = both(rand_vec(N * C, 321), {N, C}, dt);
    Both out = poisoned({N, C}, dt);
    for (auto d : kDevices) add(a.*d, b.*d, out.*d);
    expect_match(out, tol_for(dt), str("add ", dtype_name(dt)));

    Both inplace = both(rand_vec(N * C, 322), {N, C}, dt);  // out aliasing a
    for (auto d : kDevices) add(inplace.*d, b.*d, inplace.*d);
    expect_match(inplace, tol_for(dt), str("add in place ", dtype_name(dt)));

    Both x = both(rand_vec(N * C, 323, -4, 4), {N, C}, dt);
    for (auto d : kDevices) scale_(x.*d, -0.37f);
    expect_match(x, tol_for(dt), str("scale_ ", dtype_name(dt)));
  }
}

// Both loop orders of the CUDA version (one strided copy per index of the shorter leading dimension), exact.
TEST_F(CudaOps, TransposeBlocksMovesEveryBlock) {
  for (auto [P, Q, L] : {std::tuple<int64_t, int64_t, int64_t>{2, 5, 7}, {5, 2, 7}, {3, 3, 1}, {1, 4, 6}})
    for (DType dt : kFloatTypes) {
      const Both x = both(rand_vec(P * Q * L, 330), {P, Q, L}, dt);
      Both out = poisoned({Q, P, L}, dt);
      for (auto d : kDevices) transpose_blocks(x.*d, out.*d);
      expect_exact(out, str("transpose_blocks ", P, "x", Q, "x", L, " ", dtype_name(dt)));
    }
}

TEST_F(CudaOps, GeluForwardAndBackward) {
  const int64_t N = 41, C = 257;
  for (DType dt : kFloatTypes) {
    const Both x = both(rand_vec(N * C, 330, -5, 5), {N, C}, dt), dout = both(rand_vec(N * C, 331), {N, C}, dt);
    Both out = poisoned({N, C}, dt), dx = poisoned({N, C}, dt);
    for (auto d : kDevices) {
      gelu_forward(x.*d, out.*d);
      gelu_backward(x.*d, dout.*d, dx.*d);
    }
    expect_match(out, tol_for(dt), str("gelu_forward ", dtype_name(dt)));
    expect_match(dx, tol_for(dt), str("gelu_backward ", dtype_name(dt)));
  }
}

// ---- LayerNorm -----------------------------------------------------------------------------------

// Shapes with row lengths around the vector width, activations and weights aligned and not, out aliasing x
// and dx aliasing dout.
TEST_F(CudaOps, LayerNormForwardAndBackward) {
  const auto shapes = norm_shapes({{37, 97}, {4, 768}, {3, 1600}});
  for_each_norm_case(shapes, [](int64_t N, int64_t C, DType dt, int64_t off, DType w_dt, int64_t w_off,
                                const std::string& what) {
    const Vec xv = rand_vec(N * C, 1440, -2, 3), dv = rand_vec(N * C, 1443);
    const Both x = both_at(xv, {N, C}, dt, off), dout = both_at(dv, {N, C}, dt, off);
    const Both w = both_at(rand_vec(C, 1441, 0.5, 1.5), {C}, w_dt, w_off);
    const Both b = both_at(rand_vec(C, 1442), {C}, w_dt, w_off);
    Both out = poisoned_at({N, C}, dt, off), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
    Both dx = poisoned_at({N, C}, dt, off);
    Both dw = both(rand_vec(C, 1444), {C}, DType::f32), db = both(rand_vec(C, 1445), {C}, DType::f32);
    Both y_inplace = both_at(xv, {N, C}, dt, off), dx_inplace = both_at(dv, {N, C}, dt, off);
    Both mean2 = poisoned({N}, DType::f32), rstd2 = poisoned({N}, DType::f32);
    Both dw2 = both(Vec(C, 0.0), {C}, DType::f32), db2 = both(Vec(C, 0.0), {C}, DType::f32);
    for (auto dev : kDevices) {
      layernorm_forward(x.*dev, w.*dev, b.*dev, out.*dev, mean.*dev, rstd.*dev, {.eps = 1e-5f});
      layernorm_backward(dout.*dev, x.*dev, w.*dev, mean.*dev, rstd.*dev, dx.*dev, dw.*dev, db.*dev);
      // out aliasing x, dx aliasing dout
      layernorm_forward(y_inplace.*dev, w.*dev, b.*dev, y_inplace.*dev, mean2.*dev, rstd2.*dev, {.eps = 1e-5f});
      layernorm_backward(dx_inplace.*dev, x.*dev, w.*dev, mean.*dev, rstd.*dev, dx_inplace.*dev, dw2.*dev, db2.*dev);
    }
    const double tol = tol_for(dt);
    expect_match(out, tol, "layernorm out" + what);
    expect_match(mean, tol, "layernorm mean" + what);
    expect_match(rstd, tol, "layernorm rstd" + what);
    expect_match(dx, tol, "layernorm dx" + what);
    expect_match(dw, tol, "layernorm dweight" + what);
    expect_match(db, tol, "layernorm dbias" + what);
    expect_match(y_inplace, tol, "layernorm out in place of x" + what);
    expect_match(dx_inplace, tol, "layernorm dx in place of dout" + what);
  });
}

// ---- Llama ops: RMSNorm, SwiGLU, RoPE --------------------------------------------------------------

// As LayerNormForwardAndBackward.
TEST_F(CudaOps, RmsNormForwardAndBackward) {
  const auto shapes = norm_shapes({{37, 97}, {4, 768}, {3, 4096}, {300, 64}});
  for_each_norm_case(
      shapes, [](int64_t N, int64_t C, DType dt, int64_t off, DType w_dt, int64_t w_off, const std::string& what) {
        const Vec xv = rand_vec(N * C, 1450, -2, 3), dv = rand_vec(N * C, 1452);
        const Both x = both_at(xv, {N, C}, dt, off), dout = both_at(dv, {N, C}, dt, off);
        const Both w = both_at(rand_vec(C, 1451, 0.5, 1.5), {C}, w_dt, w_off);
        Both out = poisoned_at({N, C}, dt, off), rstd = poisoned({N}, DType::f32);
        Both dx = poisoned_at({N, C}, dt, off), dw = both(rand_vec(C, 1453), {C}, DType::f32);
        Both y_inplace = both_at(xv, {N, C}, dt, off), dx_inplace = both_at(dv, {N, C}, dt, off);
        Both rstd2 = poisoned({N}, DType::f32), dw2 = both(Vec(C, 0.0), {C}, DType::f32);
        for (auto dev : kDevices) {
          rmsnorm_forward(x.*dev, w.*dev, out.*dev, rstd.*dev, {.eps = 1e-6f});
          rmsnorm_backward(dout.*dev, x.*dev, w.*dev, rstd.*dev, dx.*dev, dw.*dev);
          // out aliasing x, dx aliasing dout
          rmsnorm_forward(y_inplace.*dev, w.*dev, y_inplace.*dev, rstd2.*dev, {.eps = 1e-6f});
          rmsnorm_backward(dx_inplace.*dev, x.*dev, w.*dev, rstd.*dev, dx_inplace.*dev, dw2.*dev);
        }
        const double tol = tol_for(dt);
        expect_match(out, tol, "rmsnorm out" + what);
        expect_match(rstd, tol, "rmsnorm rstd" + what);
        expect_match(dx, tol, "rmsnorm dx" + what);
        expect_match(dw, tol, "rmsnorm dweight" + what);
        expect_match(y_inplace, tol, "rmsnorm out in place of x" + what);
        expect_match(dx_inplace, tol, "rmsnorm dx in place of dout" + what);
      });
}

// out aliasing x, dx aliasing dout (the weight gradient reads dout before dx overwrites it), and the weight
// gradient is the same bits on every run (fixed row chunks, no atomics).
TEST_F(CudaOps, RmsNormInPlaceAndDeterministic) {
  const int64_t N = 2049, C = 320;
  for (DType dt : kFloatTypes) {
    const Vec xv = rand_vec(N * C, 364, -2, 2), dv = rand_vec(N * C, 365);
    const Both x = both(xv, {N, C}, dt), w = both(rand_vec(C, 366, 0.5, 1.5), {C}, dt);
    Both y = both(xv, {N, C}, dt), rstd = poisoned({N}, DType::f32);
    Both dx = both(dv, {N, C}, dt), dw = both(Vec(C, 0.0), {C}, DType::f32);
    for (auto d : kDevices) {
      rmsnorm_forward(y.*d, w.*d, y.*d, rstd.*d, {});
      rmsnorm_backward(dx.*d, x.*d, w.*d, rstd.*d, dx.*d, dw.*d);
    }
    expect_match(y, tol_for(dt), str("rmsnorm out in place of x ", dtype_name(dt)));
    expect_match(dx, tol_for(dt), str("rmsnorm dx in place of dout ", dtype_name(dt)));
    expect_match(dw, tol_for(dt), str("rmsnorm dweight ", dtype_name(dt)));
    Tensor dout2 = make(dv, {N, C}, dt).to(Device::cuda), dw2 = make(Vec(C, 0.0), {C}).to(Device::cuda);
    rmsnorm_backward(dout2, x.gpu, w.gpu, rstd.gpu, dout2, dw2);
    EXPECT_EQ(bytes_of(dw.gpu), bytes_of(dw2)) << "rmsnorm dweight is not deterministic, " << dtype_name(dt);
  }
}

TEST_F(CudaOps, SwiGluForwardAndBackward) {
  for (const auto& [N, F] : {std::pair<int64_t, int64_t>{41, 129}, {3, 2816}})
    for (DType dt : kFloatTypes) {
      Vec xv = rand_vec(N * 2 * F, 370, -6, 6);
      for (double g : {-200.0, -90.0, 90.0, 200.0}) xv[2 * static_cast<size_t>(g + 300)] = g;  // tails of exp
      const Both x = both(xv, {N, 2 * F}, dt), dout = both(rand_vec(N * F, 371), {N, F}, dt);
      Both out = poisoned({N, F}, dt), dx = poisoned({N, 2 * F}, dt);
      for (auto d : kDevices) {
        swiglu_forward(x.*d, out.*d);
        swiglu_backward(x.*d, dout.*d, dx.*d);
      }
      expect_match(out, tol_for(dt), str("swiglu_forward ", N, "x", F, " ", dtype_name(dt)));
      expect_match(dx, tol_for(dt), str("swiglu_backward ", N, "x", F, " ", dtype_name(dt)));
    }
}

// GPT-shaped (G = H, R = 1), grouped-query and multi-query qkv, forward and inverse, with a position offset
// and far positions. The value slots must come back bit for bit.
TEST_F(CudaOps, RopeForwardAndInverse) {
  struct Case {
    int64_t B, T, G, R, D, offset;
    float theta;
  };
  for (const Case& c : {Case{2, 37, 4, 1, 64, 0, 10000.f}, Case{1, 19, 2, 4, 128, 5, 500000.f},
                        Case{3, 5, 1, 8, 6, 100000, 10000.f}, Case{1, 300, 2, 2, 2, 0, 10000.f}})
    for (DType dt : kFloatTypes)
      for (bool inverse : {false, true}) {
        const Shape shape{c.B, c.T, c.G, c.R + 2, c.D};
        Both qkv = both(rand_vec(shape_numel(shape), 380, -2, 2), shape, dt);
        const RopeOptions opt{.theta = c.theta, .position_offset = c.offset, .inverse = inverse};
        for (auto d : kDevices) rope_(qkv.*d, opt);
        const std::string what = str("rope_ B", c.B, " T", c.T, " G", c.G, " R", c.R, " D", c.D, " offset ", c.offset,
                                     inverse ? " inverse " : " ", dtype_name(dt));
        expect_match(qkv, tol_for(dt), what);
        const Vec got = values(qkv.gpu), before = values(make(rand_vec(shape_numel(shape), 380, -2, 2), shape, dt));
        const int64_t S = c.R + 2;
        int64_t moved = 0;
        for (int64_t btg = 0; btg < c.B * c.T * c.G; ++btg)
          for (int64_t i = 0; i < c.D; ++i) {
            const int64_t k = (btg * S + S - 1) * c.D + i;  // slot R + 1: the value
            moved += got[k] != before[k];
          }
        EXPECT_EQ(moved, 0) << what << ": " << moved << " elements of the value slots changed";
      }
}

// The CUDA kernel passes inv_freq in its parameters (D <= 512); a wider head is refused by name.
TEST_F(CudaOps, RopeRefusesHeadDimsBeyondTheKernelLimit) {
  Tensor qkv = Tensor::zeros({1, 2, 1, 3, 514}, DType::f32, Device::cuda);
  try {
    rope_(qkv, {});
    ADD_FAILURE() << "rope_ with D = 514 did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope_: the CUDA kernel supports a head dim D up to 512, got 514"),
              std::string::npos)
        << e.what();
  }
}

// ---- embeddings ----------------------------------------------------------------------------------

// A shard of rows [5, 14) of a 20-token vocabulary: ids below, inside and above it, many repeated.
TEST_F(CudaOps, EmbeddingForwardAndBackwardWithVocabStart) {
  const int64_t B = 4, T = 33, V = 9, C = 48, start = 5;
  const Both ids = both_ints(rand_ids(B * T, 350, 0, 20), {B, T});
  const EmbeddingOptions opt{.vocab_start = start};
  for (DType dt : kFloatTypes) {
    const Both table = both(rand_vec(V * C, 351), {V, C}, dt), dout = both(rand_vec(B * T * C, 352), {B, T, C}, dt);
    Both out = poisoned({B, T, C}, dt);
    Both dtable = both(rand_vec(V * C, 353, -2, 2), {V, C}, DType::f32);
    for (auto d : kDevices) {
      embedding_forward(ids.*d, table.*d, out.*d, opt);
      embedding_backward(ids.*d, dout.*d, dtable.*d, opt);
    }
    expect_exact(out, str("embedding_forward ", dtype_name(dt)));  // a copy of rows or zeros: exact
    expect_match(dtable, tol_for(dt), str("embedding_backward ", dtype_name(dt)));
  }
}

// Many tokens hitting few rows: the backward must give the same bytes every run (no float atomics).
TEST_F(CudaOps, EmbeddingBackwardIsDeterministic) {
  const int64_t B = 8, T = 256, V = 16, C = 64, start = 4;
  const Tensor ids = Tensor::from_ints(rand_ids(B * T, 360, 0, 24), {B, T}).to(Device::cuda);
  const Vec prior = rand_vec(V * C, 361, -3, 3);
  for (DType dt : kFloatTypes) {
    const Tensor dout = make(rand_vec(B * T * C, 362, -100, 100), {B, T, C}, dt).to(Device::cuda);
    std::vector<unsigned char> runs[2];
    for (auto& run : runs) {
      Tensor dtable = make(prior, {V, C}).to(Device::cuda);
      embedding_backward(ids, dout, dtable, {.vocab_start = start});
      run = bytes_of(dtable);
    }
    EXPECT_TRUE(runs[0] == runs[1]) << "embedding_backward differs between two identical runs, " << dtype_name(dt);
  }
}

TEST_F(CudaOps, PositionEmbeddingWithOffset) {
  const int64_t B = 3, T = 37, C = 40, P = 64;
  const EmbeddingOptions opt{.position_offset = 5};
  for (DType dt : kFloatTypes) {
    Both x = both(rand_vec(B * T * C, 370), {B, T, C}, dt);
    const Both wpe = both(rand_vec(P * C, 371), {P, C}, dt), dout = both(rand_vec(B * T * C, 372), {B, T, C}, dt);
    Both dwpe = both(rand_vec(P * C, 373), {P, C}, DType::f32);
    for (auto d : kDevices) {
      position_embedding_add(x.*d, wpe.*d, opt);
      position_embedding_backward(dout.*d, dwpe.*d, opt);
    }
    expect_match(x, tol_for(dt), str("position_embedding_add ", dtype_name(dt)));
    expect_match(dwpe, tol_for(dt), str("position_embedding_backward ", dtype_name(dt)));
  }
}

// ---- dropout -------------------------------------------------------------------------------------

// The same elements are dropped on both devices (zeros where the CPU has zeros, and only there).
void expect_same_mask(const Both& t, const std::string& what) {
  const Vec g = values(t.gpu), c = values(t.cpu);
  ASSERT_EQ(g.size(), c.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) bad += (g[i] == 0.0) != (c[i] == 0.0);
  EXPECT_EQ(bad, 0) << what << ": dropped elements differ";
}

TEST_F(CudaOps, DropoutForwardAndBackwardDrawTheCpuMask) {
  const int64_t B = 2, T = 37, C = 70;  // C and col_offset not multiples of 4 (one Philox block serves 4 columns)
  for (float p : {0.1f, 0.5f}) {
    const DropoutOptions opt{.p = p,
                             .seed = 1234,
                             .site = stream_id("layers.0.mlp.out"),
                             .sample_offset = 3,
                             .row_offset = 11,
                             .col_offset = 6};
    for (DType dt : kFloatTypes) {
      const std::string what = str(" p=", p, " ", dtype_name(dt));
      const Both x = both(rand_vec(B * T * C, 380, 0.25, 2), {B, T, C}, dt);  // nonzero: zeros mark the mask
      const Both dout = both(rand_vec(B * T * C, 381, -2, -0.25), {B, T, C}, dt);
      Both out = poisoned({B, T, C}, dt), dx = poisoned({B, T, C}, dt);
      Both dx_inplace = both(values(dout.cpu), {B, T, C}, dt);
      for (auto d : kDevices) {
        dropout_forward(x.*d, out.*d, opt);
        dropout_backward(dout.*d, dx.*d, opt);
        dropout_backward(dx_inplace.*d, dx_inplace.*d, opt);  // in place, as the models call it
      }
      expect_same_mask(out, "dropout_forward" + what);
      expect_same_mask(dx, "dropout_backward" + what);
      expect_match(out, tol_for(dt), "dropout_forward" + what);
      expect_match(dx, tol_for(dt), "dropout_backward" + what);
      expect_match(dx_inplace, tol_for(dt), "dropout_backward in place" + what);
      if (dt == DType::f32) {
        expect_exact(out, "dropout_forward" + what);
        expect_exact(dx, "dropout_backward" + what);
        expect_exact(dx_inplace, "dropout_backward in place" + what);
      }
    }
  }
}

// ---- attention -----------------------------------------------------------------------------------

struct AttnCase {
  bool causal;
  float dropout_p;
  int64_t B, T, H, D;
  bool flat_out;  // out and dout as the (B, T, H * D) view the models use
};

// gtest prints parameters it cannot name as raw bytes (padding included); say what the case is instead.
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << (c.causal ? "causal" : "full") << " p=" << c.dropout_p << " B=" << c.B << " T=" << c.T << " H=" << c.H
      << " D=" << c.D << (c.flat_out ? " flat" : "");
}

class CudaAttention : public CudaOps, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  const AttnCase c = GetParam();
  const int64_t B = c.B, T = c.T, H = c.H, D = c.D;
  const AttentionOptions opt{.causal = c.causal,
                             .dropout_p = c.dropout_p,
                             .seed = 17,
                             .site = stream_id("layers.2.attn.probs"),
                             .sample_offset = 5,
                             .head_offset = 2};
  const Shape out_shape = c.flat_out ? Shape{B, T, H * D} : Shape{B, T, H, D};
  for (DType dt : kFloatTypes) {
    const Both qkv = both(rand_vec(B * T * H * 3 * D, 390, -2, 2), {B, T, H, 3, D}, dt);
    const Both dout = both(rand_vec(B * T * H * D, 391), out_shape, dt);
    Both out = poisoned(out_shape, dt), lse = poisoned({B, H, T}, DType::f32);
    Both dqkv = poisoned({B, T, H, 3, D}, dt);
    for (auto d : kDevices) {
      attention_forward(qkv.*d, out.*d, lse.*d, opt);
      attention_backward(qkv.*d, out.*d, lse.*d, dout.*d, dqkv.*d, opt);
    }
    const std::string what = str(" ", dtype_name(dt));
    expect_match(out, tol_for(dt), "attention out" + what);
    expect_match(lse, tol_for(dt), "attention lse" + what);
    expect_match(dqkv, tol_for(dt), "attention dqkv" + what);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(AttnCase{true, 0.f, 2, 37, 3, 16, false}, AttnCase{true, 0.1f, 2, 37, 3, 16, false},
                      AttnCase{false, 0.f, 2, 37, 3, 16, false}, AttnCase{false, 0.1f, 2, 37, 3, 16, false},
                      AttnCase{true, 0.f, 1, 130, 2, 64, true}, AttnCase{true, 0.1f, 1, 130, 2, 64, true},
                      AttnCase{false, 0.f, 1, 130, 2, 64, true}, AttnCase{false, 0.1f, 1, 130, 2, 64, true}),
    [](const auto& info) {
      const AttnCase& c = info.param;
      return str(c.causal ? "Causal" : "Full", c.dropout_p > 0 ? "Dropout" : "NoDropout", "_B", c.B, "_T", c.T, "_H",
                 c.H, "_D", c.D);
    });

// ---- cross-entropy -------------------------------------------------------------------------------

struct CeCase {
  int64_t N, vocab_start, V, vocab_size;  // a shard of V columns from vocab_start; vocab_size -1: no padding
  int32_t target_hi;                      // targets uniform in [0, target_hi)
};

// The four ops on one vocabulary shard, each device using its own row statistics.
TEST_F(CudaOps, CrossEntropyOpsWithVocabStartAndPadding) {
  // Columns [512, 1536) of a vocabulary of 1500 padded to 1536 (36 padding columns, targets on both sides of
  // the shard), and a small unpadded shard whose targets partly lie in other shards.
  for (const CeCase& c : {CeCase{37, 512, 1024, 1500, 1500}, CeCase{6, 0, 37, -1, 50}}) {
    const int64_t N = c.N, V = c.V;
    const CrossEntropyOptions opt{.vocab_start = c.vocab_start, .vocab_size = c.vocab_size};
    const Both targets = both_ints(rand_ids(N, 400, 0, c.target_hi), {N});
    for (DType dt : kFloatTypes) {
      const std::string what = str(" N=", N, " V=", V, " vocab_start=", c.vocab_start, " ", dtype_name(dt));
      const Both logits = both(rand_vec(N * V, 401, -5, 5), {N, V}, dt);
      const Both dloss = both(rand_vec(N, 402), {N}, DType::f32);
      Both rowmax = poisoned({N}, DType::f32), sumexp = poisoned({N}, DType::f32), tl = poisoned({N}, DType::f32);
      Both losses = poisoned({N}, DType::f32), dlogits = poisoned({N, V}, dt);
      for (auto d : kDevices) {
        cross_entropy_rowmax(logits.*d, rowmax.*d, opt);
        cross_entropy_partials(logits.*d, targets.*d, rowmax.*d, sumexp.*d, tl.*d, opt);
        cross_entropy_loss(rowmax.*d, sumexp.*d, tl.*d, losses.*d);
        cross_entropy_backward(logits.*d, targets.*d, rowmax.*d, sumexp.*d, dloss.*d, dlogits.*d, opt);
      }
      expect_exact(rowmax, "cross_entropy_rowmax" + what);  // a max is exact
      expect_match(sumexp, tol_for(dt), "cross_entropy_partials sumexp" + what);
      expect_exact(tl, "cross_entropy_partials target_logit" + what);  // a copy is exact
      expect_match(losses, tol_for(dt), "cross_entropy_loss" + what);
      expect_match(dlogits, tol_for(dt), "cross_entropy_backward" + what);
    }
  }
}

// A shard holding only padding: rowmax -inf, and (given the global row statistics) sumexp and target_logit 0
// and a zero gradient.
TEST_F(CudaOps, CrossEntropyShardOfOnlyPadding) {
  const int64_t N = 5, V = 36;
  const CrossEntropyOptions opt{.vocab_start = 1500, .vocab_size = 1500};
  const Both targets = both_ints({0, 1499, 700, 3, 1000}, {N});
  for (DType dt : kFloatTypes) {
    const Both logits = both(rand_vec(N * V, 410, -5, 5), {N, V}, dt);
    const Both gmax = both(rand_vec(N, 411, 4, 5), {N}, DType::f32);  // the row statistics of the other shards
    const Both gsum = both(rand_vec(N, 412, 1, 30), {N}, DType::f32);
    const Both dloss = both(rand_vec(N, 413), {N}, DType::f32);
    Both rowmax = poisoned({N}, DType::f32), sumexp = poisoned({N}, DType::f32), tl = poisoned({N}, DType::f32);
    Both dlogits = poisoned({N, V}, dt);
    for (auto d : kDevices) {
      cross_entropy_rowmax(logits.*d, rowmax.*d, opt);
      cross_entropy_partials(logits.*d, targets.*d, gmax.*d, sumexp.*d, tl.*d, opt);
      cross_entropy_backward(logits.*d, targets.*d, gmax.*d, gsum.*d, dloss.*d, dlogits.*d, opt);
    }
    const std::string what = str(" (padding only) ", dtype_name(dt));
    for (double m : values(rowmax.gpu)) EXPECT_EQ(m, -std::numeric_limits<double>::infinity()) << "rowmax" << what;
    expect_exact(rowmax, "cross_entropy_rowmax" + what);
    expect_exact(sumexp, "cross_entropy_partials sumexp" + what);
    expect_exact(tl, "cross_entropy_partials target_logit" + what);
    expect_exact(dlogits, "cross_entropy_backward" + what);
  }
}

// ---- optimizer ops -------------------------------------------------------------------------------

TEST_F(CudaOps, SumSquares) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    const Both x = both(rand_vec(n, 420, -3, 3), {n}, DType::f32);
    const double cpu = sum_squares(x.cpu), gpu = sum_squares(x.gpu);
    EXPECT_LE(std::abs(gpu - cpu), 1e-5 * std::abs(cpu))
        << "sum_squares of " << n << " values: gpu " << gpu << ", cpu " << cpu;
  }
}

// The gradient norm's form: many tensors (one empty) in one call, against the CPU's.
TEST_F(CudaOps, SumSquaresOfManyTensors) {
  std::vector<Tensor> cpu_xs, gpu_xs;
  for (int64_t n : {int64_t{5}, int64_t{0}, int64_t{4097}, int64_t{300001}, int64_t{1}}) {
    const Both x = both(rand_vec(n, 440 + static_cast<uint32_t>(n % 97), -2, 2), {n}, DType::f32);
    cpu_xs.push_back(x.cpu);
    gpu_xs.push_back(x.gpu);
  }
  const double cpu = sum_squares(cpu_xs), gpu = sum_squares(gpu_xs);
  EXPECT_LE(std::abs(gpu - cpu), 1e-9 * std::abs(cpu)) << "gpu " << gpu << ", cpu " << cpu;
  EXPECT_EQ(sum_squares(gpu_xs), gpu);  // deterministic
}

TEST_F(CudaOps, HasInfOrNan) {
  const int64_t n = 100003;
  const Vec x = rand_vec(n, 430, -3, 3);
  EXPECT_FALSE(has_inf_or_nan(make(x, {n}).to(Device::cuda)));
  EXPECT_FALSE(has_inf_or_nan(make({3e38, -3e38, 0}, {3}).to(Device::cuda)));
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [bad, at] : {std::pair{nan, int64_t{77777}}, std::pair{inf, n - 1}, std::pair{-inf, int64_t{0}},
                                std::pair{nan, int64_t{5}}}) {
    Vec y = x;
    y[at] = bad;
    EXPECT_TRUE(has_inf_or_nan(make(y, {n}).to(Device::cuda))) << bad << " at " << at;
  }
}

TEST_F(CudaOps, AdamWOverThreeSteps) {
  const int64_t n = 10007;
  Both master = both(rand_vec(n, 440), {n}, DType::f32);
  Both exp_avg = both(Vec(n, 0.0), {n}, DType::f32), exp_avg_sq = both(Vec(n, 0.0), {n}, DType::f32);
  for (int64_t step = 1; step <= 3; ++step) {
    const Both grad = both(rand_vec(n, 441 + static_cast<uint32_t>(step), -2, 2), {n}, DType::f32);
    const AdamWOptions opt{.lr = 1e-2f,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .step = step,
                           .grad_scale = 0.5f};
    for (auto d : kDevices) adamw_step(master.*d, grad.*d, exp_avg.*d, exp_avg_sq.*d, opt);
    expect_match(master, 1e-5, str("adamw master, step ", step));
    expect_match(exp_avg, 1e-5, str("adamw exp_avg, step ", step));
    expect_match(exp_avg_sq, 1e-5, str("adamw exp_avg_sq, step ", step));
  }
}

// ---- copies across devices and dtypes ------------------------------------------------------------

// Every (device, dtype) -> (device, dtype) copy touching the GPU equals the host's round to nearest even:
// the value rounded to the source dtype, then to the destination dtype.
TEST_F(CudaOps, CopyFromAcrossDevicesAndDtypes) {
  Vec x = rand_vec(1000, 450, -4, 4);
  for (double v : {1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 65504.0, 65519.0, 65520.0, 70000.0,
                   -1e9, 1e38, 0x1p-24, 0x1p-25, 3 * 0x1p-25, 1e-6, -0.0, 0.0, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()})
    x.push_back(static_cast<float>(v));
  const int64_t n = static_cast<int64_t>(x.size());
  for (Device src_dev : {Device::cpu, Device::cuda})
    for (DType src_dt : kFloatTypes)
      for (Device dst_dev : {Device::cpu, Device::cuda})
        for (DType dst_dt : kFloatTypes) {
          if (src_dev == Device::cpu && dst_dev == Device::cpu) continue;
          const Tensor src = make(x, {n}, src_dt).to(src_dev);
          Tensor dst = make(Vec(n, std::numeric_limits<double>::quiet_NaN()), {n}, dst_dt).to(dst_dev);
          dst.copy_from(src);
          const std::vector<float> got = dst.to_floats();
          int64_t bad = 0, first = -1;
          for (int64_t i = 0; i < n; ++i) {
            const float want = round_to(dst_dt, round_to(src_dt, static_cast<float>(x[i])));
            if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && bad++ == 0) first = i;
          }
          EXPECT_EQ(bad, 0) << device_name(src_dev) << " " << dtype_name(src_dt) << " -> " << device_name(dst_dev)
                            << " " << dtype_name(dst_dt) << ": first mismatch at " << first << " (value "
                            << (first >= 0 ? x[first] : 0.0) << ")";
        }
}

// ---- fused step ops (multi-tensor AdamW, one-pass grad stats, the loss on the device) --------------

// More tensors than one launch's table holds (256), sizes around the per-block chunks, one empty.
std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes{4097, 0, 65537, 1, 200003};
  for (int k = 0; k < 300; ++k) sizes.push_back(1 + (k * 37) % 130);
  return sizes;
}

// Bit for bit the CPU's: masters, moments and the rounded values, over three steps.
TEST_F(CudaOps, MultiTensorAdamWEqualsCpu) {
  for (DType value_dt : {DType::bf16, DType::f32}) {
    const std::vector<int64_t> sizes = many_sizes();
    std::vector<Both> master, m, v, value;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Vec p = rand_vec(sizes[k], 800 + static_cast<uint32_t>(k));
      master.push_back(both(p, {sizes[k]}, DType::f32));
      m.push_back(both(Vec(sizes[k], 0.0), {sizes[k]}, DType::f32));
      v.push_back(both(Vec(sizes[k], 0.0), {sizes[k]}, DType::f32));
      value.push_back(both(p, {sizes[k]}, value_dt));
    }
    for (int64_t step = 1; step <= 3; ++step) {
      const AdamWOptions opt{.lr = 1e-2f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .step = step,
                             .grad_scale = 0.37f};
      std::vector<AdamWTensors> ts[2];
      for (size_t k = 0; k < sizes.size(); ++k) {
        const Both g =
            both(rand_vec(sizes[k], 900 + static_cast<uint32_t>(7 * step + k), -2, 2), {sizes[k]}, DType::f32);
        for (int d = 0; d < 2; ++d)
          ts[d].push_back({.master = master[k].*kDevices[d],
                           .grad = g.*kDevices[d],
                           .exp_avg = m[k].*kDevices[d],
                           .exp_avg_sq = v[k].*kDevices[d],
                           .value = value_dt == DType::f32 ? Tensor() : value[k].*kDevices[d],
                           .decay = k % 3 != 1});
      }
      for (auto& t : ts) adamw_multi_step(t, opt);
      for (size_t k = 0; k < sizes.size(); ++k) {
        const std::string what = str(dtype_name(value_dt), " tensor ", k, " step ", step);
        expect_exact(master[k], "adamw_multi_step master, " + what);
        expect_exact(m[k], "adamw_multi_step exp_avg, " + what);
        expect_exact(v[k], "adamw_multi_step exp_avg_sq, " + what);
        if (value_dt != DType::f32) expect_exact(value[k], "adamw_multi_step value, " + what);
      }
    }
  }
}

TEST_F(CudaOps, GradStatsEqualCpu) {
  const std::vector<int64_t> sizes = many_sizes();
  std::vector<Both> xs;
  std::vector<Tensor> cpu_xs, gpu_xs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    xs.push_back(both(rand_vec(sizes[k], 1000 + static_cast<uint32_t>(k), -2, 2), {sizes[k]}, DType::f32));
    cpu_xs.push_back(xs.back().cpu);
    gpu_xs.push_back(xs.back().gpu);
  }
  const GradStats cpu = grad_stats(cpu_xs), gpu = grad_stats(gpu_xs);
  EXPECT_LE(std::abs(gpu.sum_squares - cpu.sum_squares), 1e-9 * cpu.sum_squares)
      << "gpu " << gpu.sum_squares << ", cpu " << cpu.sum_squares;
  EXPECT_FALSE(gpu.found_inf);
  EXPECT_EQ(grad_stats(gpu_xs).sum_squares, gpu.sum_squares);  // deterministic
  EXPECT_EQ(grad_stats(std::vector<Tensor>{}).sum_squares, 0.0);
  // An inf or NaN in a tensor of the first launch, of the second, or in a long tensor's last chunk.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [bad, k, at] : {std::tuple{inf, size_t{2}, int64_t{65536}}, std::tuple{nan, size_t{290}, int64_t{0}},
                                   std::tuple{-inf, size_t{4}, int64_t{200002}}}) {
    Vec y = values(xs[k].cpu);
    y[at] = bad;
    std::vector<Tensor> with_bad = gpu_xs;
    with_bad[k] = make(y, {sizes[k]}).to(Device::cuda);
    const GradStats st = grad_stats(with_bad);
    EXPECT_TRUE(st.found_inf) << bad << " in tensor " << k << " at " << at;
    EXPECT_FALSE(std::isfinite(st.sum_squares));
  }
}

TEST_F(CudaOps, AccumulateMeanAndFill) {
  Both sum = {f64_zeros(1, Device::cpu), f64_zeros(1, Device::cuda)};
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{16384}}) {
    const Both l = both(rand_vec(n, 1100 + static_cast<uint32_t>(n), 0, 9), {n}, DType::f32);
    for (auto d : kDevices) accumulate_mean(l.*d, sum.*d);
  }
  const double cpu = read_f64(sum.cpu)[0], gpu = read_f64(sum.gpu)[0];
  EXPECT_LE(std::abs(gpu - cpu), 1e-6 * cpu) << "gpu " << gpu << ", cpu " << cpu;
  for (DType dt : kFloatTypes) {
    Both x = poisoned({70001}, dt);
    for (auto d : kDevices) fill_(x.*d, 0.1f);
    expect_exact(x, str("fill_ ", dtype_name(dt)));
  }
}

// An optimizer step reads the device once (the grad norm and inf/NaN verdict together) and copies nothing
// from the host; a skipped step the same.
TEST_F(CudaOps, OptimizerStepReadsTheDeviceOnce) {
#if defined(MEGATRAIN_WITH_CUDA)
  std::vector<Parameter> params;
  for (int k = 0; k < 40; ++k) {
    Parameter p = make_parameter(str("w", k), {33, 17}, DType::bf16, Init::normal, 1.f, 3);
    p.value = p.value.to(Device::cuda);
    p.grad = make(rand_vec(33 * 17, 1200 + static_cast<uint32_t>(k)), {33, 17}).to(Device::cuda);
    p.weight_decay = k % 2 == 0;
    params.push_back(std::move(p));
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  AdamW opt(ptrs, {.weight_decay = 0.1, .grad_clip = 1.0});
  cuda::synchronize();
  for (int step = 0; step < 2; ++step) {
    const cuda::HostCopyCounts before = cuda::host_copy_counts();
    const StepResult r = opt.step(1e-3, 1.0);
    const cuda::HostCopyCounts after = cuda::host_copy_counts();
    EXPECT_FALSE(r.found_inf);
    EXPECT_EQ(after.to_host - before.to_host, 1) << "step " << step;
    EXPECT_EQ(after.from_host - before.from_host, 0) << "step " << step;
  }
  params[7].grad.view({33 * 17}).slice(5, 6).copy_from(make({std::numeric_limits<double>::infinity()}, {1}));
  const cuda::HostCopyCounts before = cuda::host_copy_counts();
  EXPECT_TRUE(opt.step(1e-3, 1.0).found_inf);
  EXPECT_EQ(cuda::host_copy_counts().to_host - before.to_host, 1);
#endif
}

// A training microbatch (forward with the loss kept on the device, backward with the seed filled there)
// copies nothing between host and device once its tokens are there.
TEST_F(CudaOps, MicrobatchLeavesTheLossOnTheDevice) {
#if defined(MEGATRAIN_WITH_CUDA)
  ModelConfig cfg;
  cfg.num_layers = 2;
  cfg.hidden_size = 32;
  cfg.num_heads = 2;
  cfg.ffn_hidden_size = 64;
  cfg.seq_length = 16;
  cfg.max_position_embeddings = 16;
  cfg.vocab_size = 100;
  cfg.padded_vocab_size = 128;
  cfg.head_dim = 16;
  cfg.dropout = cfg.attention_dropout = 0.f;  // the training and the evaluation forward agree
  GptModel model(cfg, {.dtype = DType::bf16, .device = Device::cuda});
  std::vector<int32_t> ids = rand_ids(2 * 16, 1300, 0, 100), next = rand_ids(2 * 16, 1301, 0, 100);
  const Tensor tokens = Tensor::from_ints(ids, {2, 16}).to(Device::cuda);
  const Tensor targets = Tensor::from_ints(next, {2, 16}).to(Device::cuda);
  Tensor loss_sum = f64_zeros(1, Device::cuda);
  cuda::synchronize();
  const cuda::HostCopyCounts before = cuda::host_copy_counts();
  for (int mb = 0; mb < 2; ++mb) {
    model.forward_stage(Tensor(), tokens, targets, mb, {.sample_offset = 0, .training = true}, loss_sum);
    model.backward(mb, 0.5f);
  }
  const cuda::HostCopyCounts after = cuda::host_copy_counts();
  EXPECT_EQ(after.to_host - before.to_host, 0);
  EXPECT_EQ(after.from_host - before.from_host, 0);
  // The same value as the host reading of each microbatch's loss.
  float loss = 0;
  model.forward_stage(Tensor(), tokens, targets, 9, {.sample_offset = 0, .training = false}, &loss);
  EXPECT_NEAR(read_f64(loss_sum)[0], 2.0 * loss, 1e-5);
#endif
}

// ---- caching allocator ---------------------------------------------------------------------------

// A second round of the same allocations is served from the cache: no new cudaMalloc.
TEST_F(CudaOps, CachingAllocatorReusesFreedBlocks) {
#if defined(MEGATRAIN_WITH_CUDA)
  auto round = [] {
    std::vector<Tensor> ts;
    for (const auto& [shape, dt] : {std::pair<Shape, DType>{{1000}, DType::f32},
                                    {{37, 53}, DType::bf16},
                                    {{4096, 1024}, DType::f32},
                                    {{3, 5, 7}, DType::f16},
                                    {{1, 1}, DType::f32},
                                    {{2048, 3000}, DType::bf16},
                                    {{1000}, DType::f32}})
      ts.push_back(Tensor::empty(shape, dt, Device::cuda));
  };
  round();
  const cuda::CacheStats first = cuda::cache_stats();
  round();
  const cuda::CacheStats second = cuda::cache_stats();
  EXPECT_EQ(second.device_mallocs, first.device_mallocs);
  EXPECT_GE(second.cache_hits, first.cache_hits + 7);
  EXPECT_EQ(second.reserved_bytes, first.reserved_bytes);
#endif
}

// ---- GEMM epilogues and fused kernels ------------------------------------------------------------
// Each cuBLASLt epilogue (core/cuda/gemm.cpp) and the fused residual + dropout kernel against the CPU
// reference, which runs the unfused sequence. Shapes with N a multiple of 8 take cuBLASLt's fused epilogue
// (bf16/f16 for the GELU ones); the others exercise the composed fallback. The fused results round once where
// the CPU rounds twice, hence the dtype tolerances rather than exact equality.

struct EpilogueShape {
  int64_t M, K, N;
};
constexpr EpilogueShape kEpilogueShapes[] = {{64, 40, 96}, {37, 29, 53}, {128, 64, 256}};

TEST_F(CudaOps, GemmBiasEpilogue) {
  uint32_t seed = 900;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes)
      for (float beta : {0.f, 0.5f}) {
        const Both x = both(rand_vec(M * K, ++seed), {M, K}, dt);
        const Both w = both(rand_vec(N * K, ++seed), {N, K}, dt);  // (out, in): x @ w^T, as linear_forward
        const Both bias = both(rand_vec(N, ++seed), {N}, dt);
        Both out = beta == 0.f ? poisoned({M, N}, dt) : both(rand_vec(M * N, ++seed), {M, N}, dt);
        for (auto d : kDevices)
          gemm(x.*d, w.*d, out.*d, {.trans_b = true, .beta = beta, .epilogue = Epilogue::bias, .bias = &(bias.*d)});
        expect_match(out, tol_for(dt), str("gemm+bias ", M, "x", K, "x", N, " ", dtype_name(dt), " beta=", beta));
      }
}

TEST_F(CudaOps, GemmGeluBiasEpilogueKeepsThePreActivation) {
  uint32_t seed = 920;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes) {
      const Both x = both(rand_vec(M * K, ++seed), {M, K}, dt);
      const Both w = both(rand_vec(N * K, ++seed), {N, K}, dt);
      const Both bias = both(rand_vec(N, ++seed), {N}, dt);
      Both out = poisoned({M, N}, dt), aux = poisoned({M, N}, dt);
      for (auto d : kDevices)
        gemm(x.*d, w.*d, out.*d,
             {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &(bias.*d), .aux = &(aux.*d)});
      const std::string what = str(" ", M, "x", K, "x", N, " ", dtype_name(dt));
      expect_match(aux, tol_for(dt), "gemm+gelu_bias aux (pre-activation)" + what);
      expect_match(out, tol_for(dt), "gemm+gelu_bias out" + what);
    }
}

TEST_F(CudaOps, GemmDgeluBgradEpilogueAccumulatesTheBiasGradient) {
  uint32_t seed = 940;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes) {
      const Both dy = both(rand_vec(M * K, ++seed), {M, K}, dt);          // (tokens, C): dmlp
      const Both w2 = both(rand_vec(K * N, ++seed), {K, N}, dt);          // (C, F): fc2's weight
      const Both pre = both(rand_vec(M * N, ++seed, -3, 3), {M, N}, dt);  // fc1's pre-activation
      Both out = poisoned({M, N}, dt);
      Both dbias = both(rand_vec(N, ++seed, -5, 5), {N}, DType::f32);  // nonzero start: must be added to
      for (auto d : kDevices) {
        Tensor aux = pre.*d;
        gemm(dy.*d, w2.*d, out.*d, {.epilogue = Epilogue::dgelu_bgrad, .aux = &aux, .dbias = &(dbias.*d)});
      }
      const std::string what = str(" ", M, "x", K, "x", N, " ", dtype_name(dt));
      expect_match(out, tol_for(dt), "gemm+dgelu_bgrad out" + what);
      expect_match(dbias, tol_for(dt), "gemm+dgelu_bgrad dbias" + what);
    }
}

TEST_F(CudaOps, GemmBgradEpilogueOfTheWeightGradient) {
  uint32_t seed = 960;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes) {
      // dW (M = out features, N = in features) += dout^T (M, K tokens) @ x (K, N), out f32 as a weight gradient.
      const Both dout = both(rand_vec(K * M, ++seed), {K, M}, dt);
      const Both x = both(rand_vec(K * N, ++seed), {K, N}, dt);
      Both dw = both(rand_vec(M * N, ++seed), {M, N}, DType::f32);
      Both dbias = both(rand_vec(M, ++seed, -5, 5), {M}, DType::f32);
      for (auto d : kDevices)
        gemm(dout.*d, x.*d, dw.*d, {.trans_a = true, .beta = 1.f, .epilogue = Epilogue::bgrad_a, .dbias = &(dbias.*d)});
      const std::string what = str(" ", M, "x", K, "x", N, " ", dtype_name(dt));
      expect_match(dw, tol_for(dt), "gemm+bgrad_a dW" + what);
      expect_match(dbias, tol_for(dt), "gemm+bgrad_a dbias" + what);
    }
}

TEST_F(CudaOps, DropoutAddMatchesTheCpu) {
  const int64_t B = 2, T = 37, C = 70;  // C and col_offset not multiples of 4, as the dropout test
  for (float p : {0.f, 0.1f, 0.5f}) {
    const DropoutOptions opt{.p = p,
                             .seed = 1234,
                             .site = stream_id("layers.0.attn.out"),
                             .sample_offset = 3,
                             .row_offset = 11,
                             .col_offset = 6};
    for (DType dt : kFloatTypes) {
      const std::string what = str(" p=", p, " ", dtype_name(dt));
      const Both x = both(rand_vec(B * T * C, 990, -2, 2), {B, T, C}, dt);
      const Both residual = both(rand_vec(B * T * C, 991, -2, 2), {B, T, C}, dt);
      Both out = poisoned({B, T, C}, dt);
      Both inplace = both(values(residual.cpu), {B, T, C}, dt);  // out aliasing the residual
      for (auto d : kDevices) {
        dropout_add(x.*d, residual.*d, out.*d, opt);
        dropout_add(x.*d, inplace.*d, inplace.*d, opt);
      }
      expect_match(out, tol_for(dt), "dropout_add" + what);
      expect_match(inplace, tol_for(dt), "dropout_add in place" + what);
      // Same mask and the CPU's double rounding: equal element for element in every dtype.
      expect_exact(out, "dropout_add" + what);
      expect_exact(inplace, "dropout_add in place" + what);
    }
  }
}

// ---- 16-byte vector forms: tails, odd row lengths, misaligned views ---------------------------------
// Each op on sizes and row lengths around the vector width (tails), on views at offset 0 and 1 (the vector and
// scalar forms), against the CPU; where an op has no reduction, its two GPU results must also be the same bits:
// the two forms do the same arithmetic per element. (The norms' cases are in their tests above.)

TEST_F(CudaOps, FlatOpsOnTailsAndMisalignedViews) {
  for (int64_t n : kTailSizes)
    for (DType dt : kFloatTypes) {
      const std::string size = str(" n=", n, " ", dtype_name(dt));
      const Vec av = rand_vec(n, 1400, -4, 4), bv = rand_vec(n, 1401), dv = rand_vec(n, 1402);
      std::vector<Tensor> sums, inplaces, scaleds, gelus, dgelus;
      for (int64_t off : kViewOffsets) {
        const std::string what = str(size, " at offset ", off);
        const Both a = both_at(av, {n}, dt, off), b = both_at(bv, {n}, dt, off), d = both_at(dv, {n}, dt, off);
        Both sum = poisoned_at({n}, dt, off), inplace = both_at(av, {n}, dt, off);
        Both scaled = both_at(av, {n}, dt, off), g = poisoned_at({n}, dt, off), dg = poisoned_at({n}, dt, off);
        for (auto dev : kDevices) {
          add(a.*dev, b.*dev, sum.*dev);
          add(inplace.*dev, b.*dev, inplace.*dev);  // out aliasing a
          scale_(scaled.*dev, -0.37f);
          gelu_forward(a.*dev, g.*dev);
          gelu_backward(a.*dev, d.*dev, dg.*dev);
        }
        expect_match(sum, tol_for(dt), "add" + what);
        expect_match(inplace, tol_for(dt), "add in place" + what);
        expect_match(scaled, tol_for(dt), "scale_" + what);
        expect_match(g, tol_for(dt), "gelu_forward" + what);
        expect_match(dg, tol_for(dt), "gelu_backward" + what);
        sums.push_back(sum.gpu);
        inplaces.push_back(inplace.gpu);
        scaleds.push_back(scaled.gpu);
        gelus.push_back(g.gpu);
        dgelus.push_back(dg.gpu);
      }
      expect_same_bits(sums, "add" + size);
      expect_same_bits(inplaces, "add in place" + size);
      expect_same_bits(scaleds, "scale_" + size);
      expect_same_bits(gelus, "gelu_forward" + size);
      expect_same_bits(dgelus, "gelu_backward" + size);
      // One operand misaligned among aligned ones: the scalar form for all.
      const Both a = both_at(av, {n}, dt, 0), b = both_at(bv, {n}, dt, 1);
      Both sum = poisoned_at({n}, dt, 0);
      for (auto dev : kDevices) add(a.*dev, b.*dev, sum.*dev);
      expect_match(sum, tol_for(dt), "add with b misaligned" + size);
      EXPECT_TRUE(bytes_of(sum.gpu) == bytes_of(sums[0])) << "add with b misaligned" << size;
    }
}

TEST_F(CudaOps, SwiGluOnTailsAndMisalignedViews) {
  for (int64_t F : {1, 7, 8, 13, 1000, 1003})
    for (int64_t N : {1, 3})
      for (DType dt : kFloatTypes) {
        const std::string size = str(" ", N, "x", F, " ", dtype_name(dt));
        Vec xv = rand_vec(N * 2 * F, 1410, -6, 6);
        xv[0] = 200.0;  // a tail of exp
        const Vec dv = rand_vec(N * F, 1411);
        std::vector<Tensor> outs, dxs;
        for (int64_t off : kViewOffsets) {
          const std::string what = str(size, " at offset ", off);
          const Both x = both_at(xv, {N, 2 * F}, dt, off), dout = both_at(dv, {N, F}, dt, off);
          Both out = poisoned_at({N, F}, dt, off), dx = poisoned_at({N, 2 * F}, dt, off);
          for (auto dev : kDevices) {
            swiglu_forward(x.*dev, out.*dev);
            swiglu_backward(x.*dev, dout.*dev, dx.*dev);
          }
          expect_match(out, tol_for(dt), "swiglu_forward" + what);
          expect_match(dx, tol_for(dt), "swiglu_backward" + what);
          outs.push_back(out.gpu);
          dxs.push_back(dx.gpu);
        }
        expect_same_bits(outs, "swiglu_forward" + size);
        expect_same_bits(dxs, "swiglu_backward" + size);
      }
}

// Device-to-device dtype conversion (copy_from), source and destination each aligned or not: the host's round
// to nearest even, bit for bit.
TEST_F(CudaOps, ConvertOnTailsAndMisalignedViews) {
  for (int64_t n : kTailSizes) {
    Vec x = rand_vec(n, 1420, -70000, 70000);  // past fp16's range too
    x[0] = 1.0 + 0x1p-8;                       // a bf16 tie
    for (DType src_dt : kFloatTypes)
      for (DType dst_dt : kFloatTypes) {
        if (src_dt == dst_dt) continue;
        for (int64_t src_off : kViewOffsets)
          for (int64_t dst_off : kViewOffsets) {
            const Both src = both_at(x, {n}, src_dt, src_off);
            Both dst = poisoned_at({n}, dst_dt, dst_off);
            dst.gpu.copy_from(src.gpu);
            const std::vector<float> got = dst.gpu.to_floats();
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < n; ++i) {
              const float want = round_to(dst_dt, round_to(src_dt, static_cast<float>(x[i])));
              if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && bad++ == 0) first = i;
            }
            EXPECT_EQ(bad, 0) << "convert " << dtype_name(src_dt) << " at offset " << src_off << " -> "
                              << dtype_name(dst_dt) << " at offset " << dst_off << ", n=" << n << ": first mismatch at "
                              << first;
          }
      }
  }
}

TEST_F(CudaOps, AddBiasOnOddRowsAndMisalignedViews) {
  for (int64_t C : kRowLengths)
    for (int64_t N : {1, 7})
      for (DType dt : kFloatTypes)
        for (const auto& [bias_dt, bias_off] : param_placements(dt)) {
          const std::string size =
              str(" ", N, "x", C, " ", dtype_name(dt), " bias ", dtype_name(bias_dt), " at offset ", bias_off);
          const Vec xv = rand_vec(N * C, 1430, -3, 3), bv = rand_vec(C, 1431);
          std::vector<Tensor> xs;
          for (int64_t off : kViewOffsets) {
            Both x = both_at(xv, {N, C}, dt, off);
            const Both bias = both_at(bv, {C}, bias_dt, bias_off);
            for (auto dev : kDevices) add_bias(x.*dev, bias.*dev);
            expect_match(x, tol_for(dt), str("add_bias", size, ", x at offset ", off));
            xs.push_back(x.gpu);
          }
          expect_same_bits(xs, "add_bias" + size);
        }
}

// Dropout and dropout_add: the CPU's mask in both forms (vectors need col_offset a multiple of four as well),
// fp32 dropout and every dtype of dropout_add exact, and the two GPU forms the same bits.
TEST_F(CudaOps, DropoutOnOddRowsColumnOffsetsAndMisalignedViews) {
  const int64_t B = 2, T = 3;
  for (int64_t C : kRowLengths)
    for (int64_t col_offset : {0, 6, 8})
      for (DType dt : kFloatTypes) {
        const DropoutOptions opt{.p = 0.3f,
                                 .seed = 77,
                                 .site = stream_id("layers.1.mlp.out"),
                                 .sample_offset = 5,
                                 .row_offset = 2,
                                 .col_offset = col_offset};
        const std::string size = str(" C=", C, " col_offset=", col_offset, " ", dtype_name(dt));
        const Vec xv = rand_vec(B * T * C, 1460, 0.25, 2), rv = rand_vec(B * T * C, 1461, -2, 2);
        std::vector<Tensor> outs, inplaces, adds, add_inplaces;
        for (int64_t off : kViewOffsets) {
          const std::string what = str(size, " at offset ", off);
          const Both x = both_at(xv, {B, T, C}, dt, off), residual = both_at(rv, {B, T, C}, dt, off);
          Both out = poisoned_at({B, T, C}, dt, off), inplace = both_at(xv, {B, T, C}, dt, off);
          Both sum = poisoned_at({B, T, C}, dt, off), sum_inplace = both_at(rv, {B, T, C}, dt, off);
          for (auto dev : kDevices) {
            dropout_forward(x.*dev, out.*dev, opt);
            dropout_backward(inplace.*dev, inplace.*dev, opt);
            dropout_add(x.*dev, residual.*dev, sum.*dev, opt);
            dropout_add(x.*dev, sum_inplace.*dev, sum_inplace.*dev, opt);  // out aliasing the residual
          }
          expect_same_mask(out, "dropout_forward" + what);
          expect_same_mask(inplace, "dropout_backward in place" + what);
          expect_match(out, tol_for(dt), "dropout_forward" + what);
          if (dt == DType::f32) {
            expect_exact(out, "dropout_forward" + what);
            expect_exact(inplace, "dropout_backward in place" + what);
          }
          expect_exact(sum, "dropout_add" + what);
          expect_exact(sum_inplace, "dropout_add in place" + what);
          outs.push_back(out.gpu);
          inplaces.push_back(inplace.gpu);
          adds.push_back(sum.gpu);
          add_inplaces.push_back(sum_inplace.gpu);
        }
        expect_same_bits(outs, "dropout_forward" + size);
        expect_same_bits(inplaces, "dropout_backward in place" + size);
        expect_same_bits(adds, "dropout_add" + size);
        expect_same_bits(add_inplaces, "dropout_add in place" + size);
      }
}

// More rows than gridDim.y holds (65535): both dropout forms stride over the rows beyond it.
TEST_F(CudaOps, DropoutOverMoreRowsThanGridY) {
  const int64_t B = 1, T = 65537, C = 8;
  const DropoutOptions opt{.p = 0.5f, .seed = 3, .site = stream_id("layers.0.attn.out"), .row_offset = 1};
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t off : kViewOffsets) {
      const std::string what = str(" ", B, "x", T, "x", C, " ", dtype_name(dt), " at offset ", off);
      const Vec xv = rand_vec(B * T * C, 1470, 0.25, 2);
      const Both x = both_at(xv, {B, T, C}, dt, off), residual = both_at(xv, {B, T, C}, dt, off);
      Both out = poisoned_at({B, T, C}, dt, off), sum = poisoned_at({B, T, C}, dt, off);
      for (auto dev : kDevices) {
        dropout_forward(x.*dev, out.*dev, opt);
        dropout_add(x.*dev, residual.*dev, sum.*dev, opt);
      }
      expect_same_mask(out, "dropout_forward" + what);
      expect_exact(sum, "dropout_add" + what);
    }
}

// Cross-entropy over row lengths around the vector width, with and without padding columns (real columns not
// a multiple of the width), logits and dlogits aligned or not. Given the same row statistics, dlogits is the
// same bits in both forms.
TEST_F(CudaOps, CrossEntropyOnOddRowsPaddingAndMisalignedViews) {
  for (int64_t V : kRowLengths)
    for (int64_t vocab_size : {int64_t{-1}, V - 3})
      for (int64_t N : {1, 7})
        for (DType dt : kFloatTypes) {
          const CrossEntropyOptions opt{.vocab_start = 0, .vocab_size = vocab_size};
          const std::string size = str(" N=", N, " V=", V, " vocab_size=", vocab_size, " ", dtype_name(dt));
          const Both targets = both_ints(rand_ids(N, 1480, 0, static_cast<int32_t>(V)), {N});
          const Vec lv = rand_vec(N * V, 1481, -5, 5);
          const Both dloss = both(rand_vec(N, 1482), {N}, DType::f32);
          std::vector<Tensor> maxes, grads;
          for (int64_t off : kViewOffsets) {
            const std::string what = str(size, " at offset ", off);
            const Both logits = both_at(lv, {N, V}, dt, off);
            Both rowmax = poisoned({N}, DType::f32), sumexp = poisoned({N}, DType::f32);
            Both tl = poisoned({N}, DType::f32), losses = poisoned({N}, DType::f32);
            Both dlogits = poisoned_at({N, V}, dt, off);
            for (auto dev : kDevices) {
              cross_entropy_rowmax(logits.*dev, rowmax.*dev, opt);
              cross_entropy_partials(logits.*dev, targets.*dev, rowmax.*dev, sumexp.*dev, tl.*dev, opt);
              cross_entropy_loss(rowmax.*dev, sumexp.*dev, tl.*dev, losses.*dev);
            }
            // The backward from the CPU's statistics on both devices.
            const Tensor cpu_max = rowmax.cpu, cpu_sum = sumexp.cpu;
            cross_entropy_backward(logits.cpu, targets.cpu, cpu_max, cpu_sum, dloss.cpu, dlogits.cpu, opt);
            cross_entropy_backward(logits.gpu, targets.gpu, cpu_max.to(Device::cuda), cpu_sum.to(Device::cuda),
                                   dloss.gpu, dlogits.gpu, opt);
            expect_exact(rowmax, "cross_entropy_rowmax" + what);
            expect_match(sumexp, tol_for(dt), "cross_entropy_partials sumexp" + what);
            expect_exact(tl, "cross_entropy_partials target_logit" + what);
            expect_match(losses, tol_for(dt), "cross_entropy_loss" + what);
            expect_match(dlogits, tol_for(dt), "cross_entropy_backward" + what);
            maxes.push_back(rowmax.gpu);
            grads.push_back(dlogits.gpu);
          }
          expect_same_bits(maxes, "cross_entropy_rowmax" + size);
          expect_same_bits(grads, "cross_entropy_backward" + size);
        }
}

// ---- attention paths: cuDNN's fused attention and the kernel -------------------------------------
// MEGATRAIN_ATTENTION picks the path (core/cuda/attention_backend.h); each test sets it and checks which path
// ran with last_attention_path(), so a silent fallback to the kernel cannot pass for cuDNN.

#if defined(MEGATRAIN_WITH_CUDA)
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

// The choice by dtype, dropout and mode needs no GPU: it runs wherever the CUDA backend is built.
TEST(AttentionPath, ChosenByDtypeDropoutAndMode) {
  std::string why;
  {
    AttentionModeScope mode("auto");
    EXPECT_EQ(cuda::attention_path(DType::f32, 0.f, &why), cuda::AttentionPath::kernel);
    EXPECT_NE(why.find("bf16 or fp16"), std::string::npos) << why;
    EXPECT_EQ(cuda::attention_path(DType::bf16, 0.1f, &why), cuda::AttentionPath::kernel);
    EXPECT_NE(why.find("dropout 0.1 needs layout-invariant masks"), std::string::npos) << why;
    const auto fused = cuda::cudnn_built() ? cuda::AttentionPath::cudnn : cuda::AttentionPath::kernel;
    EXPECT_EQ(cuda::attention_path(DType::bf16, 0.f), fused);
    EXPECT_EQ(cuda::attention_path(DType::f16, 0.f), fused);
    EXPECT_NE(cuda::attention_path_description(DType::bf16, 0.1f).find("megatrain kernel (dropout 0.1"),
              std::string::npos);
    if (cuda::cudnn_built()) {
      EXPECT_NE(cuda::attention_path_description(DType::bf16, 0.f).find("cuDNN fused (flash)"), std::string::npos);
    }
  }
  {
    AttentionModeScope mode("kernel");
    EXPECT_EQ(cuda::attention_path(DType::bf16, 0.f, &why), cuda::AttentionPath::kernel);
    EXPECT_EQ(why, "MEGATRAIN_ATTENTION=kernel");
  }
  {
    AttentionModeScope mode("cudnn");  // forcing cuDNN where it cannot run is an error, not a silent fallback
    EXPECT_THROW(cuda::attention_path(DType::f32, 0.f), std::runtime_error);
    EXPECT_THROW(cuda::attention_path(DType::bf16, 0.1f), std::runtime_error);
    if (cuda::cudnn_built())
      EXPECT_EQ(cuda::attention_path(DType::bf16, 0.f), cuda::AttentionPath::cudnn);
    else
      EXPECT_THROW(cuda::attention_path(DType::bf16, 0.f), std::runtime_error);
  }
  {
    AttentionModeScope mode("flash");
    EXPECT_THROW(cuda::attention_mode(), std::runtime_error);
  }
}

TEST(AttentionPath, CudnnVersionIsNamedOrNotBuilt) {
  const std::string v = cuda::cudnn_version();
  if (cuda::cudnn_built())
    EXPECT_NE(v.find("(built with 9."), std::string::npos) << v;
  else
    EXPECT_EQ(v.rfind("not built", 0), 0u) << v;
}

// Skips unless a GPU and the cuDNN path are there.
class CudnnAttention : public CudaOps {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  }
};

struct CudnnCase {
  int64_t B, T, H, D;
  bool causal;
};

void PrintTo(const CudnnCase& c, std::ostream* os) {
  *os << (c.causal ? "causal" : "full") << " B=" << c.B << " T=" << c.T << " H=" << c.H << " D=" << c.D;
}

// The forward and backward of one case on both devices, the GPU under the current MEGATRAIN_ATTENTION.
struct AttnRun {
  Both qkv, dout, out, lse, dqkv;
};

AttnRun run_attention(const CudnnCase& c, DType dt, uint32_t seed, cuda::AttentionPath expect_path) {
  const int64_t B = c.B, T = c.T, H = c.H, D = c.D;
  const AttentionOptions opt{.causal = c.causal};
  AttnRun r{both(rand_vec(B * T * H * 3 * D, seed, -2, 2), {B, T, H, 3, D}, dt),
            both(rand_vec(B * T * H * D, seed + 1), {B, T, H, D}, dt), poisoned({B, T, H, D}, dt),
            poisoned({B, H, T}, DType::f32), poisoned({B, T, H, 3, D}, dt)};
  const AttentionCalls before = attention_calls();
  for (auto d : kDevices) {
    attention_forward(r.qkv.*d, r.out.*d, r.lse.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "forward";
    }
    attention_backward(r.qkv.*d, r.out.*d, r.lse.*d, r.dout.*d, r.dqkv.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "backward";
    }
  }
  // The counters the log and metrics.jsonl report: two CPU calls, and two on the path the GPU took.
  const AttentionCalls after = attention_calls();
  const bool fused = expect_path == cuda::AttentionPath::cudnn;
  EXPECT_EQ(after.cpu - before.cpu, 2);
  EXPECT_EQ(after.cudnn - before.cudnn, fused ? 2 : 0);
  EXPECT_EQ(after.kernel - before.kernel, fused ? 0 : 2);
  return r;
}

class CudnnAttentionShapes : public CudnnAttention, public ::testing::WithParamInterface<CudnnCase> {};

TEST_P(CudnnAttentionShapes, ForwardAndBackwardMatchCpu) {
  AttentionModeScope mode("cudnn");
  for (DType dt : {DType::bf16, DType::f16}) {
    const AttnRun r = run_attention(GetParam(), dt, 700, cuda::AttentionPath::cudnn);
    const std::string what = str(" ", dtype_name(dt));
    expect_match(r.out, tol_for(dt), "cudnn attention out" + what);
    expect_match(r.lse, tol_for(dt), "cudnn attention lse" + what);
    expect_match(r.dqkv, tol_for(dt), "cudnn attention dqkv" + what);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionShapes,
                         ::testing::Values(CudnnCase{2, 37, 3, 64, true}, CudnnCase{1, 130, 2, 128, true},
                                           CudnnCase{2, 128, 4, 64, true}, CudnnCase{1, 77, 2, 128, true},
                                           CudnnCase{2, 100, 2, 64, false}),
                         [](const auto& info) {
                           const CudnnCase& c = info.param;
                           return str(c.causal ? "Causal" : "Full", "_B", c.B, "_T", c.T, "_H", c.H, "_D", c.D);
                         });

// The same inputs give the same gradient bits (cuDNN's deterministic SDPA backward).
TEST_F(CudnnAttention, BackwardIsDeterministic) {
  AttentionModeScope mode("cudnn");
  const int64_t B = 2, T = 193, H = 4, D = 64;
  const AttentionOptions opt{.causal = true};
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor qkv = make(rand_vec(B * T * H * 3 * D, 710, -2, 2), {B, T, H, 3, D}, dt).to(Device::cuda);
    const Tensor dout = make(rand_vec(B * T * H * D, 711), {B, T, H, D}, dt).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, dt, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    attention_forward(qkv, out, lse, opt);
    Tensor first = Tensor::empty({B, T, H, 3, D}, dt, Device::cuda);
    Tensor second = Tensor::empty({B, T, H, 3, D}, dt, Device::cuda);
    attention_backward(qkv, out, lse, dout, first, opt);
    attention_backward(qkv, out, lse, dout, second, opt);
    EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::cudnn);
    EXPECT_EQ(bytes_of(first), bytes_of(second)) << dtype_name(dt);
  }
}

// Forcing either path: both match the CPU, so they match each other within the dtype's tolerance.
TEST_F(CudnnAttention, ForcedKernelAndForcedCudnnBothMatchCpu) {
  const CudnnCase c{2, 65, 2, 64, true};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const auto& [mode_name, path] :
         {std::pair{"kernel", cuda::AttentionPath::kernel}, std::pair{"cudnn", cuda::AttentionPath::cudnn}}) {
      AttentionModeScope mode(mode_name);
      const AttnRun r = run_attention(c, dt, 720, path);
      const std::string what = str(" ", dtype_name(dt), " MEGATRAIN_ATTENTION=", mode_name);
      expect_match(r.out, tol_for(dt), "attention out" + what);
      expect_match(r.lse, tol_for(dt), "attention lse" + what);
      expect_match(r.dqkv, tol_for(dt), "attention dqkv" + what);
    }
  }
}

// auto takes cuDNN for bf16 without dropout, the kernel for fp32, dropout, or a head dimension cuDNN cannot
// load (D = 20, not a multiple of 8); forcing cuDNN on that shape fails loudly.
TEST_F(CudnnAttention, AutoFallsBackToTheKernelWhereCudnnCannotRun) {
  {
    AttentionModeScope mode("auto");
    run_attention({1, 50, 2, 64, true}, DType::bf16, 730, cuda::AttentionPath::cudnn);
    run_attention({1, 50, 2, 64, true}, DType::f32, 731, cuda::AttentionPath::kernel);
    const AttnRun r = run_attention({1, 50, 2, 20, true}, DType::bf16, 732, cuda::AttentionPath::kernel);
    expect_match(r.out, tol_for(DType::bf16), "attention out D=20 on the kernel");
    expect_match(r.dqkv, tol_for(DType::bf16), "attention dqkv D=20 on the kernel");
    const int64_t B = 1, T = 50, H = 2, D = 64;
    const Tensor qkv = make(rand_vec(B * T * H * 3 * D, 733), {B, T, H, 3, D}, DType::bf16).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    attention_forward(qkv, out, lse, {.causal = true, .dropout_p = 0.1f, .seed = 3});
    EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::kernel) << "dropout runs on the kernel";
  }
  {
    AttentionModeScope mode("cudnn");
    const int64_t B = 1, T = 50, H = 2, D = 20;
    const Tensor qkv = make(rand_vec(B * T * H * 3 * D, 734), {B, T, H, 3, D}, DType::bf16).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    EXPECT_THROW(attention_forward(qkv, out, lse, {.causal = true}), std::runtime_error);
  }
}
// ---- grouped-query attention ----
// qkv (B, T, G, R + 2, D): R query heads per key/value group (G = 1: multi-query). Each GPU path is forced with
// MEGATRAIN_ATTENTION and checked against the CPU, whose grouped-query attention test_ops.cpp checks against
// the expanded reference.

struct GqaCase {
  int64_t B, T, G, R, D;
  bool causal;
  float dropout_p;
};

void PrintTo(const GqaCase& c, std::ostream* os) {
  *os << (c.causal ? "causal" : "full") << " p=" << c.dropout_p << " B=" << c.B << " T=" << c.T << " G=" << c.G
      << " R=" << c.R << " D=" << c.D;
}

std::string gqa_name(const GqaCase& c) {
  return str(c.causal ? "Causal" : "Full", c.dropout_p > 0 ? "Dropout" : "NoDropout", "_B", c.B, "_T", c.T, "_G", c.G,
             "_R", c.R, "_D", c.D);
}

// The forward and backward of one grouped case on both devices, the GPU under the current MEGATRAIN_ATTENTION,
// which must take `expect_path`.
AttnRun run_gqa(const GqaCase& c, DType dt, uint32_t seed, cuda::AttentionPath expect_path) {
  const int64_t B = c.B, T = c.T, G = c.G, R = c.R, D = c.D, H = G * R;
  const AttentionOptions opt{
      .causal = c.causal, .dropout_p = c.dropout_p, .seed = 23, .site = 9, .sample_offset = 1, .head_offset = 4};
  AttnRun r{both(rand_vec(B * T * G * (R + 2) * D, seed, -2, 2), {B, T, G, R + 2, D}, dt),
            both(rand_vec(B * T * H * D, seed + 1), {B, T, H, D}, dt), poisoned({B, T, H, D}, dt),
            poisoned({B, H, T}, DType::f32), poisoned({B, T, G, R + 2, D}, dt)};
  for (auto d : kDevices) {
    attention_forward(r.qkv.*d, r.out.*d, r.lse.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "forward";
    }
    attention_backward(r.qkv.*d, r.out.*d, r.lse.*d, r.dout.*d, r.dqkv.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "backward";
    }
  }
  return r;
}

void expect_gqa_match(const AttnRun& r, DType dt, const std::string& what) {
  expect_match(r.out, tol_for(dt), "attention out" + what);
  expect_match(r.lse, tol_for(dt), "attention lse" + what);
  expect_match(r.dqkv, tol_for(dt), "attention dqkv" + what);
}

class CudaGqaKernel : public CudaOps, public ::testing::WithParamInterface<GqaCase> {};

// The kernel (every dtype, dropout with the CPU's masks): dk, dv summed over each group's heads in the block.
TEST_P(CudaGqaKernel, ForwardAndBackwardMatchCpu) {
  AttentionModeScope mode("kernel");
  for (DType dt : kFloatTypes)
    expect_gqa_match(run_gqa(GetParam(), dt, 800, cuda::AttentionPath::kernel), dt, str(" ", dtype_name(dt)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGqaKernel,
                         ::testing::Values(GqaCase{2, 37, 2, 2, 16, true, 0.f}, GqaCase{2, 37, 2, 4, 16, true, 0.1f},
                                           GqaCase{2, 37, 1, 4, 16, false, 0.1f}, GqaCase{1, 130, 1, 2, 64, true, 0.f},
                                           GqaCase{1, 70, 3, 2, 128, true, 0.1f},
                                           GqaCase{1, 40, 2, 3, 256, false, 0.f}),
                         [](const auto& info) { return gqa_name(info.param); });

// The same inputs give the same gradient bits on the kernel (dk, dv: a fixed order over the group's heads).
TEST_F(CudaOps, GqaKernelBackwardIsDeterministic) {
  AttentionModeScope mode("kernel");
  const int64_t B = 2, T = 97, G = 2, R = 4, D = 64, H = G * R;
  const AttentionOptions opt{.causal = true, .dropout_p = 0.1f, .seed = 4, .site = 5};
  const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 810, -2, 2), {B, T, G, R + 2, D}).to(Device::cuda);
  const Tensor dout = make(rand_vec(B * T * H * D, 811), {B, T, H, D}).to(Device::cuda);
  Tensor out = Tensor::empty({B, T, H, D}, DType::f32, Device::cuda);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
  attention_forward(qkv, out, lse, opt);
  Tensor first = Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
  Tensor second = Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
  attention_backward(qkv, out, lse, dout, first, opt);
  attention_backward(qkv, out, lse, dout, second, opt);
  EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::kernel);
  EXPECT_EQ(bytes_of(first), bytes_of(second));
}

class CudnnGqa : public CudnnAttention, public ::testing::WithParamInterface<GqaCase> {};

// cuDNN's native grouped-query SDPA: K, V (B, G, T, D) read in place, the queries gathered for R > 1, dq
// scattered back, dk and dv summed over the group by cuDNN.
TEST_P(CudnnGqa, ForwardAndBackwardMatchCpu) {
  AttentionModeScope mode("cudnn");
  for (DType dt : {DType::bf16, DType::f16})
    expect_gqa_match(run_gqa(GetParam(), dt, 820, cuda::AttentionPath::cudnn), dt,
                     str(" ", dtype_name(dt), " on cuDNN"));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnGqa,
                         ::testing::Values(GqaCase{2, 37, 2, 2, 64, true, 0.f}, GqaCase{1, 130, 1, 4, 128, true, 0.f},
                                           GqaCase{2, 100, 2, 3, 64, false, 0.f}, GqaCase{2, 65, 4, 1, 64, true, 0.f}),
                         [](const auto& info) { return gqa_name(info.param); });

// Forcing either path on one grouped case: both match the CPU.
TEST_F(CudnnAttention, GqaForcedKernelAndForcedCudnnBothMatchCpu) {
  const GqaCase c{2, 65, 2, 4, 64, true, 0.f};
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [mode_name, path] :
         {std::pair{"kernel", cuda::AttentionPath::kernel}, std::pair{"cudnn", cuda::AttentionPath::cudnn}}) {
      AttentionModeScope mode(mode_name);
      expect_gqa_match(run_gqa(c, dt, 830, path), dt, str(" ", dtype_name(dt), " MEGATRAIN_ATTENTION=", mode_name));
    }
}

// The same inputs give the same gradient bits on cuDNN with R > 1 (its deterministic backward, then the scatter).
TEST_F(CudnnAttention, GqaBackwardIsDeterministic) {
  AttentionModeScope mode("cudnn");
  const int64_t B = 2, T = 193, G = 2, R = 4, D = 64, H = G * R;
  const AttentionOptions opt{.causal = true};
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 840, -2, 2), {B, T, G, R + 2, D}, dt).to(Device::cuda);
    const Tensor dout = make(rand_vec(B * T * H * D, 841), {B, T, H, D}, dt).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, dt, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    attention_forward(qkv, out, lse, opt);
    Tensor first = Tensor::empty(qkv.shape(), dt, Device::cuda);
    Tensor second = Tensor::empty(qkv.shape(), dt, Device::cuda);
    attention_backward(qkv, out, lse, dout, first, opt);
    attention_backward(qkv, out, lse, dout, second, opt);
    EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::cudnn);
    EXPECT_EQ(bytes_of(first), bytes_of(second)) << dtype_name(dt);
  }
}
// ---- end grouped-query attention ----
#endif  // MEGATRAIN_WITH_CUDA

}  // namespace
}  // namespace mt
