// config_rules.cpp: every rule a Config must satisfy, checked in section order, and its derived values.
#include "core/config/config_rules.h"

#include "core/tensor/ops.h"  // kMaxRouterExperts
#include "core/tensor/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt {
namespace {

constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxSequence = int64_t{1} << 24;
constexpr int64_t kMaxVocab = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxVocabMultiple = int64_t{1} << 20;
constexpr int64_t kMaxParallel = int64_t{1} << 20;  // ranks along one dimension
constexpr int64_t kMaxCount = int64_t{1} << 40;     // iterations, batch sizes, intervals
constexpr double kMaxTimeoutS = 1e7;                // about 115 days; times 1000 fits int64 milliseconds
// Bytes one tensor may hold (kMaxTensorBytes in core/tensor/tensor.h), as a double for products of config sizes.
constexpr double kMaxBytes = static_cast<double>(kMaxTensorBytes);

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

// Small checks that name the key and the value.
class Rules {
 public:
  explicit Rules(const ConfigSource& src) : src_(src) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const { src_.fail(path, what); }
  bool given(const std::string& path) const { return src_.given(path); }
  void positive(const std::string& path, int64_t v) const {
    if (v < 1) fail(path, fmt::format("must be positive, got {}", v));
  }
  void positive(const std::string& path, double v) const {
    if (!(v > 0)) fail(path, fmt::format("must be positive, got {}", v));
    finite(path, v);
  }
  void finite(const std::string& path, double v) const {
    if (!std::isfinite(v)) fail(path, fmt::format("must be a finite number, got {}", v));
  }
  // Upper bounds keep every size and product computed from the config far from int64 overflow.
  void at_most(const std::string& path, int64_t v, int64_t max, const char* why) const {
    if (v > max) fail(path, fmt::format("{} is more than the largest supported {} ({})", v, max, why));
  }
  void at_most(const std::string& path, double v, double max, const char* why) const {
    if (v > max) fail(path, fmt::format("{} is more than the largest supported {} ({})", v, max, why));
  }
  void non_negative(const std::string& path, int64_t v) const {
    if (v < 0) fail(path, fmt::format("must be >= 0, got {}", v));
  }
  void non_negative(const std::string& path, double v) const {
    if (!(v >= 0)) fail(path, fmt::format("must be >= 0, got {}", v));
    finite(path, v);
  }
  void probability(const std::string& path, double v) const {  // [0, 1)
    if (!(v >= 0 && v < 1)) fail(path, fmt::format("must be in [0, 1), got {}", v));
  }
  void one_of(const std::string& path, const std::string& v, std::initializer_list<const char*> allowed) const {
    for (const char* a : allowed)
      if (v == a) return;
    fail(path, fmt::format("expected one of {}, got '{}'", fmt::join(allowed, ", "), v));
  }

 private:
  const ConfigSource& src_;
};

void resolve_model(ModelConfig& m, const Rules& r) {
  r.positive("model.num_layers", m.num_layers);
  r.positive("model.hidden_size", m.hidden_size);
  r.positive("model.num_heads", m.num_heads);
  r.positive("model.seq_length", m.seq_length);
  r.positive("model.vocab_size", m.vocab_size);
  r.positive("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  // Generous bounds (far beyond any trained model) so that sizes multiply without overflow; the tensor
  // and parameter byte counts are checked below once the padded vocabulary is known.
  r.at_most("model.num_layers", m.num_layers, kMaxLayers, "number of layers");
  r.at_most("model.hidden_size", m.hidden_size, kMaxWidth, "width");
  r.at_most("model.num_heads", m.num_heads, kMaxWidth, "number of heads");
  r.at_most("model.seq_length", m.seq_length, kMaxSequence, "sequence length");
  r.at_most("model.vocab_size", m.vocab_size, kMaxVocab, "vocabulary: token ids are int32");
  r.at_most("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, kMaxVocabMultiple,
            "vocabulary padding multiple");
  if (m.hidden_size % m.num_heads != 0)
    r.fail("model.num_heads", fmt::format("{} does not divide model.hidden_size={}", m.num_heads, m.hidden_size));
  const bool llama = m.arch == Arch::llama;
  // Megatron's SwiGLU default keeps the MLP's parameters near 8h^2: 2/3 of 4h, rounded down to 64.
  if (m.ffn_hidden_size == 0)
    m.ffn_hidden_size = llama ? std::max<int64_t>(64, (8 * m.hidden_size / 3) / 64 * 64) : 4 * m.hidden_size;
  r.positive("model.ffn_hidden_size", m.ffn_hidden_size);
  r.at_most("model.ffn_hidden_size", m.ffn_hidden_size, 4 * kMaxWidth, "feed-forward width");
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  r.positive("model.max_position_embeddings", m.max_position_embeddings);
  r.at_most("model.max_position_embeddings", m.max_position_embeddings, kMaxSequence, "number of positions");
  if (m.max_position_embeddings < m.seq_length)
    r.fail("model.max_position_embeddings",
           fmt::format("{} is less than model.seq_length={}", m.max_position_embeddings, m.seq_length));
  r.probability("model.dropout", m.dropout);
  r.probability("model.attention_dropout", m.attention_dropout);
  r.positive("model.layernorm_eps", double{m.layernorm_eps});
  r.positive("model.init_std", double{m.init_std});
  m.head_dim = m.hidden_size / m.num_heads;

  // Grouped-query attention: num_query_groups key/value heads, each shared by num_heads / num_query_groups
  // query heads. auto stays 0 (ModelConfig::kv_heads() reads it as num_heads; to_yaml writes it as auto), so a
  // config written back follows a later change of num_heads.
  r.non_negative("model.num_query_groups", m.num_query_groups);
  const int64_t groups = m.kv_heads();
  if (m.num_heads % groups != 0)
    r.fail("model.num_query_groups", fmt::format("{} does not divide model.num_heads={}", groups, m.num_heads));
  if (!llama && groups != m.num_heads)
    r.fail(
        "model.num_query_groups",
        fmt::format("grouped-query attention ({} groups for {} heads) needs model.arch: llama", groups, m.num_heads));
  r.positive("model.rotary_base", m.rotary_base);
  r.at_most("model.rotary_base", m.rotary_base, std::numeric_limits<float>::max(),
            "float: the rotary embeddings compute in it");
  if (llama) {
    if (m.head_dim % 2 != 0)
      r.fail("model.num_heads", fmt::format("rotary embeddings rotate pairs: the head dimension hidden_size / "
                                            "num_heads = {} must be even",
                                            m.head_dim));
    // Llama unties the LM head from the embedding unless the file says otherwise.
    if (!r.given("model.tie_embeddings")) m.tie_embeddings = false;
  }
}

// parallel.context: the sequence of every sample is cut into 2 * context chunks (then, with sequence parallelism,
// each rank's part into tensor shards); what the ring cannot split yet is refused by name. Dropout (hidden,
// attention and LoRA) works: its masks are keyed by the chunks' global positions, so they are one rank's.
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
  if (m.moe.enabled() && m.moe.capacity_factor > 0)
    r.fail("model.moe.capacity_factor",
           fmt::format("{} with parallel.context={} is not built yet: which choices an expert drops depends on every "
                       "token of the microbatch, which the context ranks split (0, dropless, works)",
                       m.moe.capacity_factor, p.context));
}

// parallel.shard: parameters (ZeRO-3, parallel/sharded_parameters.h): each layer's weights are gathered around
// its forward and its backward; what that cannot serve yet is refused by name.
void resolve_shard_parameters(const Config& c, const Rules& r) {
  const ParallelConfig& p = c.parallel;
  if (p.shard != ShardStage::parameters) return;
  const auto refuse = [&](const char* key, const std::string& why) {
    r.fail(key, fmt::format("{} with parallel.shard: parameters is not built yet: {}", why,
                            "use parallel.shard: gradients (ZeRO-2) there"));
  };
  if (c.model.moe.enabled())
    refuse("model.moe",
           fmt::format("num_experts={} (the expert layers' own buffer and grid)", c.model.moe.num_experts));
  if (c.training.fp8.format != Fp8Format::none)
    refuse("training.fp8.format", "fp8 (its casts of the weights would outlive the gathered unit)");
  if (p.pipeline_schedule == PipelineSchedule::zb_h1 || p.pipeline_schedule == PipelineSchedule::zb_v)
    refuse("parallel.pipeline_schedule",
           fmt::format("{} (a deferred weight gradient needs its layer gathered again later)",
                       name_of(p.pipeline_schedule)));
  if (p.context > 1) refuse("parallel.context", fmt::format("{} (context parallelism)", p.context));
}

// parallel.shard_group (hybrid sharding, parallel/hybrid_shard.h): a divisor of the data-parallel size, for a stage that
// shards; what it cannot serve yet is refused by name. Run after parallel.data and parallel.shard are resolved.
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
  if (p.shard_group == p.data) return;  // the whole group: plain sharding
  const auto refuse = [&](const char* key, const std::string& why) {
    r.fail(key, fmt::format("{} with parallel.shard_group={} (below parallel.data={}) is not built yet", why,
                            p.shard_group, p.data));
  };
  if (p.context > 1) refuse("parallel.context", fmt::format("{} (context parallelism)", p.context));
  if (c.model.moe.enabled() && (p.expert > 1 || (p.expert_tensor != 0 && p.expert_tensor != p.tensor)))
    refuse("parallel.expert", fmt::format("{} (the experts' own gradient buffer and grid)", p.expert));
}

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
  resolve_shard_parameters(c, r);
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
  // With context parallelism the experts' grid folds the context ranks in (parallel/topology.h).
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

void resolve_training(Config& c, const Rules& r) {
  TrainingConfig& t = c.training;
  const int64_t dp = c.parallel.data;
  if (t.recompute != Recompute::selective && !t.recompute_modules.empty())
    r.fail(
        "training.recompute_modules",
        fmt::format("is set, but training.recompute is {}: set training.recompute: selective", name_of(t.recompute)));
  if (t.recompute == Recompute::selective && t.recompute_modules.empty()) t.recompute_modules = {"core_attn"};
  r.non_negative("training.recompute_num_layers", t.recompute_num_layers);
  if (t.recompute_num_layers > c.model.num_layers)
    r.fail("training.recompute_num_layers",
           fmt::format("{} is more than model.num_layers={} (it counts the layers of each model chunk that recompute)",
                       t.recompute_num_layers, c.model.num_layers));
  if (t.recompute_num_layers > 0 && t.recompute != Recompute::full)
    r.fail("training.recompute_num_layers",
           fmt::format("{} is set, but training.recompute is {}: it chooses the layers of full recomputation",
                       t.recompute_num_layers, name_of(t.recompute)));
  if (t.recompute_method == "uniform")
    r.fail("training.recompute_method",
           "uniform is not implemented yet (use block: the first recompute_num_layers layers of each model chunk)");
  r.one_of("training.recompute_method", t.recompute_method, {"block"});
  for (size_t i = 0; i < t.recompute_modules.size(); ++i) {
    const std::string& name = t.recompute_modules[i];
    const std::string key = fmt::format("training.recompute_modules[{}]", i);
    r.one_of(key, name, {"core_attn", "layernorm", "mlp_act", "moe_act"});
    if (name == "moe_act" && !c.model.moe.enabled())
      r.fail(key, "moe_act needs mixture-of-experts layers (model.moe.num_experts is 0)");
    for (size_t j = 0; j < i; ++j)
      if (t.recompute_modules[j] == name) r.fail(key, fmt::format("{} is listed twice", name));
  }
  r.positive("training.micro_batch_size", t.micro_batch_size);
  r.non_negative("training.global_batch_size", t.global_batch_size);
  r.at_most("training.micro_batch_size", t.micro_batch_size, kMaxCount, "batch size");
  r.at_most("training.global_batch_size", t.global_batch_size, kMaxCount, "batch size");
  if (t.global_batch_size == 0) t.global_batch_size = t.micro_batch_size * dp;
  if (t.global_batch_size % (t.micro_batch_size * dp) != 0)
    r.fail("training.global_batch_size",
           fmt::format("{} is not divisible by training.micro_batch_size*data-parallel size = {}*{} = {}",
                       t.global_batch_size, t.micro_batch_size, dp, t.micro_batch_size * dp));
  t.num_microbatches = t.global_batch_size / (t.micro_batch_size * dp);
  // Megatron's interleaved 1F1B passes microbatches through each model chunk in groups of pipeline-size
  // (parallel/schedule.cpp asserts the same rule); checked here so that it names the keys before ranks start.
  const ParallelConfig& p = c.parallel;
  if (p.virtual_pipeline > 1 && t.num_microbatches % p.pipeline != 0)
    r.fail("training.global_batch_size",
           fmt::format("{} gives {} microbatches (global_batch_size / (micro_batch_size * data-parallel size) = "
                       "{}/({}*{})), not a multiple of parallel.pipeline={}: the interleaved schedule "
                       "(parallel.virtual_pipeline={}) runs microbatches through each chunk in groups of "
                       "parallel.pipeline",
                       t.global_batch_size, t.num_microbatches, t.global_batch_size, t.micro_batch_size, dp, p.pipeline,
                       p.virtual_pipeline));
  r.positive("training.train_iters", t.train_iters);
  r.at_most("training.train_iters", t.train_iters, kMaxCount, "number of iterations");
  // Sample and token positions (iteration * global batch * (seq_length + 1)) must fit int64.
  if (static_cast<double>(t.train_iters) * static_cast<double>(t.global_batch_size) *
          static_cast<double>(c.model.seq_length + 1) >
      0x1p62)
    r.fail("training.train_iters", fmt::format("{} iterations of {} samples of {} tokens count more tokens than "
                                               "int64 can address",
                                               t.train_iters, t.global_batch_size, c.model.seq_length + 1));
#if !defined(MEGATRAIN_WITH_CUDA)
  if (t.device == DeviceChoice::cuda)
    r.fail("training.device",
           "cuda: this megatrain was built without the CUDA backend (no CUDA toolkit at build "
           "time); use cpu or auto");
#endif
  if (c.parallel.backend == BackendChoice::nccl && t.device == DeviceChoice::cpu)
    r.fail("parallel.backend", "nccl needs training.device: cuda (NCCL moves GPU memory); use gloo or auto on cpu");
  r.non_negative("training.seed", t.seed);
  r.positive("training.max_nonfinite_iters", t.max_nonfinite_iters);
  r.non_negative("training.exit_interval", t.exit_interval);
  r.non_negative("training.exit_duration_mins", t.exit_duration_mins);

  const LossScaleConfig& s = t.loss_scale;
  r.positive("training.loss_scale.min", s.min);
  if (!(s.initial >= s.min))
    r.fail("training.loss_scale.initial", fmt::format("{} is less than training.loss_scale.min={}", s.initial, s.min));
  r.positive("training.loss_scale.initial", s.initial);
  r.positive("training.loss_scale.window", s.window);
  r.positive("training.loss_scale.hysteresis", s.hysteresis);

  const Fp8Config& f = t.fp8;
  if (f.enabled() && t.precision != Precision::bf16)
    r.fail("training.fp8.format",
           fmt::format("{} needs training.precision: bf16 (the fp8 GEMMs' outputs and everything "
                       "else run in bf16), got {}",
                       name_of(f.format), name_of(t.precision)));
  r.positive("training.fp8.amax_history_len", f.amax_history_len);
  r.at_most("training.fp8.amax_history_len", f.amax_history_len, 1 << 20, "history length");
  r.non_negative("training.fp8.margin", f.margin);
  r.at_most("training.fp8.margin", f.margin, 64, "margin (a power of two)");

  const LossSpikeConfig& k = t.loss_spike;
  r.positive("training.loss_spike.window", k.window);
  r.non_negative("training.loss_spike.warmup_iters", k.warmup_iters);
  r.positive("training.loss_spike.sigmas", k.sigmas);
  if (!(k.ratio >= 1))
    r.fail("training.loss_spike.ratio",
           fmt::format("must be at least 1 (a spike is above mean * ratio), got {}", k.ratio));
  r.finite("training.loss_spike.ratio", k.ratio);
}

void resolve_optimizer(Config& c, const Rules& r) {
  OptimizerConfig& o = c.optimizer;
  r.positive("optimizer.lr", o.lr);
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr))
    r.fail("optimizer.min_lr", fmt::format("must be in [0, optimizer.lr={}], got {}", o.lr, o.min_lr));
  r.non_negative("optimizer.warmup_iters", o.warmup_iters);
  r.non_negative("optimizer.decay_iters", o.decay_iters);
  r.at_most("optimizer.warmup_iters", o.warmup_iters, kMaxCount, "number of iterations");
  r.at_most("optimizer.decay_iters", o.decay_iters, kMaxCount, "number of iterations");
  const bool decay_iters_defaulted = o.decay_iters == 0;
  if (decay_iters_defaulted) o.decay_iters = c.training.train_iters;
  if (o.warmup_iters > o.decay_iters)
    r.fail("optimizer.warmup_iters",
           decay_iters_defaulted
               ? fmt::format("{} is more than optimizer.decay_iters={} (unset, so it defaulted to training.train_iters"
                             "={}): lower optimizer.warmup_iters, raise training.train_iters or set "
                             "optimizer.decay_iters",
                             o.warmup_iters, o.decay_iters, c.training.train_iters)
               : fmt::format("{} is more than optimizer.decay_iters={}", o.warmup_iters, o.decay_iters));
  if (!(o.wsd_decay_fraction > 0 && o.wsd_decay_fraction <= 1))
    r.fail("optimizer.wsd_decay_fraction", fmt::format("must be in (0, 1], got {}", o.wsd_decay_fraction));
  // The anneal starts after the warmup has reached the peak.
  if (o.decay == LrDecay::wsd &&
      o.wsd_decay_fraction * static_cast<double>(o.decay_iters) > static_cast<double>(o.decay_iters - o.warmup_iters))
    r.fail("optimizer.wsd_decay_fraction",
           fmt::format("{} of optimizer.decay_iters={} is {} anneal steps, more than the {} left after "
                       "optimizer.warmup_iters={}",
                       o.wsd_decay_fraction, o.decay_iters, o.wsd_decay_fraction * static_cast<double>(o.decay_iters),
                       o.decay_iters - o.warmup_iters, o.warmup_iters));
  r.non_negative("optimizer.weight_decay", o.weight_decay);
  for (size_t i = 0; i < o.betas.size(); ++i) r.probability(fmt::format("optimizer.betas[{}]", i), o.betas[i]);
  r.positive("optimizer.eps", o.eps);
  r.non_negative("optimizer.grad_clip", o.grad_clip);
  r.non_negative("optimizer.offload_host_memory_gib", o.offload_host_memory_gib);
}

// One data.train / data.valid list: no empty path, and blend weights finite and > 0 (megatron-core asserts it).
void check_data_list(const Rules& r, const char* key, const std::vector<std::string>& items) {
  const DataBlend blend = parse_data_blend(items);
  const size_t stride = blend.weights.empty() ? 1 : 2, offset = blend.weights.empty() ? 0 : 1;
  for (size_t i = 0; i < blend.prefixes.size(); ++i)
    if (blend.prefixes[i].empty()) r.fail(fmt::format("{}[{}]", key, i * stride + offset), "is an empty path");
  for (size_t i = 0; i < blend.weights.size(); ++i)
    if (!std::isfinite(blend.weights[i]) || !(blend.weights[i] > 0))
      r.fail(fmt::format("{}[{}]", key, 2 * i),
             fmt::format("blend weight {} must be a finite number > 0", items[2 * i]));
  // Each weight is divided by their sum: a sum beyond the largest double made every share 0.
  const double sum = std::accumulate(blend.weights.begin(), blend.weights.end(), 0.0);
  if (!std::isfinite(sum))
    r.fail(key, fmt::format("the blend weights sum to {} (beyond the largest double, {:g}); they are relative, so "
                            "scale them down",
                            sum, std::numeric_limits<double>::max()));
}

void resolve_data(Config& c, const Rules& r) {
  const DataConfig& d = c.data;
  if (d.train.empty() && !d.synthetic)
    r.fail("data.train", "needs at least one dataset prefix (or set data.synthetic: true)");
  check_data_list(r, "data.train", d.train);
  check_data_list(r, "data.valid", d.valid);
  for (size_t i = 0; i < d.split.size(); ++i) r.non_negative(fmt::format("data.split[{}]", i), d.split[i]);
  if (!(std::accumulate(d.split.begin(), d.split.end(), 0.0) > 0))
    r.fail("data.split", fmt::format("[{}] must have a positive sum", fmt::join(d.split, ", ")));
}

}  // namespace

DataBlend parse_data_blend(const std::vector<std::string>& items) {
  DataBlend blend;
  if (!items.empty() && items.size() % 2 == 0) {
    for (size_t i = 0; i < items.size(); i += 2) {
      // Python's float(): the whole item, surrounding blanks allowed.
      const std::string& s = items[i];
      char* end = nullptr;
      const double w = std::strtod(s.c_str(), &end);
      while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
      if (s.empty() || end == s.c_str() || *end != '\0') {
        blend.weights.clear();
        break;
      }
      blend.weights.push_back(w);
    }
  }
  if (blend.weights.empty()) {
    blend.prefixes = items;
  } else {
    for (size_t i = 1; i < items.size(); i += 2) blend.prefixes.push_back(items[i]);
  }
  return blend;
}

namespace {

// The megatrain LoRA target of a module name that Hugging Face (PEFT's target_modules), Megatron-Core or Meta's
// Llama code gives the same linear; null for any other name.
const char* megatrain_lora_target(std::string_view name) {
  static constexpr std::pair<std::string_view, const char*> kNames[] = {
      {"q_proj", "qkv (one fused query/key/value linear)"},
      {"k_proj", "qkv (one fused query/key/value linear)"},
      {"v_proj", "qkv (one fused query/key/value linear)"},
      {"c_attn", "qkv"},
      {"query_key_value", "qkv"},
      {"linear_qkv", "qkv"},
      {"wq", "qkv (one fused query/key/value linear)"},
      {"wk", "qkv (one fused query/key/value linear)"},
      {"wv", "qkv (one fused query/key/value linear)"},
      {"o_proj", "proj"},
      {"out_proj", "proj"},
      {"dense", "proj"},
      {"linear_proj", "proj"},
      {"wo", "proj"},
      {"c_proj", "proj (attention's c_proj) or fc2 (the MLP's c_proj)"},
      {"gate_proj", "fc1 (gate and up are one fused linear)"},
      {"up_proj", "fc1 (gate and up are one fused linear)"},
      {"w1", "fc1 (gate and up are one fused linear)"},
      {"w3", "fc1 (gate and up are one fused linear)"},
      {"c_fc", "fc1"},
      {"fc_in", "fc1"},
      {"dense_h_to_4h", "fc1"},
      {"linear_fc1", "fc1"},
      {"down_proj", "fc2"},
      {"w2", "fc2"},
      {"fc_out", "fc2"},
      {"dense_4h_to_h", "fc2"},
      {"linear_fc2", "fc2"}};
  for (const auto& [hf, ours] : kNames)
    if (name == hf) return ours;
  return nullptr;
}

// finetune.lora: rank 0 (the default) is off. A negative rank, or rank 0 beside another key set to a value of its own
// (a block that forgot its rank; to_yaml writes the defaults, which stay accepted), is refused.
void resolve_finetune(const Config& c, const Rules& r) {
  const LoraConfig& l = c.finetune.lora;
  const LoraConfig defaults;
  const bool others_set = l.alpha != defaults.alpha || l.dropout != defaults.dropout || l.targets != defaults.targets;
  if (l.rank < 0 || (l.rank == 0 && others_set))
    r.fail("finetune.lora.rank",
           fmt::format("must be >= 1 when finetune.lora is given (the adapters' rank), got {}; leave the block "
                       "out (or set only rank: 0) for no LoRA",
                       l.rank));
  r.at_most("finetune.lora.rank", l.rank, kMaxWidth, "adapter rank");
  r.non_negative("finetune.lora.alpha", l.alpha);
  r.finite("finetune.lora.dropout", l.dropout);
  r.probability("finetune.lora.dropout", l.dropout);
  if (!l.enabled()) return;
  if (l.targets.empty()) r.fail("finetune.lora.targets", "needs at least one of qkv, proj, fc1, fc2");
  for (size_t i = 0; i < l.targets.size(); ++i) {
    if (const char* ours = megatrain_lora_target(l.targets[i]))
      r.fail("finetune.lora.targets",
             fmt::format("'{}' names a module of another framework (Hugging Face, Megatron-Core or Meta's Llama); "
                         "megatrain's target for it is {} (targets: qkv, proj, fc1, fc2)",
                         l.targets[i], ours));
    r.one_of("finetune.lora.targets", l.targets[i], {"qkv", "proj", "fc1", "fc2"});
    for (size_t j = 0; j < i; ++j)
      if (l.targets[j] == l.targets[i]) r.fail("finetune.lora.targets", fmt::format("names '{}' twice", l.targets[i]));
  }
  if (c.model.moe.enabled())
    r.fail("finetune.lora.rank", "LoRA on mixture-of-experts models is not supported yet (model.moe.num_experts > 0)");
  if (c.training.fp8.enabled())
    r.fail("finetune.lora.rank", "LoRA with fp8 GEMMs is not supported yet (training.fp8.format is set)");
}

void resolve_checkpoint_and_logging(Config& c, const Rules& r) {
  const CheckpointConfig& k = c.checkpoint;
  r.non_negative("checkpoint.save_interval", k.save_interval);
  r.non_negative("checkpoint.keep_last", k.keep_last);
  if (k.load.empty()) r.fail("checkpoint.load", "expected auto, none or a checkpoint path, got ''");
  if (!c.training.init_from.empty() && k.load != "auto" && k.load != "none")
    r.fail("training.init_from",
           fmt::format("starts from {}'s weights with a fresh optimizer and data position, but checkpoint.load: {} "
                       "resumes a run; set one of them (checkpoint.load: auto resumes this run's own checkpoints "
                       "in checkpoint.save_dir and otherwise starts from training.init_from)",
                       c.training.init_from, k.load));
  const LoggingConfig& l = c.logging;
  if (l.dir.empty()) r.fail("logging.dir", "needs a run directory, got ''");
  r.positive("logging.interval", l.interval);
  r.non_negative("logging.eval_interval", l.eval_interval);
  r.non_negative("logging.eval_iters", l.eval_iters);
  r.non_negative("logging.profile_iteration", l.profile_iteration);
  r.at_most("logging.interval", l.interval, kMaxCount, "interval");
  r.at_most("logging.eval_interval", l.eval_interval, kMaxCount, "interval");
  r.at_most("logging.eval_iters", l.eval_iters, int64_t{1} << 24, "number of validation iterations");
  r.at_most("checkpoint.save_interval", k.save_interval, kMaxCount, "interval");
  r.at_most("checkpoint.keep_last", k.keep_last, kMaxCount, "count");
  r.at_most("logging.profile_iteration", l.profile_iteration, kMaxCount, "iteration");
  if (l.profile_iteration > c.training.train_iters)
    r.fail("logging.profile_iteration", fmt::format("iteration {} is past training.train_iters={}: it would never run",
                                                    l.profile_iteration, c.training.train_iters));
  if (l.eval_interval > 0 && l.eval_iters == 0)
    r.fail("logging.eval_iters", fmt::format("must be positive when logging.eval_interval={}", l.eval_interval));
  if (!l.trace_iterations.empty() && !l.trace)
    r.fail("logging.trace_iterations", "is set, but logging.trace is false: set logging.trace: true");
  for (size_t i = 0; i < l.trace_iterations.size(); ++i) {
    const std::string key = fmt::format("logging.trace_iterations[{}]", i);
    r.positive(key, l.trace_iterations[i]);
    if (l.trace_iterations[i] > c.training.train_iters)
      r.fail(key, fmt::format("iteration {} is past training.train_iters={}: it would never run", l.trace_iterations[i],
                              c.training.train_iters));
    if (i > 0 && l.trace_iterations[i] <= l.trace_iterations[i - 1])
      r.fail(key, fmt::format("{} does not follow {}: list the iterations in ascending order, each once",
                              l.trace_iterations[i], l.trace_iterations[i - 1]));
  }
  r.one_of("logging.level", l.level, {"trace", "debug", "info", "warn", "error", "critical", "off"});
}

// Refuses, before anything is allocated, models whose tensors or parameters cannot fit: the largest weight
// and activation tensors of one rank, and the fp32 state (value, master, two moments, gradient) of all
// parameters. Products are taken in double: the bounds above keep them exact enough to compare.
void check_sizes(const Config& c, const Rules& r) {
  const ModelConfig& m = c.model;
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size),
               v = static_cast<double>(m.padded_vocab_size), p = static_cast<double>(m.max_position_embeddings),
               s = static_cast<double>(m.seq_length), b = static_cast<double>(c.training.micro_batch_size),
               heads = static_cast<double>(m.num_heads);
  auto tensor = [&](const char* key, const char* what, double numel) {
    if (numel * 4 > kMaxBytes)
      r.fail(key, fmt::format("{} would need {:.3g} bytes, more than the {} bytes one tensor may hold", what, numel * 4,
                              kMaxTensorBytes));
  };
  const bool llama = m.arch == Arch::llama;
  const double kv = static_cast<double>(2 * m.kv_heads() * m.head_dim);
  tensor("model.hidden_size", "the attention weight (hidden_size + 2*num_query_groups*head_dim, hidden_size)",
         (h + kv) * h);
  tensor("model.ffn_hidden_size", "the feed-forward weight ((2*)ffn_hidden_size, hidden_size)",
         (llama ? 2 : 1) * f * h);
  tensor("model.vocab_size", "the embedding table (padded vocabulary, hidden_size)", v * h);
  tensor("model.max_position_embeddings", "the position table (max_position_embeddings, hidden_size)", p * h);
  tensor("training.micro_batch_size", "the hidden states (micro_batch_size, seq_length, hidden_size)", b * s * h);
  tensor("training.micro_batch_size", "the logits (micro_batch_size, seq_length, padded vocabulary)", b * s * v);
  tensor("model.seq_length", "the attention scores (micro_batch_size, num_heads, seq_length, seq_length)",
         b * heads * s * s);
  const double params = estimated_parameters(m);
  if (params * 20 > kMaxBytes) {
    // Blame the larger part: the layers, or the vocabulary (and position) tables.
    ModelConfig tables_only = m;
    tables_only.num_layers = 0;
    const double tables = estimated_parameters(tables_only), layers = params - tables;
    r.fail(layers >= tables ? "model.num_layers" : "model.vocab_size",
           fmt::format("the model's {:.3g} parameters ({} layers of hidden_size {}: {:.3g}; the embedding tables of "
                       "the padded vocabulary {}: {:.3g}) need {:.3g} bytes of state (20 bytes a parameter), more "
                       "than {} bytes",
                       params, m.num_layers, m.hidden_size, layers, m.padded_vocab_size, tables, params * 20,
                       kMaxTensorBytes));
  }
}

}  // namespace

double estimated_parameters(const ModelConfig& m) {
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size),
               v = static_cast<double>(m.padded_vocab_size), p = static_cast<double>(m.max_position_embeddings);
  if (m.arch == Arch::llama) {
    // Per layer: Q, K, V and proj (2h^2 + 2h * kv), gate, up and down (3hf), two RMSNorms (2h); then the word
    // embeddings, the final norm and an untied head. No biases, no position table.
    const double kv = static_cast<double>(m.kv_heads() * m.head_dim);
    return static_cast<double>(m.num_layers) * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h +
           v * h * (m.tie_embeddings ? 1 : 2);
  }
  // Per layer: QKV and proj (4h^2 + 4h), fc1 and fc2 (2hf + f + h), two norms (4h); then the embeddings,
  // the final norm and an untied head.
  return static_cast<double>(m.num_layers) * (4 * h * h + 2 * h * f + 9 * h + f) + p * h + 2 * h +
         v * h * (m.tie_embeddings ? 1 : 2);
}

void resolve_config(Config& c, int64_t world_size, const ConfigSource& src) {
  const Rules r(src);
  resolve_model(c.model, r);
  resolve_parallel(c, world_size, r);
  resolve_moe(c, r);
  // Padded so that every tensor-parallel rank holds an equal, aligned slice of the vocabulary.
  const int64_t multiple = c.model.make_vocab_size_divisible_by * c.parallel.tensor;  // both bounded: no overflow
  c.model.padded_vocab_size = (c.model.vocab_size + multiple - 1) / multiple * multiple;
  if (c.model.padded_vocab_size > kMaxVocab)
    r.fail("model.make_vocab_size_divisible_by",
           fmt::format("{} (times parallel.tensor={}) pads model.vocab_size={} to {}, more than the largest "
                       "supported vocabulary {} (token ids are int32)",
                       c.model.make_vocab_size_divisible_by, c.parallel.tensor, c.model.vocab_size,
                       c.model.padded_vocab_size, kMaxVocab));
  resolve_training(c, r);
  check_sizes(c, r);
  resolve_optimizer(c, r);
  resolve_data(c, r);
  resolve_checkpoint_and_logging(c, r);
  resolve_finetune(c, r);
}

}  // namespace mt
