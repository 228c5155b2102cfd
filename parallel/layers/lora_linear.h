// lora_linear.h: a low-rank adapter (Hu et al., "LoRA", 2021) beside a tensor-parallel linear, sharded to match it:
//
//   y = W x + (alpha / r) * B A dropout(x)        A (r, in) kaiming-uniform (PEFT's a = sqrt(5): U(+-1/sqrt(in))),
//                                                 B (out, r) zeros, so training starts from the base model.
//
//   beside a ColumnParallelLinear (qkv, fc1): A replicated, B split on its output rows like W (out/t, r). x is the
//     gathered input, so h = A x is whole on every rank and B's slice gives this rank's output columns exactly.
//   beside a RowParallelLinear (proj, fc2): A split on its input columns like W (r, in/t), B replicated. Each rank's
//     h_r = A_r x_r is a partial sum; B h_r is added to the linear's partial output before its reduction (the TP
//     all-reduce, or the reduce-scatter with SP), which sums it exactly as it sums W_r x_r: no extra collective.
//
// Backward: dh = (alpha / r) dout B. Beside a column-parallel linear dout is this rank's columns, so dh, the input
// gradient dh A and A's gradient dh^T x are partial sums: the input gradient rides on the linear's reduction and A's
// gradient is summed over the tensor-parallel group with the replicas' sums (Parameter::grad_sums.tensor). Beside a
// row-parallel linear dout is whole: dh, A's slice gradient and the input gradient are exact, and B's gradient
// (alpha / r) dout^T h_r is a partial sum, summed over the group the same way. Every layout computes the same sums.
//
// The dropout mask is keyed by global (sample, position, input column), so every layout drops the same entries.
#pragma once
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/parameter.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

enum class LoraSide { column, row };  // the tensor-parallel linear it sits beside

struct LoraOptions {
  std::string name;          // the linear's ("layers.3.attn.qkv"): parameters <name>.lora_a, <name>.lora_b
  int64_t in_features = 0;   // global, the linear's
  int64_t out_features = 0;  // global, the linear's
  int64_t rank = 0;
  float alpha = 16.f;  // the update is scaled by alpha / rank
  float dropout = 0.f;
  DType dtype = DType::f32;
  uint64_t seed = 0;
};

// What the adapter keeps of one microbatch for backward.
struct LoraSaved {
  Tensor h;  // (N, r) A dropout(x): whole beside a column-parallel linear, this rank's partial sum beside a row one
};

// One microbatch's use of an adapter: where its forward keeps h, and its dropout's keys (p 0 outside training; the
// adapter sets the column offset).
struct LoraCall {
  LoraSaved* saved = nullptr;
  DropoutOptions dropout;
};

class LoraAdapter {
 public:
  LoraAdapter(const LoraOptions& opt, LoraSide side, const TensorParallel& tp);

  // x: the linear's input as its GEMM sees it ((N, in) gathered beside a column-parallel linear, (N, in/t) beside a
  // row-parallel one), B samples of N / B positions. out (the linear's GEMM output: (N, out/t), or the (N, out)
  // partial before the reduction) += scale * B A dropout(x). Keeps h in call.saved.
  void forward(const Tensor& x, int64_t samples, Tensor& out, const LoraCall& call) const;
  // dout: the GEMM output's gradient ((N, out/t), or (N, out) whole beside a row-parallel linear); x as in forward.
  // dx (x's shape) += the adapter's input gradient (beside a column-parallel linear this rank's share, which the
  // linear's reduction sums). A's and B's gradients accumulate as weight-gradient work (parallel/pipeline/weight_grad.h).
  void backward(const Tensor& dout, const Tensor& x, int64_t samples, Tensor& dx, const LoraCall& call);

  std::vector<Parameter*> parameters() { return {&a_, &b_}; }  // A then B
  const Parameter& a() const { return a_; }
  const Parameter& b() const { return b_; }
  float scale() const { return scale_; }
  // w (the linear's weight slice) += scale * B A: the merged weight, for code that computes with the weights alone
  // (generation's KV-cache decoder).
  void merge_into(Tensor& w) const { gemm(b_.value, a_.value, w, {.alpha = scale_, .beta = 1.f}); }

 private:
  // dropout(x) with the adapter's keys (x itself when p is 0).
  Tensor dropped(const Tensor& x, int64_t samples, const DropoutOptions& d) const;
  DropoutOptions keys(const LoraCall& call) const;

  LoraSide side_;
  TensorParallel tp_;
  float scale_ = 1.f;
  float dropout_ = 0.f;
  int64_t col_offset_ = 0;  // the first global input column of x (beside a row-parallel linear: this rank's)
  Parameter a_;             // (r, in) replicated, or (r, in/t) beside a row-parallel linear
  Parameter b_;             // (out/t, r) beside a column-parallel linear, or (out, r) replicated
};

// Whether a parameter is one of the adapters' (named <linear>.lora_a / <linear>.lora_b).
bool is_lora_parameter(const Parameter& p);

}  // namespace mt
