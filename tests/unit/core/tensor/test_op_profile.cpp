// test_op_profile.cpp: the op profiler (core/tensor/op_profile.h) on the CPU: each entry point's outermost call is
// timed once, keyed by op and the GEMM's shape; nothing is recorded without a session; a session ends cleanly
// on an exception; the tables name every op. The GPU half (CUDA events) is in test_cuda_ops.profile.cpp.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "core/tensor/op_profile.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"

namespace mt {
namespace {

Tensor filled(Shape shape, float start) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.01f * static_cast<float>(i % 97);
  return Tensor::from_floats(v, std::move(shape));
}

const op_profile::Row* find(const op_profile::Report& r, const std::string& op, const std::string& detail) {
  for (const auto& row : r.rows)
    if (row.op == op && row.detail == detail) return &row;
  return nullptr;
}

TEST(OpProfile, TimesEachCallOnceByOpAndShape) {
  Tensor a = filled({64, 32}, 0.5f), b = filled({32, 48}, -0.25f),
         out = Tensor::empty({64, 48}, DType::f32, Device::cpu);
  Tensor bt = filled({48, 32}, 0.1f), x = filled({64, 48}, 1.f), y = filled({64, 48}, 2.f);
  op_profile::Session s(Device::cpu);
  EXPECT_TRUE(op_profile::active());
  gemm(a, b, out);
  gemm(a, b, out);
  gemm(a, bt, out, GemmOptions{.trans_b = true});
  add(x, y, out);
  const op_profile::Report r = s.finish();
  EXPECT_FALSE(op_profile::active());
  EXPECT_EQ(r.device, Device::cpu);
  const auto* nn = find(r, "gemm", "64x48x32 nn");
  const auto* nt = find(r, "gemm", "64x48x32 nt");
  const auto* sum = find(r, "add", "");
  ASSERT_TRUE(nn && nt && sum) << op_profile::format_report(r, 1, 10);
  EXPECT_EQ(nn->calls, 2);
  EXPECT_EQ(nt->calls, 1);
  EXPECT_EQ(sum->calls, 1);
  EXPECT_EQ(r.rows.size(), 3u);
  EXPECT_GT(nn->ms, 0);
  EXPECT_LE(r.op_ms(), r.step_ms);
  for (size_t i = 1; i < r.rows.size(); ++i) EXPECT_GE(r.rows[i - 1].ms, r.rows[i].ms) << "rows: largest first";
  const auto by_op = r.by_op();
  ASSERT_EQ(by_op.size(), 2u);
  EXPECT_EQ(by_op[0].op == "gemm" ? by_op[0].calls : by_op[1].calls, 3);
  const std::string text = op_profile::format_report(r, 7, 10);
  EXPECT_NE(text.find("op profile of iteration 7 on the CPU"), std::string::npos) << text;
  EXPECT_NE(text.find("| gemm | 64x48x32 nn | 2 |"), std::string::npos) << text;
}

TEST(OpProfile, NestedScopesCountOnceInTheOuterOne) {
  op_profile::Session s(Device::cpu);
  {
    const op_profile::Scope outer("outer");
    const op_profile::Scope inner("inner");
    const op_profile::Scope detail("inner", [] { return std::string("never asked for"); });
  }
  const op_profile::Report r = s.finish();
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].op, "outer");
  EXPECT_EQ(r.rows[0].calls, 1);
}

TEST(OpProfile, NothingIsRecordedWithoutASessionAndTheDetailIsNotBuilt) {
  bool asked = false;
  {
    const op_profile::Scope s("gemm", [&] {
      asked = true;
      return std::string();
    });
  }
  EXPECT_FALSE(asked);
  EXPECT_FALSE(op_profile::active());
}

TEST(OpProfile, AnExceptionInsideTheStepEndsTheSession) {
  try {
    op_profile::Session s(Device::cpu);
    const op_profile::Scope op("failing");
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(op_profile::active());
  op_profile::Session again(Device::cpu);  // a new one opens
  EXPECT_THROW(op_profile::Session(Device::cpu), std::logic_error);
  EXPECT_TRUE(again.finish().rows.empty());
}

}  // namespace
}  // namespace mt
