// trainer_stop.cpp: when the training loop stops early and what it says then: loss spikes (training.loss_spike),
// non-finite streaks (training.max_nonfinite_iters), signals, --exit-after and the wall-clock budgets, agreed by
// every rank, and the run's last words.
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/runtime/stop_signal.h"
#include "app/train/nonfinite.h"
#include "app/train/trainer_impl.h"

namespace mt::app {

bool Trainer::spike_check(double local_sum, int64_t iteration) {
  const int64_t M = cfg_.training.num_microbatches, dp = replicas();
  const std::vector<double> sum = sum_over_stages_and_replicas({local_sum});
  if (!observe_loss(static_cast<float>(sum[0] / static_cast<double>(M * dp)), iteration)) return false;
  if (cfg_.training.loss_spike.action == SpikeAction::stop) spike_stop_ = true;
  return true;
}

bool Trainer::observe_loss(float loss, int64_t iteration) {
  if (!spike_.observe(loss)) return false;
  const SpikeAction action = cfg_.training.loss_spike.action;
  if (dist_.is_logging_rank())
    spdlog::warn("loss spike at iteration {}: loss {:.4f}, running mean {:.4f}, threshold {:.4f}{}", iteration, loss,
                 spike_.mean_before(), spike_.threshold_before(),
                 action == SpikeAction::log    ? ""
                 : action == SpikeAction::skip ? " (training.loss_spike.action=skip: the step is not applied)"
                                               : " (training.loss_spike.action=stop: the step is not applied; "
                                                 "saving and stopping)");
  metrics_.write({{"event", "loss_spike"},
                  {"iteration", iteration},
                  {"spike_loss", loss},
                  {"running_mean", spike_.mean_before()},
                  {"threshold", spike_.threshold_before()},
                  {"action", std::string(name_of(action))}});
  return true;
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

// Whether training stops after this iteration, and why (logged here): a loss spike with action stop, a signal,
// a failed logging sink with logging.on_sink_error=save_and_stop, --exit-after, training.exit_interval or
// training.exit_duration_mins. Every rank decides alike: the spike's loss was agreed before the update, and the
// signal and the wall-clock budget (clocks differ) are agreed here over the whole world in one exchange (a TP or PP
// peer that trained on would wait for this rank in its next collective).
std::optional<Trainer::Stop> Trainer::stop_after_iteration() {
  if (spike_stop_) return Stop{.why = Stop::Why::spike};
  const int sig = stop_signal();
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 60;
  const bool over_budget = cfg_.training.exit_duration_mins > 0 && minutes >= cfg_.training.exit_duration_mins;
  // Only the logging rank writes the sinks: its failure reaches the others here.
  std::vector<double> flags{sig != 0 ? 1.0 : 0.0, over_budget ? 1.0 : 0.0, metrics_.stop_asked() ? 1.0 : 0.0};
  if (dist_.env.world_size > 1) flags = sum_doubles(*dist_.world, flags);
  if (flags[0] > 0) {
    spdlog::warn("received {}: saving and stopping after iteration {}",
                 sig != 0 ? fmt::format("signal {}", sig) : "a stop signal on another rank", c_.iteration);
    return Stop{};
  }
  if (flags[2] > 0) {
    spdlog::warn("a logging sink failed (logging.on_sink_error=save_and_stop): saving and stopping after iteration {}",
                 c_.iteration);
    return Stop{};
  }
  if (opt_.exit_after > 0 && c_.iteration >= opt_.exit_after) {
    spdlog::info("stopping after iteration {} as asked (--exit-after)", c_.iteration);
    return Stop{};
  }
  if (c_.iteration >= cfg_.training.train_iters) return std::nullopt;  // the end: no early stop to report
  if (const int64_t every = cfg_.training.exit_interval; every > 0 && c_.iteration % every == 0) {
    spdlog::info("saving and exiting after iteration {} (training.exit_interval={})", c_.iteration, every);
    return Stop{};
  }
  if (flags[1] > 0) {
    spdlog::info(
        "saving and exiting after iteration {}: training.exit_duration_mins={} reached ({:.2f} min "
        "since training started{})",
        c_.iteration, cfg_.training.exit_duration_mins, minutes, over_budget ? "" : " on another rank");
    return Stop{};
  }
  return std::nullopt;
}

// --exit-after N when the run resumes at or past N: stop at once; the checkpoint it resumed from already holds
// this state, so nothing new is trained or saved.
std::optional<Trainer::Stop> Trainer::stop_before_training() const {
  if (opt_.exit_after <= 0 || c_.iteration < opt_.exit_after) return std::nullopt;
  spdlog::info("resumed at iteration {}, at or past --exit-after {}: stopping without training", c_.iteration,
               opt_.exit_after);
  return Stop{.why = Stop::Why::nothing_to_train};
}

void Trainer::finish(const std::optional<Stop>& stop, bool saved) const {
  if (stop && stop->why == Stop::Why::spike)
    throw std::runtime_error(fmt::format(
        "training stopped after iteration {}: loss spike (training.loss_spike.action=stop; see the warning above). "
        "The spike's step was not applied; {}. Resuming continues after the spike's batch",
        c_.iteration,
        cfg_.checkpoint.save_dir.empty() ? "no checkpoint (checkpoint.save_dir is not set)"
                                         : fmt::format("checkpoint saved in {}", cfg_.checkpoint.save_dir)));
  // A run that could not save what it was asked to save fails (issue 30: it used to exit 0 without its checkpoint).
  if (!saved)
    throw std::runtime_error(fmt::format(
        "training ended after iteration {} without its checkpoint: the last {} iteration(s) were not finite (see the "
        "warnings above), so {} keeps the checkpoint from before them; resume from it with other settings (a lower "
        "optimizer.lr, training.precision, optimizer.grad_clip)",
        c_.iteration, nonfinite_streak_, cfg_.checkpoint.save_dir));
  if (stop) return;
  spdlog::info("training done: {} iterations, {} samples, {} skipped, {} nan; peak memory (MiB): {}", c_.iteration,
               c_.consumed_samples, c_.skipped_iters, c_.nan_iters, memory_summary(device_));
}

}  // namespace mt::app
