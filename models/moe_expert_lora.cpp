// moe_expert_lora.cpp: LoRA adapters on a MoE layer's experts (models/moe_expert_lora.h).
#include "models/moe_expert_lora.h"

#include <fmt/format.h>

#include "core/tensor/ops.h"
#include "parallel/pipeline/weight_grad.h"

namespace mt {

ExpertRows::ExpertRows(const std::vector<int64_t>& expert_rows) {
  int64_t row = 0;
  for (size_t l = 0; l < expert_rows.size(); ++l) {
    const int64_t n = expert_rows[l];
    if (n == 0) continue;
    experts.push_back(l);
    rows.emplace_back(row, row + n);
    row += n;
  }
}

std::vector<Tensor> ExpertRows::slices(const Tensor& t) const {
  std::vector<Tensor> out;
  for (const auto& [begin, end] : rows) out.push_back(t.slice(begin, end));
  return out;
}

namespace {

// The groups' adapters' A and B values, and their gradients.
struct Factors {
  std::vector<Tensor> a, b, da, db;
  Factors(const ExpertRows& g, const std::vector<LoraAdapter>& adapters) {
    for (size_t l : g.experts) {
      const LoraAdapter& ad = adapters.at(l);
      a.push_back(ad.a().value);
      b.push_back(ad.b().value);
      da.push_back(ad.a().grad);
      db.push_back(ad.b().grad);
    }
  }
};

// The update of one targeted linear, out += s (in A^T) B^T per group, keeping h = in A^T (Re, r).
void update_forward(const ExpertRows& g, const std::vector<LoraAdapter>& adapters, int64_t r, float scale,
                    const Tensor& in, Tensor& out, Tensor& h) {
  h = Tensor::empty({in.dim(0), r}, in.dtype(), in.device());
  const Factors f(g, adapters);
  std::vector<Tensor> ins = g.slices(in), hs = g.slices(h), outs = g.slices(out);
  gemm_grouped(ins, f.a, hs, GemmOptions{.trans_b = true});                                // h = in A^T
  gemm_grouped(hs, f.b, outs, GemmOptions{.trans_b = true, .alpha = scale, .beta = 1.f});  // out += s h B^T
}

// Its backward: din += s (dout B) A; dB += s dout^T h, dA += (s dout B)^T in.
void update_backward(const ExpertRows& g, std::vector<LoraAdapter>& adapters, float scale, const Tensor& dout,
                     const Tensor& in, const Tensor& h, Tensor& din) {
  Tensor dh = Tensor::empty(h.shape(), dout.dtype(), dout.device());  // (Re, r) = s dout B
  const Factors f(g, adapters);
  std::vector<Tensor> douts = g.slices(dout), ins = g.slices(in), hs = g.slices(h), dhs = g.slices(dh),
                      dins = g.slices(din);
  gemm_grouped(douts, f.b, dhs, GemmOptions{.alpha = scale});
  gemm_grouped(dhs, f.a, dins, GemmOptions{.beta = 1.f});
  weight_grad_work([douts, ins, hs, dhs, da = f.da, db = f.db, scale]() mutable {
    gemm_grouped(douts, hs, db, GemmOptions{.trans_a = true, .alpha = scale, .beta = 1.f});
    gemm_grouped(dhs, ins, da, GemmOptions{.trans_a = true, .beta = 1.f});
  });
}

}  // namespace

ExpertAdapters::ExpertAdapters(const LoraConfig& lora, const Shape& shape, DType dtype, uint64_t seed,
                               const TensorParallel& expert_tp, const TensorParallel& tp)
    : scale_(static_cast<float>(lora.alpha / static_cast<double>(lora.rank))), rank_(lora.rank) {
  auto options = [&](const std::string& linear, int64_t in, int64_t out) {
    return LoraOptions{.name = linear,
                       .in_features = in,
                       .out_features = out,
                       .rank = lora.rank,
                       .alpha = static_cast<float>(lora.alpha),
                       .dtype = dtype,
                       .seed = seed};
  };
  const int64_t C = shape.hidden, El = shape.local_experts;
  auto experts = [&](const char* target, const char* linear, int64_t in, int64_t out, LoraSide side,
                     std::vector<LoraAdapter>& into) {
    if (!lora.targets_any(target)) return;
    into.reserve(static_cast<size_t>(El));  // parameters() points into them: no reallocation after
    for (int64_t l = 0; l < El; ++l) {
      into.emplace_back(options(fmt::format("{}.experts.{}.{}", shape.prefix, shape.first_expert + l, linear), in, out),
                        side, expert_tp);
      for (Parameter* p : into.back().parameters()) p->expert = true;
    }
  };
  experts("fc1", "fc1", C, shape.fc1_rows, LoraSide::column, fc1_);
  experts("fc2", "fc2", shape.width, C, LoraSide::row, fc2_);
  if (shape.shared_width > 0) {
    if (lora.targets_any("fc1"))
      shared_fc1_ = std::make_shared<LoraAdapter>(
          options(shape.prefix + ".shared_expert.fc1", C, shape.shared_fc1_rows), LoraSide::column, tp);
    if (lora.targets_any("fc2"))
      shared_fc2_ = std::make_shared<LoraAdapter>(options(shape.prefix + ".shared_expert.fc2", shape.shared_width, C),
                                                  LoraSide::row, tp);
  }
}

std::vector<Parameter*> ExpertAdapters::expert_parameters(size_t l) {
  std::vector<Parameter*> out;
  for (std::vector<LoraAdapter>* v : {&fc1_, &fc2_})
    if (!v->empty())
      for (Parameter* p : v->at(l).parameters()) out.push_back(p);
  return out;
}

std::vector<Parameter*> ExpertAdapters::shared_parameters() {
  std::vector<Parameter*> out;
  for (LoraAdapter* a : {shared_fc1_.get(), shared_fc2_.get()})
    if (a)
      for (Parameter* p : a->parameters()) out.push_back(p);
  return out;
}

void ExpertAdapters::forward_fc1(const ExpertRows& g, const Tensor& x, Tensor& h, ExpertLoraSaved& s) const {
  if (fc1()) update_forward(g, fc1_, rank_, scale_, x, h, s.h1);
}

void ExpertAdapters::forward_fc2(const ExpertRows& g, const Tensor& act, Tensor& y, ExpertLoraSaved& s) const {
  if (fc2()) update_forward(g, fc2_, rank_, scale_, act, y, s.h2);
}

void ExpertAdapters::backward_fc2(const ExpertRows& g, const Tensor& dy, const Tensor& act, const ExpertLoraSaved& s,
                                  Tensor& dact) {
  if (fc2()) update_backward(g, fc2_, scale_, dy, act, s.h2, dact);
}

void ExpertAdapters::backward_fc1(const ExpertRows& g, const Tensor& dh, const Tensor& x, const ExpertLoraSaved& s,
                                  Tensor& dx) {
  if (fc1()) update_backward(g, fc1_, scale_, dh, x, s.h1, dx);
}

void ExpertAdapters::merge_into(size_t l, Tensor& w1, Tensor& w2) const {
  if (fc1()) fc1_.at(l).merge_into(w1);
  if (fc2()) fc2_.at(l).merge_into(w2);
}

void ExpertAdapters::merge_shared_into(Tensor& w1, Tensor& w2) const {
  if (shared_fc1_) shared_fc1_->merge_into(w1);
  if (shared_fc2_) shared_fc2_->merge_into(w2);
}

void ExpertAdapters::clear() {
  fc1_.clear();
  fc2_.clear();
  shared_fc1_.reset();
  shared_fc2_.reset();
}

}  // namespace mt
