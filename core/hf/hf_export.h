// hf_export.h: converts a checkpoint into the Hugging Face transformers layout (model.safetensors +
// config.json) of GPT2LMHeadModel (model.arch: gpt) or LlamaForCausalLM (model.arch: llama), or for a llama with
// model.moe, MixtralForCausalLM (no shared expert) or Qwen2MoeForCausalLM (a shared expert), so a trained model
// loads with from_pretrained(). The name and layout table is hf_mapping.h.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/hf/hf_mapping.h"
#include "core/hf/hf_tokenizer_export.h"
#include "core/io/progress.h"

namespace mt {

// The model hyperparameters an export needs, read from the checkpoint's stored config (model.*) and
// checked against the stored tensor shapes (which fix the padded vocabulary and the position count).
HfModelShape hf_export_shape(const CheckpointReader& ckpt);

// Writes OUT/model.safetensors (weights in `dtype`: f32, bf16 or f16) and OUT/config.json for the
// checkpoint's architecture. Everything is checked before anything is written; a failure leaves no partial
// model.safetensors. Throws CheckpointError (FileError for a failed write). config.json's bos/eos_token_id are
// `ids` (hf_special_ids when the tokenizer is known: the ids generation_config.json states), else null: an id
// nobody stated would mean nothing.
// `progress` hears of each tensor written. `read`, when given, supplies our tensors (name without "model.", f32 of
// the global shape) instead of the checkpoint: a LoRA export's merged weights.
using HfWeightReader = std::function<Tensor(const std::string& ours, const Shape& shape)>;
void export_hf(const CheckpointReader& ckpt, const std::string& out_dir, DType dtype = DType::f32,
               std::optional<HfSpecialIds> ids = std::nullopt, const ProgressHook& progress = {},
               const HfWeightReader& read = {});

// ---- LoRA checkpoints (finetune.lora; hf_export_lora.cpp) ----
// What a LoRA checkpoint's stored config says: its adapters and where its frozen base is.
struct HfLoraShape {
  int64_t rank = 0;
  double alpha = 0, dropout = 0;
  std::vector<std::string> targets;  // ours: qkv, proj, fc1, fc2
  std::string base;                  // training.init_from, as the training run named it ("" : seeded init)
};
// The LoRA section of the checkpoint's stored config; nullopt for a checkpoint without adapters.
std::optional<HfLoraShape> hf_lora_shape(const CheckpointReader& ckpt);
// The merged model: export_hf of `base` with every adapted weight W + (alpha / rank) B A, B and A from `lora`.
void export_hf_lora_merged(const CheckpointReader& lora, const CheckpointReader& base, const std::string& out_dir,
                           DType dtype, std::optional<HfSpecialIds> ids, const ProgressHook& progress = {});
// A PEFT adapter for the base's Hugging Face export: OUT/adapter_config.json and OUT/adapter_model.safetensors with
// PEFT's names (base_model.model.<HF module>.lora_A.weight (r, in), .lora_B.weight (out, r)). Our fused qkv and
// gate/up adapters map onto Hugging Face's separate projections exactly: each gets the shared A and its rows of B
// (the rows hf_mapping.h gives its weight), which computes the same B A x per projection.
void export_peft_adapter(const CheckpointReader& lora, const CheckpointReader& base, const std::string& out_dir,
                         DType dtype);
// export_hf for a GPT checkpoint only (refuses another model.arch).
void export_hf_gpt2(const CheckpointReader& ckpt, const std::string& out_dir, DType dtype = DType::f32,
                    std::optional<HfSpecialIds> ids = std::nullopt);

// config.json text of `family` (its model class: GPT2LMHeadModel, LlamaForCausalLM, ...) for `s`: the family's table
// (hf_config_families.cpp) written by hf_json::config_json.
std::string hf_config_json(HfArch family, const HfModelShape& s, DType dtype, std::optional<HfSpecialIds> ids);

}  // namespace mt
