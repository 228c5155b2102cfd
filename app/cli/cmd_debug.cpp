// cmd_debug.cpp: megatrain debug hang RUN_DIR: reads the flight records the ranks of a failed or hung run dumped
// (RUN_DIR/flight_recorder/rank_*.json, parallel/comm/flight_recorder.h) and names the rank(s) that never reached a
// collective the others waited in, and what each rank was doing.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/cli/commands.h"
#include "core/io/file_error.h"
#include "parallel/comm/flight_recorder.h"

namespace mt::app {

namespace fs = std::filesystem;

void add_debug_commands(CLI::App& root) {
  auto* debug = root.add_subcommand("debug", "Diagnose a failed or hung run from what its ranks left");
  debug->require_subcommand(1);
  auto* hang = debug->add_subcommand(
      "hang", "Name the rank(s) that never reached a collective the others waited in, from the flight records");
  auto run_dir = std::make_shared<std::string>();
  hang->add_option("run_dir", *run_dir, "the run's logging.dir")->required();
  hang->callback([run_dir] {
    const fs::path dir = fs::path(*run_dir) / "flight_recorder";
    std::vector<std::string> paths;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".json") paths.push_back(e.path().string());
    if (ec || paths.empty())
      throw FileError(
          fmt::format("{}: no flight records ({}): a rank writes its own when it fails (a collective "
                      "timed out, a peer went away); a run that has not failed yet has none",
                      dir.string(), ec ? ec.message() : "the directory holds no rank_*.json"));
    std::sort(paths.begin(), paths.end());
    std::vector<FlightDump> dumps;
    for (const std::string& p : paths) dumps.push_back(read_flight_dump(p));
    const HangReport report = analyse_flight_dumps(dumps);
    for (const std::string& line : report.lines) fmt::print("{}\n", line);
  });
}

}  // namespace mt::app
