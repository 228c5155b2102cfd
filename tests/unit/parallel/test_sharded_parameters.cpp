// test_sharded_parameters.cpp: ZeRO-3's gathers (parallel/sharding/sharded_parameters.h), threads as ranks over Gloo. The
// gradient buffer's units option cuts the buckets at the units' borders; once built, the parameters outside the
// whole buckets hold no value; acquire gives a unit (prefetched or not) exactly the values of the model, a
// parameter shared by two units stays until both release it, and after an optimizer step each unit gathers the
// updated values, the same as the optimizer's all-gather makes under ZeRO-1; a non-finite value in a rank's block is
// found there and named.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "parallel/sharding/distributed_optimizer.h"
#include "parallel/sharding/sharded_parameters.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

float initial(size_t param, int64_t element) { return static_cast<float>((param * 13 + element * 7) % 19) * 0.125f; }

void expect_values(const std::vector<Parameter>& params, const std::vector<size_t>& which,
                   const std::vector<std::vector<float>>& expected, const std::string& what) {
  for (size_t i : which) {
    ASSERT_TRUE(params[i].value.defined()) << what << ": " << params[i].name;
    EXPECT_EQ(params[i].value.to_floats(), expected[i]) << what << ": " << params[i].name;
  }
}

TEST(ShardedParameters, UnitsGatherTheModelsValuesAndDropThem) {
  // Three units: an "embedding" {0, 1}, a "layer" {2, 3, 4}, a "head" {5} that also reads parameter 0 (tied).
  const std::vector<int64_t> sizes{6, 3, 5, 8, 2, 7};
  const std::vector<std::vector<size_t>> unit_params{{0, 1}, {2, 3, 4}, {5, 0}};
  for (int world : {2, 3}) {
    auto store = make_hash_store();
    run_ranks(world, [&](int r) {
      const std::string what = "world " + std::to_string(world) + ", rank " + std::to_string(r);
      std::vector<Parameter> params(sizes.size());
      std::vector<Parameter*> ps;
      std::vector<std::vector<float>> values(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        params[i].name = "p" + std::to_string(i);
        for (int64_t e = 0; e < sizes[i]; ++e) values[i].push_back(initial(i, e));
        params[i].value = Tensor::from_floats(values[i], {sizes[i]});
        ps.push_back(&params[i]);
      }
      std::vector<std::vector<Parameter*>> units;
      std::unordered_map<const Parameter*, int> unit_of;
      for (size_t u = 0; u < unit_params.size(); ++u) {
        units.emplace_back();
        for (size_t i : unit_params[u]) {
          units.back().push_back(ps[i]);
          unit_of.emplace(ps[i], static_cast<int>(u));
        }
      }
      // Buckets of up to 100 elements would hold everything: the units cut them.
      GradBuffer grads(ps, Device::cpu, join_gloo(store, "grads", first_ranks(world), r),
                       {.bucket_elements = 100, .shard = true, .shard_gradients = true, .units = unit_of});
      ASSERT_EQ(grads.buckets().size(), 3u) << what;
      for (const GradBuffer::Bucket& b : grads.buckets())
        for (const Parameter* p : b.params) EXPECT_EQ(unit_of.at(p), unit_of.at(b.params.front())) << what;
      auto dp = join_gloo(store, "dp", first_ranks(world), r);
      DistributedOptimizer optimizer(grads, *dp, {.weight_decay = 0.0, .grad_clip = 0.0});
      ShardedParameters sharded(grads, optimizer, *dp, units);
      for (const Parameter* p : ps) EXPECT_FALSE(p->value.defined()) << what << ": " << p->name << " kept whole";
      EXPECT_EQ(grads.shape(ps[3]), Shape{8}) << what;
      // Forward: acquire a unit, prefetch the next, release.
      sharded.acquire(0);
      sharded.prefetch(1);
      expect_values(params, unit_params[0], values, what + ", unit 0");
      EXPECT_FALSE(params[2].value.defined()) << what << ": a prefetched unit is whole only once acquired";
      EXPECT_GT(sharded.gathered_elements(), 0);
      sharded.release(0);
      EXPECT_FALSE(params[0].value.defined()) << what;
      sharded.acquire(1);
      expect_values(params, unit_params[1], values, what + ", unit 1 (prefetched)");
      sharded.release(1);
      // The tied parameter 0 is the head's too: held while either unit holds it.
      sharded.acquire(2);
      sharded.acquire(0);
      sharded.release(2);
      expect_values(params, {0, 1}, values, what + ", unit 0 beside the head");
      EXPECT_FALSE(params[5].value.defined()) << what;
      sharded.release(0);
      EXPECT_EQ(sharded.gathered_elements(), 0) << what;
      EXPECT_THROW(sharded.release(0), std::logic_error);
      // A step: every gradient 1 on every rank, so each value moves by -lr (Adam's first step, no decay); the units
      // gather what the optimizer's shards hold now.
      grads.begin_step();
      for (size_t u = units.size(); u-- > 0;) {
        grads.prepare(units[u]);
        for (Parameter* p : units[u])
          p->grad.view({p->grad.numel()})
              .copy_from(Tensor::from_floats(std::vector<float>(static_cast<size_t>(p->grad.numel()), 1.0f),
                                             {p->grad.numel()}));
        grads.mark_ready(units[u]);
      }
      grads.finalize();
      optimizer.step(0.5, 1.0);
      for (const Parameter* p : ps) EXPECT_FALSE(p->value.defined()) << what << ": the step gathered " << p->name;
      for (int u = 0; u < 3; ++u) {
        sharded.acquire(u);
        for (size_t i : unit_params[static_cast<size_t>(u)]) {
          const std::vector<float> got = params[i].value.to_floats();
          for (size_t e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], values[i][e] - 0.5f, 1e-6) << what;
        }
        sharded.release(u);
      }
      // A NaN in rank 0's block of the layer's bucket (buckets()[1], in backward order): it begins with p2.
      EXPECT_EQ(sharded.first_nonfinite_shard(), nullptr) << what;
      if (r == 0) optimizer.value_shard(1).data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_EQ(sharded.first_nonfinite_shard(), r == 0 ? ps[2] : nullptr) << what;
    });
  }
}

}  // namespace
}  // namespace mt
