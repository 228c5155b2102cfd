// test_metrics.cpp: a logging sink that fails during a run (metrics.jsonl on a full disk, here a link to
// /dev/full, which refuses every write with ENOSPC as root too) is closed with a warning naming its file and the
// OS error, and the run goes on; with logging.on_sink_error=save_and_stop it asks the trainer to save and stop.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "app/train/metrics.h"
#include "core/io/file_error.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

// A fresh run directory, removed at the end.
struct RunDir {
  fs::path path;
  RunDir() {
    std::string pattern = (fs::temp_directory_path() / "mt-metrics-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~RunDir() { fs::remove_all(path); }
};

// Collects what spdlog's default logger says while it lives.
struct LogCapture {
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  LogCapture() {
    auto logger = std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_st>(out));
    logger->set_pattern("%l %v");
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous); }
  std::string text() const { return out.str(); }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A run directory whose metrics.jsonl is a full disk.
RunDir full_disk_run() {
  RunDir run;
  fs::create_symlink("/dev/full", run.path / "metrics.jsonl");
  return run;
}

}  // namespace

TEST(MetricsFile, AWriteOnAFullDiskWarnsNamingTheFileAndTheOsErrorAndTheRunGoesOn) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const RunDir run = full_disk_run();
  LogCapture log;
  app::MetricsFile metrics(run.path.string());
  EXPECT_NO_THROW(metrics.write({{"iteration", 1}}));
  const std::string said = log.text();
  EXPECT_TRUE(contains(said, "warning logging sink failed: " + (run.path / "metrics.jsonl").string() +
                                 ": cannot write: " + std::strerror(ENOSPC)))
      << said;
  EXPECT_TRUE(contains(said, "training goes on without it (logging.on_sink_error=warn)")) << said;
  EXPECT_FALSE(metrics.stop_asked());
  EXPECT_NO_THROW(metrics.write({{"iteration", 2}}));
  EXPECT_EQ(log.text(), said) << "the closed sink warns once";
}

TEST(MetricsFile, SaveAndStopAsksTheTrainerToStopOnceASinkFailed) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const RunDir run = full_disk_run();
  LogCapture log;
  app::MetricsFile metrics(run.path.string(), false, SinkErrorAction::save_and_stop);
  EXPECT_FALSE(metrics.stop_asked());
  metrics.write({{"iteration", 1}});
  EXPECT_TRUE(metrics.stop_asked());
  EXPECT_TRUE(contains(log.text(), "saves a checkpoint and stops after this iteration")) << log.text();
}

TEST(MetricsFile, AWorkingSinkAsksNothing) {
  const RunDir run;
  app::MetricsFile metrics(run.path.string(), false, SinkErrorAction::save_and_stop);
  metrics.write({{"iteration", 1}});
  EXPECT_FALSE(metrics.stop_asked());
  std::ifstream in(run.path / "metrics.jsonl");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, R"({"iteration":1})");
}

TEST(MetricsFile, AFailedTensorBoardWriteClosesItsFileWithAWarning) {
  const RunDir run;
  LogCapture log;
  app::MetricsFile metrics(run.path.string(), true, SinkErrorAction::save_and_stop);
  int calls = 0;
  const auto failing = [&calls](TensorBoardWriter& tb) {
    ++calls;
    throw FileError(fmt::format("tensorboard: cannot write {}: {}", tb.path(), std::strerror(ENOSPC)));
  };
  EXPECT_NO_THROW(metrics.tensorboard(failing));
  EXPECT_TRUE(contains(log.text(), "warning logging sink failed: tensorboard: cannot write ")) << log.text();
  EXPECT_TRUE(metrics.stop_asked());
  metrics.tensorboard(failing);
  EXPECT_EQ(calls, 1) << "the closed writer is not called again";
}
