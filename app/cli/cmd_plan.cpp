// cmd_plan.cpp: megatrain plan: the predicted peak memory per rank kind and the step time of a config's layout
// on a device (built-in tables or a rates file from `megatrain bench kernels`), or with --search the layouts
// that fit, fastest first. Nothing is allocated and no rank is started.
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "app/cli/commands.h"
#include "core/config/config.h"
#include "plan/report.h"

namespace mt::app {

namespace {

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  int64_t world = 0;         // 0: what the config's layout needs (parallel.data: auto counts as 1)
  std::string gpu = "auto";  // auto: cpu when training.device is cpu, else h100-80gb
  std::string rates;         // a rates file (bench kernels); its values replace the device table's
  bool search = false;
  size_t top = 10;
  bool json = false;
  double moe_imbalance = 0;  // 0: not given
};

plan::Hardware hardware(const PlanArgs& a, const Config& c) {
  std::string name = a.gpu;
  if (name == "auto") name = c.training.device == DeviceChoice::cpu ? "cpu" : "h100-80gb";
  plan::Hardware hw = plan::builtin_hardware(name);
  if (!a.rates.empty()) hw = plan::read_rates(a.rates, hw);
  return hw;
}

void run_plan(const PlanArgs& a) {
  bool data_auto = false;
  // The config's own layout (tensor * pipeline * data, auto as 1); a bad value is named by load_config below.
  const int64_t own_world = std::max<int64_t>(1, layout_world_size(a.config, a.overrides, &data_auto));
  const int64_t world = a.world > 0 ? a.world : own_world;
  // A search replaces the layout, so the config is read at its own (--world 4 searches 4 ranks for a config whose
  // layout needs 8); a prediction is of the layout on --world ranks.
  Config cfg = load_config(a.config, a.overrides, a.search ? own_world : world);
  cfg.model.moe.plan_imbalance = a.moe_imbalance;
  const plan::Hardware hw = hardware(a, cfg);
  // Say so: data: auto plans a single data-parallel replica (no ZeRO sharding) unless --world names the ranks.
  if (data_auto && a.world == 0 && !a.search && !a.json)
    fmt::print("note: parallel.data: auto planned as DP 1 on {} ranks; --world N plans N ranks\n", world);
  // The built-in CPU table is a placeholder (CPUs differ too much for one): say how to get real figures.
  if (!hw.is_gpu && a.rates.empty() && !a.json)
    fmt::print(
        "note: the built-in cpu rates are placeholders that only order layouts; `megatrain bench kernels -o "
        "rates.yaml` measures this machine (then --rates rates.yaml; within 12% on bench/plan_time.sh's runs)\n");
  if (a.search) {
    const std::vector<plan::Prediction> ranked = plan::search(cfg, world, hw);
    if (a.json) {
      fmt::print("{}", plan::search_json(ranked, hw, a.top));
    } else {
      fmt::print("search: {} on {} x {}, global batch {}\n", cfg.source, world, hw.name,
                 cfg.training.global_batch_size);
      fmt::print("{}", plan::format_search(ranked, hw, a.top));
      if (!ranked.empty()) fmt::print("\nthe fastest in detail:\n{}", plan::format_prediction(ranked.front(), hw));
    }
    if (ranked.empty())
      throw std::runtime_error(fmt::format("no layout of {} fits {} x {}", cfg.source, world, hw.name));
    return;
  }
  const plan::Prediction p = plan::predict(cfg, hw);
  fmt::print("{}", a.json ? plan::prediction_json(p, hw) : plan::format_prediction(p, hw));
}

}  // namespace

void add_plan_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("plan", "Predict peak memory and step time of a layout, or search for the fastest");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("-c,--config", a->config, "YAML run configuration")->required()->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "override a config key: --set parallel.tensor=4 (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  cmd->add_option("--world", a->world, "number of ranks (default: what the config's layout needs)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--gpu", a->gpu,
                  fmt::format("device: {} (default: cpu for training.device: cpu, else h100-80gb)",
                              fmt::join(plan::builtin_hardware_names(), ", ")));
  cmd->add_option("--rates", a->rates, "rates file written by `megatrain bench kernels`")->check(CLI::ExistingFile);
  cmd->add_flag("--search", a->search, "enumerate the layouts that fit, fastest first");
  cmd->add_option("--top", a->top, "with --search: how many to list (default 10)");
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->add_option("--moe-imbalance", a->moe_imbalance,
                  "expert parallelism: the most rows a rank's experts received over the balanced share, as a run's "
                  "metrics.jsonl reports it (moe_peak_received); default: model.moe.capacity_factor, else the "
                  "worst dropless routing")
      ->check(CLI::Range(1.0, 1e6));
  cmd->callback([a] { run_plan(*a); });
}

}  // namespace mt::app
