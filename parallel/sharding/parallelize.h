// parallelize.h: data parallelism and the ZeRO stages applied to one rank's model chunks in one step (after
// torchtitan's `parallelize` and Megatron's DDP wrapper): the gradient buffers and their reducers (one for the dense
// parameters, one for the experts when they reduce over a group of their own), the optimizer (AdamW, or the
// distributed optimizer sharding its state, ZeRO-1), ZeRO-2's per-microbatch buckets and ZeRO-3's units gathered
// around their computation. It knows no model: a chunk is its parameters' gathering units; the model calls the
// Parallelized's hooks (grads_needed, grads_ready, unit_begin, unit_end) and the trainer its step (begin_step,
// finish_grads, step).
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/optim/optimizer.h"
#include "core/tensor/parameter.h"
#include "parallel/comm/communicator.h"
#include "parallel/sharding/grad_buffer.h"
#include "parallel/sharding/sharded_parameters.h"

namespace mt {

// What the data-parallel ranks share (parallel.shard): nothing, the optimizer state (ZeRO-1), the gradients too
// (ZeRO-2) or the parameters too (ZeRO-3).
enum class ZeroStage { none, optimizer, gradients, parameters };

// The groups the gradients reduce and the state shards over. The reducers' communicators are handed over (each is
// used by its gradient buffer only); the others are the caller's and must outlive the Parallelized.
struct DataParallelGroups {
  std::unique_ptr<Communicator> dense_grads;  // the dense reducer's: data (x context) parallel
  Communicator* tensor = nullptr;             // sums Parameter::grad_sums.tensor gradients (SP replicas)
  Communicator* embedding = nullptr;          // sums the tied embedding copies (first and last stage)
  Communicator* replicas = nullptr;           // hybrid sharding's replica group (the dense reducer's); null: none
  Communicator* shard_owners = nullptr;       // the dense optimizer's shards and ZeRO-3's gathers
  // Experts apart (expert parallelism or parallel folding): their gradients reduce over the expert-data-parallel
  // group in a buffer of their own, with an optimizer state of their own. False: the experts are dense parameters.
  bool experts_apart = false;
  std::unique_ptr<Communicator> expert_grads;  // the experts' reducer's: expert-data parallel
  Communicator* expert_data = nullptr;         // the experts' optimizer shards (expert-data parallel, or the
                                               // expert ranks of the shard group with hybrid sharding)
  Communicator* expert_replicas = nullptr;     // hybrid sharding's replica group of the experts; null: none
  Communicator* expert = nullptr;              // the expert-parallel group: its ranks hold different experts
  // Sums the experts' Parameter::grad_sums.tensor gradients (their LoRA adapters' partial sums over the experts'
  // tensor-parallel ranks); null: one rank there, nothing to sum.
  Communicator* expert_tensor = nullptr;
  bool counts_expert_replicas = true;  // the grad norm counts whole experts here (expert TP rank 0)
  bool first_expert_fold = true;       // the tensor-parallel ranks that add the experts' norm (tp < ETP)
  bool keeps_expert_state = true;      // writes the experts' optimizer state (expert-data-parallel rank 0)
};

struct ParallelizeOptions {
  Device device = Device::cpu;  // of the gradients and the optimizer state
  ZeroStage zero = ZeroStage::none;
  int64_t bucket_elements = 40000000;  // parallel.grad_bucket_size
  int64_t num_microbatches = 1;        // gradients are final after the last one's backward (ZeRO-2: every one's)
  AdamWConfig adam;                    // the dense parameters' optimizer (the experts' counts its own replicas)
};

class Parallelized {
 public:
  // Builds the gradient buffers, the optimizer and ZeRO-3's gathering over `params` (every parameter of the rank's
  // chunks, in chunk order; the frozen ones get no gradient and no state) whose chunks compute in the units
  // `chunk_units` (per chunk, in forward order: GptModel::units()). Under ZeRO-3 the parameters' values are released
  // here (whole only between unit_begin and unit_end from now on).
  Parallelized(const std::vector<Parameter*>& params, std::vector<std::vector<std::vector<Parameter*>>> chunk_units,
               DataParallelGroups groups, ParallelizeOptions opt);

  // The model's hooks. Backward is about to write these parameters' gradients (ZeRO-2 makes their buckets' storage;
  // elsewhere nothing to do): GptModel::set_grads_needed_hook, needed when needs_grads_needed().
  void grads_needed(int microbatch, const std::vector<Parameter*>& params);
  bool needs_grads_needed() const { return zero_ >= ZeroStage::gradients; }
  // These gradients are complete for `microbatch` (GptModel::set_grads_ready_hook): after the last microbatch (ZeRO-2:
  // every one) their buckets start reducing.
  void grads_ready(int microbatch, const std::vector<Parameter*>& params);
  // ZeRO-3 (GptModel::set_unit_hook, needed when gathers_units()): unit `unit` of chunk `chunk` is about to compute
  // (its parameters gathered; `next` >= 0 is prefetched meanwhile), or has computed (released).
  bool gathers_units() const { return !sharded_.empty(); }
  void unit_begin(int chunk, int unit, int next);
  void unit_end(int chunk, int unit);
  // ZeRO-3: the parameters of unit `unit` of chunk `chunk` (what is released with it).
  const std::vector<Parameter*>& unit_parameters(int chunk, int unit) const;

  // The step. Starts one: every gradient zeroed, none ready.
  void begin_step();
  // After the last backward: every gradient summed over its groups and the data-parallel ranks (this rank's shard of
  // it with ZeRO), every ZeRO-3 unit released.
  void finish_grads();
  StepResult step(float lr, double loss_scale, const StepCheck* check) {
    return optimizer_->step(lr, loss_scale, check);
  }

  // AdamW or the distributed optimizer (of the experts too: ExpertSplitOptimizer); the trainer never asks which.
  Optimizer& optimizer() { return *optimizer_; }
  const AdamWConfig& adam_config() const { return adam_; }
  // Elements of a parameter as this rank stores it (under ZeRO-3 its value is whole only while its unit computes).
  int64_t stored_numel(const Parameter* p) const;
  // ZeRO-2/3: the largest transient gradient bucket of its buffers (GradBuffer::largest_transient_bytes).
  int64_t largest_transient_grad_bytes() const {
    return std::max(grads_->largest_transient_bytes(), expert_grads_ ? expert_grads_->largest_transient_bytes() : 0);
  }
  // ZeRO-3: the first parameter with an inf or NaN in this rank's blocks of the released values; else nullptr.
  const Parameter* first_nonfinite_shard() const;

 private:
  // Applies `act` to the trainable ones of `params`, each in its buffer (dense or experts).
  void for_buffers(const std::vector<Parameter*>& params, void (GradBuffer::*act)(const std::vector<Parameter*>&));

  ZeroStage zero_ = ZeroStage::none;
  int last_microbatch_ = 0;
  AdamWConfig adam_;
  DataParallelGroups groups_;                 // the communicators not handed to a buffer stay alive here
  std::unique_ptr<GradBuffer> grads_;         // the storage of every dense Parameter::grad, reduced in buckets
  std::unique_ptr<GradBuffer> expert_grads_;  // the experts' when apart (over the expert-data-parallel group)
  std::unique_ptr<Optimizer> optimizer_;
  // ZeRO-3: gathers each unit's parameters, one per gradient buffer (the dense one's, then the experts'); empty else.
  std::vector<std::unique_ptr<ShardedParameters>> sharded_;
  std::vector<int> first_unit_;                 // ZeRO-3: each chunk's first unit in sharded_'s numbering
  std::vector<std::vector<Parameter*>> units_;  // ZeRO-3: every chunk's units, in that numbering
};

// The one step that makes a rank's chunks data-parallel (the Parallelized above).
inline std::unique_ptr<Parallelized> parallelize(const std::vector<Parameter*>& params,
                                                 std::vector<std::vector<std::vector<Parameter*>>> chunk_units,
                                                 DataParallelGroups groups, ParallelizeOptions opt) {
  return std::make_unique<Parallelized>(params, std::move(chunk_units), std::move(groups), std::move(opt));
}

}  // namespace mt
