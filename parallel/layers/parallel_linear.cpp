#include "parallel/layers/parallel_linear.h"

#include <stdexcept>

#include <fmt/format.h>

#include "parallel/layers/sequence_parallel.h"
#include "parallel/pipeline/weight_grad.h"

namespace mt {

namespace {

void check_split(const LinearOptions& opt, int64_t features, const char* what, const TensorParallel& tp) {
  if (features <= 0 || features % tp.size != 0)
    throw std::invalid_argument(fmt::format("{}: {}={} must be positive and divisible by tensor-parallel size {}",
                                            opt.name, what, features, tp.size));
}

}  // namespace

// ---- ColumnParallelLinear ------------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const LinearOptions& opt, const TensorParallel& tp)
    : tp_(tp), has_bias_(opt.bias) {
  check_split(opt, opt.out_features, "out_features", tp);
  const int64_t out = opt.out_features, in = opt.in_features, o0 = tp.begin(out), local = tp.count(out);
  weight_ = make_parameter_slice(opt.name + ".weight", {.global = {out, in}, .start = {o0, 0}, .local = {local, in}},
                                 opt.dtype, Init::normal, opt.init_std, opt.seed);
  if (has_bias_)
    bias_ = make_parameter_slice(opt.name + ".bias", {.global = {out}, .start = {o0}, .local = {local}}, opt.dtype,
                                 Init::zeros, 0, opt.seed);
}

ColumnParallelLinear::ColumnParallelLinear(Parameter& weight, const TensorParallel& tp) : tp_(tp), borrowed_(&weight) {}

std::vector<Parameter*> ColumnParallelLinear::parameters() {
  std::vector<Parameter*> ps;
  if (!borrowed_) ps.push_back(&weight_);
  if (has_bias_) ps.push_back(&bias_);
  if (lora_)
    for (Parameter* p : lora_->parameters()) ps.push_back(p);
  return ps;
}

Tensor ColumnParallelLinear::forward(const Tensor& x, int64_t B, Tensor* gelu_preact, const LoraCall* lora) const {
  const Tensor x_full = sequence_to_full(x, B, tp_);  // (N, in): f, an all-gather with SP
  const Tensor& w = weight().value;                   // (out/t, in)
  const int64_t N = x_full.dim(0);
  Tensor out = Tensor::empty({N, w.dim(0)}, x.dtype(), x.device());  // (N, out/t)
  if (lora_) {  // the adapter's update joins the GEMM's output, before the GELU (fc1): no GELU epilogue
    if (!lora) throw std::logic_error(fmt::format("{}: forward without its adapter's call", weight().name));
    Tensor& pre = gelu_preact ? (*gelu_preact = Tensor::empty({N, w.dim(0)}, x.dtype(), x.device())) : out;
    recipe_->forward(x_full, w, pre,
                     {.trans_b = true,
                      .epilogue = has_bias_ ? Epilogue::bias : Epilogue::none,
                      .bias = has_bias_ ? &bias_.value : nullptr});
    lora_->forward(x_full, B, pre, *lora);
    if (gelu_preact) gelu_forward(pre, out);
    return out;
  }
  GemmOptions g{.trans_b = true};
  if (gelu_preact) {
    if (!has_bias_) throw std::logic_error(fmt::format("{}: the GELU epilogue needs a bias", weight().name));
    *gelu_preact = Tensor::empty({N, w.dim(0)}, x.dtype(), x.device());
    g.epilogue = Epilogue::gelu_bias;
    g.bias = &bias_.value;
    g.aux = gelu_preact;
  } else if (has_bias_) {
    g.epilogue = Epilogue::bias;
    g.bias = &bias_.value;
  }
  recipe_->forward(x_full, w, out, g);  // x_full is whole; the weight is this rank's rows of the logical one
  return out;
}

Tensor ColumnParallelLinear::backward(const Tensor& dout, const Tensor& x, int64_t B, BackwardOptions opt) {
  Parameter& w = weight();
  const int64_t N = dout.dim(0), in = w.value.dim(1);
  // Megatron's order: with SP the forward's input is gathered again (only the shard was kept) while dx is
  // computed; dx's reduction then travels while dW is computed.
  SequenceGather input(x, B, tp_);
  Tensor dx_partial = Tensor::empty({N, in}, dout.dtype(), dout.device());  // (N, in) this rank's share
  const RecipeGrad dy = recipe_->input_grad(dout, w, dx_partial, {});       // dx = dout @ W
  const Tensor x_full = input.wait();                                       // (N, in)
  if (lora_) {  // its input gradient joins this rank's share before the reduction
    if (!opt.lora) throw std::logic_error(fmt::format("{}: backward without its adapter's call", w.name));
    lora_->backward(dout, x_full, B, dx_partial, *opt.lora);
  }
  // Started here, waited for below. On NCCL the collective is enqueued on the communicator's stream behind
  // an event recorded on the compute stream at this call, so it reads dx_partial (or its rank-major copy)
  // only after the GEMM and copy that produce it; the communicator records its tensors' blocks with the
  // caching allocator (record_stream) and keeps them referenced until the op completes, so no later
  // allocation reuses them while it is in flight. On Gloo it has completed when the constructor returns.
  SequenceReduction dx(dx_partial, B, tp_);
  // dW (out/t, in) += dout^T x and the bias gradient (column sums of dout), while the reduction travels.
  recipe_->weight_grad(dy, x_full, w, has_bias_ && !opt.bias_grad_done ? &bias_ : nullptr);
  return dx.wait();  // (Ns, in): f backward, a reduce-scatter with SP
}

// ---- RowParallelLinear ---------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const LinearOptions& opt, const TensorParallel& tp)
    : tp_(tp), has_bias_(opt.bias) {
  check_split(opt, opt.in_features, "in_features", tp);
  const int64_t out = opt.out_features, in = opt.in_features;
  weight_ = make_parameter_slice(opt.name + ".weight",
                                 {.global = {out, in}, .start = {0, tp.begin(in)}, .local = {out, tp.count(in)}},
                                 opt.dtype, Init::normal, opt.init_std, opt.seed);
  if (has_bias_) bias_ = make_parameter(opt.name + ".bias", {out}, opt.dtype, Init::zeros, 0, opt.seed);
}

std::vector<Parameter*> RowParallelLinear::parameters() {
  std::vector<Parameter*> ps{&weight_};
  if (has_bias_) ps.push_back(&bias_);
  if (lora_)
    for (Parameter* p : lora_->parameters()) ps.push_back(p);
  return ps;
}

Tensor RowParallelLinear::forward(const Tensor& x, int64_t B, const LoraCall* lora) const {
  Tensor partial = Tensor::empty({x.dim(0), weight_.value.dim(0)}, x.dtype(), x.device());  // (N, out)
  recipe_->forward(x, weight_.value, partial, {.trans_b = true});  // x: this rank's columns of the logical input
  if (lora_) {  // the adapter's partial update rides on the same reduction
    if (!lora) throw std::logic_error(fmt::format("{}: forward without its adapter's call", weight_.name));
    lora_->forward(x, B, partial, *lora);
  }
  Tensor y = sequence_shard_sum(partial, B, tp_);  // (Ns, out): g, a reduce-scatter with SP
  // After the reduction, so no GEMM epilogue: added once, not once per rank.
  if (has_bias_) add_bias(y, bias_.value);
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dout, const Tensor& x, int64_t B, BackwardOptions opt) {
  const Tensor dout_full = sequence_to_full(dout, B, tp_);  // (N, out): g backward, an all-gather with SP
  Tensor dx = Tensor::empty({x.dim(0), x.dim(1)}, x.dtype(), x.device());  // (N, in/t)
  const RecipeGrad dy =
      recipe_->input_grad(dout_full, weight_, dx, {.epilogue = opt.dx_epilogue, .aux = opt.aux, .dbias = opt.dbias});
  if (lora_) {
    if (!opt.lora || opt.dx_epilogue != Epilogue::none)
      throw std::logic_error(fmt::format("{}: an adapter's backward needs its call and no dx epilogue", weight_.name));
    lora_->backward(dout_full, x, B, dx, *opt.lora);
  }
  // dW (out, in/t) += dout^T x; the bias gradient (column sums of dout, every rank the whole).
  recipe_->weight_grad(dy, x, weight_, has_bias_ ? &bias_ : nullptr);
  return dx;
}

}  // namespace mt
