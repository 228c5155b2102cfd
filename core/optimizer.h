// optimizer.h: AdamW over fp32 master weights with global grad-norm clipping and inf/NaN skipping.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/parameter.h"
#include "core/tensor.h"

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

class AdamW {
 public:
  // The parameters' values are cast from fp32 master copies after each step; when the values are
  // themselves f32 they serve as the master copy.
  AdamW(std::vector<Parameter*> params, AdamWConfig cfg);

  // Unscales the gradients by 1/loss_scale, computes the global grad norm, and unless it is inf/NaN
  // clips and applies one AdamW step at learning rate lr. Gradients are left as they were.
  // On a GPU the step waits for the device once (the grad norm and inf/NaN verdict, one small read) and
  // updates every master, moment and compute-dtype value in one multi-tensor pass.
  // With `check`, its veto may skip the update (StepResult::vetoed).
  StepResult step(double lr, double loss_scale, const StepCheck* check = nullptr);
  void zero_grads();

  int64_t steps() const { return steps_; }  // successful steps so far
  void set_steps(int64_t s) { steps_ = s; }

  struct Slot {
    Parameter* param;
    Tensor master;      // f32, same shape as the value (the value itself when f32)
    Tensor exp_avg;     // f32
    Tensor exp_avg_sq;  // f32
  };
  std::vector<Slot>& slots() { return slots_; }
  // Casts every master weight into its parameter's value (after loading a checkpoint).
  void sync_values_from_master();

 private:
  std::vector<Slot> slots_;
  AdamWConfig cfg_;
  int64_t steps_ = 0;
};

}  // namespace mt
