#include "app/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "app/checkpointing.h"
#include "app/data_sources.h"
#include "app/distributed.h"
#include "app/nonfinite.h"
#include "app/train_state.h"
#include "parallel/distributed_optimizer.h"
#include "parallel/grad_buffer.h"
#include "parallel/pipeline_executor.h"
#include "parallel/schedule.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/checkpoint/save_dir.h"
#include "core/data/indexed_dataset.h"
#include "core/loss_scaler.h"
#include "core/lr_schedule.h"
#include "core/optimizer.h"
#include "models/gpt.h"

namespace mt::app {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_signal_ns{0};

// The first signal asks for a checkpoint at the end of the iteration; another one more than two seconds
// later ends at once. (A Ctrl-C under --nproc reaches a rank twice, from the terminal and forwarded by the
// launcher, and must not skip the checkpoint.) clock_gettime is async-signal-safe.
extern "C" void on_signal(int sig) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  if (g_signal.exchange(sig) == 0) {
    g_first_signal_ns.store(now);
  } else if (now - g_first_signal_ns.load() > 2000000000) {
    std::_Exit(128 + sig);
  }
}

// Appends one JSON object per line to RUN_DIR/metrics.jsonl, flushed each time.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& run_dir) {
    if (run_dir.empty()) return;
    path_ = (fs::path(run_dir) / "metrics.jsonl").string();
    out_.open(path_, std::ios::app);
    if (!out_) throw std::runtime_error(fmt::format("{}: cannot open for writing", path_));
  }
  void write(const std::string& json) {
    if (!out_.is_open()) return;
    out_ << json << '\n';
    out_.flush();
    if (!out_) throw std::runtime_error(fmt::format("{}: write failed", path_));
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// A JSON number, or null for inf/NaN (JSON has neither).
std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

std::string memory_summary(Device device) {
  const MemoryStats& m = allocator_for(device).stats();
  std::string s;
  for (size_t k = 0; k < MemoryStats::kKinds; ++k)
    s += fmt::format("{} {:.2f} | ", mem_kind_name(static_cast<MemKind>(k)), m.peak[k] / 1048576.0);
  return s + fmt::format("total {:.2f}", m.peak_total / 1048576.0);
}

struct Counters {
  int64_t iteration = 0;  // iterations completed
  int64_t consumed_samples = 0;
  int64_t skipped_iters = 0;  // fp16 steps skipped for inf/NaN gradients
  int64_t nan_iters = 0;      // iterations whose loss was inf/NaN
};

// The model chunks this rank holds: one per virtual pipeline stage c * pp + stage, each with its layers
// (parallel.layers_per_stage, or an even split), the embedding on virtual stage 0, the head on the last.
std::vector<std::unique_ptr<GptModel>> build_chunks(const Config& cfg, const Distributed& dist, DType dtype) {
  const int64_t p = dist.pp_size(), v = cfg.parallel.virtual_pipeline, vstages = p * v;
  std::vector<int64_t> layers = cfg.parallel.layers_per_stage;
  if (layers.empty()) layers.assign(static_cast<size_t>(vstages), cfg.model.num_layers / vstages);
  std::vector<std::unique_ptr<GptModel>> chunks;
  for (int64_t c = 0; c < v; ++c) {
    const int64_t vs = c * p + dist.pp_rank();
    int64_t begin = 0;
    for (int64_t i = 0; i < vs; ++i) begin += layers[static_cast<size_t>(i)];
    chunks.push_back(std::make_unique<GptModel>(
        cfg.model, GptOptions{.dtype = dtype,
                              .device = dist.placement.device,
                              .seed = static_cast<uint64_t>(cfg.training.seed),
                              .recompute = cfg.training.recompute == Recompute::full,
                              .tp = TensorParallel{.comm = dist.tp.get(),
                                                   .rank = dist.tp_rank(),
                                                   .size = dist.tp_size(),
                                                   .sequence_parallel = cfg.parallel.sequence_parallel},
                              .stage = StageLayout{.has_embedding = vs == 0,
                                                   .has_head = vs == vstages - 1,
                                                   .layer_begin = begin,
                                                   .layer_end = begin + layers[static_cast<size_t>(vs)]}}));
  }
  return chunks;
}

std::vector<Parameter*> all_parameters(const std::vector<std::unique_ptr<GptModel>>& chunks) {
  std::vector<Parameter*> out;
  for (const auto& c : chunks) out.insert(out.end(), c->parameters().begin(), c->parameters().end());
  return out;
}

// The training losses of the steps since the host last read them, kept on the model's device: each step
// gets an f64 slot that the last stage's microbatches add their mean losses into (GptModel::forward_stage),
// and the host reads all slots at once, once per logging interval (or before a checkpoint), so a GPU step
// never waits for its loss.
class StepLosses {
 public:
  StepLosses(Device device, int64_t capacity) : slots_(f64_zeros(std::max<int64_t>(capacity, 1), device)) {}
  bool full() const { return used_ == slots_.numel(); }
  // The next step's slot (1) f64, zeroed.
  Tensor next_slot() {
    Tensor slot = slots_.slice(used_, used_ + 1);
    slot.zero_();
    ++used_;
    return slot;
  }
  // This rank's loss sums of the steps since the last take, in order (one copy to the host).
  std::vector<double> take() {
    if (used_ == 0) return {};
    std::vector<double> v = read_f64(slots_.slice(0, used_));
    used_ = 0;
    return v;
  }

 private:
  Tensor slots_;  // (capacity) f64
  int64_t used_ = 0;
};

class Trainer;

// The pipeline executor's view of this rank's chunks for one iteration: microbatch m's samples, the loss
// of the last stage (added into the step's device slot), the backward seed.
class IterationStage final : public PipelineStage {
 public:
  IterationStage(Trainer& t, float dloss, Tensor loss_sum) : t_(t), dloss_(dloss), loss_sum_(std::move(loss_sum)) {}
  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, const Tensor& grad) override;
  Shape activation_shape() const override;
  DType activation_dtype() const override;
  Device activation_device() const override;

 private:
  Trainer& t_;
  float dloss_;
  Tensor loss_sum_;  // (1) f64 on the device: the step's sum over the microbatches whose loss this rank computed
};

// The pipeline executor's view of this rank's chunks for evaluation (a forward_only schedule): local
// microbatch j is validation batch dp_rank + j * dp, forward without dropout, the loss summed on the last stage.
class EvalStage final : public PipelineStage {
 public:
  explicit EvalStage(Trainer& t) : t_(t) {}
  Tensor forward(int microbatch, int chunk, const Tensor& input) override;
  Tensor backward(int microbatch, int chunk, const Tensor& grad) override;  // never called: forward only
  Shape activation_shape() const override;
  DType activation_dtype() const override;
  Device activation_device() const override;
  double loss_sum = 0;  // over the microbatches whose loss this rank computed, in microbatch order

 private:
  Trainer& t_;
};

class Trainer {
 public:
  Trainer(const Config& cfg, const TrainOptions& opt, Distributed& dist)
      : cfg_(cfg), opt_(opt), dist_(dist), dtype_(dtype_of(cfg.training.precision)), device_(dist.placement.device),
        data_(open_data_sources(cfg)), chunks_(build_chunks(cfg, dist, dtype_)), params_(all_parameters(chunks_)),
        adam_config_(AdamWConfig{
            .beta1 = cfg.optimizer.betas.at(0),
            .beta2 = cfg.optimizer.betas.at(1),
            .eps = cfg.optimizer.eps,
            .weight_decay = cfg.optimizer.weight_decay,
            .grad_clip = cfg.optimizer.grad_clip,
            .count_replicas = dist.tp_rank() == 0,
            .sum_across_ranks = [&dist](double x) { return dist.mp->size() > 1 ? sum_doubles(*dist.mp, {x})[0] : x; }}),
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
        metrics_(dist.is_logging_rank() ? cfg.logging.dir : "") {
    // One flat fp32 buffer holds every gradient; its buckets are reduced over data parallelism (reduce-scattered
    // with the distributed optimizer) as soon as the last microbatch's backward has finished them.
    grads_ = std::make_unique<GradBuffer>(params_, device_, std::move(dist.dp_grads),
                                          GradBufferOptions{.bucket_elements = cfg.parallel.grad_bucket_size,
                                                            .shard = cfg.parallel.distributed_optimizer,
                                                            .tensor = dist.tp.get(),
                                                            .embedding = dist.emb.get()});
    if (cfg.parallel.distributed_optimizer)
      zero_ = std::make_unique<DistributedOptimizer>(*grads_, *dist.dp, adam_config_);
    else
      adam_ = std::make_unique<AdamW>(params_, adam_config_);
    const int last_mb = static_cast<int>(cfg.training.num_microbatches) - 1;
    for (auto& chunk : chunks_)
      chunk->set_grads_ready_hook([this, last_mb](int mb, const std::vector<Parameter*>& ps) {
        if (mb == last_mb) grads_->mark_ready(ps);
      });
    // The per-parameter gradients made with the model are gone: peaks start from the real state.
    allocator_for(device_).reset_peaks();
  }

  void run();

 private:
  friend class IterationStage;
  friend class EvalStage;
  // Samples of microbatch m of this data-parallel rank in the current iteration.
  int64_t microbatch_first_sample(int64_t m) const {
    return c_.consumed_samples + (m * dist_.dp_size() + dist_.dp_rank()) * cfg_.training.micro_batch_size;
  }
  // What crosses between pipeline stages: one microbatch's hidden states (sequence shards with SP).
  Shape activation_shape() const {
    const int64_t sp = cfg_.parallel.sequence_parallel ? dist_.tp_size() : 1;
    return {cfg_.training.micro_batch_size, cfg_.model.seq_length / sp, cfg_.model.hidden_size};
  }
  int64_t num_parameters() const {
    int64_t n = 0;
    for (const Parameter* p : params_) n += p->value.numel();
    return n;
  }
  void maybe_resume();
  void train_step(float& lr_used, StepResult& result);
  // Reads the losses of the steps since the last read (summed over the pipeline and data-parallel ranks: a
  // collective, at the same iteration on every rank) into interval_loss_ and c_.nan_iters.
  void read_losses();
  double evaluate();
  void save();
  void check_finite(const StepResult& r);
  std::vector<int> ranks_where(bool here);
  void log_interval(double ms_per_iter, double loss, double lr, double grad_norm);

  // A microbatch's tokens and targets (B, S), read on the host and moved to the model's device.
  void load_batch(const SampleFn& source, int64_t first, Tensor& tokens, Tensor& targets) const;

  const Config& cfg_;
  TrainOptions opt_;
  Distributed& dist_;
  DType dtype_;
  Device device_;  // where the model, its gradients and the optimizer state live
  DataSources data_;
  std::vector<std::unique_ptr<GptModel>> chunks_;  // this rank's model chunks (one without pipelining)
  std::vector<Parameter*> params_;                 // all of their parameters
  AdamWConfig adam_config_;
  std::unique_ptr<GradBuffer> grads_;           // the storage of every Parameter::grad, reduced in buckets
  std::unique_ptr<AdamW> adam_;                 // replicated optimizer state, or
  std::unique_ptr<DistributedOptimizer> zero_;  // state sharded over the data-parallel group (ZeRO-1)
  int64_t optimizer_steps() const { return zero_ ? zero_->steps() : adam_->steps(); }
  LossScaler scaler_;
  LrSchedule schedule_;
  MetricsFile metrics_;
  Counters c_;
  std::optional<std::string> last_saved_;
  // Read once per logging interval (a long interval reads when its at most 1024 slots are full).
  StepLosses step_losses_{device_, std::min<int64_t>(cfg_.logging.interval, 1024)};
  double interval_loss_ = 0;  // sum of the step losses read in this logging interval
  // Non-finite iterations in a row (check_finite), and what the first of them found.
  int64_t nonfinite_streak_ = 0;
  std::string nonfinite_first_;
};

void Trainer::maybe_resume() {
  const auto& ck = cfg_.checkpoint;
  std::optional<std::string> dir;
  if (ck.load == "none") return;
  if (ck.load == "auto") {
    if (ck.save_dir.empty()) return;
    dir = resolve_resume_checkpoint(ck.save_dir);  // never starts over when checkpoints are there
    if (!dir) return;
  } else {
    dir = resolve_resume_checkpoint(ck.load);
    if (!dir)
      throw CheckpointError(
          fmt::format("checkpoint.load: {} holds no checkpoint (no metadata.yaml, no latest)", ck.load));
  }
  CheckpointReader reader(*dir);
  const CheckpointState& s = reader.state();
  const TrainState rs = TrainState::load(s, *dir);  // every value checked before any is used
  // A checkpoint of another model shape is refused, unless a partial load is asked for.
  const std::vector<std::string> diff = model_shape_differences(s.config_yaml, to_yaml(cfg_), *dir);
  std::optional<PartialLoad> partial;
  if (!diff.empty()) {
    if (!ck.allow_partial_load)
      throw CheckpointError(
          fmt::format("{}: was saved by another model ({}); resume it with the same model keys, or "
                      "set checkpoint.allow_partial_load: true to load only the tensors that match",
                      *dir, fmt::join(diff, ", ")));
    spdlog::warn("partial load from {}: the model differs ({})", *dir, fmt::join(diff, ", "));
    partial.emplace();
  }
  if (zero_) {
    // Whole per-parameter states of this model-parallel slice, then this rank's shard of them. (A partial load
    // keeps the initial values, zero moments, for what it skips.)
    std::vector<AdamW::Slot> slots;
    for (Parameter* p : params_) {
      AdamW::Slot slot{p, Tensor::empty(p->value.shape(), DType::f32, device_),
                       Tensor::empty(p->value.shape(), DType::f32, device_),
                       Tensor::empty(p->value.shape(), DType::f32, device_)};
      if (partial) {
        slot.master.copy_from(p->value);
        slot.exp_avg.zero_();
        slot.exp_avg_sq.zero_();
      }
      slots.push_back(slot);
    }
    load_optimizer(reader, slots, partial ? &*partial : nullptr);
    zero_->scatter_slots(slots);
  } else {
    load_optimizer(reader, adam_->slots(), partial ? &*partial : nullptr);
    adam_->sync_values_from_master();
  }
  if (partial) {
    spdlog::warn("partial load: {} tensors loaded: {}", partial->loaded.size(), fmt::join(partial->loaded, ", "));
    spdlog::warn("partial load: {} tensors left at their initial values: {}", partial->skipped.size(),
                 fmt::join(partial->skipped, ", "));
  }
  c_.iteration = rs.iteration;
  c_.consumed_samples = rs.consumed_samples;
  c_.skipped_iters = rs.skipped_iters;
  c_.nan_iters = rs.nan_iters;
  if (zero_)
    zero_->set_steps(rs.optimizer_steps);
  else
    adam_->set_steps(rs.optimizer_steps);
  scaler_.restore(rs.loss_scaler);
  if (rs.seed != cfg_.training.seed)
    spdlog::warn(
        "resuming with training.seed={} but the checkpoint was trained with seed {}: data order and "
        "dropout masks change",
        cfg_.training.seed, rs.seed);
  spdlog::info("resumed from {} at iteration {} ({} samples consumed)", *dir, c_.iteration, c_.consumed_samples);
  metrics_.write(fmt::format(R"({{"event":"resume","iteration":{},"checkpoint":"{}"}})", c_.iteration, *dir));
}

// Data-parallel replicas hold identical state, so the ranks of data-parallel rank 0 write: each its
// tensor-parallel slices, and tensor-parallel rank 0 the replicated tensors. Rank 0 creates the temporary
// directory and commits it once every writer has flushed and verified its file.
void Trainer::save() {
  read_losses();  // the saved nan_iters counts every step so far (every rank reads here, as every rank saves)
  if (cfg_.checkpoint.save_dir.empty() || last_saved_ == std::to_string(c_.iteration)) return;
  if (nonfinite_streak_ > 0) {  // keep the good checkpoints from being rotated out by one taken now
    spdlog::warn("not saving a checkpoint at iteration {}: the last {} iteration(s) were not finite", c_.iteration,
                 nonfinite_streak_);
    return;
  }
  // Never a checkpoint whose weights hold inf or NaN.
  const std::optional<std::string> bad = first_nonfinite(params_, /*grads=*/false);
  if (const std::vector<int> ranks = ranks_where(bad.has_value()); !ranks.empty())
    throw std::runtime_error(
        fmt::format("not saving a checkpoint at iteration {}: the weights are not finite on rank(s) [{}]{}",
                    c_.iteration, fmt::join(ranks, ", "),
                    bad ? fmt::format("; on this rank (rank {}) first {}", dist_.rank(), describe_parameter(*bad))
                        : std::string()));
  auto t0 = std::chrono::steady_clock::now();
  const std::string key = fmt::format("checkpoint/{}/tmp", c_.iteration);
  std::string tmp;
  if (dist_.rank() == 0) {
    tmp = begin_checkpoint(cfg_.checkpoint.save_dir, c_.iteration);
    dist_.store->set(key, Bytes(tmp.begin(), tmp.end()));
  }
  const bool writer = dist_.dp_rank() == 0;
  // With the distributed optimizer every data-parallel rank takes part in gathering the state.
  std::vector<AdamW::Slot> slots = zero_ ? zero_->gather_slots() : adam_->slots();
  if (writer) {
    if (dist_.rank() != 0) {
      Bytes b = dist_.store->get(key, Millis(static_cast<int64_t>(cfg_.parallel.timeout_s * 1000)));
      tmp.assign(b.begin(), b.end());
    }
    const bool tp_first = dist_.tp_rank() == 0;
    try {
      write_rank_files(tmp, dist_.tp_rank() + dist_.tp_size() * dist_.pp_rank(),
                       optimizer_tensors(
                           slots, [&](const Parameter& p) { return !p.tied_copy && (p.tensor_parallel || tp_first); }));
    } catch (...) {
      abort_checkpoint(tmp);  // a failed save leaves no temporary directory behind
      throw;
    }
  }
  dist_.world->barrier();
  std::string dir;
  if (dist_.rank() == 0) {
    CheckpointState s;
    s.config_yaml = to_yaml(cfg_);
    TrainState{.iteration = c_.iteration,
               .consumed_samples = c_.consumed_samples,
               .skipped_iters = c_.skipped_iters,
               .nan_iters = c_.nan_iters,
               .optimizer_steps = optimizer_steps(),
               .loss_scaler = scaler_.state(),
               .seed = cfg_.training.seed}
        .save(s);
    try {
      write_checkpoint_tokenizer(tmp, cfg_.data.train);
      dir = commit_checkpoint(cfg_.checkpoint.save_dir, tmp, s, dist_.tp_size() * dist_.pp_size(),
                              cfg_.checkpoint.keep_last);
    } catch (...) {
      abort_checkpoint(tmp);
      throw;
    }
  }
  dist_.world->barrier();
  last_saved_ = std::to_string(c_.iteration);
  if (dist_.rank() != 0) return;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("saved checkpoint {} ({:.0f} ms)", dir, ms);
  metrics_.write(fmt::format(R"({{"event":"save","iteration":{},"checkpoint":"{}"}})", c_.iteration, dir));
}

// One iteration: every microbatch of this rank forward and backward (gradients accumulate), the gradients
// summed over the data-parallel group, then the optimizer step (the same on every rank).
// Microbatch m of data-parallel rank r holds samples consumed + (m * dp + r) * B + [0, B), so the global batch
// is the same set of samples whatever the layout.
void Trainer::train_step(float& lr_used, StepResult& result) {
  const int64_t M = cfg_.training.num_microbatches;
  const int64_t dp = dist_.dp_size();
  grads_->begin_step();                        // zeroes every gradient
  if (step_losses_.full()) read_losses();      // a logging interval longer than the slots
  Tensor loss_sum = step_losses_.next_slot();  // (1) f64 on the device
  // The objective is the mean loss over all M * dp microbatches (times the loss scale): a host value, so the
  // backward seed needs no read of the device.
  const float dloss = static_cast<float>(scaler_.scale() / static_cast<double>(M * dp));
  // One engine for every layout: one stage runs no_pipelining (F0 B0 F1 B1 ...), several 1F1B, several with
  // more than one chunk interleaved 1F1B. Only the last stage computes losses: read_losses sums them over the
  // pipeline group.
  const int p = dist_.pp_size(), v = static_cast<int>(chunks_.size());
  const ScheduleKind kind =
      p == 1 ? ScheduleKind::no_pipelining : (v > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b);
  const ScheduleSpec spec{.kind = kind, .stages = p, .microbatches = static_cast<int>(M), .chunks = v};
  IterationStage stage(*this, dloss, loss_sum);
  execute_pipeline(build_schedule(spec)[static_cast<size_t>(dist_.pp_rank())], stage,
                   PipelinePlacement{.comm = dist_.pp.get(), .stage = dist_.pp_rank(), .stages = p, .chunks = v});
  // The sums over TP (sequence-parallel replicas) and the embedding group (tied copies), then the data-parallel
  // buckets not started yet, then the wait: every gradient is final (this rank's shard of it with ZeRO).
  grads_->finalize();
  lr_used = static_cast<float>(schedule_.at(optimizer_steps() + 1));
  // The step's one read of the device: the grad norm and inf/NaN verdict, inside the optimizer.
  result = zero_ ? zero_->step(lr_used, scaler_.scale()) : adam_->step(lr_used, scaler_.scale());
  scaler_.update(result.found_inf);
  if (result.found_inf) ++c_.skipped_iters;
}

// Each step's loss: the double sum of its f32 microbatch means, summed (as doubles) over the pipeline group
// (with several stages) and then the data-parallel group, over M * dp, rounded to f32 once. The exchanges carry
// every pending step at once.
void Trainer::read_losses() {
  std::vector<double> sums = step_losses_.take();
  if (sums.empty()) return;
  const int64_t M = cfg_.training.num_microbatches, dp = dist_.dp_size();
  if (dist_.pp_size() > 1) sums = sum_doubles(*dist_.pp, std::move(sums));
  if (dp > 1) sums = sum_doubles(*dist_.dp, std::move(sums));
  for (double sum : sums) {
    const float loss = static_cast<float>(sum / static_cast<double>(M * dp));
    if (!std::isfinite(loss)) ++c_.nan_iters;
    interval_loss_ += loss;
  }
}

// Mean loss over the first eval_iters global batches of the validation samples, microbatch i on dp rank i % dp.
// The pipeline runs a forward_only schedule through the same executor as training (so its transfers follow
// the checked schedule order that NCCL needs); the last stage adds the losses in microbatch order.
double Trainer::evaluate() {
  const int64_t dp = dist_.dp_size();
  const int64_t batches = cfg_.logging.eval_iters * cfg_.training.num_microbatches * dp;
  const int p = dist_.pp_size(), v = static_cast<int>(chunks_.size());
  const ScheduleSpec spec{
      .kind = ScheduleKind::forward_only, .stages = p, .microbatches = static_cast<int>(batches / dp), .chunks = v};
  EvalStage stage(*this);
  execute_pipeline(build_schedule(spec)[static_cast<size_t>(dist_.pp_rank())], stage,
                   PipelinePlacement{.comm = dist_.pp.get(), .stage = dist_.pp_rank(), .stages = p, .chunks = v});
  double sum = stage.loss_sum;
  if (p > 1) sum = sum_doubles(*dist_.pp, {sum})[0];
  if (dp > 1) sum = sum_doubles(*dist_.dp, {sum})[0];
  return sum / static_cast<double>(batches);
}

Tensor EvalStage::forward(int microbatch, int chunk, const Tensor& input) {
  const int64_t B = t_.cfg_.training.micro_batch_size;
  const int64_t i = t_.dist_.dp_rank() + microbatch * t_.dist_.dp_size();  // the validation batch
  Tensor tokens, targets;
  t_.load_batch(t_.data_.valid, i * B, tokens, targets);
  const StepContext ctx{.sample_offset = i * B, .training = false};
  float loss = 0;
  GptModel& model = *t_.chunks_[static_cast<size_t>(chunk)];
  Tensor out = model.forward_stage(input, tokens, targets, microbatch, ctx, &loss);
  if (model.stage().has_head) loss_sum += loss;
  return out;
}

Tensor EvalStage::backward(int microbatch, int chunk, const Tensor&) {
  throw std::logic_error(
      fmt::format("evaluation: backward of microbatch {} chunk {} in a forward_only schedule", microbatch, chunk));
}

Shape EvalStage::activation_shape() const { return t_.activation_shape(); }

DType EvalStage::activation_dtype() const { return t_.dtype_; }

Device EvalStage::activation_device() const { return t_.device_; }

Tensor IterationStage::forward(int microbatch, int chunk, const Tensor& input) {
  const Config& cfg = t_.cfg_;
  const int64_t first = t_.microbatch_first_sample(microbatch);
  Tensor tokens, targets;
  t_.load_batch(t_.data_.train, first, tokens, targets);
  StepContext ctx{.sample_offset = first, .training = true, .seed = static_cast<uint64_t>(cfg.training.seed)};
  return t_.chunks_[static_cast<size_t>(chunk)]->forward_stage(input, tokens, targets, microbatch, ctx, loss_sum_);
}

Tensor IterationStage::backward(int microbatch, int chunk, const Tensor& grad) {
  return t_.chunks_[static_cast<size_t>(chunk)]->backward_stage(microbatch, grad, dloss_);
}

Shape IterationStage::activation_shape() const { return t_.activation_shape(); }

DType IterationStage::activation_dtype() const { return t_.dtype_; }

Device IterationStage::activation_device() const { return t_.device_; }

void Trainer::load_batch(const SampleFn& source, int64_t first, Tensor& tokens, Tensor& targets) const {
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  Tensor host_tokens = Tensor::empty({B, S}, DType::i32), host_targets = Tensor::empty({B, S}, DType::i32);
  make_batch(source, first, B, S, host_tokens, host_targets);
  tokens = device_ == Device::cpu ? host_tokens : host_tokens.to(device_);
  targets = device_ == Device::cpu ? host_targets : host_targets.to(device_);
}

// The ranks (global) where `here` is true on that rank; every rank calls it at the same point.
std::vector<int> Trainer::ranks_where(bool here) {
  const int world = dist_.env.world_size;
  std::vector<double> flags(static_cast<size_t>(world), 0.0);
  flags[static_cast<size_t>(dist_.rank())] = here ? 1.0 : 0.0;
  if (world > 1) flags = sum_doubles(*dist_.world, flags);
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r)
    if (flags[static_cast<size_t>(r)] > 0) ranks.push_back(r);
  return ranks;
}

// Counts non-finite iterations in a row: an inf/NaN gradient norm (the global norm, the same on every rank,
// so every rank decides alike; the step's loss is read on the host once per logging interval only, and a
// non-finite loss gives non-finite gradients), except fp16 steps that the loss scaler skipped while its scale
// can still back off (Megatron skips those forever; here they count once the scale sits at its minimum,
// where backing off can no longer help). The first of a streak finds the first non-finite gradient on each
// rank; after training.max_nonfinite_iters in a row the run stops with an error naming it.
void Trainer::check_finite(const StepResult& r) {
  const bool nonfinite = !std::isfinite(r.grad_norm) || r.found_inf;
  const bool scaler_can_help = scaler_.dynamic() && scaler_.scale() > cfg_.training.loss_scale.min;
  if (!nonfinite || scaler_can_help) {
    nonfinite_streak_ = 0;
    return;
  }
  if (nonfinite_streak_++ == 0) {
    const std::optional<std::string> grad = first_nonfinite(params_, /*grads=*/true);
    const std::vector<int> ranks = ranks_where(grad.has_value());
    nonfinite_first_ = fmt::format(
        "the first non-finite gradient, at iteration {}, was on rank(s) [{}]{}", c_.iteration, fmt::join(ranks, ", "),
        grad ? fmt::format("; on this rank (rank {}) in {}", dist_.rank(), describe_parameter(*grad)) : std::string());
    spdlog::warn("iteration {} is not finite (grad norm {}): {}", c_.iteration, r.grad_norm, nonfinite_first_);
  }
  if (nonfinite_streak_ >= cfg_.training.max_nonfinite_iters)
    throw std::runtime_error(fmt::format(
        "training stopped: {} non-finite iterations in a row (iterations {} to {}, training.max_nonfinite_iters={}); "
        "{}; no checkpoint was saved since",
        nonfinite_streak_, c_.iteration - nonfinite_streak_ + 1, c_.iteration, cfg_.training.max_nonfinite_iters,
        nonfinite_first_));
}

void Trainer::run() {
  const int64_t G = cfg_.training.global_batch_size, S = cfg_.model.seq_length;
  spdlog::info("data: {}", data_.description);
  spdlog::info("model: {} parameters ({} layers, hidden {}, {} heads, vocabulary {} padded to {}), {}",
               num_parameters(), cfg_.model.num_layers, cfg_.model.hidden_size, cfg_.model.num_heads,
               cfg_.model.vocab_size, cfg_.model.padded_vocab_size, name_of(cfg_.training.precision));
  maybe_resume();
  // --exit-after N when the run resumes at or past N: stop at once; the checkpoint it resumed from already
  // holds this state, so nothing new is trained or saved.
  if (opt_.exit_after > 0 && c_.iteration >= opt_.exit_after) {
    spdlog::info("resumed at iteration {}, at or past --exit-after {}: stopping without training", c_.iteration,
                 opt_.exit_after);
    return;
  }
  if (cfg_.logging.eval_interval > 0 && !data_.valid)
    throw DataError(
        "logging.eval_interval is set but the validation split holds less than one sample "
        "(raise data.split's second weight or set data.valid)");

  const double flops_per_iter = model_flops_per_iteration(cfg_.model, G * S);
  double interval_ms = 0;
  int64_t interval_iters = 0;
  while (c_.iteration < cfg_.training.train_iters) {
    auto t0 = std::chrono::steady_clock::now();
    float lr = 0;
    StepResult r;
    train_step(lr, r);
    ++c_.iteration;
    c_.consumed_samples += G;
    check_finite(r);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    interval_ms += ms;
    ++interval_iters;

    if (c_.iteration % cfg_.logging.interval == 0 || c_.iteration == cfg_.training.train_iters) {
      read_losses();  // the interval's losses, in one read (and one exchange across ranks)
      double mean_loss = interval_loss_ / interval_iters, mean_ms = interval_ms / interval_iters;
      double tokens_per_s = static_cast<double>(G * S) / (mean_ms / 1000.0);
      // Model FLOP/s per rank (per GPU), and MFU against the device's dense bf16 peak where it is known.
      double tflops = flops_per_iter / (mean_ms / 1000.0) / 1e12 / dist_.env.world_size;
      const double peak = dist_.placement.peak_tflops;
      const std::string mfu_text =
          peak > 0 ? fmt::format("{:5.1f}%", 100.0 * tflops / peak) : fmt::format("n/a ({})", device_name(device_));
      spdlog::info(
          " iteration {:>7}/{:<7} | consumed samples {:>9} | ms/iter {:8.1f} | tokens/s {:9.0f} | "
          "TFLOP/s/GPU {:7.3f} | MFU {} | lr {:.3e} | loss {:.6e} | loss scale {} | grad norm {:.4f} | "
          "skipped {} | nan {}",
          c_.iteration, cfg_.training.train_iters, c_.consumed_samples, mean_ms, tokens_per_s, tflops, mfu_text, lr,
          mean_loss, scaler_.scale(), r.grad_norm, c_.skipped_iters, c_.nan_iters);
      metrics_.write(fmt::format(
          R"({{"iteration":{},"consumed_samples":{},"ms_per_iter":{:.3f},"tokens_per_s":{:.1f},"tflops":{:.6f},"mfu":{},"lr":{},"loss":{},"loss_scale":{},"grad_norm":{},"skipped_iters":{},"nan_iters":{},"peak_bytes":{},"device":"{}"}})",
          c_.iteration, c_.consumed_samples, mean_ms, tokens_per_s, tflops,
          peak > 0 ? json_number(tflops / peak) : "null", lr, json_number(mean_loss), json_number(scaler_.scale()),
          json_number(r.grad_norm), c_.skipped_iters, c_.nan_iters, allocator_for(device_).stats().peak_total,
          device_name(device_)));
      if (c_.iteration == cfg_.logging.interval) spdlog::info("peak memory (MiB): {}", memory_summary(device_));
      interval_loss_ = interval_ms = 0;
      interval_iters = 0;
    }
    if (cfg_.logging.eval_interval > 0 &&
        (c_.iteration % cfg_.logging.eval_interval == 0 || c_.iteration == cfg_.training.train_iters)) {
      double v = evaluate();
      spdlog::info(" validation loss at iteration {}: {:.6e} | perplexity {:.3f}", c_.iteration, v, std::exp(v));
      metrics_.write(fmt::format(R"({{"iteration":{},"valid_loss":{}}})", c_.iteration, json_number(v)));
    }
    if (cfg_.checkpoint.save_interval > 0 && c_.iteration % cfg_.checkpoint.save_interval == 0) save();
    // Every rank must stop after the same iteration, whenever the signal reached it: agreed over the whole
    // world (a TP or PP peer that trained on would wait for this rank in its next collective).
    const int sig = g_signal.load();
    const bool stop = dist_.env.world_size > 1 ? sum_doubles(*dist_.world, {sig != 0 ? 1.0 : 0.0})[0] > 0 : sig != 0;
    if (stop) {
      spdlog::warn("received {}: saving and stopping after iteration {}",
                   sig != 0 ? fmt::format("signal {}", sig) : "a stop signal on another rank", c_.iteration);
      save();
      return;
    }
    if (opt_.exit_after > 0 && c_.iteration >= opt_.exit_after) {
      spdlog::info("stopping after iteration {} as asked (--exit-after)", c_.iteration);
      save();
      return;
    }
  }
  save();
  spdlog::info("training done: {} iterations, {} samples, {} skipped, {} nan; peak memory (MiB): {}", c_.iteration,
               c_.consumed_samples, c_.skipped_iters, c_.nan_iters, memory_summary(device_));
}

}  // namespace

void setup_logging(const std::string& run_dir, const std::string& level) {
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stdout_sink_mt>()};
  if (!run_dir.empty()) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) throw std::runtime_error(fmt::format("logging.dir: cannot create {}: {}", run_dir, ec.message()));
    sinks.push_back(
        std::make_shared<spdlog::sinks::basic_file_sink_mt>((fs::path(run_dir) / "megatrain.log").string()));
  }
  auto logger = std::make_shared<spdlog::logger>("megatrain", sinks.begin(), sinks.end());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

void train(const Config& cfg, const TrainOptions& opt, const LaunchEnv& env) {
  // Rank 0 logs to the console and the run directory; the others only report problems.
  const bool logging_rank = env.rank == 0;
  setup_logging(logging_rank ? cfg.logging.dir : "", logging_rank ? cfg.logging.level : "warn");
  spdlog::info("megatrain {} resolved config:\n{}", MEGATRAIN_VERSION, to_yaml(cfg));
  // Rank 0 holds the save_dir for the whole run: a second run on it is refused rather than let the two delete
  // each other's temporary directories.
  std::optional<ckpt::SaveDirLock> save_dir_lock;
  if (logging_rank && !cfg.checkpoint.save_dir.empty()) {
    save_dir_lock.emplace(cfg.checkpoint.save_dir);
    check_save_dir_writable(cfg.checkpoint.save_dir);
  }
  const Placement placement = place_rank(cfg, env);
  spdlog::info("device: {}", placement.description);
  std::unique_ptr<Distributed> dist = init_distributed(cfg, env, placement);
  Trainer trainer(cfg, opt, *dist);
  // Until here a signal ends the process at once (nothing to save); from now on it asks for a checkpoint.
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGHUP, on_signal);  // the terminal closed: like SIGTERM
  try {
    trainer.run();
  } catch (const CommError& e) {
    // A collective failed or timed out: say which ranks stopped answering, if any (the cause, not this rank).
    if (!dist->heartbeat) throw;
    throw CommError(std::string(e.what()) + dist->heartbeat->silent_ranks());
  }
}

}  // namespace mt::app
