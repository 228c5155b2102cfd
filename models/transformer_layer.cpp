#include "models/transformer_layer.h"

#include <stdexcept>

#include <fmt/format.h>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "models/moe_block.h"

namespace mt {

TransformerLayer::TransformerLayer(const ModelConfig& cfg, const PartOptions& opt, bool recompute)
    : cfg_(cfg), opt_(opt), recompute_(recompute) {
  const LayerSpec spec = LayerSpec::of(cfg, opt.layer);
  auto branch = [&](const char* norm, std::unique_ptr<BlockPart> part, const char* site) {
    Branch b{.norm = Norm(opt.name(norm), cfg.hidden_size, spec.norm, cfg.layernorm_eps, opt.dtype, opt.seed),
             .part = std::move(part),
             .site = stream_id(opt.name(site))};
    if (opt.tp.sequence_parallel) b.norm.mark_sequence_parallel();
    branches_.push_back(std::move(b));
  };
  branch("ln1", make_attention(spec, cfg, opt), "attn.out");
  branch("ln2", make_mlp(spec, cfg, opt), "mlp.out");
}

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> ps;
  for (Branch& b : branches_)
    for (const std::vector<Parameter*>& more : {b.norm.parameters(), b.part->parameters()})
      ps.insert(ps.end(), more.begin(), more.end());
  return ps;
}

MoeMlp* TransformerLayer::moe() {
  for (Branch& b : branches_)
    if (auto* m = dynamic_cast<MoeBlock*>(b.part.get())) return &m->mlp();
  return nullptr;
}

void TransformerLayer::enable_fp8(const std::shared_ptr<Fp8Context>& ctx) {
  for (Branch& b : branches_) b.part->enable_fp8(ctx);
}

void TransformerLayer::merge_lora() {
  for (Branch& b : branches_) b.part->merge_lora();
}

DropoutOptions TransformerLayer::residual_dropout(const StepContext& ctx, uint64_t site, int64_t T) const {
  return opt_.cp.with_rows(
      {.p = ctx.training ? cfg_.dropout : 0.f, .seed = ctx.seed, .site = site, .sample_offset = ctx.sample_offset}, T,
      opt_.tp.shard_offset(T), opt_.tp.shard_length(T));
}

PartStep TransformerLayer::part_step(const Activations& a, bool record, float dloss) const {
  const Tensor& x = a.branches.front().in;
  const int64_t Ts = x.dim(1);
  return {.ctx = &a.ctx,
          .samples = x.dim(0),
          .tokens = opt_.tp.sequence_sharded() ? Ts * opt_.tp.size : Ts,
          .record = record,
          .dloss = dloss};
}

Tensor TransformerLayer::run(Activations& a, bool keep, bool record) {
  a.branches.resize(branches_.size());
  const PartStep step = part_step(a, record, 1.f);
  const int64_t B = step.samples, Ts = a.branches.front().in.dim(1), C = cfg_.hidden_size, Ns = B * Ts;
  // Each branch's output lives until the layer's forward returns.
  std::vector<Tensor> outputs;
  Tensor h = a.branches.front().in;
  for (size_t i = 0; i < branches_.size(); ++i) {
    const Branch& b = branches_[i];
    BranchSaved& s = a.branches[i];
    s.in = h;
    b.norm.forward(h.view({Ns, C}), s.n);
    outputs.push_back(b.part->forward(s.n.out, s.part, step));  // (Ns, C)
    h = Tensor::empty({B, Ts, C}, opt_.dtype, opt_.device);
    dropout_add(outputs.back().view({B, Ts, C}), s.in, h, residual_dropout(a.ctx, b.site, step.tokens));
  }
  if (!keep) {
    Tensor x = a.branches.front().in;
    a.branches.clear();
    a.branches.resize(1);
    a.branches.front().in = x;
  }
  return h;
}

TransformerLayer::Activations TransformerLayer::starting(const Tensor& x, const StepContext& ctx) {
  Activations a;
  a.ctx = ctx;
  a.branches.resize(1);
  a.branches.front().in = x;
  return a;
}

Tensor TransformerLayer::forward(const Tensor& x, int mb, const StepContext& ctx) {
  Activations a = starting(x, ctx);
  Tensor out = run(a, ctx.training && !recompute_, ctx.training);
  if (ctx.training) {
    if (!recompute_) drop_selected(a);
    saved_[mb] = std::move(a);
  }
  return out;
}

Tensor TransformerLayer::forward_unkept(const Tensor& x, const StepContext& ctx) {
  Activations a = starting(x, ctx);
  return run(a, false, ctx.training);  // a training forward: a MoE part counts its routing once, here
}

Tensor TransformerLayer::forward_again(const Tensor& x, int mb, const StepContext& ctx) {
  if (recompute_)  // its backward would run the forward a third time
    throw std::logic_error(fmt::format("layer {}: forward_again on a layer that recomputes itself", opt_.layer));
  Activations a = starting(x, ctx);
  Tensor out = run(a, true, false);
  saved_[mb] = std::move(a);
  return out;
}

void TransformerLayer::drop_selected(Activations& a) const {
  for (size_t i = 0; i < branches_.size(); ++i) {
    if (opt_.selective.layernorm) a.branches[i].n.out = Tensor();
    branches_[i].part->drop_selected(a.branches[i].part);
  }
}

void TransformerLayer::recompute_selected(Activations& a) {
  const int64_t C = cfg_.hidden_size;
  if (opt_.selective.layernorm)
    for (size_t i = 0; i < branches_.size(); ++i) {
      BranchSaved& s = a.branches[i];
      branches_[i].norm.forward(s.in.view({s.in.dim(0) * s.in.dim(1), C}), s.n);
    }
  const PartStep step = part_step(a, false, 1.f);
  for (size_t i = 0; i < branches_.size(); ++i) branches_[i].part->recompute_selected(a.branches[i].part, step);
}

Tensor TransformerLayer::backward(const Tensor& dout, int mb, float dloss) {
  auto it = saved_.find(mb);
  if (it == saved_.end())
    throw std::logic_error(fmt::format("layer {}: backward of microbatch {} without forward", opt_.layer, mb));
  Activations a = std::move(it->second);
  saved_.erase(it);
  if (recompute_)
    run(a, true, false);  // the same inputs and dropout keys give the same activations
  else if (opt_.selective.any())
    recompute_selected(a);
  const PartStep step = part_step(a, false, dloss);
  const int64_t B = step.samples, Ts = a.branches.front().in.dim(1), C = cfg_.hidden_size, Ns = B * Ts;

  // Each branch, last first: d(in) = d(out) + norm'(part'(dropout'(d(out)))). Its gradients live until the layer's
  // backward returns.
  std::vector<Tensor> held;
  Tensor d = dout.view({Ns, C});
  for (size_t i = branches_.size(); i-- > 0;) {
    Branch& b = branches_[i];
    BranchSaved& s = a.branches[i];
    Tensor dpart = Tensor::empty({Ns, C}, opt_.dtype, opt_.device);
    Tensor dpart_btc = dpart.view({B, Ts, C});
    dropout_backward(d.view({B, Ts, C}), dpart_btc, residual_dropout(a.ctx, b.site, step.tokens));
    const Tensor dnorm = b.part->backward(dpart, s.n.out, s.part, step);  // (Ns, C)
    Tensor din = b.norm.backward(dnorm, s.in.view({Ns, C}), s.n);
    add(din, d, din);
    held.insert(held.end(), {dpart, dnorm, d});
    d = din;
  }
  return d.view({B, Ts, C});
}

Tensor TransformerLayer::decode(const Tensor& x, DecodeCache& cache, const DecodeStep& step) const {
  cache.parts.resize(branches_.size());
  Tensor h = x;  // (n, C)
  for (size_t i = 0; i < branches_.size(); ++i) {
    Norm::Saved n;
    branches_[i].norm.forward(h, n);
    const Tensor y = branches_[i].part->decode(n.out, cache.parts[i], step);
    Tensor out = Tensor::empty(h.shape(), h.dtype(), h.device());
    add(h, y, out);
    h = out;
  }
  return h;
}

}  // namespace mt
