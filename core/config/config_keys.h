// config_keys.h: the one list of every YAML key of a Config, shared by the reader, the writer and the key check.
#pragma once
#include <cstddef>

#include "core/config/config.h"

namespace mt::config_keys {

// How one key is read and written.
struct Key {
  const char* name;
  bool required = false;
  bool accepts_auto = false;  // the string "auto" is stored as 0 (parallel.data, model.vocab_size, ...)
  // 0 is refused: the default is written by leaving the key out or as auto. A 0 that silently meant the default
  // hid a forgotten value (issue 30, item 8).
  const char* refuses_zero = nullptr;  // the default, for the message ("num_heads"); null: 0 is read as given
  size_t length = 0;                   // a list of exactly this many entries; 0: any length
  // A number key whose default 0 is written and read as this word (model.moe.capacity_factor: none); a number 0
  // is then refused as refuses_zero says.
  const char* zero_word = nullptr;
  // Why the key means nothing in this config, judged from the keys visited before it ("training.fp8.format is
  // none ..."); null: it applies. The reader refuses such a key when the document sets it, naming this reason (a
  // silently ignored key hid a mistake, issue 49 item 5), and the writer leaves it out.
  const char* inert = nullptr;
};

// Calls v.section(name, body) for every section (nested for model.moe, training.loss_scale and training.loss_spike)
// and v.field(Key, member) for every key, in the order to_yaml prints them. C is Config or const Config. Derived
// values are not keys.
template <class V, class C>
void visit(V& v, C& c) {
  v.section("model", [&] {
    auto& m = c.model;
    v.field({.name = "arch"}, m.arch);
    v.field({.name = "num_layers", .required = true}, m.num_layers);
    v.field({.name = "hidden_size", .required = true}, m.hidden_size);
    v.field({.name = "num_heads", .required = true}, m.num_heads);
    v.field({.name = "num_query_groups", .accepts_auto = true, .refuses_zero = "num_heads"}, m.num_query_groups);
    v.field({.name = "head_dim", .accepts_auto = true, .refuses_zero = "hidden_size / num_heads"}, m.head_dim);
    v.field({.name = "ffn_hidden_size",
             .accepts_auto = true,
             .refuses_zero = "4 * hidden_size for gpt, Megatron's SwiGLU width 8 * hidden_size / 3 rounded down to 64 "
                             "for llama"},
            m.ffn_hidden_size);
    v.field({.name = "seq_length", .required = true}, m.seq_length);
    v.field({.name = "max_position_embeddings"}, m.max_position_embeddings);
    v.field({.name = "vocab_size", .required = true, .accepts_auto = true}, m.vocab_size);
    v.field({.name = "make_vocab_size_divisible_by"}, m.make_vocab_size_divisible_by);
    v.field({.name = "tie_embeddings"}, m.tie_embeddings);
    v.field({.name = "dropout"}, m.dropout);
    v.field({.name = "attention_dropout"}, m.attention_dropout);
    v.field({.name = "layernorm_eps"}, m.layernorm_eps);
    v.field({.name = "rotary_base"}, m.rotary_base);
    v.field({.name = "qkv_bias"}, m.qkv_bias);
    v.field({.name = "qk_norm"}, m.qk_norm);
    v.field({.name = "sliding_window"}, m.sliding_window);
    v.field({.name = "full_attention_layers",
             .inert = m.sliding_window == 0 ? "model.sliding_window is 0 (every layer attends to every earlier token)"
                                            : nullptr},
            m.full_attention_layers);
    v.section("rope_scaling", [&] {
      auto& rs = m.rope_scaling;
      v.field({.name = "type"}, rs.type);
      const char* plain =
          rs.enabled() ? nullptr
                       : "model.rope_scaling.type is none (plain rotary embeddings): set model.rope_scaling.type";
      const char* not_llama3 = plain ? plain
                               : rs.type != RopeScalingType::llama3
                                   ? "model.rope_scaling.type is not llama3 (the key is llama3's)"
                                   : nullptr;
      const char* not_yarn = plain ? plain
                             : rs.type != RopeScalingType::yarn
                                 ? "model.rope_scaling.type is not yarn (the key is yarn's)"
                                 : nullptr;
      const char* linear = plain                                ? plain
                           : rs.type == RopeScalingType::linear ? "model.rope_scaling.type is linear (factor only)"
                                                                : nullptr;
      v.field({.name = "factor", .inert = plain}, rs.factor);
      v.field({.name = "low_freq_factor", .inert = not_llama3}, rs.low_freq_factor);
      v.field({.name = "high_freq_factor", .inert = not_llama3}, rs.high_freq_factor);
      v.field({.name = "original_max_position_embeddings", .inert = linear}, rs.original_max_position_embeddings);
      v.field({.name = "attention_factor", .inert = not_yarn}, rs.attention_factor);
      v.field({.name = "beta_fast", .inert = not_yarn}, rs.beta_fast);
      v.field({.name = "beta_slow", .inert = not_yarn}, rs.beta_slow);
      v.field({.name = "mscale", .inert = not_yarn}, rs.mscale);
      v.field({.name = "mscale_all_dim", .inert = not_yarn}, rs.mscale_all_dim);
      v.field({.name = "truncate", .inert = not_yarn}, rs.truncate);
    });
    v.field({.name = "init_std"}, m.init_std);
    v.section("moe", [&] {
      auto& e = m.moe;
      v.field({.name = "num_experts"}, e.num_experts);
      // A dense model takes no other MoE key, so a forgotten num_experts is not a silently dense run.
      const char* dense = e.enabled() ? nullptr : "model.moe.num_experts is 0 (a dense model): set num_experts";
      v.field({.name = "top_k", .inert = dense}, e.top_k);
      v.field({.name = "layer_freq", .inert = dense}, e.layer_freq);
      v.field({.name = "layer_pattern", .inert = dense}, e.layer_pattern);
      v.field(
          {.name = "ffn_hidden_size", .accepts_auto = true, .refuses_zero = "model.ffn_hidden_size", .inert = dense},
          e.ffn_hidden_size);
      v.field({.name = "shared_expert_ffn_hidden_size", .inert = dense}, e.shared_expert_ffn_hidden_size);
      v.field({.name = "score_function", .inert = dense}, e.score_function);
      v.field({.name = "norm_topk_prob", .inert = dense}, e.norm_topk_prob);
      v.field({.name = "aux_loss_coeff", .inert = dense}, e.aux_loss_coeff);
      v.field({.name = "z_loss_coeff", .inert = dense}, e.z_loss_coeff);
      v.field({.name = "bias_update_rate", .inert = dense}, e.bias_update_rate);
      v.field({.name = "capacity_factor", .refuses_zero = "none: dropless", .zero_word = "none", .inert = dense},
              e.capacity_factor);
    });
  });
  v.section("parallel", [&] {
    auto& p = c.parallel;
    v.field({.name = "tensor"}, p.tensor);
    v.field({.name = "pipeline"}, p.pipeline);
    v.field({.name = "virtual_pipeline"}, p.virtual_pipeline);
    v.field({.name = "data", .accepts_auto = true}, p.data);
    v.field({.name = "sequence_parallel"}, p.sequence_parallel);
    v.field({.name = "distributed_optimizer"}, p.distributed_optimizer);
    v.field({.name = "shard"}, p.shard);
    v.field({.name = "shard_group", .accepts_auto = true}, p.shard_group);
    v.field({.name = "layers_per_stage"}, p.layers_per_stage);
    v.field({.name = "timeout_s"}, p.timeout_s);
    v.field({.name = "gloo_shared_memory"}, p.gloo_shared_memory);
    v.field({.name = "grad_bucket_size"}, p.grad_bucket_size);
    v.field({.name = "backend"}, p.backend);
    v.field({.name = "pipeline_schedule"}, p.pipeline_schedule);
    v.field({.name = "expert"}, p.expert);
    v.field({.name = "expert_tensor", .accepts_auto = true, .refuses_zero = "parallel.tensor"}, p.expert_tensor);
    v.field({.name = "context"}, p.context);
    v.field({.name = "context_comm"}, p.context_comm);
  });
  v.section("training", [&] {
    auto& t = c.training;
    v.field({.name = "init_from"}, t.init_from);
    v.field({.name = "micro_batch_size"}, t.micro_batch_size);
    v.field({.name = "global_batch_size"}, t.global_batch_size);
    v.field({.name = "train_iters", .required = true}, t.train_iters);
    v.field({.name = "precision"}, t.precision);
    v.section("loss_scale", [&] {
      v.field({.name = "initial"}, t.loss_scale.initial);
      v.field({.name = "min"}, t.loss_scale.min);
      v.field({.name = "window"}, t.loss_scale.window);
      v.field({.name = "hysteresis"}, t.loss_scale.hysteresis);
    });
    v.section("fp8", [&] {
      v.field({.name = "format"}, t.fp8.format);
      const char* off =
          t.fp8.enabled() ? nullptr : "training.fp8.format is none (no fp8 GEMMs): set training.fp8.format";
      v.field({.name = "recipe", .inert = off}, t.fp8.recipe);
      // The amax history is the delayed recipe's; current scales each tensor by its own amax.
      const char* no_history = off ? off
                               : t.fp8.recipe != Fp8Recipe::delayed
                                   ? "training.fp8.recipe is current (each tensor scaled by its own amax, no history): "
                                     "set training.fp8.recipe: delayed"
                                   : nullptr;
      v.field({.name = "amax_history_len", .inert = no_history}, t.fp8.amax_history_len);
      v.field({.name = "amax_compute_algo", .inert = no_history}, t.fp8.amax_compute_algo);
      v.field({.name = "margin", .inert = off}, t.fp8.margin);
      v.field({.name = "first_last_bf16", .inert = off}, t.fp8.first_last_bf16);
    });
    v.section("loss_spike", [&] {
      v.field({.name = "action"}, t.loss_spike.action);
      v.field({.name = "window"}, t.loss_spike.window);
      v.field({.name = "warmup_iters"}, t.loss_spike.warmup_iters);
      v.field({.name = "sigmas"}, t.loss_spike.sigmas);
      v.field({.name = "ratio"}, t.loss_spike.ratio);
    });
    v.field({.name = "recompute"}, t.recompute);
    v.field({.name = "recompute_modules"}, t.recompute_modules);
    v.field({.name = "recompute_num_layers"}, t.recompute_num_layers);
    v.field({.name = "recompute_method"}, t.recompute_method);
    v.field({.name = "seed"}, t.seed);
    v.field({.name = "device"}, t.device);
    v.field({.name = "max_nonfinite_iters"}, t.max_nonfinite_iters);
    v.field({.name = "exit_interval"}, t.exit_interval);
    v.field({.name = "exit_duration_mins"}, t.exit_duration_mins);
  });
  v.section("optimizer", [&] {
    auto& o = c.optimizer;
    v.field({.name = "type"}, o.type);
    v.field({.name = "lr", .required = true}, o.lr);
    v.field({.name = "min_lr"}, o.min_lr);
    v.field({.name = "warmup_iters"}, o.warmup_iters);
    v.field({.name = "decay_iters"}, o.decay_iters);
    v.field({.name = "decay"}, o.decay);
    v.field({.name = "wsd_decay_fraction"}, o.wsd_decay_fraction);
    v.field({.name = "wsd_decay_style"}, o.wsd_decay_style);
    v.field({.name = "weight_decay"}, o.weight_decay);
    v.field({.name = "betas", .length = 2}, o.betas);
    v.field({.name = "eps"}, o.eps);
    v.field({.name = "grad_clip"}, o.grad_clip);
    v.field({.name = "offload"}, o.offload);
    v.field({.name = "offload_host_memory_gib"}, o.offload_host_memory_gib);
  });
  v.section("data", [&] {
    auto& d = c.data;
    v.field({.name = "train"}, d.train);
    v.field({.name = "valid"}, d.valid);
    v.field({.name = "split", .length = 3}, d.split);
    v.field({.name = "synthetic"}, d.synthetic);
    v.field({.name = "allow_tokenizer_change"}, d.allow_tokenizer_change);
    v.field({.name = "verify_checksums"}, d.verify_checksums);
    v.field({.name = "loss_mask"}, d.loss_mask);
    v.field({.name = "sft_packing"}, d.sft_packing);
  });
  v.section("checkpoint", [&] {
    auto& k = c.checkpoint;
    v.field({.name = "save_dir"}, k.save_dir);
    v.field({.name = "save_interval"}, k.save_interval);
    v.field({.name = "keep_last"}, k.keep_last);
    v.field({.name = "load"}, k.load);
    v.field({.name = "allow_partial_load"}, k.allow_partial_load);
  });
  v.section("logging", [&] {
    auto& l = c.logging;
    v.field({.name = "dir"}, l.dir);
    v.field({.name = "interval"}, l.interval);
    v.field({.name = "eval_interval"}, l.eval_interval);
    v.field({.name = "eval_iters"}, l.eval_iters);
    v.field({.name = "level"}, l.level);
    v.field({.name = "tensorboard"}, l.tensorboard);
    v.field({.name = "verbose_line"}, l.verbose_line);
    v.field({.name = "straggler_margin"}, l.straggler_margin);
    v.field({.name = "on_sink_error"}, l.on_sink_error);
    v.field({.name = "profile_iteration"}, l.profile_iteration);
    v.field({.name = "trace"}, l.trace);
    v.field({.name = "trace_iterations"}, l.trace_iterations);
  });
  v.section("finetune", [&] {
    v.section("lora", [&] {
      auto& l = c.finetune.lora;
      v.field({.name = "rank"}, l.rank);
      v.field({.name = "alpha"}, l.alpha);
      v.field({.name = "dropout"}, l.dropout);
      v.field({.name = "targets"}, l.targets);
      v.field({.name = "random_base",
               .inert = !l.enabled()                    ? "finetune.lora.rank is 0 (no adapters)"
                        : !c.training.init_from.empty() ? "training.init_from is set: the adapters' base is its weights"
                                                        : nullptr},
              l.random_base);
    });
  });
}

// The top-level section that to_yaml writes and readers skip.
inline constexpr const char* kDerivedSection = "derived";

}  // namespace mt::config_keys
