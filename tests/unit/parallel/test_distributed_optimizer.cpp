// test_distributed_optimizer.cpp: ZeRO-1 against plain AdamW. With threads as data-parallel ranks over Gloo,
// gradients reduce-scattered by the sharded gradient buffer and a step of the distributed optimizer give, on
// every rank, the parameters, grad norm and (gathered) optimizer state that AdamW gives on one rank from the
// summed gradients: bit for bit, whatever the bucket size (the values make every sum exact, so the grad
// norm's per-rank partial sums cannot round differently).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/optim/optimizer.h"
#include "parallel/sharding/distributed_optimizer.h"
#include "parallel/sharding/grad_buffer.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

const std::vector<int64_t> kSizes{5, 12, 3, 8, 1, 9};

// Exact in bf16 and fp32: eighths of small integers.
float initial_value(size_t param, int64_t element) {
  return static_cast<float>((static_cast<int64_t>(param) * 5 + element * 3) % 13 - 6) * 0.125f;
}
float grad_value(int rank, size_t param, int64_t element, int step) {
  return static_cast<float>((rank * 7 + static_cast<int64_t>(param) * 3 + element * 5 + step) % 17 - 8) * 0.25f;
}

struct Model {
  std::vector<Parameter> params;
  explicit Model(DType dtype) {
    for (size_t i = 0; i < kSizes.size(); ++i) {
      Parameter p;
      p.name = "p" + std::to_string(i);
      std::vector<float> v;
      for (int64_t e = 0; e < kSizes[i]; ++e) v.push_back(initial_value(i, e));
      p.value = Tensor::from_floats(v, {kSizes[i]}, dtype);
      p.grad = Tensor::zeros({kSizes[i]}, DType::f32);
      p.weight_decay = i % 3 != 2;  // some without decay, as biases and norms
      params.push_back(std::move(p));
    }
  }
  std::vector<Parameter*> pointers() {
    std::vector<Parameter*> out;
    for (Parameter& p : params) out.push_back(&p);
    return out;
  }
};

AdamWConfig config() { return {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .grad_clip = 1.0}; }
double lr(int step) { return 1e-2 / (step + 1); }

struct Reference {
  std::vector<std::vector<float>> values;  // per step, all parameters concatenated
  std::vector<double> grad_norms;
  std::vector<AdamW::Slot> slots;  // after the last step
  Model model;
  explicit Reference(DType dtype) : model(dtype) {}
};

// AdamW on one rank, on the gradients summed over `world` ranks in rank order.
void run_reference(int world, int steps, Reference& ref) {
  AdamW adam(ref.model.pointers(), config());
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < kSizes.size(); ++i)
      for (int64_t e = 0; e < kSizes[i]; ++e) {
        float g = grad_value(0, i, e, step);
        for (int q = 1; q < world; ++q) g += grad_value(q, i, e, step);
        ref.model.params[i].grad.data<float>()[e] = g;
      }
    ref.grad_norms.push_back(adam.step(lr(step), 1.0).grad_norm);
    std::vector<float> all;
    for (Parameter& p : ref.model.params) {
      std::vector<float> v = p.value.to_floats();
      all.insert(all.end(), v.begin(), v.end());
    }
    ref.values.push_back(all);
  }
  ref.slots = adam.slots();  // the tensors outlive the optimizer through their shared storage
}

void expect_matches_adamw(int world, int64_t bucket_elements, DType dtype) {
  const int steps = 3;
  Reference ref(dtype);
  run_reference(world, steps, ref);
  auto store = make_hash_store();
  run_ranks(world, [&](int r) {
    const std::string what = "world " + std::to_string(world) + ", buckets of " + std::to_string(bucket_elements) +
                             ", " + std::string(dtype_name(dtype)) + ", rank " + std::to_string(r);
    auto dp = join_gloo(store, "dp", first_ranks(world), r);
    Model m(dtype);
    GradBuffer buffer(m.pointers(), Device::cpu, join_gloo(store, "dpgrads", first_ranks(world), r),
                      {.bucket_elements = bucket_elements, .shard = true});
    DistributedOptimizer zero(buffer, *dp, config());
    for (int step = 0; step < steps; ++step) {
      buffer.begin_step();
      for (size_t i = 0; i < kSizes.size(); ++i)
        for (int64_t e = 0; e < kSizes[i]; ++e) m.params[i].grad.data<float>()[e] = grad_value(r, i, e, step);
      for (size_t i = kSizes.size(); i-- > 0;) buffer.mark_ready({&m.params[i]});
      buffer.finalize();
      const StepResult result = zero.step(lr(step), 1.0);
      ASSERT_FALSE(result.found_inf) << what;
      EXPECT_EQ(result.grad_norm, ref.grad_norms[static_cast<size_t>(step)]) << what << ", step " << step;
      std::vector<float> all;
      for (Parameter& p : m.params) {
        std::vector<float> v = p.value.to_floats();
        all.insert(all.end(), v.begin(), v.end());
      }
      ASSERT_EQ(all, ref.values[static_cast<size_t>(step)]) << what << ", step " << step;
    }
    EXPECT_EQ(zero.steps(), steps);
    const std::vector<AdamW::Slot> slots = zero.gather_slots();
    ASSERT_EQ(slots.size(), ref.slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      EXPECT_EQ(slots[i].param, &m.params[i]) << what;
      EXPECT_EQ(slots[i].master.to_floats(), ref.slots[i].master.to_floats()) << what << ", p" << i;
      EXPECT_EQ(slots[i].exp_avg.to_floats(), ref.slots[i].exp_avg.to_floats()) << what << ", p" << i;
      EXPECT_EQ(slots[i].exp_avg_sq.to_floats(), ref.slots[i].exp_avg_sq.to_floats()) << what << ", p" << i;
    }
  });
}

TEST(DistributedOptimizer, StepEqualsAdamWOnTheSummedGradientsOverTwoAndThreeRanks) {
  for (int world : {2, 3})
    for (int64_t bucket : {1, 10, 1000})
      for (DType dtype : {DType::f32, DType::bf16}) expect_matches_adamw(world, bucket, dtype);
}

// A checkpoint's whole per-parameter state, scattered into a ZeRO optimizer of another group size, gathers
// back unchanged and sets the parameters' values from the masters.
TEST(DistributedOptimizer, ScatteredSlotsGatherBackAndSetTheValues) {
  Reference ref(DType::f32);
  run_reference(2, 2, ref);
  auto store = make_hash_store();
  run_ranks(3, [&](int r) {
    auto dp = join_gloo(store, "dp", first_ranks(3), r);
    Model m(DType::f32);
    GradBuffer buffer(m.pointers(), Device::cpu, join_gloo(store, "dpgrads", first_ranks(3), r),
                      {.bucket_elements = 10, .shard = true});
    DistributedOptimizer zero(buffer, *dp, config());
    std::vector<AdamW::Slot> slots;
    for (size_t i = 0; i < ref.slots.size(); ++i)
      slots.push_back({&m.params[i], ref.slots[i].master, ref.slots[i].exp_avg, ref.slots[i].exp_avg_sq});
    zero.scatter_slots(slots);
    const std::vector<AdamW::Slot> back = zero.gather_slots();
    for (size_t i = 0; i < back.size(); ++i) {
      EXPECT_EQ(m.params[i].value.to_floats(), ref.slots[i].master.to_floats()) << "rank " << r << " p" << i;
      EXPECT_EQ(back[i].exp_avg.to_floats(), ref.slots[i].exp_avg.to_floats()) << "rank " << r << " p" << i;
      EXPECT_EQ(back[i].exp_avg_sq.to_floats(), ref.slots[i].exp_avg_sq.to_floats()) << "rank " << r << " p" << i;
    }
  });
}

TEST(DistributedOptimizer, RefusesABufferThatIsNotShardedOverItsGroup) {
  auto store = make_hash_store();
  run_ranks(2, [&](int r) {
    auto dp = join_gloo(store, "dp", first_ranks(2), r);
    Model m(DType::f32);
    GradBuffer buffer(m.pointers(), Device::cpu, join_gloo(store, "dpgrads", first_ranks(2), r), {});
    // Neither rank closes its connections while the other may still be connecting ("connection closed by peer").
    dp->barrier();
    EXPECT_THROW(DistributedOptimizer(buffer, *dp, config()), std::invalid_argument);
    dp->barrier();
  });
}

}  // namespace
}  // namespace mt
