// norm.h: the normalization of an architecture over the last dimension, with what its backward needs:
// LayerNorm with weight and bias (GPT) or RMSNorm with a weight only (Llama). Norms are replicated over
// tensor parallelism; with sequence parallelism each rank normalizes its sequence shard, so the weights'
// gradients are partial sums over the group (grad_sums.tensor).
#pragma once
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"

namespace mt {

enum class NormKind { layernorm, rmsnorm };

// The norm of a model's architecture.
inline NormKind norm_kind(Arch arch) { return arch == Arch::llama ? NormKind::rmsnorm : NormKind::layernorm; }

class Norm {
 public:
  Norm() = default;
  // Parameters <name>.weight (C), ones, and for LayerNorm <name>.bias (C), zeros.
  Norm(const std::string& name, int64_t C, NormKind kind, float eps, DType dtype, uint64_t seed);

  // What forward keeps for backward.
  struct Saved {
    Tensor out;   // (N, C) the normalized rows, in the activations' dtype
    Tensor mean;  // (N) f32, LayerNorm only
    Tensor rstd;  // (N) f32
  };
  // x (N, C) -> s.out (N, C), returned.
  const Tensor& forward(const Tensor& x, Saved& s) const;
  // dout (N, C) and the forward's x and s -> dx (N, C); accumulates the parameters' gradients.
  Tensor backward(const Tensor& dout, const Tensor& x, const Saved& s);

  // With sequence parallelism each rank's gradients cover its shard: summed over the tensor-parallel group.
  void mark_sequence_parallel();
  std::vector<Parameter*> parameters();  // weight, then bias for LayerNorm
  const Parameter& weight() const { return weight_; }
  const Parameter* bias() const { return kind_ == NormKind::layernorm ? &bias_ : nullptr; }  // null for RMSNorm

 private:
  NormKind kind_ = NormKind::layernorm;
  float eps_ = 1e-5f;
  Parameter weight_, bias_;  // (C)
};

}  // namespace mt
