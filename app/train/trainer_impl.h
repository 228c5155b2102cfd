// trainer_impl.h: the training loop's parts, shared by trainer.cpp (the loop and the step), trainer_stop.cpp (when
// it stops), trainer_checkpoint.cpp (resume and save) and trainer_report.cpp (what it says). Not an interface:
// app/train/trainer.h is.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/train/checkpointing.h"
#include "app/train/data_sources.h"
#include "app/train/fp8_state.h"
#include "app/train/microbatches.h"
#include "app/runtime/distributed.h"
#include "app/train/metrics.h"
#include "app/train/straggler.h"
#include "app/train/model_chunks.h"
#include "app/train/moe_monitor.h"
#include "app/train/train_state.h"
#include "app/train/trainer.h"
#include "core/checkpoint/save_dir.h"
#include "core/io/progress.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/loss_spike.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/optimizer.h"
#include "core/tensor/op_profile.h"
#include "models/gpt.h"
#include "models/model_stage.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/comm/comm_counted.h"
#include "parallel/sharding/parallelize.h"
#include "parallel/pipeline/schedule.h"

namespace mt {
class CheckpointReader;
}  // namespace mt

namespace mt::app {

// The loop's own counters; with the optimizer's step count and the loss scaler's state they make the TrainState
// a checkpoint stores.
struct Counters {
  int64_t iteration = 0;  // iterations completed
  int64_t consumed_samples = 0;
  int64_t skipped_iters = 0;  // fp16 steps skipped for inf/NaN gradients
  int64_t nan_iters = 0;      // iterations whose loss was inf/NaN
};

class Trainer {
 public:
  // `data`: the samples (open_data_sources for a run); `zb_v`: the zero-bubble V schedule's weights
  // (app/train/meta_step.h measure_schedule_memory; nothing for the other schedules).
  Trainer(const Config& cfg, const TrainOptions& opt, Distributed& dist, DataSources data, ScheduleMemory zb_v);

  void run();
  // One iteration without the loop around it (no checkpoint, evaluation or report): the planner's measured step on
  // the meta device (app/train/meta_step.h).
  void step_once();
  // The elements this rank stores (its shards, tied copies included).
  // The largest transient gradient bucket (ZeRO-2/3; 0 else): what one reduction in flight holds.
  int64_t largest_transient_grad_bytes() const { return par_->largest_transient_grad_bytes(); }
  int64_t num_parameters() const {
    int64_t n = 0;
    for (const Parameter* p : params_) n += par_->stored_numel(p);
    return n;
  }

 private:
  StageActivation activation() const { return stage_activation(cfg_, dist_, dtype_); }
  // The ranks whose microbatch losses make one step's mean: data x context parallel (every context rank's loss
  // is the mean over its equal share of each sample's tokens).
  int64_t replicas() const { return dist_.dp_size() * dist_.cp_size(); }
  // The model's parameters, every global tensor once (padded vocabulary rows included, as stored): the sum over
  // the model-parallel group of this rank's tensor-parallel slices, replicated tensors on tensor-parallel rank 0,
  // tied copies never (the grad norm's rule). A collective of the model-parallel group.
  // trainable_only: those not frozen (finetune.lora's adapters).
  int64_t total_parameters(bool trainable_only = false);
  // Every rank's peak memory in bytes, by global rank (one host exchange over the world: every rank calls it at
  // the same iteration), and its log line: min, max and the pipeline stages' maxima.
  struct RankPeaks {
    std::vector<int64_t> total, activations;  // by global rank: every kind's bytes, and the activations' alone
    double moe_peak_received = 0;             // the largest of every rank's MoeMonitor::peak_received
  };
  RankPeaks gather_peak_memory();
  void log_peak_memory(const RankPeaks& peaks) const;
  // The run's opening lines: the data and the model (its parameter count is a collective of every rank).
  void log_run();
  // The interval report after iteration c_.iteration: reads the interval's losses (a collective), writes
  // metrics.jsonl / TensorBoard and the log line; `mean_ms` is the interval's mean iteration time.
  void report(const StepResult& r, float lr, double mean_ms, int64_t interval_iters, double flops_per_iter);
  // logging.profile_iteration: the logging rank writes RUN_DIR/op_profile.md, logs the per-op totals and adds an
  // op_profile event to metrics.jsonl.
  void write_op_profile(const op_profile::Report& r, int64_t iteration);
  // logging.trace: the iterations to trace (from the config, or this run's second and third), and the timeline
  // of those recorded so far written (every rank's events through the store to the logging rank, which writes
  // RUN_DIR/trace.json): a collective, at the same iteration on every rank.
  std::vector<int64_t> traced_iterations() const;
  void write_trace(int64_t last_iteration);
  // The spike check of one step's loss: `local_sum` is this rank's loss sum (zero off the last stage), summed
  // over the pipeline and data-parallel groups as read_losses does (so every rank holds the same loss). Feeds
  // the detector, logs a spike; true when the step must not be applied (training.loss_spike.action skip/stop).
  bool spike_check(double local_sum, int64_t iteration);
  // Feeds the detector one finite-or-not step loss, logs a spike; true when it is one.
  bool observe_loss(float loss, int64_t iteration);
  // checkpoint.load (resume), else training.init_from (weights only).
  void maybe_resume();
  bool resume();     // true when a checkpoint was resumed
  void init_from();  // training.init_from: the model weights of a checkpoint, nothing else
  // finetune.lora: the frozen base this run's adapters train on (set by maybe_resume; recorded by every save).
  LoraBase lora_base_;
  // checkpoint.save_dir: rank 0 locks it (ckpt::SaveDirLock) and checks that it can write there, once the run has
  // passed every check and loaded what it resumes: a refused run leaves the save_dir as it was (none is created,
  // no .lock is left). A collective of the world: every rank throws when rank 0 cannot hold it.
  void hold_save_dir();
  std::optional<ckpt::SaveDirLock> save_dir_lock_;
  // The MoE layers' expert biases from `reader` (of checkpoint `dir`), zero where it holds none.
  void load_expert_biases(const CheckpointReader& reader, const std::string& dir);
  void train_step(float& lr_used, StepResult& result);
  // Reads the losses of the steps since the last read (summed over the pipeline and data-parallel ranks: a
  // collective, at the same iteration on every rank) into interval_loss_ and c_.nan_iters.
  void read_losses();
  double evaluate();
  // Saves this iteration's state when checkpoint.save_dir is set (once per iteration). False when it was refused
  // because the last iterations were not finite: the checkpoint before them stays the latest.
  bool save();
  // The progress line of a long checkpoint save or load: on the logging rank when standard error is a terminal,
  // and only for one that takes longer than the line's interval.
  Progress checkpoint_progress(std::string what) const;
  void check_finite(const StepResult& r);
  std::vector<int> ranks_where(bool here);
  void log_interval(double ms_per_iter, double loss, double lr, double grad_norm);

  const Config& cfg_;
  TrainOptions opt_;
  Distributed& dist_;
  DType dtype_;
  Device device_;  // where the model, its gradients and the optimizer state live
  // The training schedule, built once: ZB-V weighs its pairs by what they hold, measured on the meta device
  // (app/train/meta_step.h), the same on every rank and in `megatrain plan`.
  ScheduleSpec train_schedule_;
  DataSources data_;
  Microbatches batches_{cfg_, dist_, data_};       // what the stages read of data_
  std::vector<std::unique_ptr<GptModel>> chunks_;  // this rank's model chunks (one without pipelining)
  std::vector<Parameter*> params_;                 // all of their parameters
  MoeMonitor moe_;                                 // their mixture-of-experts layers' routing and expert biases
  std::shared_ptr<Fp8Context> fp8_;                // training.fp8: the scales of the layers' fp8 GEMMs; null when off
  // The chunks made data-parallel (parallel/sharding/parallelize.h): gradient buffers, optimizer, ZeRO-2/3.
  std::unique_ptr<Parallelized> par_;
  int64_t optimizer_steps() const { return par_->optimizer().steps(); }
  LossScaler scaler_;
  LossSpikeDetector spike_{LossSpikeOptions{.window = cfg_.training.loss_spike.window,
                                            .warmup = cfg_.training.loss_spike.warmup_iters,
                                            .sigmas = cfg_.training.loss_spike.sigmas,
                                            .ratio = cfg_.training.loss_spike.ratio}};
  // training.loss_spike.action skip/stop: each step's loss is checked before its update (else once per read).
  bool spike_per_step() const { return cfg_.training.loss_spike.action != SpikeAction::log; }
  bool spike_stop_ = false;  // a spike with action stop: save and exit after this iteration
  // Why training ends before train_iters, agreed by every rank: asked for (a signal, --exit-after,
  // training.exit_interval or exit_duration_mins), a loss spike with action stop (the run then exits with an
  // error), or nothing to train (resumed at or past --exit-after: the checkpoint already holds this state).
  struct Stop {
    enum class Why { asked, spike, nothing_to_train } why = Why::asked;
  };
  std::optional<Stop> stop_before_training() const;
  std::optional<Stop> stop_after_iteration();
  // The run's last words: the spike's error, the error of a final checkpoint refused as not finite, or the
  // summary of a run that reached train_iters.
  void finish(const std::optional<Stop>& stop, bool saved) const;
  LrSchedule schedule_;
  MetricsFile metrics_;
  Counters c_;
  // When training started (exit_duration_mins counts from here).
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  // The previous interval report (the ETA's pace: wall-clock per iteration, evaluation and saving included).
  std::chrono::steady_clock::time_point last_report_ = started_;
  int64_t reports_ = 0;  // interval reports so far in this run
  // The training thread's time blocked in collectives at the last report (the interval's busy time is the rest).
  int64_t comm_wait_at_report_ns_ = 0;
  StragglerWatch stragglers_{cfg_.logging.straggler_margin,
                             dist_.tp_size() * dist_.cp_size() * dist_.dp_size()};  // the ranks of one stage
  // Every rank's busy time per iteration of this interval, compared within its stage (one world all-reduce).
  std::optional<StragglerVerdict> watch_stragglers(double wall_ms_per_iter, int64_t interval_iters);
  CommBytes comm_at_report_ = comm_bytes_moved();  // the communicators' byte counters at the last report
  AttentionCalls attention_at_report_;             // attention_calls() at the previous report
  int attention_kinds_ = -1;  // which implementations ran in the previous interval (bits); -1 before
  // Logs which attention implementation ran this interval: on the first report, and whenever the mix changes
  // (a cuDNN call refused mid-run falls back to the kernel: the log says so).
  void log_attention_calls(const AttentionCalls& now);
  // Per-replica loss sums (nonzero on last stages only) summed over the pipeline, then the data-parallel group.
  std::vector<double> sum_over_stages_and_replicas(std::vector<double> sums);
  std::optional<std::string> last_saved_;
  // Read once per logging interval (a long interval reads when its at most 1024 slots are full).
  StepLosses step_losses_{device_, std::min<int64_t>(cfg_.logging.interval, 1024)};
  double interval_loss_ = 0;  // sum of the step losses read in this logging interval
  // Non-finite iterations in a row (check_finite), and what the first of them found.
  int64_t nonfinite_streak_ = 0;
  std::string nonfinite_first_;
};

}  // namespace mt::app
