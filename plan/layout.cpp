// layout.cpp: layouts applied to a config through the real config rules, and the trainer's own refusals.
#include "plan/layout.h"

#include <fmt/format.h>

#include <memory>
#include <string>

#include "models/pipeline_schedule.h"
#include "parallel/pipeline/schedule.h"

namespace mt::plan {

Layout layout_of(const Config& c) {
  return Layout{.tensor = c.parallel.tensor,
                .pipeline = c.parallel.pipeline,
                .virtual_pipeline = c.parallel.virtual_pipeline,
                .data = c.parallel.data,
                .micro_batch_size = c.training.micro_batch_size,
                .sequence_parallel = c.parallel.sequence_parallel,
                .recompute = c.training.recompute,
                .shard = c.parallel.shard,
                .shard_group = c.parallel.shard_group,
                .expert = c.parallel.expert,
                .expert_tensor = c.parallel.experts_tensor() == c.parallel.tensor ? 0 : c.parallel.expert_tensor,
                .context = c.parallel.context,
                .context_allgather = c.parallel.context_comm == ContextComm::allgather};
}

namespace {

const char* zero_word(ShardStage s) {
  return s == ShardStage::none        ? "off"
         : s == ShardStage::optimizer ? "on"
         : s == ShardStage::gradients ? "grads"
                                      : "params";
}

// The base config's document, parsed once for as long as the same base comes back (a search applies thousands of
// layouts to one base; parsing its YAML text was most of the search's time).
const ConfigDocument& document_of(const Config& base) {
  thread_local std::string text, source;
  thread_local std::unique_ptr<ConfigDocument> document;
  std::string now = to_yaml(base);
  if (!document || now != text || base.source != source) {
    document = std::make_unique<ConfigDocument>(now, base.source);
    text = std::move(now);
    source = base.source;
  }
  return *document;
}

}  // namespace

std::string describe(const Layout& l) {
  return fmt::format(
      "TP {} PP {} VP {} DP {} mbs {} SP {} recompute {} ZeRO {}{}{}{}{}", l.tensor, l.pipeline, l.virtual_pipeline,
      l.data, l.micro_batch_size, l.sequence_parallel ? "on" : "off", name_of(l.recompute), zero_word(l.shard),
      l.shard_group > 0 && l.shard_group < l.data ? fmt::format(" shard group {}", l.shard_group) : "",
      l.expert > 1 ? fmt::format(" EP {}", l.expert) : "",
      l.expert_tensor > 0 && l.expert_tensor != l.tensor ? fmt::format(" ETP {}", l.expert_tensor) : "",
      l.context > 1 ? fmt::format(" CP {} {}", l.context, l.context_allgather ? "allgather" : "p2p") : "");
}

Config apply_layout(const Config& base, const Layout& l) {
  std::vector<std::string> sets = {
      fmt::format("parallel.tensor={}", l.tensor),
      fmt::format("parallel.pipeline={}", l.pipeline),
      fmt::format("parallel.virtual_pipeline={}", l.virtual_pipeline),
      fmt::format("parallel.data={}", l.data),
      fmt::format("parallel.context={}", l.context),
      fmt::format("parallel.context_comm={}", l.context_allgather ? "allgather" : "p2p"),
      fmt::format("parallel.sequence_parallel={}", l.sequence_parallel ? "true" : "false"),
      "parallel.distributed_optimizer=false",
      fmt::format("parallel.shard={}", name_of(l.shard)),
      fmt::format("parallel.shard_group={}", l.shard_group),
      fmt::format("training.micro_batch_size={}", l.micro_batch_size),
      fmt::format("training.recompute={}", name_of(l.recompute)),
  };
  // Full recomputation keeps the base config's method and layers (block or uniform groups); without it they mean
  // nothing and are refused, so they go.
  if (l.recompute != Recompute::full) {
    sets.push_back("training.recompute_num_layers=0");
    sets.push_back("training.recompute_method=block");
  }
  // Selective recomputation keeps the base config's modules, or (searching) drops every module it can.
  if (l.recompute != Recompute::selective) {
    sets.push_back("training.recompute_modules=[]");
  } else if (base.training.recompute != Recompute::selective) {
    sets.push_back(base.model.moe.enabled() ? "training.recompute_modules=[core_attn, layernorm, mlp_act, moe_act]"
                                            : "training.recompute_modules=[core_attn, layernorm, mlp_act]");
  }
  // The expert layers' tensor-parallel degree (the dense layers' unless folded); the experts split over l.expert
  // ranks.
  if (base.model.moe.enabled()) {
    sets.push_back(fmt::format("parallel.expert_tensor={}", l.expert_tensor > 0 ? l.expert_tensor : l.tensor));
    sets.push_back(fmt::format("parallel.expert={}", l.expert));
  }
  // An uneven split written for the base layout does not carry over to another number of stages.
  if (l.pipeline != base.parallel.pipeline || l.virtual_pipeline != base.parallel.virtual_pipeline)
    sets.push_back("parallel.layers_per_stage=[]");
  return document_of(base).parse(sets, l.tensor * l.context * l.pipeline * l.data);
}

std::string runtime_refusal(const Config& c) {
  if (c.parallel.pipeline == 1 && c.parallel.virtual_pipeline == 1) return "";
  const ScheduleSpec spec = training_schedule(c, c.training.num_microbatches);
  try {
    (void)build_schedule(spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace mt::plan
