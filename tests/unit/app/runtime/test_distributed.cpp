// test_distributed.cpp: init_distributed as a training run calls it, for each backend: every group it
// creates exists and moves tensors on the run's device. The NCCL case needs a GPU (one rank: NCCL refuses two
// ranks of one communicator on one GPU) and skips without one; the Gloo case runs everywhere.
#include <gtest/gtest.h>

#include <latch>
#include <string>
#include <thread>
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
  const std::unique_ptr<Communicator> dp_grads = d.take_dense_grads();
  for (Named g : {Named{"world", d.world.get()}, Named{"tp", &d.group({"tp"})}, Named{"dp", &d.group({"dp"})},
                  Named{"pp", &d.group({"pp"})}, Named{"mp", &d.group({"tp", "pp"})}, Named{"dp_grads", dp_grads.get()},
                  Named{"ep", &d.group({"ep"})}, Named{"edp", &d.expert_data_parallel()}}) {
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
  // Without expert parallelism the ep group is the rank alone and costs nothing; the expert-data-parallel
  // group is the data-parallel group itself.
  EXPECT_EQ(d->ep_size(), 1);
  EXPECT_EQ(d->ep_rank(), 0);
  EXPECT_EQ(d->groups.find({"edp"}), nullptr);
  EXPECT_EQ(&d->expert_data_parallel(), &d->group({"dp"}));
  EXPECT_EQ(d->context_parallel(), nullptr);
  EXPECT_EQ(&d->weight_replicas(), &d->group({"dp"}));
  // A group asked for by names in another order is the same group; one never made is named at once.
  EXPECT_EQ(&d->group({"pp", "tp"}), &d->group({"tp", "pp"}));
  EXPECT_EQ(d->group({"tp", "pp"}).name(), "mp[0]");
  try {
    d->group({"tp", "cp"});
    ADD_FAILURE() << "no std::logic_error for a group never made";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("mesh group tpcp was not made at start-up"), std::string::npos) << e.what();
  }
}

// Four CPU ranks (threads, a TCP store on rank 0) with data parallel 4 split into expert-parallel groups of two:
// ep {0, 1} and {2, 3}, edp {0, 2} and {1, 3}. parallel.expert is set on the parsed config (the config rules
// refuse it without MoE layers; init_distributed takes the layout as given).
TEST(InitDistributed, GlooExpertParallelGroupsOfTwoOfFourDataParallelRanks) {
  constexpr int kWorld = 4;
  Config cfg = load_config(
      testing_util::source_path("configs/gpt-tiny.yaml"),
      {"training.device=cpu", "parallel.backend=gloo", "parallel.timeout_s=60", "training.micro_batch_size=4"}, kWorld);
  ASSERT_EQ(cfg.parallel.data, kWorld);
  cfg.parallel.expert = 2;
  const int port = TcpStoreServer("127.0.0.1", 0).port();  // a free port for rank 0's store
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ranks;
  std::latch others_gone(kWorld - 1);
  for (int r = 0; r < kWorld; ++r)
    ranks.emplace_back([&, r] {
      try {
        const LaunchEnv env{.rank = r,
                            .world_size = kWorld,
                            .local_rank = r,
                            .local_world_size = kWorld,
                            .master_port = port,
                            .job_id = "ep-test"};
        auto d = init_distributed(cfg, env, place_rank(cfg, env));
        EXPECT_EQ(d->ep_size(), 2);
        EXPECT_EQ(d->ep_rank(), r % 2);
        EXPECT_EQ(d->edp_size(), 2);
        EXPECT_EQ(d->edp_rank(), r / 2);
        Communicator& ep = d->group({"ep"});
        Communicator& edp = d->group({"edp"});
        EXPECT_EQ(&d->expert_data_parallel(), &edp);
        EXPECT_EQ(ep.name(), r < 2 ? "ep[0,1]" : "ep[2,3]");
        EXPECT_EQ(edp.name(), r % 2 == 0 ? "edp[0,2]" : "edp[1,3]");
        EXPECT_EQ(ep.rank(), d->ep_rank());
        EXPECT_EQ(edp.rank(), d->edp_rank());
        EXPECT_EQ(d->take_expert_grads()->name(), r % 2 == 0 ? "edpgrads[0,2]" : "edpgrads[1,3]");
        // Each rank sends r + 1 elements of value 10 r + q to ep rank q: an exchange within its ep group.
        const std::vector<int64_t> send{r + 1, r + 1};
        const std::vector<int64_t> recv = exchange_counts(ep, send);
        const int first = r / 2 * 2;  // the global rank of ep rank 0
        EXPECT_EQ(recv, (std::vector<int64_t>{first + 1, first + 2}));
        std::vector<float> mine;
        for (int q = 0; q < 2; ++q) mine.insert(mine.end(), static_cast<size_t>(r + 1), 10.f * r + q);
        Tensor in = Tensor::from_floats(mine, {2 * (r + 1)});
        Tensor out = Tensor::zeros({recv[0] + recv[1]}, DType::f32);
        ep.all_to_all(in, send, out, recv)->wait();
        std::vector<float> expected;
        for (int q = 0; q < 2; ++q)
          expected.insert(expected.end(), static_cast<size_t>(first + q + 1), 10.f * (first + q) + d->ep_rank());
        EXPECT_EQ(out.to_floats(), expected) << "rank " << r;
        // The edp group sums over the ranks holding the same experts.
        EXPECT_EQ(sum_doubles(edp, {double(r)}), std::vector<double>{double(r % 2 + r % 2 + 2)});
        d->world->barrier();
        // Rank 0 serves the store: it goes last, after the others' heartbeats have said goodbye through it.
        if (r == 0) others_gone.wait();
        d.reset();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
      if (r != 0) others_gone.count_down();
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
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
