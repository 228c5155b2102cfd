#include "models/layer_spec.h"

#include "models/attention.h"
#include "models/dense_mlp.h"
#include "models/moe_block.h"

namespace mt {

LayerSpec LayerSpec::of(const ModelConfig& cfg, int64_t layer) {
  const bool llama = cfg.arch == Arch::llama;
  LayerSpec s;
  s.norm = norm_kind(cfg.arch);
  s.position = llama ? PositionKind::rotary : PositionKind::learned;
  s.bias = !llama;
  s.qkv_bias = s.bias || cfg.qkv_bias;
  s.qk_norm = cfg.qk_norm;
  s.window = cfg.window_of(layer);
  s.mlp = cfg.moe.is_moe_layer(layer) ? MlpKind::moe : llama ? MlpKind::swiglu : MlpKind::gelu;
  return s;
}

std::unique_ptr<BlockPart> make_attention(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt) {
  return std::make_unique<SelfAttention>(spec, cfg, opt);
}

std::unique_ptr<BlockPart> make_mlp(const LayerSpec& spec, const ModelConfig& cfg, const PartOptions& opt) {
  if (spec.mlp == MlpKind::moe) return std::make_unique<MoeBlock>(cfg, opt);
  return std::make_unique<DenseMlp>(spec, cfg, opt);
}

}  // namespace mt
