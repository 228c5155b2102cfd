// optimizer.h: the optimizer interface the trainer steps and checkpoints (step, grad norm and skip, state), and
// AdamW over fp32 master weights replicated on every rank. The distributed optimizer (ZeRO-1,
// parallel/sharding/distributed_optimizer.h) is the other implementation; sharded gradients and parameters, host offload
// and frozen parameters plug in here too, and the trainer never asks which one runs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/optim/host_offload.h"
#include "core/tensor/ops.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"

namespace mt {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;
  double grad_clip = 1.0;  // 0: no clipping
  // The global grad norm counts every parameter once: tensor-parallel slices on every rank, replicas only
  // where count_replicas is set (one rank of the tensor-parallel group), and the per-rank sums of squares
  // are added up across the model-parallel ranks by sum_across_ranks (null: one rank).
  bool count_replicas = true;
  std::function<double(double)> sum_across_ranks;
  // optimizer.offload: the masters and moments in host memory and the update on the host (core/optim/host_offload.h),
  // in AdamW and the distributed optimizer alike.
  OffloadOptions offload;
};

struct StepResult {
  double grad_norm = 0;    // global norm of the unscaled gradients (before clipping)
  bool found_inf = false;  // an inf or NaN gradient: the step was skipped
  bool vetoed = false;     // StepCheck::veto refused the update: the step was skipped
};

// A look at a step before its update (the trainer's loss spike check): `read_along` (n) f64 on the gradients'
// device is read to the host in the same copy as the grad-norm statistics (no second wait for the device), and
// `veto` gets those values with the verdict; true skips the update. Every rank must decide alike.
struct StepCheck {
  Tensor read_along;
  std::function<bool(const std::vector<double>& values, const StepResult& verdict)> veto;
};
// The grad_stats of xs; with a check, read in one copy together with check->read_along into *along.
GradStats read_grad_stats(const std::vector<Tensor>& xs, const StepCheck* check, std::vector<double>* along);

// Megatron's clipping: scale the gradients by max_norm / (norm + 1e-6) when that is below 1 (max_norm 0: off).
double clip_coefficient(double grad_norm, double max_norm);

// Pieces shared by AdamW and the distributed optimizer (parallel/):
// whether p's gradient enters the global grad norm on this rank (replicas once, tied copies never);
bool counts_in_grad_norm(const Parameter& p, const AdamWConfig& cfg);
// the step's grad norm and inf/NaN verdict from the summed squares of the scaled gradients over all ranks
// and this rank's inf/NaN flag (both from one grad_stats pass), and in *grad_scale the factor the update
// multiplies the gradients by (unscaling and clipping). An inf or NaN anywhere makes every rank's summed
// squares non-finite, so the verdict is the same on every rank;
StepResult grad_norm_verdict(const GradStats& stats, double loss_scale, double grad_clip, double* grad_scale);
// the AdamW options of a step (weight decay cfg.weight_decay where a parameter decays, see AdamWTensors);
AdamWOptions adamw_options(const AdamWConfig& cfg, double lr, int64_t step, double grad_scale);

// Gradients that enter the global grad norm whose sum of squares `sum` adds up over the ranks that hold the rest of
// them; the groups' sums are then added, and AdamWConfig::sum_across_ranks runs on the total.
struct GradNormGroup {
  std::vector<Tensor> grads;
  std::function<double(double)> sum;
};
// The grad_stats of each group, read in one copy (with check->read_along into *along when there is a check).
std::vector<GradStats> read_grad_stats(const std::vector<GradNormGroup>& groups, const StepCheck* check,
                                       std::vector<double>* along);

// One parameter's whole optimizer state, as checkpoints store it.
struct OptimizerSlot {
  Parameter* param;
  Tensor master;      // f32, same shape as the value (the value itself when f32 and replicated)
  Tensor exp_avg;     // f32
  Tensor exp_avg_sq;  // f32
};

class Optimizer {
 public:
  using Slot = OptimizerSlot;
  explicit Optimizer(AdamWConfig cfg) : cfg_(std::move(cfg)) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Unscales the gradients by 1/loss_scale, computes the global grad norm (every parameter once over every
  // rank), and unless it is inf/NaN clips and applies one AdamW step at learning rate lr to this rank's state.
  // Gradients are left as they were. On a GPU the step waits for the device once (the grad norm and inf/NaN
  // verdict, one small read) and updates every master, moment and compute-dtype value in one multi-tensor pass.
  // With `check`, its veto may skip the update (StepResult::vetoed). Every rank calls it (collective).
  StepResult step(double lr, double loss_scale, const StepCheck* check = nullptr);

  int64_t steps() const { return steps_; }  // successful steps so far
  void set_steps(int64_t s) { steps_ = s; }

  // Checkpoints. The whole per-parameter masters and moments of this model-parallel slice, for saving: on the
  // ranks that `keep` them (the writer); with sharded state every rank of the group takes part (collective)
  // and the others get nothing. (ExpertSplitOptimizer: `keep` for the dense part, its own flag for the experts.)
  virtual std::vector<Slot> gather_state(bool keep) = 0;
  // Loading: `fill` writes whole per-parameter states into the slots it is given; with `partial` it may skip
  // some, which then keep the initial values and zero moments. This rank then takes its part and sets the
  // parameters' values from the masters.
  virtual void load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool partial) = 0;

 protected:
  // This rank's gradients that enter the global grad norm (views of the reduced gradients it updates from).
  virtual std::vector<Tensor> counted_grads() const = 0;
  // This rank's sum of squares summed over the ranks that split the state (the data-parallel group under ZeRO).
  virtual double sum_over_state_shards(double local) { return local; }
  // The counted gradients in groups (GradNormGroup): by default one, counted_grads() summed by
  // sum_over_state_shards; ExpertSplitOptimizer's expert group is summed over the expert-parallel ranks too.
  virtual std::vector<GradNormGroup> norm_groups();
  friend class ExpertSplitOptimizer;  // steps its parts' state through these
  // One AdamW update of this rank's state with `opt`, and the parameters' values after it.
  virtual void update(const AdamWOptions& opt) = 0;

  const AdamWConfig cfg_;

 private:
  int64_t steps_ = 0;
};

// Mixture-of-experts layers under expert parallelism: the dense parameters' state (`dense`, its gradients reduced
// over data parallelism) and the experts' (`experts`, reduced over the expert-data-parallel group), each AdamW or
// ZeRO-1 over its own group, stepped as one: one grad norm (the experts' sums of squares added up over the
// expert-parallel ranks, which hold different experts, by `sum_over_experts`), one verdict, one update.
class ExpertSplitOptimizer final : public Optimizer {
 public:
  // `keep_experts`: this rank writes the experts' state to checkpoints (the first rank of its expert-data-parallel
  // group), as gather_state's `keep` says for the dense part.
  ExpertSplitOptimizer(std::unique_ptr<Optimizer> dense, std::unique_ptr<Optimizer> experts,
                       std::function<double(double)> sum_over_experts, bool keep_experts, AdamWConfig cfg);

  std::vector<Slot> gather_state(bool keep) override;
  void load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool partial) override;

 private:
  std::vector<Tensor> counted_grads() const override;
  std::vector<GradNormGroup> norm_groups() override;
  void update(const AdamWOptions& opt) override;
  std::unique_ptr<Optimizer> dense_, experts_;
  std::function<double(double)> sum_over_experts_;
  bool keep_experts_;
};

// Every rank holds the whole state of its parameters.
class AdamW final : public Optimizer {
 public:
  // The parameters' values are cast from fp32 master copies after each step; when the values are
  // themselves f32 they serve as the master copy (not with cfg.offload: the masters are in host memory then).
  AdamW(std::vector<Parameter*> params, AdamWConfig cfg);
  ~AdamW() override;

  void zero_grads();
  std::vector<Slot>& slots() { return slots_; }
  // Casts every master weight into its parameter's value (after loading a checkpoint).
  void sync_values_from_master();

  std::vector<Slot> gather_state(bool keep) override { return slots_; }
  void load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool partial) override;

 private:
  std::vector<Tensor> counted_grads() const override;
  void update(const AdamWOptions& opt) override;
  std::vector<Slot> slots_;
  std::unique_ptr<HostOffload> offload_;  // cfg.offload: the slots are views of its host state
};

}  // namespace mt
