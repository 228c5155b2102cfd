// trainer.h: the training loop that ties the model, data, optimizer, loss scaler and checkpoints together.
#pragma once
#include <cstdint>
#include <string>

#include "core/config/config.h"
#include "parallel/store/launch.h"

namespace mt::app {

struct TrainOptions {
  int64_t exit_after = 0;  // > 0: save and stop once this iteration is done (as if interrupted there)
};

// Trains as `cfg` says, as rank env.rank of env.world_size. Throws on any error (bad data, unwritable
// directories, corrupted checkpoint, a failed peer).
void train(const Config& cfg, const TrainOptions& opt, const LaunchEnv& env);

// Sets up spdlog: the console and, when `run_dir` is not empty, RUN_DIR/megatrain.log.
void setup_logging(const std::string& run_dir, const std::string& level);

}  // namespace mt::app
