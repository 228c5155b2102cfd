// test_distributed.cpp: init_distributed as a training run calls it, for each backend: every group it
// creates exists and moves tensors on the run's device. The NCCL case needs a GPU (one rank: NCCL refuses two
// ranks of one communicator on one GPU) and skips without one; the Gloo case runs everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/runtime/device.h"
#include "app/runtime/distributed.h"
#include "core/config/config.h"
#include "tests/unit/source_root.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/runtime.h"
#endif

namespace mt::app {
namespace {

Config one_rank_config(const std::string& device, const std::string& backend) {
  const std::string yaml = testing_util::source_path("configs/gpt-tiny.yaml");
  return load_config(yaml, {"training.device=" + device, "parallel.backend=" + backend, "parallel.timeout_s=60"});
}

// Sums a tensor of `device` over every group of `d` (each of one rank, so values come back unchanged).
void expect_every_group_moves_tensors(Distributed& d, Device device) {
  const std::vector<float> values{1.5f, -2.f, 0.25f, 8.f};
  struct Named {
    const char* name;
    Communicator* comm;
  };
  for (Named g : {Named{"world", d.world.get()}, Named{"tp", d.tp.get()}, Named{"dp", d.dp.get()},
                  Named{"pp", d.pp.get()}, Named{"mp", d.mp.get()}, Named{"dp_grads", d.dp_grads.get()}}) {
    ASSERT_NE(g.comm, nullptr) << g.name;
    EXPECT_EQ(g.comm->size(), 1) << g.name;
    for (Device on : {device, Device::cpu}) {  // the trainer also exchanges small host tensors
      Tensor t = Tensor::from_floats(values, {4}).to(on);
      g.comm->all_reduce(t, ReduceOp::sum)->wait();
      EXPECT_EQ(t.to_floats(), values) << g.name << " on " << device_name(on);
    }
  }
  d.world->barrier();
}

TEST(InitDistributed, GlooOnTheCpuCreatesEveryGroup) {
  const Config cfg = one_rank_config("cpu", "gloo");
  const LaunchEnv env;
  auto d = init_distributed(cfg, env, place_rank(cfg, env));
  expect_every_group_moves_tensors(*d, Device::cpu);
}

// The path every default GPU run takes: parallel.backend auto on cuda is NCCL, the world communicator a
// staged wrapper around it, and every group split off that wrapper.
TEST(InitDistributed, NcclOnOneGpuCreatesEveryGroup) {
#if !defined(MEGATRAIN_WITH_NCCL)
  GTEST_SKIP() << "built without NCCL";
#else
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const Config cfg = one_rank_config("cuda", "auto");
  const LaunchEnv env;
  const Placement placement = place_rank(cfg, env);
  ASSERT_EQ(placement.backend, Backend::nccl);
  auto d = init_distributed(cfg, env, placement);
  expect_every_group_moves_tensors(*d, Device::cuda);
#endif
}

}  // namespace
}  // namespace mt::app
