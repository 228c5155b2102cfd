// The backends behind a table (core/tensor/backend.h): the CPU's table is always there and complete, the host has
// no runtime, CUDA's table is complete where it is built and otherwise named in the error of the op that asked for
// it, and a table that misses an op is refused when it registers.
#include "core/tensor/backend.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace mt {
namespace {

TEST(Backend, TheCpuTableIsCompleteAndTheHostHasNoRuntime) {
  ASSERT_TRUE(has_backend(Device::cpu));
  const BackendOps& cpu = backend(Device::cpu, "test");
#define MT_BACKEND_OP(name, params) EXPECT_NE(cpu.name, nullptr) << #name;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
  EXPECT_EQ(find_runtime(Device::cpu), nullptr);
}

TEST(Backend, AnOpDispatchesThroughTheTable) {
  Tensor x = Tensor::zeros({3}, DType::f32);
  backend(Device::cpu, "fill_").fill_(x, 2.5f);
  EXPECT_EQ(x.to_floats(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
}

// A build with CUDA has its complete table (no GPU needed to look); one without names the backend in the error of
// the op that asked for it.
TEST(Backend, TheCudaTableIsCompleteOrItsAbsenceIsNamedByTheOp) {
  if (has_backend(Device::cuda)) {
    const BackendOps& cuda = backend(Device::cuda, "test");
#define MT_BACKEND_OP(name, params) EXPECT_NE(cuda.name, nullptr) << #name;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
    return;
  }
  EXPECT_EQ(find_runtime(Device::cuda), nullptr);
  try {
    (void)backend(Device::cuda, "gemm");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: this megatrain was built without the CUDA backend"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)device_runtime(Device::cuda, "copy_from"), std::runtime_error);
}

TEST(Backend, AnIncompleteTableIsRefused) {
  BackendOps partial = backend(Device::cpu, "test");
  partial.rope_ = nullptr;
  try {
    register_backend(Device::cpu, partial, nullptr);
    FAIL() << "no error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("has no rope_"), std::string::npos) << e.what();
  }
  EXPECT_NE(backend(Device::cpu, "test").rope_, nullptr);  // the registered table stays
}

}  // namespace
}  // namespace mt
