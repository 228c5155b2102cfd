// train.cpp: `megatrain train` on one rank: logging, the device, the communicators, then the Trainer (trainer.cpp)
// until it stops (the Trainer takes the save directory's lock once its checks have passed).
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "app/runtime/stop_signal.h"
#include "app/train/meta_step.h"
#include "app/train/trainer_impl.h"
#include "parallel/comm/flight_recorder.h"

namespace mt::app {

namespace fs = std::filesystem;

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

namespace {

// A failed rank's last collectives (parallel/comm/flight_recorder.h), for `megatrain debug hang`: in
// logging.dir/flight_recorder/rank_NNNNN.json, named in the log. A dump that cannot be written is only a warning.
void dump_flight_record(const Config& cfg, const LaunchEnv& env, const std::string& reason) {
  if (env.world_size <= 1 || cfg.logging.dir.empty()) return;
  const fs::path dir = fs::path(cfg.logging.dir) / "flight_recorder";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (dir / fmt::format("rank_{:05d}.json", env.rank)).string();
  if (flight_recorder().dump(path, env.rank, env.world_size, reason))
    spdlog::error("rank {}: its last collectives are in {} (megatrain debug hang {})", env.rank, path, cfg.logging.dir);
  else
    spdlog::warn("rank {}: cannot write its flight record {}", env.rank, path);
}

}  // namespace

void train(const Config& cfg, const TrainOptions& opt, const LaunchEnv& env) {
  // Rank 0 logs to the console and the run directory; the others only report problems.
  const bool logging_rank = env.rank == 0;
  setup_logging(logging_rank ? cfg.logging.dir : "", logging_rank ? cfg.logging.level : "warn");
  spdlog::info("megatrain {} resolved config:\n{}", MEGATRAIN_VERSION, to_yaml(cfg));
  const Placement placement = place_rank(cfg, env);
  spdlog::info("device: {}", placement.description);
  std::unique_ptr<Distributed> dist = init_distributed(cfg, env, placement);
  Trainer trainer(
      cfg, opt, *dist, open_data_sources(cfg),
      measure_schedule_memory(cfg, placement.device == Device::cuda ? meta::Mirror::cuda : meta::Mirror::cpu));
  // Until here a signal ends the process at once (nothing to save); from now on it asks for a checkpoint.
  install_stop_signals();
  try {
    trainer.run();
  } catch (const CommError& e) {
    // A collective failed or timed out: say which ranks stopped answering, if any (the cause, not this rank).
    const std::string why = std::string(e.what()) + (dist->heartbeat ? dist->heartbeat->silent_ranks() : "");
    dump_flight_record(cfg, env, why);
    throw CommError(why);
  } catch (const std::exception& e) {
    dump_flight_record(cfg, env, e.what());
    throw;
  }
}

}  // namespace mt::app
