// layer_spec.h: what a transformer layer is made of, chosen once per layer from the model's configuration (as
// Megatron-Core's layer specs choose modules): the norm, where positions enter, whether the linears have biases,
// and the MLP's kind. make_attention and make_mlp build the parts (models/block_part.h) of a spec; the layer
// itself only runs them.
#pragma once
#include <cstdint>
#include <memory>

#include "core/config/config.h"
#include "models/block_part.h"
#include "models/norm.h"

namespace mt {

enum class PositionKind { learned, rotary };  // a table added to the embedding (GPT), or q and k rotated (Llama)
enum class MlpKind { gelu, swiglu, moe };     // GELU on fc1's epilogue, SwiGLU of fc1's gate/up pairs, experts

struct LayerSpec {
  NormKind norm = NormKind::layernorm;
  PositionKind position = PositionKind::learned;
  bool bias = true;      // the attention's and a dense MLP's linears
  bool qkv_bias = true;  // the query, key and value projection (with `bias`, or alone: Qwen2's)
  bool qk_norm = false;  // each query and key head RMS-normalized before the rotary embeddings (Qwen3's)
  int64_t window = 0;    // > 0: sliding-window attention over the last this many tokens (Mistral's); 0: causal
  MlpKind mlp = MlpKind::gelu;
  // Layer `layer` of the model `cfg`.
  static LayerSpec of(const ModelConfig& cfg, int64_t layer);
};

// The parts of a layer of `spec`, built from `opt` (their parameters on the host, as make_parameter makes them).
std::unique_ptr<BlockPart> make_attention(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt);
std::unique_ptr<BlockPart> make_mlp(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt);

}  // namespace mt
