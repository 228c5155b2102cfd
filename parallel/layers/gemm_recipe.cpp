#include "parallel/layers/gemm_recipe.h"

#include "parallel/pipeline/weight_grad.h"

namespace mt {

namespace {

// A frozen weight (LoRA's base) gets no dW GEMM; a trained bias beside it still gets dY's column sums.
void frozen_weight_grad(const Tensor& dy, Parameter* bias) {
  if (bias) weight_grad_work([dy, bias] { bias_backward(dy, bias->grad); });
}

class PlainRecipe final : public GemmRecipe {
 public:
  void forward(const Tensor& x, const Tensor& w, Tensor& out, const GemmOptions& g) const override {
    gemm(x, w, out, g);
  }
  RecipeGrad input_grad(const Tensor& dy, const Parameter& w, Tensor& dx, const GemmOptions& g) const override {
    gemm(dy, w.value, dx, g);
    return {.dy = dy};
  }
  void weight_grad(const RecipeGrad& g, const Tensor& x, Parameter& w, Parameter* bias) const override {
    if (bias && bias->frozen) bias = nullptr;
    if (w.frozen) return frozen_weight_grad(g.dy, bias);
    weight_grad_work([dout = g.dy, x, &w, bias] {
      gemm(dout, x, w.grad,
           {.trans_a = true,
            .beta = 1.f,
            .epilogue = bias ? Epilogue::bgrad_a : Epilogue::none,
            .dbias = bias ? &bias->grad : nullptr});
    });
  }
};

class Fp8Recipe final : public GemmRecipe {
 public:
  Fp8Recipe(Fp8Link link, const TensorParallel& tp, LinearSharding sharding)
      : link_(std::move(link)), tp_(tp), sharding_(sharding) {}

  void forward(const Tensor& x, const Tensor& w, Tensor& out, const GemmOptions& g) const override {
    const Fp8Tensor qx = link_.ctx->quantize(link_.id, Fp8Operand::input, x, sharded(sharding_.x), tp_);
    const Fp8Tensor& qw = link_.weight(w, sharded(true), tp_);
    gemm_fp8(qx.q, qx.scale_inv, qw.q, qw.scale_inv, out, g);
  }
  RecipeGrad input_grad(const Tensor& dy, const Parameter& w, Tensor& dx, const GemmOptions& g) const override {
    // A frozen weight's dY feeds dx only: no dW GEMM reads its transpose.
    const Fp8Layout layout = w.frozen ? Fp8Layout::rows : Fp8Layout::both;
    const Fp8Tensor qdy =
        link_.ctx->quantize(link_.id, Fp8Operand::grad_output, dy, sharded(sharding_.dy), tp_, layout);
    const Fp8Tensor& qw = link_.weight(w.value, sharded(true), tp_);
    GemmOptions tn = g;
    tn.trans_b = true;  // dx = dY (W^T)^T
    gemm_fp8(qdy.q, qdy.scale_inv, qw.qt, qw.scale_inv, dx, tn);
    return {.dy = dy, .qdy = qdy};
  }
  void weight_grad(const RecipeGrad& g, const Tensor& x, Parameter& w, Parameter* bias) const override {
    if (bias && bias->frozen) bias = nullptr;
    if (w.frozen) return frozen_weight_grad(g.dy, bias);  // nor x's transposed cast
    const Fp8Tensor qx =
        link_.ctx->quantize(link_.id, Fp8Operand::input, x, sharded(sharding_.x), tp_, Fp8Layout::transposed);
    weight_grad_work([g, qx, &w, bias] {
      gemm_fp8(g.qdy.qt, g.qdy.scale_inv, qx.qt, qx.scale_inv, w.grad, {.trans_b = true, .beta = 1.f});
      if (bias) bias_backward(g.dy, bias->grad);
    });
  }

 private:
  bool sharded(bool operand) const { return operand && tp_.size > 1; }
  Fp8Link link_;
  TensorParallel tp_;
  LinearSharding sharding_;
};

}  // namespace

std::shared_ptr<const GemmRecipe> plain_recipe() {
  static const std::shared_ptr<const GemmRecipe> plain = std::make_shared<PlainRecipe>();
  return plain;
}

std::shared_ptr<const GemmRecipe> fp8_recipe(Fp8Link link, const TensorParallel& tp, LinearSharding sharding) {
  return std::make_shared<Fp8Recipe>(std::move(link), tp, sharding);
}

}  // namespace mt
