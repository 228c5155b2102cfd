// report.cpp: the planner's text tables and JSON.
#include "plan/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan/model_shapes.h"

namespace mt::plan {

namespace {

constexpr double kMiB = 1048576.0;

// A parameter count as people say it: 46.7B, 124.4M.
std::string count_words(double n) {
  if (n >= 1e9) return fmt::format("{:.1f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  return fmt::format("{:.0f}", n);
}

// The layout as describe() says it, with " offload" when the optimizer state is on the host.
std::string layout_words(const Prediction& p) {
  return describe(p.layout) + (p.config.optimizer.offload ? " offload" : "");
}

nlohmann::json layout_json(const Layout& l) {
  return {{"tensor", l.tensor},
          {"pipeline", l.pipeline},
          {"virtual_pipeline", l.virtual_pipeline},
          {"data", l.data},
          {"micro_batch_size", l.micro_batch_size},
          {"sequence_parallel", l.sequence_parallel},
          {"recompute", std::string(name_of(l.recompute))},
          {"distributed_optimizer", l.shard >= ShardStage::optimizer},
          {"shard", std::string(name_of(l.shard))},
          {"shard_group", l.shard_group},
          {"expert", l.expert},
          {"expert_tensor", l.expert_tensor > 0 ? l.expert_tensor : l.tensor}};
}

nlohmann::json to_json(const Prediction& p, const Hardware& hw) {
  nlohmann::json j;
  j["layout"] = layout_json(p.layout);
  j["arch"] = std::string(name_of(p.config.model.arch));
  j["parameters"] = model_parameters(p.config.model, false);
  j["active_parameters"] = model_parameters(p.config.model, true);
  j["world_size"] = p.config.parallel.world_size;
  j["num_microbatches"] = p.config.training.num_microbatches;
  j["device"] = hw.name;
  j["memory_bytes_available"] = hw.memory_bytes;
  j["fits"] = p.fits;
  j["offload"] = p.config.optimizer.offload;
  j["host_bytes"] = max_host_bytes(p.memory);
  if (p.config.model.moe.enabled()) {
    const MoeImbalance bound = moe_imbalance(p.config.model.moe, p.config.parallel.expert, p.config.parallel.context,
                                             p.config.parallel.tensor / p.config.parallel.experts_tensor());
    j["moe_imbalance"] = {{"factor", bound.factor}, {"source", bound.source}};
  }
  j["host_bytes_budget"] = p.config.optimizer.offload_host_memory_gib * kMiB * 1024;
  nlohmann::json ranks = nlohmann::json::array();
  for (const StageMemory& s : p.memory.stages) {
    nlohmann::json r{{"kind", s.kind},
                     {"stage", s.stage},
                     {"layers", s.layers},
                     {"parameters", s.parameters},
                     {"peak_in_flight", s.peak_in_flight},
                     {"transient_grad_bytes", s.transient_grad_bytes},
                     {"total_bytes", s.bytes.total}};
    for (size_t k = 0; k < KindBytes::kKinds; ++k)
      r["peak_bytes"][std::string(mem_kind_name(static_cast<MemKind>(k)))] = s.bytes.peak[k];
    ranks.push_back(r);
  }
  j["memory"] = ranks;
  const StepTime& t = p.time;
  j["time_s"] = {{"compute", t.compute},         {"gemm", t.gemm},           {"attention", t.attention},
                 {"elementwise", t.elementwise}, {"tp_comm", t.tp_comm},     {"ep_comm", t.ep_comm},
                 {"cp_comm", t.cp_comm},         {"pp_comm", t.pp_comm},     {"bubble", t.bubble},
                 {"dp_comm", t.dp_comm},         {"optimizer", t.optimizer}, {"total", t.total}};
  j["all_to_all_bytes_per_token"] = t.all_to_all_bytes_per_token;
  j["tokens_per_s"] = t.tokens_per_s;
  j["model_tflops_per_gpu"] = t.model_tflops_per_gpu;
  j["hardware_tflops_per_gpu"] = t.hardware_tflops_per_gpu;
  j["mfu"] = t.mfu;
  return j;
}

}  // namespace

std::string format_prediction(const Prediction& p, const Hardware& hw) {
  const Config& c = p.config;
  std::string s = fmt::format("layout: {} on {} x {} ({} microbatches per iteration per pipeline)\n", layout_words(p),
                              c.parallel.world_size, hw.name, c.training.num_microbatches);
  const std::string kv = c.model.kv_heads() != c.model.num_heads
                             ? fmt::format(" ({} key/value heads)", c.model.kv_heads())
                             : std::string();
  s += fmt::format("model: {} {:.3g} parameters, {} layers, hidden {}, {} heads{}, sequence {}, global batch {}, {}\n",
                   name_of(c.model.arch), model_parameters(c.model, false), c.model.num_layers, c.model.hidden_size,
                   c.model.num_heads, kv, c.model.seq_length, c.training.global_batch_size,
                   name_of(c.training.precision));
  if (const MoeConfig& e = c.model.moe; e.enabled()) {
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < c.model.num_layers; ++l) moe_layers += e.is_moe_layer(l) ? 1 : 0;
    const std::string shared = e.shared_expert_ffn_hidden_size > 0
                                   ? fmt::format(" and a shared expert of {}", e.shared_expert_ffn_hidden_size)
                                   : std::string();
    s += fmt::format(
        "mixture of experts: {} of {} layers, top {} of {} experts of width {}{}: {} parameters, {} active per "
        "token; expert parallelism {}{}\n",
        moe_layers, c.model.num_layers, e.top_k, e.num_experts, e.ffn_hidden_size, shared,
        count_words(model_parameters(c.model, false)), count_words(model_parameters(c.model, true)), c.parallel.expert,
        c.parallel.experts_tensor() != c.parallel.tensor
            ? fmt::format(", expert tensor parallelism {} (folded from tensor parallelism {})",
                          c.parallel.experts_tensor(), c.parallel.tensor)
            : std::string());
    if (c.parallel.expert > 1) {
      const MoeImbalance bound =
          moe_imbalance(e, c.parallel.expert, c.parallel.context, c.parallel.tensor / c.parallel.experts_tensor());
      s += fmt::format("expert routing planned at {:.2f}x the balanced rows on a rank's experts: {}\n", bound.factor,
                       bound.source);
    }
  }
  s += fmt::format(
      "\npredicted peak memory per rank (MiB, split as the training log's \"peak memory\"), device {:.0f} MiB\n",
      hw.memory_bytes / kMiB);
  s += fmt::format("  {:<7} {:>5} {:>6} {:>9} {:>12} {:>11} {:>11} {:>12} {:>11} {:>11}  {}\n", "rank", "stage",
                   "layers", "in flight", "parameters", "gradients", "optimizer", "activations", "workspace", "total",
                   "fits");
  for (const StageMemory& m : p.memory.stages) {
    const KindBytes& b = m.bytes;
    s += fmt::format("  {:<7} {:>5} {:>6} {:>9} {:>12.2f} {:>11.2f} {:>11.2f} {:>12.2f} {:>11.2f} {:>11.2f}  {}\n",
                     m.kind, m.stage, m.layers, m.peak_in_flight, b[MemKind::parameter] / kMiB,
                     b[MemKind::gradient] / kMiB, b[MemKind::optimizer] / kMiB, b[MemKind::activation] / kMiB,
                     b[MemKind::workspace] / kMiB, b.total / kMiB, b.total <= hw.memory_bytes ? "yes" : "NO");
  }
  if (c.optimizer.offload) {
    const double budget = c.optimizer.offload_host_memory_gib;
    s += fmt::format("  host (optimizer.offload: masters, moments, staging): {:.2f} MiB per rank, {}\n",
                     max_host_bytes(p.memory) / kMiB,
                     budget > 0 ? fmt::format("budget {:.0f} MiB (optimizer.offload_host_memory_gib): {}",
                                              budget * 1024, host_fits(c, p.memory) ? "fits" : "does NOT fit")
                                : std::string("no budget set (optimizer.offload_host_memory_gib)"));
  }
  const StepTime& t = p.time;
  auto ms = [](double sec) { return sec * 1e3; };
  s += "\npredicted time per iteration (ms, slowest pipeline stage)\n";
  s += fmt::format("  compute {:.1f} (GEMM {:.1f}, attention {:.1f}, elementwise {:.1f})\n", ms(t.compute), ms(t.gemm),
                   ms(t.attention), ms(t.elementwise));
  s += fmt::format(
      "  tensor-parallel comm {:.1f} | pipeline comm {:.1f} | pipeline bubble {:.1f} | data-parallel "
      "comm {:.1f} | optimizer {:.1f}\n",
      ms(t.tp_comm), ms(t.pp_comm), ms(t.bubble), ms(t.dp_comm), ms(t.optimizer));
  if (c.parallel.context > 1)
    s += fmt::format("  context-parallel comm {:.1f} (CP {}, {})\n", ms(t.cp_comm), c.parallel.context,
                     name_of(c.parallel.context_comm));
  if (c.model.moe.enabled())
    s += fmt::format("  expert-parallel all-to-all {:.1f} ({:.0f} bytes per token and MoE layer a step; EP {})\n",
                     ms(t.ep_comm), t.all_to_all_bytes_per_token, c.parallel.expert);
  s += fmt::format(
      "  total {:.1f} ms | tokens/s {:.0f} | TFLOP/s/GPU {:.1f} (with recomputation {:.1f}) | MFU {:.1f}%\n",
      ms(t.total), t.tokens_per_s, t.model_tflops_per_gpu, t.hardware_tflops_per_gpu, 100 * t.mfu);
  return s;
}

std::string format_search(const std::vector<Prediction>& ranked, const Hardware& hw, size_t top) {
  std::string s = fmt::format("{} layouts fit; the fastest {}:\n", ranked.size(), std::min(top, ranked.size()));
  s += fmt::format("  {:>3}  {:<60} {:>10} {:>12} {:>8} {:>6} {:>12}\n", "#", "layout", "ms/iter", "tokens/s",
                   "TFLOP/s", "MFU", "memory MiB");
  for (size_t i = 0; i < ranked.size() && i < top; ++i) {
    const Prediction& p = ranked[i];
    s += fmt::format("  {:>3}  {:<60} {:>10.1f} {:>12.0f} {:>8.1f} {:>5.1f}% {:>12.0f}\n", i + 1, layout_words(p),
                     p.time.total * 1e3, p.time.tokens_per_s, p.time.model_tflops_per_gpu, 100 * p.time.mfu,
                     p.memory.max_total() / kMiB);
  }
  return s;
}

std::string prediction_json(const Prediction& p, const Hardware& hw) { return to_json(p, hw).dump(2) + "\n"; }

std::string search_json(const std::vector<Prediction>& ranked, const Hardware& hw, size_t top) {
  nlohmann::json j = nlohmann::json::array();
  for (size_t i = 0; i < ranked.size() && i < top; ++i) j.push_back(to_json(ranked[i], hw));
  return j.dump(2) + "\n";
}

}  // namespace mt::plan
