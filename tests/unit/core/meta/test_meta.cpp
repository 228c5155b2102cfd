// The meta device (core/meta/meta.h): tensors without values, ops checked and counted, memory accounted as the
// real backends' allocators account it, and the CPU's in-op workspaces mirrored.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "core/meta/meta.h"
#include "core/tensor/backend.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"

namespace mt {
namespace {

int64_t kind_peak(const MemoryStats& s, MemKind k) { return s.peak[static_cast<size_t>(k)]; }
int64_t kind_now(const MemoryStats& s, MemKind k) { return s.current[static_cast<size_t>(k)]; }

TEST(Meta, LargeTensorsHaveNoMemoryAndAreCounted) {
  meta::Session session(meta::Mirror::cpu);
  {
    // 64 GiB: far more than this machine has, counted and never touched.
    Tensor big = Tensor::empty({int64_t{1} << 34}, DType::f32, Device::meta, MemKind::activation);
    EXPECT_EQ(big.device(), Device::meta);
    EXPECT_TRUE(meta::is_unbacked(big.raw()));
    big.zero_();  // no memory to clear: a no-op, not a crash
    EXPECT_EQ(kind_now(session.memory(), MemKind::activation), int64_t{1} << 36);
  }
  EXPECT_EQ(kind_now(session.memory(), MemKind::activation), 0);
  EXPECT_EQ(kind_peak(session.memory(), MemKind::activation), int64_t{1} << 36);
  EXPECT_EQ(session.memory().peak_total, int64_t{1} << 36);
}

TEST(Meta, SmallTensorsCarryValuesToAndFromTheHost) {
  meta::Session session(meta::Mirror::cpu);
  const std::vector<float> v = {1.5f, -2.f, 3.25f};
  const Tensor m = Tensor::from_floats(v, {3}).to(Device::meta);
  EXPECT_FALSE(meta::is_unbacked(m.raw()));
  EXPECT_EQ(m.to_floats(), v);
  // An unbacked tensor reads as zeros.
  const Tensor big = Tensor::empty({1 << 20}, DType::f32, Device::meta);
  EXPECT_EQ(big.slice(0, 2).to_floats(), (std::vector<float>{0.f, 0.f}));
}

TEST(Meta, GemmChecksShapesCountsFlopsAndMirrorsTheCpuWorkspaces) {
  meta::Session session(meta::Mirror::cpu);
  {
    Tensor a = Tensor::empty({64, 32}, DType::bf16, Device::meta),
           b = Tensor::empty({32, 16}, DType::bf16, Device::meta);
    Tensor out = Tensor::empty({64, 16}, DType::bf16, Device::meta);
    session.reset_peaks();
    gemm(a, b, out);
    // core/cpu/gemm.cpp widens out, a and b to fp32 for the call.
    EXPECT_EQ(kind_peak(session.memory(), MemKind::workspace), 4 * (64 * 16 + 64 * 32 + 32 * 16));
    EXPECT_EQ(kind_now(session.memory(), MemKind::workspace), 0);
    Tensor wrong = Tensor::empty({64, 17}, DType::bf16, Device::meta);
    EXPECT_THROW(gemm(a, b, wrong), std::invalid_argument);  // the entry point's checks hold on meta
  }
  const meta::Counts c = session.counts();
  ASSERT_EQ(c.ops.count("gemm"), 1u);
  EXPECT_EQ(c.ops.at("gemm").calls, 1);
  EXPECT_DOUBLE_EQ(c.ops.at("gemm").flops, 2.0 * 64 * 16 * 32);
  EXPECT_DOUBLE_EQ(c.ops.at("gemm").bytes, 2.0 * (64 * 32 + 32 * 16 + 64 * 16));
}

TEST(Meta, CudaMirrorKeepsOneGemmWorkspaceForTheSession) {
  meta::Session session(meta::Mirror::cuda);
  Tensor a = Tensor::empty({64, 32}, DType::bf16, Device::meta), b = Tensor::empty({32, 16}, DType::bf16, Device::meta);
  Tensor out = Tensor::empty({64, 16}, DType::bf16, Device::meta);
  gemm(a, b, out);
  gemm(a, b, out);
  EXPECT_EQ(kind_now(session.memory(), MemKind::workspace), int64_t{32} << 20);
  EXPECT_EQ(session.counts().ops.at("gemm").calls, 2);
}

TEST(Meta, EveryOtherOpIsCountedWithItsBytes) {
  meta::Session session(meta::Mirror::cpu);
  Tensor x = Tensor::empty({8, 16}, DType::f32, Device::meta), out = Tensor::empty({8, 16}, DType::f32, Device::meta);
  gelu_forward(x, out);
  const meta::Counts c = session.counts();
  EXPECT_EQ(c.ops.at("gelu_forward").calls, 1);
  EXPECT_DOUBLE_EQ(c.ops.at("gelu_forward").bytes, 2.0 * 8 * 16 * 4);
  EXPECT_DOUBLE_EQ(c.bytes(), 2.0 * 8 * 16 * 4);
  EXPECT_DOUBLE_EQ(c.flops(), 0);
}

TEST(Meta, MoeDispatchGivesEveryExpertItsBalancedShare) {
  meta::Session session(meta::Mirror::cpu);
  Tensor experts = Tensor::empty({10, 2}, DType::i32, Device::meta),
         row_of = Tensor::empty({10, 2}, DType::i32, Device::meta);
  Tensor counts = Tensor::empty({3}, DType::i32, Device::meta);
  moe_dispatch_index(experts, row_of, counts);
  EXPECT_EQ(counts.to_floats(), (std::vector<float>{7, 7, 6}));  // 20 choices over 3 experts
  moe_dispatch_index(experts, row_of, counts, {.capacity = 5});
  EXPECT_EQ(counts.to_floats(), (std::vector<float>{5, 5, 5}));
}

TEST(Meta, HasARuntimeAndAName) {
  EXPECT_TRUE(has_backend(Device::meta));
  EXPECT_EQ(device_name(Device::meta), "meta");
  EXPECT_EQ(device_runtime(Device::meta, "test").device_count(), 1);
}

}  // namespace
}  // namespace mt
