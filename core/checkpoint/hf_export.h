// hf_export.h: converts a GPT checkpoint into the Hugging Face transformers layout of GPT2LMHeadModel
// (model.safetensors + config.json), so a trained model loads with from_pretrained().
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/checkpoint/checkpoint.h"

namespace mt {

// The model hyperparameters an export needs, read from the checkpoint's stored config (model.*) and
// checked against the stored tensor shapes.
struct GptExportShape {
  int64_t num_layers = 0, hidden = 0, heads = 0, ffn = 0;
  int64_t vocab = 0, padded_vocab = 0, positions = 0;
  int64_t seq_length = 0;  // model.seq_length (0 when the config has none)
  bool tied = true;
  double layernorm_eps = 1e-5, dropout = 0.1, attention_dropout = 0.1, init_std = 0.02;
};
GptExportShape gpt_export_shape(const CheckpointReader& ckpt);

// Writes OUT/model.safetensors (weights in `dtype`: f32, bf16 or f16) and OUT/config.json. Everything is
// checked before anything is written; a failure leaves no partial model.safetensors. Throws CheckpointError.
// config.json's bos/eos_token_id are `eod` (the tokenizer's end-of-document id) when known, else
// vocab_size - 1 (the byte tokenizer's eod when the vocabulary is 257).
void export_hf_gpt2(const CheckpointReader& ckpt, const std::string& out_dir, DType dtype = DType::f32,
                    std::optional<int32_t> eod = std::nullopt);

}  // namespace mt
