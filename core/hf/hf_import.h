// hf_import.h: reads a Hugging Face transformers model directory (config.json + model.safetensors, or a
// sharded model.safetensors.index.json) of GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM (whose shared_expert_gate must be
// zeros: hf_mapping.h) or Qwen3MoeForCausalLM into our parameters, the inverse
// of hf_export.h through the same table (hf_mapping.h). `megatrain ckpt import` (app/cli/cmd_ckpt_import.cpp)
// turns the result into a checkpoint at iteration 0.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/hf/hf_mapping.h"
#include "core/io/progress.h"

namespace mt {

struct HfImportOptions {
  std::optional<int64_t> seq_length;  // model.seq_length; default max_position_embeddings
  double dropout = 0;                 // model.dropout and model.attention_dropout (HF's are for pretraining)
};

// HF_DIR/config.json as our model (padded_vocab left 0: the config resolution fixes it). Refuses, naming the
// file and the key: another architecture, a rotary scaling type or key we do not model, biases in a llama (but
// Qwen2's q/k/v), an odd head_dim, an activation or attention variant we do not compute. Throws CheckpointError.
HfModelShape read_hf_config(const std::string& hf_dir, const HfImportOptions& opt = {});

// The model section of a megatrain config for `s` ("model:\n  arch: gpt\n  ..."), every shape key spelled out.
std::string hf_model_yaml(const HfModelShape& s);

// Our parameters (fp32; vocabulary tables padded with zero rows to s.padded_vocab), by our names, from the
// model's safetensors (F32, BF16 or F16). Every tensor must be there in its shape, and no other (besides
// buffers older transformers saved); tied embeddings may carry an lm_head.weight equal to the embedding.
// Throws CheckpointError naming the file and the tensor. `progress` hears of each tensor read (fp32 bytes).
std::vector<std::pair<std::string, Tensor>> read_hf_weights(const std::string& hf_dir, const HfModelShape& s,
                                                            const ProgressHook& progress = {});

}  // namespace mt
