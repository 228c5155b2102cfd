// config_rules_training.cpp: the rules of training.*, optimizer.* and finetune.* (LoRA).
#include <fmt/format.h>

#include <string_view>
#include <utility>

#include "core/config/config_rules_detail.h"
#include "core/tensor/backend.h"

namespace mt::config_rules {
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

}  // namespace

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
           fmt::format("{} is more than model.num_layers={} ({})", t.recompute_num_layers, c.model.num_layers,
                       t.recompute_method == "uniform" ? "with uniform it is the layers of each recomputed group"
                                                       : "it counts the layers of each model chunk that recompute"));
  if (t.recompute_num_layers > 0 && t.recompute != Recompute::full)
    r.fail("training.recompute_num_layers",
           fmt::format("{} is set, but training.recompute is {}: it chooses the layers of full recomputation",
                       t.recompute_num_layers, name_of(t.recompute)));
  // block: the first recompute_num_layers layers of each model chunk, each on its own; uniform: each chunk's layers
  // in consecutive groups of recompute_num_layers, each group checkpointed as one (models/gpt.h).
  r.one_of("training.recompute_method", t.recompute_method, {"block", "uniform"});
  if (t.recompute_method == "uniform" && t.recompute != Recompute::full)
    r.fail("training.recompute_method",
           fmt::format("uniform is set, but training.recompute is {}: it groups the layers of full recomputation",
                       name_of(t.recompute)));
  // Megatron needs the group size too; 0 (block's "every layer") has no meaning as a group.
  if (t.recompute_method == "uniform" && t.recompute_num_layers < 1)
    r.fail("training.recompute_num_layers",
           fmt::format("{} with training.recompute_method: uniform: set the layers of each recomputed group (>= 1; "
                       "1 recomputes each layer on its own)",
                       t.recompute_num_layers));
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
  // (parallel/pipeline/schedule.cpp asserts the same rule); checked here so that it names the keys before ranks start.
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
  if (t.device == DeviceChoice::cuda && !has_backend(Device::cuda))
    r.fail("training.device",
           "cuda: this megatrain was built without the CUDA backend (no CUDA toolkit at build "
           "time); use cpu or auto");
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
  // The experts' adapters (fc1, fc2 on a MoE layer) take their rows in expert order, not at their tokens' places, so
  // no dropout mask keyed by position exists for them; PEFT's adapters on fused experts (ParamWrapper) refuse
  // dropout too.
  if (c.model.moe.enabled() && l.dropout > 0 && (l.targets_any("fc1") || l.targets_any("fc2")))
    r.fail("finetune.lora.dropout",
           fmt::format("must be 0 with adapters on a mixture of experts' linears (model.moe.num_experts={} and "
                       "finetune.lora.targets names fc1 or fc2), as PEFT's adapters on fused experts; got {}",
                       c.model.moe.num_experts, l.dropout));
}

}  // namespace mt::config_rules
