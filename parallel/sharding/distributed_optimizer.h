// distributed_optimizer.h: ZeRO-1. The fp32 master weights and Adam moments are split over the data-parallel
// group as the gradient buffer shards its buckets (rank r owns block r of every bucket, reduce-scattered there
// during backward): every rank updates its shard in one multi-tensor pass that also rounds it to the compute
// dtype, and those shards are all-gathered back, bucket by bucket, into every rank's parameters.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/optim/optimizer.h"
#include "parallel/comm/communicator.h"
#include "parallel/sharding/grad_buffer.h"

namespace mt {

class DistributedOptimizer final : public Optimizer {
 public:
  // The state covers this rank's blocks of `grads`' buckets (a sharded buffer over the group of `dp`, which
  // must outlive it: the data-parallel group, or with hybrid sharding this rank's shard group). cfg.sum_across_ranks adds the grad-norm sums of the other model-parallel ranks; the
  // data-parallel sum is done here.
  DistributedOptimizer(const GradBuffer& grads, Communicator& dp, AdamWConfig cfg);
  ~DistributedOptimizer() override;

  // Optimizer::step updates this rank's shard from the reduced gradients (GradBuffer::finalize done), then
  // all-gathers the parameters. Every rank of the group must call it.

  // The whole per-parameter master weights and moments, gathered over the group (collective), for saving: in
  // host memory, on the ranks that `keep` them (the writer); the others take part and get nothing.
  std::vector<Slot> gather_slots(bool keep = true);
  // Takes this rank's shard from whole per-parameter states (after loading) and casts the masters into the
  // parameters' values.
  void scatter_slots(const std::vector<Slot>& slots);

  std::vector<Slot> gather_state(bool keep) override { return gather_slots(keep); }
  // The whole states go through host memory (12 bytes a parameter: more than a GPU holds beside the model).
  void load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool partial) override;

  int64_t shard_size() const { return shard_; }

  // ZeRO-3 (parallel/sharding/sharded_parameters.h): after a step or a load only the buckets marked here (by gradient
  // buffer index: those summed over another group first) are gathered into the parameters; the others' values
  // are gathered by their unit from value_shard().
  // The rounded masters become the parameters' resident copy then (MemKind::parameter in the accounting).
  void gather_only(std::vector<bool> buckets);
  // This rank's block of gradient-buffer bucket b in the parameters' dtype (the rounded masters; the masters
  // themselves for f32 parameters): what an all-gather over the group makes the bucket's values of.
  Tensor value_shard(size_t bucket) const;

 private:
  // One parameter's part of one bucket's block of this rank.
  struct Segment {
    Parameter* param;
    int64_t param_offset;  // first element of the part inside the parameter
    int64_t begin, end;    // positions in this rank's shard (the state tensors)
    Tensor grad;           // (end - begin) f32, the reduced gradient: a view into the gradient buffer
  };
  // Where a bucket's block lies in this rank's shard.
  struct BucketShard {
    int64_t begin, end;  // the bucket in the gradient buffer
    int64_t shard_begin, shard;
    const std::vector<Parameter*>* params;  // the bucket's parameters (the gradient buffer's list)
    size_t index;                           // in the gradient buffer's buckets()
  };
  std::vector<Tensor> counted_grads() const override;
  double sum_over_state_shards(double local) override;
  void update(const AdamWOptions& opt) override;

  const GradBuffer& grads_;
  Communicator& dp_;
  int64_t shard_ = 0;           // elements this rank owns, over all buckets
  int64_t largest_bucket_ = 0;  // elements of the largest bucket: the gathers' staging size
  std::vector<BucketShard> buckets_;
  std::vector<Segment> segments_;         // in buffer order
  Tensor master_, exp_avg_, exp_avg_sq_;  // (shard) f32 each; with cfg.offload views of offload_'s host state
  std::unique_ptr<HostOffload> offload_;  // cfg.offload (core/optim/host_offload.h): the state and the update
  // (shard) in the parameters' compute dtype when it is not f32: the update writes the rounded masters here
  // and the all-gather moves these (half the bytes of f32); undefined for f32 parameters (masters gathered).
  // With offload always defined, on the device (f32 too): the host update's values land here.
  Tensor value_shard_;
  std::vector<bool> gather_only_;  // ZeRO-3: the buckets all_gather_into_values gathers (empty: all)
  // Gathers every rank's blocks of `shard` (shard_), bucket by bucket, into a bucket-sized temporary and passes
  // it (the bucket's elements of the gradient buffer's layout) to `use`.
  // only: the buckets to gather (by gradient-buffer index; null or empty: all).
  void for_each_gathered_bucket(const Tensor& shard, const std::function<void(const BucketShard&, const Tensor&)>& use,
                                const std::vector<bool>* only = nullptr);
  // Gathers every rank's updated values into the parameters; values_current: value_shard_ already holds
  // this rank's rounded masters (after a step), else they are cast first (after loading).
  void all_gather_into_values(bool values_current);
};

}  // namespace mt
