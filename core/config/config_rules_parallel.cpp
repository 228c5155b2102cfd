// config_rules_parallel.cpp: the rules of parallel.* (the layout, context parallelism, sharding) and of model.moe
// with expert parallelism.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/config/config_rules_detail.h"
#include "core/tensor/ops.h"  // kMaxRouterExperts

namespace mt::config_rules {
namespace {

// "1, 2, 4, 8": the divisors of n > 0, for a message that lists the valid values.
std::string divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return fmt::format("{}", fmt::join(low, ", "));
}

// parallel.context: the sequence of every sample is cut into 2 * context chunks (then, with sequence parallelism,
// each rank's part into tensor shards); what the ring cannot split yet is refused by name. Dropout (hidden,
// attention and LoRA) works: its masks are keyed by the chunks' global positions, so they are one rank's; so do MoE
// capacity drops, decided over the whole microbatch (models/moe_mlp.h).
void resolve_context(Config& c, const Rules& r) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  r.positive("parallel.context", p.context);
  r.at_most("parallel.context", p.context, kMaxParallel, "context-parallel size");
  if (p.context == 1) return;
  if (m.seq_length % (2 * p.context) != 0)
    r.fail("parallel.context", fmt::format("{} needs model.seq_length={} divisible by 2 x parallel.context = {} (each "
                                           "sample is cut into 2 x context chunks)",
                                           p.context, m.seq_length, 2 * p.context));
  else if (p.sequence_parallel && (m.seq_length / p.context) % p.tensor != 0)
    r.fail("parallel.sequence_parallel",
           fmt::format("needs each context rank's model.seq_length / parallel.context = {} / {} = {} tokens divisible "
                       "by parallel.tensor={}",
                       m.seq_length, p.context, m.seq_length / p.context, p.tensor));
}

// parallel.shard_group (hybrid sharding, parallel/sharding/hybrid_shard.h): a divisor of the data-parallel size, for a stage
// that shards; what it cannot serve yet is refused by name. Run after parallel.data and parallel.shard are resolved.
void resolve_shard_group(const Config& c, const Rules& r) {
  const ParallelConfig& p = c.parallel;
  r.non_negative("parallel.shard_group", p.shard_group);
  if (p.shard_group <= 0) return;
  if (p.shard == ShardStage::none)
    r.fail("parallel.shard_group",
           fmt::format("{} needs a stage that shards (parallel.shard: optimizer, gradients or parameters), got "
                       "parallel.shard: none",
                       p.shard_group));
  if (p.data % p.shard_group != 0)
    r.fail("parallel.shard_group",
           fmt::format("{} does not divide parallel.data={} (the shard groups split the data-parallel ranks)",
                       p.shard_group, p.data));
  if (p.shard_group >= p.data) return;  // the whole group: plain sharding
  // With context parallelism a shard group is shard_group data ranks with all their context ranks. The experts (when
  // apart) shard over the expert-data-parallel ranks inside one dense shard group: the tensor x shard_group x context
  // ranks of a group must hold whole expert-parallel groups, or each expert group must span whole shard groups.
  const bool experts_apart = p.expert > 1 || p.experts_tensor() != p.tensor;
  const int64_t group_ranks = p.tensor * p.shard_group * p.context, fold = p.expert * p.experts_tensor();
  if (c.model.moe.enabled() && experts_apart && group_ranks % fold != 0 && fold % group_ranks != 0)
    r.fail("parallel.shard_group",
           fmt::format("{} makes shard groups of parallel.tensor x shard_group x context = {} ranks, which neither "
                       "hold whole expert-parallel groups of parallel.expert x expert_tensor = {} ranks nor are "
                       "split evenly by them: the experts' shards would straddle the groups (use a shard group "
                       "that {} divides, or one that divides it)",
                       p.shard_group, group_ranks, fold, fold));
}

}  // namespace

void resolve_parallel(Config& c, int64_t world_size, const Rules& r) {
  ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  r.positive("parallel.tensor", p.tensor);
  r.positive("parallel.pipeline", p.pipeline);
  r.positive("parallel.virtual_pipeline", p.virtual_pipeline);
  r.non_negative("parallel.data", p.data);
  r.at_most("parallel.tensor", p.tensor, kMaxParallel, "tensor-parallel size");
  r.at_most("parallel.pipeline", p.pipeline, kMaxParallel, "pipeline-parallel size");
  r.at_most("parallel.virtual_pipeline", p.virtual_pipeline, kMaxParallel, "number of virtual stages");
  r.at_most("parallel.data", p.data, kMaxParallel, "data-parallel size");
  if (world_size < 1) r.fail("parallel", fmt::format("the world size must be positive, got {}", world_size));

  if (m.num_heads % p.tensor != 0)
    r.fail("parallel.tensor", fmt::format("{} does not divide model.num_heads={}", p.tensor, m.num_heads));
  if (m.kv_heads() % p.tensor != 0)
    r.fail("parallel.tensor",
           fmt::format("{} does not divide model.num_query_groups={}: tensor parallelism splits the key/value heads "
                       "(use a tensor-parallel size that divides {})",
                       p.tensor, m.kv_heads(), m.kv_heads()));
  if (m.ffn_hidden_size % p.tensor != 0)
    r.fail("parallel.tensor", fmt::format("{} does not divide model.ffn_hidden_size={}", p.tensor, m.ffn_hidden_size));
  if (p.sequence_parallel && p.tensor == 1)
    r.fail("parallel.sequence_parallel",
           "needs parallel.tensor > 1 (sequence parallelism splits the tensor-parallel "
           "group's activations), got parallel.tensor=1");
  if (p.sequence_parallel && m.seq_length % p.tensor != 0)
    r.fail("parallel.sequence_parallel",
           fmt::format("needs model.seq_length={} divisible by parallel.tensor={}", m.seq_length, p.tensor));

  resolve_context(c, r);

  // Context parallelism multiplies the ranks one data-parallel replica needs; without it the messages are as before.
  const int64_t model_parallel = p.tensor * p.context * p.pipeline;
  const std::string mp_names = p.context > 1 ? "parallel.tensor*context*pipeline" : "parallel.tensor*pipeline";
  const std::string mp_sizes = p.context > 1 ? fmt::format("{}*{}*{}", p.tensor, p.context, p.pipeline)
                                             : fmt::format("{}*{}", p.tensor, p.pipeline);
  if (p.data == 0) {  // auto
    if (world_size % model_parallel != 0)
      r.fail("parallel.data", fmt::format("auto needs the world size {} divisible by {} = {} = {}", world_size,
                                          mp_names, mp_sizes, model_parallel));
    p.data = world_size / model_parallel;
  } else if (model_parallel * p.data != world_size) {
    r.fail("parallel.data", fmt::format("{}*data = {}*{} = {} does not match the world size {}", mp_names, mp_sizes,
                                        p.data, model_parallel * p.data, world_size));
  }
  p.world_size = world_size;
  r.positive("parallel.timeout_s", p.timeout_s);
  r.at_most("parallel.timeout_s", p.timeout_s, kMaxTimeoutS, "timeout in seconds");
  r.positive("parallel.grad_bucket_size", p.grad_bucket_size);
  r.at_most("parallel.grad_bucket_size", p.grad_bucket_size, kMaxCount, "bucket size");
  // The alias: distributed_optimizer: true is shard: optimizer (none becomes optimizer; a higher stage is refused
  // rather than guessed at).
  if (p.distributed_optimizer && p.shard > ShardStage::optimizer)
    r.fail("parallel.distributed_optimizer",
           fmt::format("true (the alias of parallel.shard: optimizer) conflicts with parallel.shard: {}; give only "
                       "parallel.shard",
                       name_of(p.shard)));
  if (p.distributed_optimizer) p.shard = ShardStage::optimizer;
  resolve_shard_group(c, r);

  if (p.pipeline > m.num_layers)
    r.fail("parallel.pipeline", fmt::format("{} is more than model.num_layers={}", p.pipeline, m.num_layers));
  if (p.virtual_pipeline > 1 && p.pipeline == 1)
    r.fail("parallel.virtual_pipeline",
           fmt::format("{} needs parallel.pipeline > 1 (interleaving splits pipeline stages)", p.virtual_pipeline));
  switch (p.pipeline_schedule) {
    case PipelineSchedule::automatic:
      break;
    case PipelineSchedule::one_f_one_b:
      if (p.virtual_pipeline > 1)
        r.fail("parallel.pipeline_schedule", fmt::format("1f1b runs one model chunk per stage, but "
                                                         "parallel.virtual_pipeline={}: use interleaved (or auto)",
                                                         p.virtual_pipeline));
      break;
    case PipelineSchedule::interleaved:
      if (p.virtual_pipeline == 1)
        r.fail("parallel.pipeline_schedule",
               "interleaved needs parallel.virtual_pipeline > 1 (model chunks per stage to interleave)");
      break;
    case PipelineSchedule::zb_h1:
      if (p.pipeline == 1)
        r.fail("parallel.pipeline_schedule", "zb-h1 needs parallel.pipeline > 1 (a pipeline to fill the bubbles of)");
      if (p.virtual_pipeline > 1)
        r.fail(
            "parallel.pipeline_schedule",
            fmt::format("zb-h1 runs one model chunk per stage, but parallel.virtual_pipeline={}", p.virtual_pipeline));
      break;
    case PipelineSchedule::zb_v:
      if (p.pipeline == 1)
        r.fail("parallel.pipeline_schedule", "zb-v needs parallel.pipeline > 1 (a pipeline to fill the bubbles of)");
      if (p.virtual_pipeline != 2)
        r.fail("parallel.pipeline_schedule",
               fmt::format("zb-v places two model chunks per stage in a V: set parallel.virtual_pipeline=2 (it is {})",
                           p.virtual_pipeline));
      break;
  }
  const int64_t chunks = p.pipeline * p.virtual_pipeline;
  if (!p.layers_per_stage.empty()) {
    if (static_cast<int64_t>(p.layers_per_stage.size()) != chunks)
      r.fail("parallel.layers_per_stage",
             fmt::format("has {} entries, expected parallel.pipeline*virtual_pipeline = {}*{} = {}",
                         p.layers_per_stage.size(), p.pipeline, p.virtual_pipeline, chunks));
    for (size_t i = 0; i < p.layers_per_stage.size(); ++i)
      r.non_negative(fmt::format("parallel.layers_per_stage[{}]", i), p.layers_per_stage[i]);
    const int64_t sum = std::accumulate(p.layers_per_stage.begin(), p.layers_per_stage.end(), int64_t{0});
    if (sum != m.num_layers)
      r.fail("parallel.layers_per_stage", fmt::format("[{}] sums to {}, expected model.num_layers={}",
                                                      fmt::join(p.layers_per_stage, ", "), sum, m.num_layers));
  } else if (m.num_layers % chunks != 0) {
    r.fail("model.num_layers", fmt::format("{} is not divisible by parallel.pipeline*virtual_pipeline = {}*{} = {} "
                                           "(give parallel.layers_per_stage for an uneven split)",
                                           m.num_layers, p.pipeline, p.virtual_pipeline, chunks));
  }
}

// model.moe and expert parallelism. A dense model (num_experts 0) takes no other MoE key (the reader refuses
// them), nor expert parallelism.
void resolve_moe(Config& c, const Rules& r) {
  MoeConfig& e = c.model.moe;
  ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  r.non_negative("model.moe.num_experts", e.num_experts);
  r.at_most("model.moe.num_experts", e.num_experts, kMaxRouterExperts,
            "number of experts (the router keeps a token's scores of every expert in fast memory)");
  if (!e.enabled()) {  // the other MoE keys are refused when set (config_keys.h: Key::inert)
    if (p.expert != 1)
      r.fail("parallel.expert",
             fmt::format("{} needs mixture-of-experts layers (model.moe.num_experts is 0)", p.expert));
    if (p.expert_tensor != 0)
      r.fail("parallel.expert_tensor", "needs mixture-of-experts layers (model.moe.num_experts is 0)");
    return;
  }
  r.positive("model.moe.top_k", e.top_k);
  if (e.top_k > e.num_experts)
    r.fail("model.moe.top_k",
           fmt::format("{} is more than model.moe.num_experts={} (each token picks top_k distinct experts)", e.top_k,
                       e.num_experts));
  r.positive("model.moe.layer_freq", e.layer_freq);
  if (e.layer_pattern.empty()) {
    if (e.layer_freq > m.num_layers)
      r.fail("model.moe.layer_freq", fmt::format("{} is more than model.num_layers={} (every layer_freq-th layer is "
                                                 "MoE, from layer 0)",
                                                 e.layer_freq, m.num_layers));
  } else {
    // (layer_freq 1 beside a pattern is what a written config holds: the default, which the pattern overrides.)
    if (r.given("model.moe.layer_freq") && e.layer_freq != 1)
      r.fail("model.moe.layer_pattern", "and model.moe.layer_freq are both set: give one of them");
    if (static_cast<int64_t>(e.layer_pattern.size()) != m.num_layers)
      r.fail("model.moe.layer_pattern", fmt::format("has {} entries, expected one 0/1 per layer (model.num_layers={})",
                                                    e.layer_pattern.size(), m.num_layers));
    for (size_t i = 0; i < e.layer_pattern.size(); ++i)
      if (e.layer_pattern[i] != 0 && e.layer_pattern[i] != 1)
        r.fail(fmt::format("model.moe.layer_pattern[{}]", i),
               fmt::format("expected 0 (dense) or 1 (MoE), got {}", e.layer_pattern[i]));
    if (std::find(e.layer_pattern.begin(), e.layer_pattern.end(), 1) == e.layer_pattern.end())
      r.fail("model.moe.layer_pattern", "has no 1: no layer would be MoE (leave model.moe out for a dense model)");
  }
  if (e.ffn_hidden_size == 0) e.ffn_hidden_size = m.ffn_hidden_size;
  r.positive("model.moe.ffn_hidden_size", e.ffn_hidden_size);
  r.at_most("model.moe.ffn_hidden_size", e.ffn_hidden_size, 4 * kMaxWidth, "feed-forward width");
  r.non_negative("model.moe.shared_expert_ffn_hidden_size", e.shared_expert_ffn_hidden_size);
  r.at_most("model.moe.shared_expert_ffn_hidden_size", e.shared_expert_ffn_hidden_size, 4 * kMaxWidth,
            "feed-forward width");
  for (const auto& [key, v] : {std::pair{"aux_loss_coeff", e.aux_loss_coeff}, std::pair{"z_loss_coeff", e.z_loss_coeff},
                               std::pair{"bias_update_rate", e.bias_update_rate}}) {
    const std::string path = fmt::format("model.moe.{}", key);
    r.finite(path, v);
    r.non_negative(path, v);
  }
  r.finite("model.moe.capacity_factor", e.capacity_factor);
  if (e.capacity_factor < 0)
    r.fail(
        "model.moe.capacity_factor",
        fmt::format("must be positive, got {} (leave it out, or write none, for dropless routing)", e.capacity_factor));

  // Expert parallelism: each pipeline stage's tensor x data ranks are refolded into expert_tensor x expert x
  // expert-data ranks for the MoE layers.
  r.positive("parallel.expert", p.expert);
  r.at_most("parallel.expert", p.expert, kMaxParallel, "expert-parallel size");
  if (e.num_experts % p.expert != 0)
    r.fail("parallel.expert", fmt::format("{} does not divide model.moe.num_experts={} (each expert-parallel rank "
                                          "holds an equal share; valid: {})",
                                          p.expert, e.num_experts, divisors(e.num_experts)));
  if (p.expert_tensor == 0) p.expert_tensor = p.tensor;
  r.positive("parallel.expert_tensor", p.expert_tensor);
  r.at_most("parallel.expert_tensor", p.expert_tensor, kMaxParallel, "tensor-parallel size");
  if (p.tensor % p.expert_tensor != 0)
    r.fail("parallel.expert_tensor",
           fmt::format("{} does not divide parallel.tensor={} (the experts' tensor-parallel ranks are a part of each "
                       "tensor-parallel group: Megatron's parallel folding)",
                       p.expert_tensor, p.tensor));
  // With context parallelism the experts' grid folds the context ranks in (parallel/comm/topology.h).
  const int64_t stage_ranks = p.tensor * p.context * p.data;
  if (p.expert_tensor == p.tensor && (p.context * p.data) % p.expert != 0)
    r.fail("parallel.expert",
           p.context == 1 ? fmt::format("{} does not divide parallel.data={} (expert-parallel ranks are drawn from the "
                                        "data-parallel ranks)",
                                        p.expert, p.data)
                          : fmt::format("{} does not divide parallel.data x parallel.context = {} x {} = {} "
                                        "(expert-parallel ranks are drawn from the context and data-parallel ranks)",
                                        p.expert, p.data, p.context, p.data * p.context));
  else if (stage_ranks % (p.expert * p.expert_tensor) != 0)
    r.fail("parallel.expert",
           fmt::format("parallel.expert*expert_tensor = {}*{} = {} does not divide "
                       "parallel.tensor*{}data = {}*{}{} = {} (the expert layers' ranks are drawn "
                       "from each pipeline stage's tensor{} and data ranks)",
                       p.expert, p.expert_tensor, p.expert * p.expert_tensor, p.context == 1 ? "" : "context*",
                       p.tensor, p.context == 1 ? "" : fmt::format("{}*", p.context), p.data, stage_ranks,
                       p.context == 1 ? "" : ", context"));
  if (e.ffn_hidden_size % p.expert_tensor != 0)
    r.fail("parallel.expert_tensor",
           fmt::format("{} does not divide model.moe.ffn_hidden_size={}", p.expert_tensor, e.ffn_hidden_size));
  if (e.shared_expert_ffn_hidden_size % p.tensor != 0)
    r.fail("parallel.tensor", fmt::format("{} does not divide model.moe.shared_expert_ffn_hidden_size={}", p.tensor,
                                          e.shared_expert_ffn_hidden_size));
}

}  // namespace mt::config_rules
