// trainer_checkpoint.cpp: the training loop's resume (checkpoint.load) and save (checkpoint.save_dir).
#include <chrono>
#include <exception>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/train/checkpointing.h"
#include "app/train/nonfinite.h"
#include "app/train/trainer_impl.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint_writer.h"
#include "core/checkpoint/save_dir.h"
#include "core/tensor/trace.h"

namespace mt::app {

Progress Trainer::checkpoint_progress(std::string what) const {
  return Progress({.what = std::move(what),
                   .enabled = dist_.is_logging_rank() && progress_wanted(ProgressMode::automatic),
                   .last_line_when_quick = false});
}

// With finetune.lora a checkpoint holds the adapters (and their optimizer state) only: the frozen base is always
// training.init_from's weights (or the seeded initialization without it), loaded first, on a resume too.
void Trainer::maybe_resume() {
  const bool lora = cfg_.finetune.lora.enabled();
  if (lora && cfg_.training.init_from.empty()) {
    // Adapters on a random base learn nothing worth keeping: only on request (the layout tests train so).
    if (!cfg_.finetune.lora.random_base)
      throw ConfigError(
          "training.init_from: empty, but finetune.lora trains adapters on a frozen base that init_from must give "
          "(the checkpoint to fine-tune; `megatrain ckpt import` makes one from a Hugging Face model); set "
          "finetune.lora.random_base: true to train them on this model's seeded, random initialization instead "
          "(tests and experiments only)");
    lora_base_ = seeded_lora_base(cfg_.training.seed);
    if (dist_.is_logging_rank())
      spdlog::warn(
          "finetune.lora.random_base: the frozen base is this model's seeded (random) initialization, not a trained "
          "model");
  }
  if (lora && !cfg_.training.init_from.empty()) init_from();
  if (!resume() && !lora && !cfg_.training.init_from.empty()) init_from();
}

void Trainer::init_from() {
  const std::string& from = cfg_.training.init_from;
  const std::optional<std::string> dir = resolve_resume_checkpoint(from);
  if (!dir)
    throw CheckpointError(fmt::format(
        "training.init_from: {} holds no checkpoint (no metadata.yaml, no latest; `megatrain ckpt import` makes one "
        "from a Hugging Face model)",
        from));
  CheckpointReader reader(*dir);
  check_checkpoint_tokenizer(*dir, cfg_);
  const std::vector<std::string> diff = model_shape_differences(reader.state().config_yaml, to_yaml(cfg_), *dir);
  if (!diff.empty())
    throw CheckpointError(fmt::format(
        "training.init_from: {} holds another model ({}); set the model keys it was saved with (an import writes "
        "them to its model.yaml)",
        *dir, fmt::join(diff, ", ")));
  Progress loading = checkpoint_progress("init_from load");
  if (cfg_.finetune.lora.enabled()) {  // the frozen base only; the adapters keep their initialization
    std::vector<Parameter*> base;
    for (Parameter* p : params_)
      if (p->frozen) base.push_back(p);
    load_parameters(reader, base);
    loading.finish();
    lora_base_ = lora_base_of(reader);
    spdlog::info("LoRA: the frozen base model is {}'s weights (the adapters start at B = 0)", *dir);
    metrics_.write({{"event", "init_from"}, {"checkpoint", *dir}});
    return;
  }
  par_->optimizer().load_state([&](const std::vector<Optimizer::Slot>& slots) { load_model_weights(reader, slots); },
                               false);
  loading.finish();
  load_expert_biases(reader, *dir);
  spdlog::info(
      "initialized the model from {} (its weights only: a fresh optimizer, iteration 0, the data from the "
      "start)",
      *dir);
  metrics_.write({{"event", "init_from"}, {"checkpoint", *dir}});
}

void Trainer::hold_save_dir() {
  const std::string& save_dir = cfg_.checkpoint.save_dir;
  if (save_dir.empty()) return;
  // Rank 0 holds the save_dir for the rest of the run: a second run on it is refused rather than let the two delete
  // each other's temporary directories. Its error is rethrown after every rank has heard of it.
  std::exception_ptr failed;
  if (dist_.rank() == 0) {
    try {
      save_dir_lock_.emplace(save_dir);
      check_save_dir_writable(save_dir);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (ranks_where(failed != nullptr).empty()) return;
  if (failed) std::rethrow_exception(failed);
  throw CheckpointError(fmt::format("{}: rank 0 cannot hold checkpoint.save_dir (its error says why)", save_dir));
}

bool Trainer::resume() {
  const auto& ck = cfg_.checkpoint;
  std::optional<std::string> dir;
  if (ck.load == "none") return false;
  if (ck.load == "auto") {
    if (ck.save_dir.empty()) return false;
    dir = resolve_resume_checkpoint(ck.save_dir);  // never starts over when checkpoints are there
    if (!dir) return false;
  } else {
    dir = resolve_resume_checkpoint(ck.load);
    if (!dir)
      throw CheckpointError(
          fmt::format("checkpoint.load: {} holds no checkpoint (no metadata.yaml, no latest)", ck.load));
  }
  CheckpointReader reader(*dir);
  const CheckpointState& s = reader.state();
  const TrainState rs = TrainState::load(s, *dir);  // every value checked before any is used
  check_checkpoint_tokenizer(*dir, cfg_);
  // A checkpoint of another model shape, or of other LoRA adapters, is refused, unless a partial load is asked for.
  std::vector<std::string> diff = model_shape_differences(s.config_yaml, to_yaml(cfg_), *dir);
  for (std::string& d : lora_differences(s.config_yaml, cfg_.finetune.lora)) diff.push_back(std::move(d));
  std::optional<PartialLoad> partial;
  if (!diff.empty()) {
    if (!ck.allow_partial_load)
      throw CheckpointError(
          fmt::format("{}: was saved by another model ({}); resume it with the keys it was saved with, or "
                      "set checkpoint.allow_partial_load: true to load only the tensors that match",
                      *dir, fmt::join(diff, ", ")));
    spdlog::warn("partial load from {}: the model differs ({})", *dir, fmt::join(diff, ", "));
    partial.emplace();
  }
  if (cfg_.finetune.lora.enabled()) check_lora_base(s, *dir, lora_base_, cfg_.training.init_from);
  Progress loading = checkpoint_progress("checkpoint load");
  par_->optimizer().load_state(
      [&](const std::vector<Optimizer::Slot>& slots) {
        load_optimizer(reader, slots, partial ? &*partial : nullptr, loading.hook("tensors"));
      },
      partial.has_value());
  loading.finish();
  if (partial) {
    spdlog::warn("partial load: {} tensors loaded: {}", partial->loaded.size(), fmt::join(partial->loaded, ", "));
    spdlog::warn("partial load: {} tensors left at their initial values: {}", partial->skipped.size(),
                 fmt::join(partial->skipped, ", "));
  }
  load_expert_biases(reader, *dir);
  if (fp8_) load_fp8_tensors(*fp8_, reader, *dir);
  c_.iteration = rs.iteration;
  c_.consumed_samples = rs.consumed_samples;
  c_.skipped_iters = rs.skipped_iters;
  c_.nan_iters = rs.nan_iters;
  par_->optimizer().set_steps(rs.optimizer_steps);
  scaler_.restore(rs.loss_scaler);
  spike_.restore(rs.loss_spike);
  if (rs.seed != cfg_.training.seed)
    spdlog::warn(
        "resuming with training.seed={} but the checkpoint was trained with seed {}: data order and "
        "dropout masks change",
        cfg_.training.seed, rs.seed);
  spdlog::info("resumed from {} at iteration {} ({} samples consumed)", *dir, c_.iteration, c_.consumed_samples);
  metrics_.write({{"event", "resume"}, {"iteration", c_.iteration}, {"checkpoint", *dir}});
  return true;
}

void Trainer::load_expert_biases(const CheckpointReader& reader, const std::string& dir) {
  for (auto& [prefix, bias] : moe_.expert_biases()) {  // a checkpoint without them (bias updates off then) starts at 0
    const std::string name = expert_bias_tensor(prefix);
    if (!reader.has(name)) {
      spdlog::warn("{}: holds no {} (saved without model.moe.bias_update_rate): the expert biases start at zero", dir,
                   name);
      continue;
    }
    if (reader.info(name).global_shape != Shape{static_cast<int64_t>(bias.size())})
      throw CheckpointError(fmt::format("{}: {} holds {} values, this model has {} experts", dir, name,
                                        reader.info(name).global_shape.at(0), bias.size()));
    Tensor t = Tensor::empty({static_cast<int64_t>(bias.size())}, DType::f32);
    reader.read(name, t);
    moe_.set_expert_bias(prefix, t.to_floats());
  }
}

// Data-parallel replicas hold identical state, so the ranks of data-parallel rank 0 write: each its
// tensor-parallel slices, and tensor-parallel rank 0 the replicated tensors. Rank 0 creates the temporary
// directory and commits it once every writer has flushed and verified its file.
bool Trainer::save() {
  const trace::Span span("checkpoint", "save checkpoint");
  read_losses();  // the saved nan_iters counts every step so far (every rank reads here, as every rank saves)
  if (cfg_.checkpoint.save_dir.empty() || last_saved_ == std::to_string(c_.iteration)) return true;
  if (nonfinite_streak_ > 0) {  // keep the good checkpoints from being rotated out by one taken now
    spdlog::warn("not saving a checkpoint at iteration {}: the last {} iteration(s) were not finite", c_.iteration,
                 nonfinite_streak_);
    return false;
  }
  // Never a checkpoint whose weights hold inf or NaN.
  std::optional<std::string> bad = first_nonfinite(params_, /*grads=*/false);
  if (!bad)  // ZeRO-3: the released values live in this rank's blocks
    if (const Parameter* p = par_->first_nonfinite_shard()) bad = p->name;
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
  const bool writer = dist_.dp_rank() == 0 && dist_.cp_rank() == 0;  // the context ranks hold the same weights
  // With expert parallelism the first rank of each expert-data-parallel group writes its experts too (with the
  // experts' grid refolded, i = etp + ETP * ep for i in [0, ETP * EP) of each stage, context ranks included; the
  // dense writers are i = tp in [0, T)).
  const bool expert_writer = dist_.edp_rank() == 0;
  // With the distributed optimizer every data-parallel rank takes part in gathering the state; the writer
  // keeps it (in host memory).
  std::vector<Optimizer::Slot> slots = par_->optimizer().gather_state(writer);
  if (writer || expert_writer) {
    if (dist_.rank() != 0) {
      Bytes b = dist_.store->get(key, Millis(static_cast<int64_t>(cfg_.parallel.timeout_s * 1000)));
      tmp.assign(b.begin(), b.end());
    }
    const bool tp_first = dist_.tp_rank() == 0, etp_first = dist_.etp_rank() == 0;
    try {
      Progress saving = checkpoint_progress("checkpoint save");
      std::vector<TensorSlice> tensors = optimizer_tensors(slots, [&](const Parameter& p) {
        if (p.tied_copy) return false;
        return p.expert ? expert_writer && (p.tensor_parallel || etp_first) : writer && (p.tensor_parallel || tp_first);
      });
      if (tp_first &&
          writer)  // the MoE layers' expert biases, replicated over TP (the same on every rank of the stage)
        for (auto& [prefix, bias] : moe_.expert_biases())
          tensors.push_back({.name = expert_bias_tensor(prefix),
                             .global_shape = {static_cast<int64_t>(bias.size())},
                             .data = Tensor::from_floats(bias, {static_cast<int64_t>(bias.size())})});
      // The delayed fp8 recipe's scales and histories, the same on every rank holding the linear.
      if (fp8_ && tp_first && writer) append_fp8_tensors(*fp8_, dist_.pp_rank() == 0, tensors);
      // One file per writer: the writers of a stage are its ranks i = tp + T * (cp + C * dp) in [0, W).
      write_rank_files(tmp, dist_.checkpoint_file(), tensors, saving.hook("tensors"));
      saving.finish();
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
               .seed = cfg_.training.seed,
               .loss_spike = spike_.state()}
        .save(s);
    if (cfg_.finetune.lora.enabled()) record_lora_base(s, lora_base_);
    try {
      write_checkpoint_tokenizer(tmp, cfg_.data.train);
      dir = commit_checkpoint(cfg_.checkpoint.save_dir, tmp, s, dist_.checkpoint_writers_per_stage() * dist_.pp_size(),
                              cfg_.checkpoint.keep_last);
    } catch (...) {
      abort_checkpoint(tmp);
      throw;
    }
  }
  dist_.world->barrier();
  last_saved_ = std::to_string(c_.iteration);
  if (dist_.rank() != 0) return true;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("saved checkpoint {} ({:.0f} ms)", dir, ms);
  metrics_.write({{"event", "save"}, {"iteration", c_.iteration}, {"checkpoint", dir}});
  return true;
}

}  // namespace mt::app
