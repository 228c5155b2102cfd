// gemm_recipe.h: how a tensor-parallel linear's three GEMMs compute (TransformerEngine's "recipes"): the forward
// y = x W^T, the input gradient dx = dY W and the weight gradient dW += dY^T x (with the bias gradient, the column
// sums of dY). A linear (parallel_linear.h) runs its communication and adapter the same way under every recipe.
//
//   plain  the activations' dtype (fp32, bf16, fp16): gemm, the bias gradient on the weight GEMM's epilogue; a frozen
//          weight (LoRA's base) gets no weight GEMM, a frozen bias no sums.
//   fp8    each operand cast to fp8 with its scale from the linear's Fp8Context (fp8_linear.h): x and W in e4m3, dY
//          in e4m3 or e5m2; every GEMM in the TN form (dY cast with its transpose in one pass, x^T alone for dW);
//          the bias gradient sums the unquantised dY.
//
// The weight gradient is weight-gradient work (parallel/pipeline/weight_grad.h): deferred to the schedule's W under a
// zero-bubble pipeline, else run at once.
#pragma once
#include <memory>

#include "core/tensor/ops.h"
#include "core/tensor/parameter.h"
#include "parallel/layers/fp8_linear.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

// dY as the weight gradient reads it: the tensor itself, and under fp8 its cast.
struct RecipeGrad {
  Tensor dy;
  Fp8Tensor qdy;
};

class GemmRecipe {
 public:
  virtual ~GemmRecipe() = default;
  // out = x W^T, with `g`'s epilogue (g.trans_b set).
  virtual void forward(const Tensor& x, const Tensor& w, Tensor& out, const GemmOptions& g) const = 0;
  // dx = dY W (W: w's value), with `g`'s epilogue; returns dY for weight_grad (for a frozen w, as dx alone reads it).
  virtual RecipeGrad input_grad(const Tensor& dy, const Parameter& w, Tensor& dx, const GemmOptions& g) const = 0;
  // Queues w.grad += dY^T x and, with `bias`, bias->grad += dY's column sums.
  virtual void weight_grad(const RecipeGrad& dy, const Tensor& x, Parameter& w, Parameter* bias) const = 0;
};

// The plain recipe (one, stateless).
std::shared_ptr<const GemmRecipe> plain_recipe();

// Which operands of a linear are tensor-parallel shards of the logical tensor (their fp8 amax is max-reduced over
// the group): its input x and its output gradient dY (the weight always is, with tensor-parallel size > 1).
struct LinearSharding {
  bool x = false;
  bool dy = false;
};
// The fp8 recipe of the linear `link` names, in the group `tp`.
std::shared_ptr<const GemmRecipe> fp8_recipe(Fp8Link link, const TensorParallel& tp, LinearSharding sharding);

}  // namespace mt
