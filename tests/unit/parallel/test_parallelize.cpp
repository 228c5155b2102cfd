// test_parallelize.cpp: the one step that makes a rank's chunks data-parallel (parallel/sharding/parallelize.h), threads as
// ranks over Gloo. Without sharding every trainable parameter's gradient is a view of the buffer, summed over the
// ranks once the last microbatch marks it ready, and the frozen ones get none; under ZeRO-3 the values are released
// at once, unit_begin of a chunk's unit gives that unit (numbered within its chunk) its whole values until unit_end,
// and a unit still gathered at the end of the backward is an error.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/sharding/parallelize.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

// Two chunks of units: chunk 0 {p0, p1} then {p2}, chunk 1 {p3}; p4 is frozen (in chunk 1's unit too).
struct Chunks {
  std::vector<Parameter> params = std::vector<Parameter>(5);
  std::vector<Parameter*> ps;
  std::vector<std::vector<std::vector<Parameter*>>> units;
  Chunks() {
    const std::vector<int64_t> sizes{4, 3, 5, 6, 2};
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].name = "p" + std::to_string(i);
      params[i].value = Tensor::from_floats(std::vector<float>(static_cast<size_t>(sizes[i]), 0.5f * i), {sizes[i]});
      ps.push_back(&params[i]);
    }
    params[4].frozen = true;
    units = {{{ps[0], ps[1]}, {ps[2]}}, {{ps[3], ps[4]}}};
  }
};

// Runs `body` on two ranks, each with its chunks parallelized as `opt` says over Gloo.
void on_two_ranks(const ParallelizeOptions& opt, const std::function<void(int r, Chunks& c, Parallelized& par)>& body) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {
    Chunks c;
    std::unique_ptr<Communicator> dp = join_gloo(store, "dp", first_ranks(2), r);
    Parallelized par(c.ps, c.units,
                     {.dense_grads = join_gloo(store, "grads", first_ranks(2), r), .shard_owners = dp.get()}, opt);
    body(r, c, par);
  });
}

TEST(Parallelize, GradientsAreSummedOverTheRanksAfterTheLastMicrobatch) {
  on_two_ranks({.num_microbatches = 2, .adam = {.weight_decay = 0.0, .grad_clip = 0.0}},
               [](int r, Chunks& c, Parallelized& par) {
                 EXPECT_FALSE(par.needs_grads_needed());
                 EXPECT_FALSE(par.gathers_units());
                 EXPECT_FALSE(c.params[4].grad.defined()) << "a frozen parameter has no gradient";
                 par.begin_step();
                 for (size_t i = 0; i < 4; ++i) {
                   Parameter& p = c.params[i];
                   ASSERT_TRUE(p.grad.defined()) << p.name;
                   p.grad.copy_from(Tensor::from_floats(
                       std::vector<float>(static_cast<size_t>(p.grad.numel()), r + 1.0f), {p.grad.numel()}));
                 }
                 par.grads_ready(0, c.ps);  // not the last microbatch: nothing reduces yet
                 par.grads_ready(1, c.ps);
                 par.finish_grads();
                 for (size_t i = 0; i < 4; ++i)
                   for (float g : c.params[i].grad.to_floats())
                     EXPECT_EQ(g, 3.0f) << c.params[i].name << " on rank " << r;
                 EXPECT_EQ(par.stored_numel(&c.params[3]), 6);
                 const StepResult res = par.step(0.25f, 1.0, nullptr);
                 EXPECT_FALSE(res.found_inf);
                 EXPECT_EQ(par.optimizer().steps(), 1);
                 EXPECT_NEAR(c.params[0].value.to_floats()[0], -0.25f, 1e-6) << "Adam's first step moves by -lr";
                 EXPECT_EQ(c.params[4].value.to_floats()[0], 2.0f) << "the frozen parameter stays";
               });
}

TEST(Parallelize, ZeroThreeGathersEachChunksUnitsAroundTheirComputation) {
  on_two_ranks({.zero = ZeroStage::parameters, .bucket_elements = 100}, [](int, Chunks& c, Parallelized& par) {
    EXPECT_TRUE(par.needs_grads_needed());
    EXPECT_TRUE(par.gathers_units());
    EXPECT_FALSE(c.params[3].value.defined()) << "released once parallelized";
    EXPECT_EQ(par.stored_numel(&c.params[3]), 6) << "the shape as laid out";
    par.unit_begin(1, 0, -1);  // chunk 1's first unit: p3
    ASSERT_TRUE(c.params[3].value.defined());
    EXPECT_EQ(c.params[3].value.to_floats(), std::vector<float>(6, 1.5f));
    EXPECT_FALSE(c.params[2].value.defined()) << "chunk 0's second unit is not chunk 1's first";
    par.begin_step();
    EXPECT_THROW(par.finish_grads(), std::logic_error) << "a unit gathered past the backward";
    par.unit_end(1, 0);
    EXPECT_FALSE(c.params[3].value.defined());
    EXPECT_EQ(par.first_nonfinite_shard(), nullptr);
  });
}

}  // namespace
}  // namespace mt
