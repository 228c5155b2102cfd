// moe_expert_lora.h: LoRA adapters on a mixture-of-experts layer (models/moe_mlp.h) when finetune.lora targets fc1 or
// fc2: each of this rank's experts has its own A and B beside its fc1 (gate and up, interleaved as the weight's rows)
// and its fc2, computed as grouped GEMMs over the experts' row slices as the experts' weights are; the shared expert's
// linears have plain adapters (parallel/layers/lora_linear.h). The router stays frozen.
//
//   h_e += s (x_e A1_e^T) B1_e^T      A1_e (r, C) replicated over the experts' tensor-parallel ranks, B1_e (F1/etp, r)
//   y_e += s (act_e A2_e^T) B2_e^T    A2_e (r, F/etp), B2_e (C, r) replicated over them
//
// So each expert's adapter is split as lora_linear.h splits one beside a column- (fc1) and a row-parallel (fc2)
// linear, over the experts' tensor-parallel group (parallel.expert_tensor): A1's and B2's gradients are partial sums
// there (Parameter::grad_sums.tensor; the experts' gradient buffer sums them over that group), and the experts'
// outputs and input gradients ride on the layer's tensor-parallel sum. Every adapter parameter of an expert is an
// expert parameter (Parameter::expert): held by the expert's EP rank, its gradient reduced over the
// expert-data-parallel group with the experts'. Names: <prefix>.experts.<e>.fc1.lora_a (global expert index e), and
// <prefix>.shared_expert.fc1.lora_a. No adapter dropout (the config refuses it, as PEFT's ParamWrapper does).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config/config.h"
#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "parallel/layers/lora_linear.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

// The local experts that have rows, as the groups of gemm_grouped: expert l's rows are the slice of the expert-major
// row tensors at its offset (experts without rows are left out: a GEMM over zero rows does nothing).
struct ExpertRows {
  std::vector<size_t> experts;                    // the local experts with rows, in order
  std::vector<std::pair<int64_t, int64_t>> rows;  // their [begin, end) rows

  explicit ExpertRows(const std::vector<int64_t>& expert_rows);
  // Each group's rows of t (Re, ...): views, so a GEMM's output writes into t.
  std::vector<Tensor> slices(const Tensor& t) const;
};

// What the experts' adapters keep of one microbatch: (Re, r) x A1^T and act A2^T, expert-major.
struct ExpertLoraSaved {
  Tensor h1, h2;
};

class ExpertAdapters {
 public:
  ExpertAdapters() = default;
  struct Shape {
    std::string prefix;           // the layer's ("layers.3.mlp")
    int64_t first_expert = 0;     // this rank's first expert (global index)
    int64_t local_experts = 0;    // E / ep
    int64_t hidden = 0;           // C
    int64_t fc1_rows = 0;         // F1: F, or 2F gate and up (SwiGLU), global
    int64_t width = 0;            // F, global
    int64_t shared_width = 0;     // Fs (0: no shared expert)
    int64_t shared_fc1_rows = 0;  // Fs1
  };
  // Adapters beside the linears lora targets (lora.enabled()); `expert_tp` the experts' split, `tp` the shared
  // expert's.
  ExpertAdapters(const LoraConfig& lora, const Shape& shape, DType dtype, uint64_t seed,
                 const TensorParallel& expert_tp, const TensorParallel& tp);

  bool fc1() const { return !fc1_.empty(); }
  bool fc2() const { return !fc2_.empty(); }
  LoraAdapter* shared_fc1() const { return shared_fc1_.get(); }
  LoraAdapter* shared_fc2() const { return shared_fc2_.get(); }

  // Expert l's adapters' parameters (fc1's A, B, then fc2's; none untargeted), and the shared expert's.
  std::vector<Parameter*> expert_parameters(size_t l);
  std::vector<Parameter*> shared_parameters();

  // Forward, over the groups g of the expert-major rows: h (Re, F1) += fc1's update of x (Re, C); y (Re, C) += fc2's
  // update of act (Re, F). Keep their low-rank rows in s.
  void forward_fc1(const ExpertRows& g, const Tensor& x, Tensor& h, ExpertLoraSaved& s) const;
  void forward_fc2(const ExpertRows& g, const Tensor& act, Tensor& y, ExpertLoraSaved& s) const;
  // Backward: dact (Re, F) += fc2's input gradient from dy (Re, C); dx (Re, C) += fc1's from dh (Re, F1). The adapters'
  // gradients accumulate as weight-gradient work (parallel/pipeline/weight_grad.h).
  void backward_fc2(const ExpertRows& g, const Tensor& dy, const Tensor& act, const ExpertLoraSaved& s, Tensor& dact);
  void backward_fc1(const ExpertRows& g, const Tensor& dh, const Tensor& x, const ExpertLoraSaved& s, Tensor& dx);

  // Folds expert l's adapters into its weights (w1 += s B1 A1, w2 += s B2 A2) and the shared expert's into its
  // (generation), then drops every adapter.
  void merge_into(size_t l, Tensor& w1, Tensor& w2) const;
  void merge_shared_into(Tensor& w1, Tensor& w2) const;
  void clear();

 private:
  float scale_ = 1.f;
  int64_t rank_ = 0;
  std::vector<LoraAdapter> fc1_, fc2_;  // per local expert; empty when not targeted
  std::shared_ptr<LoraAdapter> shared_fc1_, shared_fc2_;
};

}  // namespace mt
