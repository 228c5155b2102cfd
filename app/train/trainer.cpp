// trainer.cpp: the training loop (Trainer::run: one stop, one save) and one iteration (Trainer::train_step), with
// what builds them. Resume and save are in trainer_checkpoint.cpp, when it stops in trainer_stop.cpp, the pipeline
// stages in trainer_stages.cpp, what the loop says in trainer_report.cpp (the records themselves in metrics.cpp), the
// rank's set-up in train.cpp.
#include "app/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/train/trainer_impl.h"
#include "core/data/indexed_dataset.h"
#include "core/tensor/trace.h"
#include "models/pipeline_schedule.h"
#include "parallel/schedule.h"
#include "plan/memory_model.h"

namespace mt::app {

namespace {

// Where this rank runs a schedule: its pipeline group, stage and chunk placement.
PipelinePlacement placement_of(const Distributed& dist, const ScheduleSpec& spec) {
  return {.comm = dist.pp.get(),
          .stage = dist.pp_rank(),
          .stages = spec.stages,
          .chunks = spec.chunks,
          .placement = spec.placement,
          .waits_on_use = waits_on_use(spec.kind)};
}

// optimizer.offload: chunks of a gradient bucket's size; the machine's cores shared by the ranks on it.
OffloadOptions offload_options(const Config& cfg, const Distributed& dist) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return {.enabled = cfg.optimizer.offload,
          .chunk_elements = cfg.parallel.grad_bucket_size,
          .threads = std::max(1, cores / std::max(1, dist.env.local_world_size))};
}

}  // namespace

Trainer::Trainer(const Config& cfg, const TrainOptions& opt, Distributed& dist)
    : cfg_(cfg), opt_(opt), dist_(dist), dtype_(dtype_of(cfg.training.precision)), device_(dist.placement.device),
      data_(open_data_sources(cfg)), chunks_(build_chunks(cfg, dist, dtype_)), params_(all_parameters(chunks_)),
      moe_(cfg.model, chunks_, dist), fp8_(enable_fp8(cfg, chunks_, dist.placement.device, dist.cp.get())),
      adam_config_(AdamWConfig{
          .beta1 = cfg.optimizer.betas.at(0),
          .beta2 = cfg.optimizer.betas.at(1),
          .eps = cfg.optimizer.eps,
          .weight_decay = cfg.optimizer.weight_decay,
          .grad_clip = cfg.optimizer.grad_clip,
          .count_replicas = dist.tp_rank() == 0,
          .sum_across_ranks = [&dist](double x) { return dist.mp->size() > 1 ? sum_doubles(*dist.mp, {x})[0] : x; },
          .offload = offload_options(cfg, dist)}),
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
  // One flat fp32 buffer holds every gradient; its buckets are reduced over data parallelism (reduce-scattered
  // with the distributed optimizer) as soon as the last microbatch's backward has finished them.
  // With expert parallelism or parallel folding (the experts' grid apart from the dense one) the experts this rank
  // holds get a buffer of their own, reduced over the expert-data-parallel group, and their own optimizer state
  // (ExpertSplitOptimizer).
  // With parallel.shard: gradients (ZeRO-2) there is no full buffer: each bucket is reduce-scattered into this
  // rank's fp32 shard every microbatch (parallel/grad_buffer.h).
  // Frozen parameters (finetune.lora's base) have no gradient and no optimizer state: only the rest enter them.
  std::vector<Parameter*> dense, experts;
  for (Parameter* p : params_)
    if (!p->frozen) (p->expert && dist.experts_apart() ? experts : dense).push_back(p);
  const bool shard_optimizer = cfg.parallel.shard >= ShardStage::optimizer;
  const bool shard_gradients = cfg.parallel.shard >= ShardStage::gradients;
  const bool shard_parameters = cfg.parallel.shard >= ShardStage::parameters;
  if (shard_gradients && dist.dp_size() == 1 && dist.is_logging_rank())
    spdlog::warn(
        "parallel.shard={} with one data-parallel rank: each rank's shard is the whole, so nothing "
        "is saved (the gradients still go through the per-microbatch buckets)",
        name_of(cfg.parallel.shard));
  // ZeRO-3: the units each chunk gathers together (parallel/sharded_parameters.h), numbered over the chunks; a
  // parameter of two units (the tied word embeddings of one stage) belongs to the first one's buckets.
  std::vector<std::vector<Parameter*>> units;
  std::vector<int> first_unit;  // of each chunk
  std::unordered_map<const Parameter*, int> unit_of;
  if (shard_parameters)
    for (auto& chunk : chunks_) {
      first_unit.push_back(static_cast<int>(units.size()));
      for (std::vector<Parameter*>& unit : chunk->units()) {
        for (const Parameter* p : unit) unit_of.emplace(p, static_cast<int>(units.size()));
        units.push_back(std::move(unit));
      }
    }
  grads_ = std::make_unique<GradBuffer>(dense, device_, std::move(dist.dp_grads),
                                        GradBufferOptions{.bucket_elements = cfg.parallel.grad_bucket_size,
                                                          .shard = shard_optimizer,
                                                          .shard_gradients = shard_gradients,
                                                          .tensor = dist.tp.get(),
                                                          .embedding = dist.emb.get(),
                                                          .units = std::move(unit_of),
                                                          .replicas = dist.replicas_grads.get()});
  auto optimizer_of = [&](const GradBuffer& grads, std::vector<Parameter*> ps, Communicator* group,
                          const AdamWConfig& adam) {
    return shard_optimizer ? std::unique_ptr<Optimizer>(std::make_unique<DistributedOptimizer>(grads, *group, adam))
                           : std::unique_ptr<Optimizer>(std::make_unique<AdamW>(std::move(ps), adam));
  };
  if (experts.empty()) {
    optimizer_ = optimizer_of(*grads_, dense, &dist.shard_owners(), adam_config_);
  } else {
    expert_grads_ = std::make_unique<GradBuffer>(experts, device_, std::move(dist.edp_grads),
                                                 GradBufferOptions{.bucket_elements = cfg.parallel.grad_bucket_size,
                                                                   .shard = shard_optimizer,
                                                                   .shard_gradients = shard_gradients});
    // The grad norm counts each expert slice once: a whole expert (not split by expert TP) on the first rank of
    // its expert tensor-parallel group; summed over the expert-parallel group that gives every expert's slice
    // once, which the tensor-parallel group's first fold (tp < ETP) brings into the model-parallel sum.
    AdamWConfig expert_adam = adam_config_;
    expert_adam.count_replicas = dist.etp_rank() == 0;
    const bool first_fold = dist.tp_rank() < dist.etp_size();
    optimizer_ = std::make_unique<ExpertSplitOptimizer>(
        optimizer_of(*grads_, dense, &dist.shard_owners(), adam_config_),
        optimizer_of(*expert_grads_, experts, dist.edp.get(), expert_adam),
        [&dist, first_fold](double x) {
          const double all = sum_doubles(*dist.ep, {x})[0];
          return first_fold ? all : 0.0;
        },
        dist.edp_rank() == 0, adam_config_);
  }
  // Marked after the last microbatch's backward (ZeRO-2: after every microbatch's); ZeRO-2 also makes a bucket's
  // storage before backward writes into it.
  const int last_mb = static_cast<int>(cfg.training.num_microbatches) - 1;
  auto split = [this](const std::vector<Parameter*>& all, void (GradBuffer::*act)(const std::vector<Parameter*>&)) {
    std::vector<Parameter*> ps;  // the frozen ones are not the buffers'
    for (Parameter* p : all)
      if (!p->frozen) ps.push_back(p);
    if (!expert_grads_) return (grads_.get()->*act)(ps);
    std::vector<Parameter*> dense_ps, expert_ps;
    for (Parameter* p : ps) (p->expert ? expert_ps : dense_ps).push_back(p);
    if (!dense_ps.empty()) (grads_.get()->*act)(dense_ps);
    if (!expert_ps.empty()) (expert_grads_.get()->*act)(expert_ps);
  };
  for (auto& chunk : chunks_) {
    chunk->set_grads_ready_hook([this, last_mb, split](int mb, const std::vector<Parameter*>& ps) {
      if (mb != last_mb && !grads_->per_microbatch()) return;
      split(ps, &GradBuffer::mark_ready);
    });
    if (shard_gradients)
      chunk->set_grads_needed_hook(
          [split](int, const std::vector<Parameter*>& ps) { split(ps, &GradBuffer::prepare); });
  }
  // ZeRO-3: from here on each unit's values are whole only around its computation; the next unit's gather is
  // issued before this one computes.
  if (shard_parameters) {
    sharded_ = std::make_unique<ShardedParameters>(*grads_, dynamic_cast<DistributedOptimizer&>(*optimizer_),
                                                   dist.shard_owners(), units);
    for (size_t c = 0; c < chunks_.size(); ++c)
      chunks_[c]->set_unit_hook([this, base = first_unit[c]](GptModel::UnitEvent e, int unit, int next) {
        switch (e) {
          case GptModel::UnitEvent::forward_begin:
          case GptModel::UnitEvent::backward_begin:
            sharded_->acquire(base + unit);
            if (next >= 0) sharded_->prefetch(base + next);
            break;
          case GptModel::UnitEvent::forward_end:
          case GptModel::UnitEvent::backward_end:
            sharded_->release(base + unit);
            break;
        }
      });
  }
  // optimizer.offload_host_memory_gib: the host state this rank holds now (the host pool) within the budget.
  const double budget = cfg.optimizer.offload_host_memory_gib;
  if (const int64_t host = allocator_for(Device::cpu).stats().host_current; budget > 0 && host > budget * (1 << 30))
    throw std::invalid_argument(fmt::format(
        "optimizer.offload_host_memory_gib: rank {} needs {:.3f} GiB of host memory for its offloaded optimizer "
        "state (fp32 masters and moments, 12 bytes per element of its shard, and the staging of two chunks of "
        "parallel.grad_bucket_size={} elements), more than the budget of {} GiB: raise the budget, shard the "
        "state over more data-parallel ranks (parallel.shard) or lower parallel.grad_bucket_size",
        dist.rank(), static_cast<double>(host) / (1 << 30), cfg.parallel.grad_bucket_size, budget));
  train_schedule_ = plan::planned_training_schedule(cfg_, cfg_.training.num_microbatches,
                                                    device_ == Device::cpu ? plan::Backend::cpu : plan::Backend::cuda);
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
  grads_->begin_step();  // zeroes every gradient
  if (expert_grads_) expert_grads_->begin_step();
  if (step_losses_.full()) read_losses();      // a logging interval longer than the slots
  Tensor loss_sum = step_losses_.next_slot();  // (1) f64 on the device
  // The objective is the mean loss over all M * dp microbatches (times the loss scale): a host value, so the
  // backward seed needs no read of the device.
  const float dloss = static_cast<float>(scaler_.scale() / static_cast<double>(M * dp));
  // With loss masks, each counted target of the global batch weighs M * dp / (their count) in its microbatch's
  // sum, so the same mean holds (all-masked microbatches add zero).
  if (data_.train_mask)
    train_target_weight_ = masked_target_weight(data_.train_mask, c_.consumed_samples, cfg_.training.global_batch_size,
                                                M * dp, fmt::format("iteration {}'s global batch", c_.iteration + 1));
  // One engine for every layout: one stage runs no_pipelining (F0 B0 F1 B1 ...), several 1F1B, several with
  // more than one chunk interleaved 1F1B. Only the last stage computes losses: read_losses sums them over the
  // pipeline group.
  IterationStage stage(*this, dloss, loss_sum);
  execute_pipeline(build_schedule(train_schedule_)[static_cast<size_t>(dist_.pp_rank())], stage,
                   placement_of(dist_, train_schedule_));
  // The sums over TP (sequence-parallel replicas) and the embedding group (tied copies), then the data-parallel
  // buckets not started yet, then the wait: every gradient is final (this rank's shard of it with ZeRO).
  grads_->finalize();
  if (expert_grads_) expert_grads_->finalize();
  // ZeRO-3: every unit released (a value gathered now would miss this step's update).
  if (sharded_ && sharded_->gathered_elements() != 0)
    throw std::logic_error(fmt::format("parallel.shard=parameters: {} gathered parameter elements outlive the step",
                                       sharded_->gathered_elements()));
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
    result = optimizer_->step(lr_used, scaler_.scale(), check_or_null);
  }
  scaler_.update(result.found_inf);
  if (result.found_inf || result.vetoed) ++c_.skipped_iters;
  moe_.after_step(!result.found_inf && !result.vetoed);  // the expert biases move with an applied step only
  // The delayed fp8 recipe's amax histories take this iteration's amaxes (over every microbatch and replica).
  if (fp8_) fp8_->step(dist_.tp.get(), dist_.dp.get());
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
  if (data_.valid_mask)
    eval_target_weight_ = masked_target_weight(data_.valid_mask, 0, batches * cfg_.training.micro_batch_size,
                                               batches * dist_.cp_size(), "the validation batches");
  const ScheduleSpec spec = evaluation_schedule(cfg_, batches / dp);
  EvalStage stage(*this);
  if (fp8_) fp8_->set_recording(false);  // validation leaves the fp8 amax histories alone
  execute_pipeline(build_schedule(spec)[static_cast<size_t>(dist_.pp_rank())], stage, placement_of(dist_, spec));
  if (fp8_) fp8_->set_recording(true);
  return sum_over_stages_and_replicas({stage.loss_sum})[0] / static_cast<double>(batches * dist_.cp_size());
}

// Loss sums live on the last pipeline stage of every data-parallel replica: summed over the pipeline group,
// then the data-parallel group (as doubles, in that order on every layout), every rank gets the totals.
std::vector<double> Trainer::sum_over_stages_and_replicas(std::vector<double> sums) {
  if (dist_.pp_size() > 1) sums = sum_doubles(*dist_.pp, std::move(sums));
  if (dist_.cp) sums = sum_doubles(*dist_.cp, std::move(sums));  // each context rank's mean over its chunks
  if (dist_.dp_size() > 1) sums = sum_doubles(*dist_.dp, std::move(sums));
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
