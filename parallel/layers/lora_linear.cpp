// lora_linear.cpp: the low-rank adapter beside a tensor-parallel linear (parallel/layers/lora_linear.h).
#include "parallel/layers/lora_linear.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "parallel/pipeline/weight_grad.h"

namespace mt {

namespace {
constexpr const char* kA = ".lora_a";
constexpr const char* kB = ".lora_b";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

bool is_lora_parameter(const Parameter& p) { return ends_with(p.name, kA) || ends_with(p.name, kB); }

LoraAdapter::LoraAdapter(const LoraOptions& opt, LoraSide side, const TensorParallel& tp)
    : side_(side), tp_(tp), scale_(opt.alpha / static_cast<float>(opt.rank)), dropout_(opt.dropout) {
  const int64_t r = opt.rank, in = opt.in_features, out = opt.out_features;
  if (r <= 0) throw std::invalid_argument(fmt::format("{}: LoRA rank must be positive, got {}", opt.name, r));
  // PEFT's kaiming_uniform_(a=sqrt(5)) on A (r, in): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / in) = 1/sqrt(in).
  const auto bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)));
  if (side == LoraSide::column) {
    const int64_t o0 = tp.begin(out), local = tp.count(out);
    a_ = make_parameter(opt.name + kA, {r, in}, opt.dtype, Init::uniform, bound, opt.seed);
    a_.grad_sums.tensor = true;  // each rank's gradient covers its output columns' share of dh
    b_ = make_parameter_slice(opt.name + kB, {.global = {out, r}, .start = {o0, 0}, .local = {local, r}}, opt.dtype,
                              Init::zeros, 0, opt.seed);
  } else {
    col_offset_ = tp.begin(in);
    a_ = make_parameter_slice(opt.name + kA, {.global = {r, in}, .start = {0, col_offset_}, .local = {r, tp.count(in)}},
                              opt.dtype, Init::uniform, bound, opt.seed);
    b_ = make_parameter(opt.name + kB, {out, r}, opt.dtype, Init::zeros, 0, opt.seed);
    b_.grad_sums.tensor = true;  // each rank's gradient uses its partial h
  }
}

DropoutOptions LoraAdapter::keys(const LoraCall& call) const {
  DropoutOptions d = call.dropout;
  d.col_offset = col_offset_;  // the rows are the call's (whole local sequences, at their global positions)
  return d;
}

Tensor LoraAdapter::dropped(const Tensor& x, int64_t samples, const DropoutOptions& d) const {
  if (d.p == 0.f) return x;
  const int64_t N = x.dim(0), K = x.dim(1);
  Tensor out = Tensor::empty({N, K}, x.dtype(), x.device());
  Tensor out3 = out.view({samples, N / samples, K});
  dropout_forward(x.view({samples, N / samples, K}), out3, d);
  return out;
}

void LoraAdapter::forward(const Tensor& x, int64_t samples, Tensor& out, const LoraCall& call) const {
  const Tensor xd = dropped(x, samples, keys(call));                             // (N, in) or (N, in/t)
  Tensor h = Tensor::empty({x.dim(0), a_.value.dim(0)}, x.dtype(), x.device());  // (N, r)
  gemm(xd, a_.value, h, {.trans_b = true});
  gemm(h, b_.value, out, {.trans_b = true, .alpha = scale_, .beta = 1.f});  // out += scale h B^T
  if (call.saved) call.saved->h = h;
}

void LoraAdapter::backward(const Tensor& dout, const Tensor& x, int64_t samples, Tensor& dx, const LoraCall& call) {
  if (!call.saved || !call.saved->h.defined())
    throw std::logic_error(fmt::format("{}: backward without the forward's h", a_.name));
  const Tensor h = call.saved->h;  // (N, r)
  const DropoutOptions d = keys(call);
  Tensor dh = Tensor::empty(h.shape(), dout.dtype(), dout.device());  // (N, r) = scale dout B
  gemm(dout, b_.value, dh, {.alpha = scale_});
  if (d.p == 0.f) {
    gemm(dh, a_.value, dx, {.beta = 1.f});  // dx += dh A
  } else {
    Tensor dxd = Tensor::empty(dx.shape(), dx.dtype(), dx.device());
    gemm(dh, a_.value, dxd);
    const int64_t N = dx.dim(0), K = dx.dim(1);
    Tensor dxd3 = dxd.view({samples, N / samples, K});
    dropout_backward(dxd3, dxd3, d);
    add(dx, dxd, dx);
  }
  weight_grad_work([this, dout, x, h, dh, d, samples] {
    gemm(dout, h, b_.grad, {.trans_a = true, .alpha = scale_, .beta = 1.f});    // dB += scale dout^T h
    gemm(dh, dropped(x, samples, d), a_.grad, {.trans_a = true, .beta = 1.f});  // dA += dh^T dropout(x)
  });
}

}  // namespace mt
