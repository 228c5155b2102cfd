// distributed_optimizer.h: ZeRO-1. The fp32 master weights and Adam moments are split evenly over the
// data-parallel group: each step reduce-scatters the flat gradient buffer, every rank updates its shard in
// one multi-tensor pass that also rounds it to the compute dtype, and those shards are all-gathered back into
// every rank's parameters.
#pragma once
#include <vector>

#include "core/optimizer.h"
#include "parallel/communicator.h"

namespace mt {

class DistributedOptimizer {
 public:
  // `params` own gradients that are consecutive views, in this order, into `flat_grads` (f32, a multiple of
  // the group size long; the tail is padding). cfg.sum_across_ranks adds the grad-norm sums of the other
  // model-parallel ranks; the data-parallel sum is done here.
  DistributedOptimizer(std::vector<Parameter*> params, Tensor flat_grads, Communicator& dp, AdamWConfig cfg);

  // Reduce-scatters the gradients (summing them over the group), then as AdamW::step on this rank's shard,
  // then all-gathers the parameters. Every rank of the group must call it.
  StepResult step(double lr, double loss_scale);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

  // The whole per-parameter master weights and moments, gathered over the group (collective), for saving.
  std::vector<AdamW::Slot> gather_slots();
  // Takes this rank's shard from whole per-parameter states (after loading) and casts the masters into the
  // parameters' values.
  void scatter_slots(const std::vector<AdamW::Slot>& slots);

  int64_t shard_size() const { return shard_; }

 private:
  struct Segment {
    Parameter* param;
    int64_t param_offset;  // first element of the parameter inside the shard's range
    int64_t begin, end;    // positions in this rank's shard
  };
  std::vector<Parameter*> params_;
  std::vector<int64_t> offsets_;  // each parameter's first element in the flat buffer
  Tensor flat_grads_;             // (dp * shard) f32
  Communicator& dp_;
  AdamWConfig cfg_;
  int64_t shard_ = 0;
  std::vector<Segment> segments_;
  Tensor master_, exp_avg_, exp_avg_sq_, grad_shard_;  // (shard) f32 each
  // (shard) in the parameters' compute dtype when it is not f32: the update writes the rounded masters here
  // and the all-gather moves these (half the bytes of f32); undefined for f32 parameters (masters gathered).
  Tensor value_shard_;
  int64_t steps_ = 0;
  // Gathers every rank's updated values into the parameters; values_current: value_shard_ already holds
  // this rank's rounded masters (after a step), else they are cast first (after loading).
  void all_gather_into_values(bool values_current);
};

}  // namespace mt
