// sharded_parameters.h: ZeRO-3 (parallel.shard: parameters). Each data-parallel rank keeps only its block of every
// gradient bucket's parameters, in the compute dtype: the distributed optimizer's rounded masters (value_shard),
// which its update writes. The model computes unit by unit (the embedding, each transformer layer, the final norm
// and head: GptModel::units()), and a unit's parameters hold their whole values only while it computes: its
// buckets are all-gathered over the data-parallel group just before its forward, dropped after it, gathered
// again for its backward (whose gradients ZeRO-2's buckets reduce-scatter into this rank's fp32 shard: the
// gradient buffer's units option cuts the buckets at the units' borders) and dropped after it.
//
// Prefetch: prefetch(next) issues the next unit's gathers before the current unit computes; acquire(unit) waits
// for them (issuing what was not prefetched). With NCCL a gather is enqueued on the communicator's stream after
// the compute stream's work so far (an event), and waiting orders the compute stream after it, so the next
// unit's gather overlaps this unit's compute; with Gloo the gather runs on the caller when issued. The gathered
// buffers are ordinary device tensors (MemKind::gathered): dropped, they go back to the caching allocator (the
// communicator holds an in-flight op's blocks until it completes).
//
// Parameters summed over another group before the data-parallel sum (sequence-parallel norms over TP, the tied
// word embeddings across pipeline stages) are in buckets of their own that ZeRO-2 keeps whole for the step: their
// values stay whole too, gathered by the optimizer after each step as under ZeRO-1 (DistributedOptimizer::
// gather_only).
#pragma once
#include <memory>
#include <vector>

#include "core/tensor/parameter.h"
#include "parallel/comm/communicator.h"
#include "parallel/sharding/distributed_optimizer.h"
#include "parallel/sharding/grad_buffer.h"

namespace mt {

class ShardedParameters {
 public:
  // units[u]: the parameters unit u computes with (one may be in two units: the tied word embeddings are the
  // embedding's and the head's); those in `grads` (whose buckets never hold two units' parameters) are sharded,
  // any other stays whole.
  // `dp` gathers (the optimizer's group; used on the training thread only). Releases the values of the
  // parameters that are not kept whole: build it after the optimizer has taken its masters from them.
  ShardedParameters(const GradBuffer& grads, DistributedOptimizer& optimizer, Communicator& dp,
                    const std::vector<std::vector<Parameter*>>& units);
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // Issues the gathers of unit u's buckets that are neither whole nor gathered nor in flight.
  void prefetch(int u);
  // Unit u's parameters hold their whole values until release(u): waits for its gathers (issuing the missing).
  void acquire(int u);
  // Drops the gathered buckets of unit u that no other acquired unit holds (their parameters' values too).
  void release(int u);
  int num_units() const { return static_cast<int>(unit_buckets_.size()); }
  // Elements of the gathered buckets alive now.
  int64_t gathered_elements() const;
  // The first parameter with an inf or NaN in this rank's blocks of the released buckets (whose values are not
  // whole between units), or nullptr: what a check of the values misses under ZeRO-3.
  const Parameter* first_nonfinite_shard() const;

 private:
  struct BucketState {
    bool sharded = false;        // false: a whole bucket, kept by the optimizer
    int holders = 0;             // acquired units holding it
    Tensor full;                 // (end - begin) in the compute dtype while gathered or in flight, else undefined
    std::unique_ptr<Work> work;  // the gather in flight
  };
  void issue(size_t b);
  void drop(size_t b);

  const GradBuffer& grads_;
  DistributedOptimizer& optimizer_;
  Communicator& dp_;
  std::vector<BucketState> buckets_;               // by the gradient buffer's bucket index
  std::vector<std::vector<size_t>> unit_buckets_;  // the sharded buckets of each unit
  std::vector<bool> acquired_;
};

}  // namespace mt
