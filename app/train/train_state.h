// train_state.h: the scalar state of a training run that a checkpoint carries (beside the tensors), with one
// save/load pair. On disk it is the `state:` map of the checkpoint's metadata.yaml (core/checkpoint), one
// string per field, so older checkpoints read unchanged.
#pragma once
#include <cstdint>
#include <string>

#include "core/checkpoint/checkpoint.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/loss_spike.h"

namespace mt::app {

struct TrainState {
  int64_t iteration = 0;         // iterations completed
  int64_t consumed_samples = 0;  // samples of the training data consumed (the data position)
  int64_t skipped_iters = 0;     // fp16 steps skipped for inf/NaN gradients
  int64_t nan_iters = 0;         // iterations whose loss was inf/NaN
  int64_t optimizer_steps = 0;   // successful optimizer steps (the LR schedule's position)
  LossScaler::State loss_scaler{.scale = 1, .growth_tracker = 0, .hysteresis_tracker = 0};
  int64_t seed = 0;  // training.seed of the run that saved it (data order and dropout masks)
  // The loss spike detector's running statistics (absent from checkpoints older than the detector: a fresh one).
  LossSpikeDetector::State loss_spike;

  // Writes every field into s (s.iteration and s.values).
  void save(CheckpointState& s) const;
  // Reads every field of a checkpoint's state, each checked before any is used: integers non-negative, counters
  // no larger than the iteration, optimizer steps + skipped = iterations, consumed samples at least one a
  // iteration, the loss scale finite and positive. Throws CheckpointError naming `dir` and the field.
  static TrainState load(const CheckpointState& s, const std::string& dir);
};

}  // namespace mt::app
