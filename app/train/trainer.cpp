// trainer.cpp: the training loop (Trainer::run: one stop, one save), one iteration (Trainer::train_step: the
// schedule over the model stages, then the step of the parallelized chunks) and evaluation. The chunks are made
// data-parallel in model_chunks.cpp (parallel/sharding/parallelize.h), run as pipeline stages by models/model_stage.h on the
// microbatches of microbatches.cpp; resume and save are in trainer_checkpoint.cpp, when it stops in trainer_stop.cpp,
// what it says in trainer_report.cpp (the records themselves in metrics.cpp), the rank's set-up in train.cpp.
#include "app/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "app/train/trainer_impl.h"
#include "core/data/indexed_dataset.h"
#include "core/tensor/trace.h"
#include "models/pipeline_schedule.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/pipeline/schedule.h"

namespace mt::app {

namespace {

// Where this rank runs a schedule: its pipeline group, stage and chunk placement.
PipelinePlacement placement_of(const Distributed& dist, const ScheduleSpec& spec) {
  return {.comm = &dist.group({"pp"}),
          .stage = dist.pp_rank(),
          .stages = spec.stages,
          .chunks = spec.chunks,
          .placement = spec.placement,
          .waits_on_use = waits_on_use(spec.kind)};
}

}  // namespace

Trainer::Trainer(const Config& cfg, const TrainOptions& opt, Distributed& dist, DataSources data, ScheduleMemory zb_v)
    : cfg_(cfg), opt_(opt), dist_(dist), dtype_(dtype_of(cfg.training.precision)), device_(dist.placement.device),
      data_(std::move(data)), chunks_(build_chunks(cfg, dist, dtype_)), params_(all_parameters(chunks_)),
      moe_(cfg.model, chunks_, dist), fp8_(enable_fp8(cfg, chunks_, dist.placement.device, dist.context_parallel())),
      scaler_(dtype_ == DType::f16, LossScalerOptions{.initial = cfg.training.loss_scale.initial,
                                                      .min = cfg.training.loss_scale.min,
                                                      .window = cfg.training.loss_scale.window,
                                                      .hysteresis = cfg.training.loss_scale.hysteresis}),
      schedule_{.lr = cfg.optimizer.lr,
                .min_lr = cfg.optimizer.min_lr,
                .warmup_iters = cfg.optimizer.warmup_iters,
                .decay_iters = cfg.optimizer.decay_iters,
                .decay = cfg.optimizer.decay,
                .wsd_decay_fraction = cfg.optimizer.wsd_decay_fraction,
                .wsd_decay_style = cfg.optimizer.wsd_decay_style},
      metrics_(dist.is_logging_rank() ? cfg.logging.dir : "", cfg.logging.tensorboard, cfg.logging.on_sink_error) {
  // Gradient buffers, optimizer and ZeRO stages over the chunks' parameters, their hooks set.
  par_ = parallelize_chunks(cfg, dist, chunks_, params_, fp8_);
  train_schedule_ = training_schedule(cfg_, cfg_.training.num_microbatches);
  train_schedule_.memory = std::move(zb_v);
  // The per-parameter gradients made with the model are gone: peaks start from the real state.
  allocator_for(device_).reset_peaks();
}

// One iteration: every microbatch of this rank forward and backward (gradients accumulate), the gradients
// summed over the data-parallel group, then the optimizer step (the same on every rank).
// Microbatch m of data-parallel rank r holds samples consumed + (m * dp + r) * B + [0, B), so the global batch
// is the same set of samples whatever the layout.
void Trainer::train_step(float& lr_used, StepResult& result) {
  const int64_t M = cfg_.training.num_microbatches;
  const int64_t dp = replicas();
  par_->begin_step();                          // zeroes every gradient
  if (step_losses_.full()) read_losses();      // a logging interval longer than the slots
  Tensor loss_sum = step_losses_.next_slot();  // (1) f64 on the device
  // The objective is the mean loss over all M * dp microbatches (times the loss scale): a host value, so the
  // backward seed needs no read of the device.
  const float dloss = static_cast<float>(scaler_.scale() / static_cast<double>(M * dp));
  // With loss masks, each counted target of the global batch weighs M * dp / (their count) in its microbatch's
  // sum, so the same mean holds (all-masked microbatches add zero).
  if (data_.train_mask) batches_.weigh_train_targets(c_.consumed_samples, M * dp, c_.iteration + 1);
  // One engine for every layout: one stage runs no_pipelining (F0 B0 F1 B1 ...), several 1F1B, several with
  // more than one chunk interleaved 1F1B. Only the last stage computes losses: read_losses sums them over the
  // pipeline group.
  TrainingStage stage(
      chunks_, activation(), [this](int m, bool head) { return batches_.train(c_.consumed_samples, m, head); }, dloss,
      loss_sum);
  execute_pipeline(build_schedule(train_schedule_)[static_cast<size_t>(dist_.pp_rank())], stage,
                   placement_of(dist_, train_schedule_));
  par_->finish_grads();  // every gradient final (this rank's shard of it with ZeRO)
  lr_used = static_cast<float>(schedule_.at(optimizer_steps() + 1));
  // The step's one read of the device: the grad norm and inf/NaN verdict, inside the optimizer (with
  // training.loss_spike.action skip/stop, the step's loss too, checked before the update).
  const int64_t iteration = c_.iteration + 1;
  const StepCheck check{.read_along = loss_sum, .veto = [&](const std::vector<double>& v, const StepResult&) {
                          return spike_check(v.at(0), iteration);
                        }};
  const StepCheck* check_or_null = spike_per_step() ? &check : nullptr;
  {
    const trace::Span span("optimizer", "optimizer step");
    result = par_->step(lr_used, scaler_.scale(), check_or_null);
  }
  scaler_.update(result.found_inf);
  if (result.found_inf || result.vetoed) ++c_.skipped_iters;
  moe_.after_step(!result.found_inf && !result.vetoed);  // the expert biases move with an applied step only
  // The delayed fp8 recipe's amax histories take this iteration's amaxes (over every microbatch and replica).
  if (fp8_) fp8_->step(&dist_.group({"tp"}), &dist_.group({"dp"}));
}

void Trainer::step_once() {
  float lr = 0;
  StepResult result;
  train_step(lr, result);
}

// Each step's loss: the double sum of its f32 microbatch means, summed (as doubles) over the pipeline group
// (with several stages) and then the data-parallel group, over M * dp, rounded to f32 once. The exchanges carry
// every pending step at once.
void Trainer::read_losses() {
  std::vector<double> sums = step_losses_.take();
  if (sums.empty()) return;
  const int64_t M = cfg_.training.num_microbatches, dp = replicas();
  sums = sum_over_stages_and_replicas(std::move(sums));
  // The slots hold the last sums.size() iterations (this is called between iterations).
  int64_t iteration = c_.iteration - static_cast<int64_t>(sums.size());
  for (double sum : sums) {
    const float loss = static_cast<float>(sum / static_cast<double>(M * dp));
    if (!std::isfinite(loss)) ++c_.nan_iters;
    interval_loss_ += loss;
    ++iteration;
    if (!spike_per_step()) observe_loss(loss, iteration);  // action log: flagged here, nothing else changes
  }
}

// Mean loss over the first eval_iters global batches of the validation samples, microbatch i on dp rank i % dp.
// The pipeline runs a forward_only schedule through the same executor as training (so its transfers follow
// the checked schedule order that NCCL needs); the last stage adds the losses in microbatch order.
double Trainer::evaluate() {
  const trace::Span span("eval", "validation");
  const int64_t dp = dist_.dp_size();
  const int64_t batches = cfg_.logging.eval_iters * cfg_.training.num_microbatches * dp;
  if (data_.valid_mask) batches_.weigh_valid_targets(batches);
  const ScheduleSpec spec = evaluation_schedule(cfg_, batches / dp);
  EvaluationStage stage(chunks_, activation(), [this](int j, bool head) { return batches_.valid(j, head); });
  if (fp8_) fp8_->set_recording(false);  // validation leaves the fp8 amax histories alone
  execute_pipeline(build_schedule(spec)[static_cast<size_t>(dist_.pp_rank())], stage, placement_of(dist_, spec));
  if (fp8_) fp8_->set_recording(true);
  return sum_over_stages_and_replicas({stage.loss_sum()})[0] / static_cast<double>(batches * dist_.cp_size());
}

// Loss sums live on the last pipeline stage of every data-parallel replica: summed over the pipeline group,
// then the data-parallel group (as doubles, in that order on every layout), every rank gets the totals.
std::vector<double> Trainer::sum_over_stages_and_replicas(std::vector<double> sums) {
  if (dist_.pp_size() > 1) sums = sum_doubles(dist_.group({"pp"}), std::move(sums));
  if (Communicator* cp = dist_.context_parallel())
    sums = sum_doubles(*cp, std::move(sums));  // each context rank's mean over its chunks
  if (dist_.dp_size() > 1) sums = sum_doubles(dist_.group({"dp"}), std::move(sums));
  return sums;
}

void Trainer::run() {
  const int64_t G = cfg_.training.global_batch_size, S = cfg_.model.seq_length;
  log_run();
  maybe_resume();
  std::optional<Stop> stop = stop_before_training();
  if (!stop && cfg_.logging.eval_interval > 0 && !data_.valid)
    throw DataError(
        "logging.eval_interval is set but the validation split holds less than one sample "
        "(raise data.split's second weight or set data.valid)");
  hold_save_dir();  // every check passed: only now is the save_dir touched

  const double flops_per_iter = model_flops_per_iteration(cfg_.model, G * S);
  double interval_ms = 0;
  int64_t interval_iters = 0;
  last_report_ = std::chrono::steady_clock::now();
  comm_wait_at_report_ns_ = this_thread_comm_wait_ns();
  comm_at_report_ = comm_bytes_moved();  // the first interval's bytes start here (not at the setup's or a resume's)
  const std::vector<int64_t> traced = traced_iterations();
  int64_t traced_unwritten = 0;  // the last traced iteration whose timeline is not written yet
  while (!stop && c_.iteration < cfg_.training.train_iters) {
    const bool tracing = std::find(traced.begin(), traced.end(), c_.iteration + 1) != traced.end();
    if (tracing) trace::resume(device_);
    std::optional<trace::Span> iteration_span;
    if (tracing) iteration_span.emplace("iteration", fmt::format("iteration {}", c_.iteration + 1));
    auto t0 = std::chrono::steady_clock::now();
    float lr = 0;
    StepResult r;
    std::optional<op_profile::Session> profile;
    if (c_.iteration + 1 == cfg_.logging.profile_iteration) profile.emplace(device_);
    train_step(lr, r);
    if (profile) write_op_profile(profile->finish(), c_.iteration + 1);
    ++c_.iteration;
    c_.consumed_samples += G;
    check_finite(r);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    interval_ms += ms;
    ++interval_iters;

    if (c_.iteration % cfg_.logging.interval == 0 || c_.iteration == cfg_.training.train_iters) {
      report(r, lr, interval_ms / static_cast<double>(interval_iters), interval_iters, flops_per_iter);
      interval_ms = 0;
      interval_iters = 0;
    }
    if (cfg_.logging.eval_interval > 0 &&
        (c_.iteration % cfg_.logging.eval_interval == 0 || c_.iteration == cfg_.training.train_iters)) {
      report_validation(c_.iteration, c_.consumed_samples, c_.consumed_samples * S, evaluate(), metrics_);
    }
    if (cfg_.checkpoint.save_interval > 0 && c_.iteration % cfg_.checkpoint.save_interval == 0) save();
    if (tracing) {
      iteration_span.reset();
      trace::pause();
      traced_unwritten = c_.iteration;
      if (c_.iteration == traced.back()) {
        write_trace(c_.iteration);
        traced_unwritten = 0;
      }
    }
    stop = stop_after_iteration();
  }
  if (traced_unwritten > 0) write_trace(traced_unwritten);  // the run stopped before the last traced iteration
  // One save for every way out of the loop (a no-op when the interval save above took this iteration).
  const bool saved = stop && stop->why == Stop::Why::nothing_to_train ? true : save();
  finish(stop, saved);
}

}  // namespace mt::app
