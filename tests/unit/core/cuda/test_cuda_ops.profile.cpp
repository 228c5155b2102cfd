// test_cuda_ops.profile.cpp: the op profiler on the GPU (CUDA events on the compute stream, core/tensor/op_profile.h):
// a session around GPU ops gives one row per op and GEMM shape with device milliseconds, a large GEMM takes longer
// than a small one, and the results of the ops are those without a session.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); skips where no GPU can run it.
#include <gtest/gtest.h>

#include "core/tensor/op_profile.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace)

TEST_F(CudaOps, OpProfileTimesGpuOpsWithEvents) {
  // The big GEMM takes about 0.2 ms on an H200, well above the launch gaps that can dominate a small one's events
  // (at L = 1024 the H200 timed the 64^3 GEMMs longer).
  const int64_t S = 64, L = 4096;
  const Both small_a = both(rand_vec(S * S, 1), {S, S}, DType::bf16),
             small_b = both(rand_vec(S * S, 2), {S, S}, DType::bf16);
  const Both big_a = both(rand_vec(L * L, 3), {L, L}, DType::bf16),
             big_b = both(rand_vec(L * L, 4), {L, L}, DType::bf16);
  Tensor small_out = Tensor::empty({S, S}, DType::bf16, Device::cuda);
  Tensor big_out = Tensor::empty({L, L}, DType::bf16, Device::cuda);
  Tensor plain = Tensor::empty({L, L}, DType::bf16, Device::cuda);
  gemm(big_a.gpu, big_b.gpu, plain);  // warm: cuBLASLt's first call
  gemm(small_a.gpu, small_b.gpu, small_out);

  op_profile::Session s(Device::cuda);
  for (int i = 0; i < 3; ++i) gemm(small_a.gpu, small_b.gpu, small_out);
  for (int i = 0; i < 3; ++i) gemm(big_a.gpu, big_b.gpu, big_out);
  const op_profile::Report r = s.finish();
  ASSERT_EQ(r.device, Device::cuda);
  ASSERT_EQ(r.rows.size(), 2u) << op_profile::format_report(r, 1, 10);
  EXPECT_EQ(r.rows[0].detail, "4096x4096x4096 nn") << "the big GEMM first (largest time)";
  EXPECT_EQ(r.rows[0].calls, 3);
  EXPECT_EQ(r.rows[1].detail, "64x64x64 nn");
  EXPECT_GT(r.rows[1].ms, 0);
  EXPECT_GT(r.rows[0].ms, r.rows[1].ms);
  EXPECT_LE(r.op_ms(), r.step_ms * 1.01) << "device time inside the wall time of the session";
  EXPECT_EQ(values(big_out), values(plain)) << "the profiled GEMM computes what the plain one does";
}

}  // namespace
}  // namespace mt
