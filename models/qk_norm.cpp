// qk_norm.cpp: QK-norm over slot-major rows (see qk_norm.h).
#include "models/qk_norm.h"

#include "core/tensor/ops.h"

namespace mt {
namespace {

struct Slots {
  int64_t S, D, NG;  // slots per group (R + 2), head width, token-groups (N G)
  int64_t R() const { return S - 2; }
};

Slots slots_of(const Tensor& qkv) {
  const int64_t S = qkv.dim(qkv.ndim() - 2), D = qkv.dim(qkv.ndim() - 1);
  return {S, D, qkv.numel() / (S * D)};
}

}  // namespace

QkNorm::QkNorm(const PartOptions& opt, int64_t D, float eps)
    : q_(opt.name("attn.q_norm"), D, NormKind::rmsnorm, eps, opt.dtype, opt.seed),
      k_(opt.name("attn.k_norm"), D, NormKind::rmsnorm, eps, opt.dtype, opt.seed) {
  for (Parameter* p : parameters()) p->grad_sums.tensor = true;  // each rank's gradient covers its own heads
}

Tensor QkNorm::forward(const Tensor& qkv, Saved& s) const {
  const Slots n = slots_of(qkv);
  s.slots = Tensor::empty({n.S, n.NG, n.D}, qkv.dtype(), qkv.device());
  transpose_blocks(qkv.view({n.NG, n.S, n.D}), s.slots);
  Tensor normed = Tensor::empty({n.S, n.NG, n.D}, qkv.dtype(), qkv.device());
  normed.slice(0, n.R()).copy_from(q_.forward(s.slots.slice(0, n.R()).view({n.R() * n.NG, n.D}), s.q));
  normed.slice(n.R(), n.R() + 1).copy_from(k_.forward(s.slots.slice(n.R(), n.R() + 1).view({n.NG, n.D}), s.k));
  normed.slice(n.R() + 1, n.S).copy_from(s.slots.slice(n.R() + 1, n.S));
  s.q.out = s.k.out = Tensor();  // copied into `normed`: the backward needs only the input and rstd
  Tensor out = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  Tensor rows = out.view({n.NG, n.S, n.D});
  transpose_blocks(normed, rows);
  return out;
}

Tensor QkNorm::backward(const Tensor& dqkv, const Saved& s) {
  const Slots n = slots_of(dqkv);
  Tensor d = Tensor::empty({n.S, n.NG, n.D}, dqkv.dtype(), dqkv.device());  // slot-major; the values' stay
  transpose_blocks(dqkv.view({n.NG, n.S, n.D}), d);
  const Tensor dq =
      q_.backward(d.slice(0, n.R()).view({n.R() * n.NG, n.D}), s.slots.slice(0, n.R()).view({n.R() * n.NG, n.D}), s.q);
  const Tensor dk =
      k_.backward(d.slice(n.R(), n.R() + 1).view({n.NG, n.D}), s.slots.slice(n.R(), n.R() + 1).view({n.NG, n.D}), s.k);
  d.slice(0, n.R()).copy_from(dq);
  d.slice(n.R(), n.R() + 1).copy_from(dk);
  Tensor dx = Tensor::empty(dqkv.shape(), dqkv.dtype(), dqkv.device());
  Tensor rows = dx.view({n.NG, n.S, n.D});
  transpose_blocks(d, rows);
  return dx;
}

std::vector<Parameter*> QkNorm::parameters() {
  std::vector<Parameter*> p = q_.parameters();
  for (Parameter* k : k_.parameters()) p.push_back(k);
  return p;
}

}  // namespace mt
