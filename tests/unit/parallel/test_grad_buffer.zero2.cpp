// test_grad_buffer.zero2.cpp: sharded gradients (ZeRO-2), threads as ranks over Gloo. Each microbatch's gradients
// are written into storage that prepare() makes, marked, reduce-scattered and added into the rank's fp32 block;
// over a step that block equals the block of one flat all-reduce of every rank's gradients summed over the
// microbatches (exact values: any order of the additions gives the same bits). A bucket's storage is gone between
// its flush and the next prepare, and a zero-bubble order (the next microbatch's B before this one's W) holds the
// flush back until no deferred gradient is owed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/sharding/grad_buffer.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

float zero2_grad(int rank, size_t param, int64_t element, int mb, int step) {
  return static_cast<float>((rank * 7 + static_cast<int64_t>(param) * 3 + element * 5 + mb * 11 + step) % 17 - 8) *
         0.25f;
}

enum class Order { one_f_one_b, zero_bubble };

void expect_sharded_gradients_match(int world, int64_t bucket_elements, int microbatches, Order order) {
  const std::vector<int64_t> sizes{5, 12, 3, 8, 1, 9, 4};
  auto store = make_hash_store();
  run_ranks(world, [&](int r) {
    auto flat_comm = join_gloo(store, "flat", first_ranks(world), r);
    std::vector<Parameter> params(sizes.size());
    std::vector<Parameter*> ps;
    for (size_t i = 0; i < sizes.size(); ++i) {
      params[i].name = "p" + std::to_string(i);
      params[i].value = Tensor::zeros({sizes[i]}, DType::f32);
      ps.push_back(&params[i]);
    }
    GradBuffer buffer(ps, Device::cpu, join_gloo(store, "dp", first_ranks(world), r),
                      {.bucket_elements = bucket_elements, .shard = true, .shard_gradients = true});
    const std::string what = "world " + std::to_string(world) + ", buckets of " + std::to_string(bucket_elements) +
                             ", " + std::to_string(microbatches) + " microbatches, order " +
                             std::to_string(static_cast<int>(order)) + ", rank " + std::to_string(r);
    ASSERT_FALSE(buffer.data().defined()) << what;
    for (const Parameter* p : ps) ASSERT_FALSE(p->grad.defined()) << what;
    int64_t full = 0;
    for (const GradBuffer::Bucket& b : buffer.buckets()) full += b.end - b.begin;
    EXPECT_EQ(buffer.resident_elements() * world, full) << what;
    for (int step = 0; step < 2; ++step) {
      buffer.begin_step();
      std::vector<float> flat;
      for (size_t i = 0; i < sizes.size(); ++i)
        for (int64_t e = 0; e < sizes[i]; ++e) {
          float g = 0;
          for (int mb = 0; mb < microbatches; ++mb) g += zero2_grad(r, i, e, mb, step);
          flat.push_back(g);
        }
      Tensor expected = Tensor::from_floats(flat, {static_cast<int64_t>(flat.size())});
      flat_comm->all_reduce(expected, ReduceOp::sum)->wait();
      auto write = [&](size_t i, int mb) {
        for (int64_t e = 0; e < sizes[i]; ++e) params[i].grad.data<float>()[e] += zero2_grad(r, i, e, mb, step);
      };
      if (order == Order::one_f_one_b) {
        for (int mb = 0; mb < microbatches; ++mb)
          for (size_t i = sizes.size(); i-- > 0;) {
            buffer.prepare({ps[i]});
            write(i, mb);
            buffer.mark_ready({ps[i]});
          }
        // Every bucket was flushed by its last mark: nothing holds a gradient.
        for (const Parameter* p : ps) EXPECT_FALSE(p->grad.defined()) << what;
      } else {  // B of every microbatch first (storage made), the deferred W (writes and marks) after
        for (int mb = 0; mb < microbatches; ++mb)
          for (size_t i = sizes.size(); i-- > 0;) buffer.prepare({ps[i]});
        for (int mb = 0; mb < microbatches; ++mb)
          for (size_t i = sizes.size(); i-- > 0;) {
            ASSERT_TRUE(params[i].grad.defined()) << what << ": storage dropped while a W was owed";
            write(i, mb);
            buffer.mark_ready({ps[i]});
          }
      }
      buffer.finalize();
      for (size_t bi = buffer.buckets().size(); bi-- > 0;) {  // buffer order
        const GradBuffer::Bucket& b = buffer.buckets()[bi];
        const Tensor mine = buffer.shard_of(bi);
        ASSERT_EQ(mine.numel(), b.shard) << what;
        for (int64_t x = 0; x < b.shard; ++x) {
          const int64_t pos = b.begin + r * b.shard + x;  // in the padded layout
          // The element's index in `expected` (unpadded): find its parameter.
          for (size_t i = 0; i < sizes.size(); ++i) {
            const int64_t o = buffer.offset(ps[i]);
            if (pos >= o && pos < o + sizes[i]) {
              int64_t before = 0;
              for (size_t k = 0; k < i; ++k) before += sizes[k];
              ASSERT_EQ(mine.data<float>()[x], expected.data<float>()[before + pos - o])
                  << what << ", step " << step << ", p" << i << " element " << pos - o;
            }
          }
        }
      }
    }
  });
}

TEST(GradBufferZero2, ShardsEqualTheBlocksOfOneFlatAllReduceOverMicrobatches) {
  for (int world : {2, 4})
    for (int64_t bucket : {1, 10, 1000})
      for (int mbs : {1, 3})
        for (Order order : {Order::one_f_one_b, Order::zero_bubble})
          expect_sharded_gradients_match(world, bucket, mbs, order);
}

TEST(GradBufferZero2, NeedsTheShardedBuffer) {
  Parameter p;
  p.value = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(GradBuffer({&p}, Device::cpu, nullptr, {.shard = false, .shard_gradients = true}),
               std::invalid_argument);
}

}  // namespace
}  // namespace mt
