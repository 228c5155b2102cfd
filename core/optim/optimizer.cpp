#include "core/optim/optimizer.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "core/tensor/ops.h"

namespace mt {

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coeff = max_norm / (grad_norm + 1e-6);
  return coeff < 1.0 ? coeff : 1.0;
}

AdamW::AdamW(std::vector<Parameter*> params, AdamWConfig cfg) : Optimizer(std::move(cfg)) {
  if (cfg_.offload.enabled) {
    // One flat host state, each parameter's elements in turn; the values stay on the device.
    std::vector<HostOffload::Segment> segments;
    int64_t n = 0;
    for (const Parameter* p : params) {
      segments.push_back({.begin = n, .end = n + p->value.numel(), .decay = p->weight_decay});
      n += p->value.numel();
    }
    const DType dtype = params.empty() ? DType::f32 : params[0]->value.dtype();
    for (const Parameter* p : params)
      if (p->value.dtype() != dtype || p->value.device() != params[0]->value.device())
        throw std::invalid_argument(fmt::format(
            "optimizer.offload: parameter {} is {} on {}, {} is {} on {}: offload needs one dtype and device", p->name,
            dtype_name(p->value.dtype()), device_name(p->value.device()), params[0]->name, dtype_name(dtype),
            device_name(params[0]->value.device())));
    offload_ = std::make_unique<HostOffload>(n, std::move(segments), dtype,
                                             params.empty() ? Device::cpu : params[0]->value.device(), cfg_.offload);
    int64_t at = 0;
    for (Parameter* p : params) {
      const int64_t e = at + p->value.numel();
      auto view = [&](const Tensor& t) { return t.slice(at, e).view(p->value.shape()); };
      Slot s{.param = p,
             .master = view(offload_->master()),
             .exp_avg = view(offload_->exp_avg()),
             .exp_avg_sq = view(offload_->exp_avg_sq())};
      s.master.copy_from(p->value);
      slots_.push_back(std::move(s));
      at = e;
    }
    return;
  }
  for (Parameter* p : params) {
    Slot s{.param = p};
    if (p->value.dtype() == DType::f32) {
      s.master = p->value;
    } else {
      s.master = Tensor::empty(p->value.shape(), DType::f32, p->value.device(), MemKind::optimizer);
      s.master.copy_from(p->value);
    }
    s.exp_avg = Tensor::zeros(p->value.shape(), DType::f32, p->value.device(), MemKind::optimizer);
    s.exp_avg_sq = Tensor::zeros(p->value.shape(), DType::f32, p->value.device(), MemKind::optimizer);
    slots_.push_back(std::move(s));
  }
}

void AdamW::zero_grads() {
  for (Slot& s : slots_) s.param->grad.zero_();
}

void AdamW::sync_values_from_master() {
  for (Slot& s : slots_)
    if (s.master.raw() != s.param->value.raw()) s.param->value.copy_from(s.master);
}

bool counts_in_grad_norm(const Parameter& p, const AdamWConfig& cfg) {
  return !p.tied_copy && (p.tensor_parallel || cfg.count_replicas);
}

StepResult grad_norm_verdict(const GradStats& stats, double loss_scale, double grad_clip, double* grad_scale) {
  StepResult r;
  r.grad_norm = std::sqrt(stats.sum_squares) / loss_scale;
  r.found_inf = stats.found_inf || !std::isfinite(r.grad_norm);
  *grad_scale = r.found_inf ? 0.0 : clip_coefficient(r.grad_norm, grad_clip) / loss_scale;
  return r;
}

AdamWOptions adamw_options(const AdamWConfig& cfg, double lr, int64_t step, double grad_scale) {
  return AdamWOptions{.lr = static_cast<float>(lr),
                      .beta1 = static_cast<float>(cfg.beta1),
                      .beta2 = static_cast<float>(cfg.beta2),
                      .eps = static_cast<float>(cfg.eps),
                      .weight_decay = static_cast<float>(cfg.weight_decay),
                      .step = step,
                      .grad_scale = static_cast<float>(grad_scale)};
}

std::vector<GradStats> read_grad_stats(const std::vector<GradNormGroup>& groups, const StepCheck* check,
                                       std::vector<double>* along) {
  const auto G = static_cast<int64_t>(groups.size());
  const int64_t n = check ? check->read_along.numel() : 0;
  Device device = check ? check->read_along.device() : Device::cpu;
  for (const GradNormGroup& g : groups)
    if (!check && !g.grads.empty()) device = g.grads.front().device();
  Tensor all = f64_zeros(2 * G + n, device);  // (2 G + n): each group's statistics, then read_along
  for (int64_t g = 0; g < G; ++g) {
    Tensor stats = all.slice(2 * g, 2 * g + 2);
    grad_stats(groups[static_cast<size_t>(g)].grads, stats);
  }
  if (check) all.slice(2 * G, 2 * G + n).copy_from(check->read_along);
  const std::vector<double> v = read_f64(all);  // the one read of the device
  if (check) along->assign(v.begin() + 2 * G, v.end());
  std::vector<GradStats> out;
  for (int64_t g = 0; g < G; ++g)
    out.push_back(
        {.sum_squares = v[static_cast<size_t>(2 * g)], .found_inf = v[static_cast<size_t>(2 * g + 1)] != 0.0});
  return out;
}

ExpertSplitOptimizer::ExpertSplitOptimizer(std::unique_ptr<Optimizer> dense, std::unique_ptr<Optimizer> experts,
                                           std::function<double(double)> sum_over_experts, bool keep_experts,
                                           AdamWConfig cfg)
    : Optimizer(std::move(cfg)), dense_(std::move(dense)), experts_(std::move(experts)),
      sum_over_experts_(std::move(sum_over_experts)), keep_experts_(keep_experts) {}

std::vector<Tensor> ExpertSplitOptimizer::counted_grads() const {
  std::vector<Tensor> out = dense_->counted_grads();
  for (Tensor& t : experts_->counted_grads()) out.push_back(t);
  return out;
}

std::vector<GradNormGroup> ExpertSplitOptimizer::norm_groups() {
  std::vector<GradNormGroup> out = dense_->norm_groups();
  for (GradNormGroup& g : experts_->norm_groups())
    out.push_back(
        {.grads = std::move(g.grads), .sum = [this, sum = g.sum](double x) { return sum_over_experts_(sum(x)); }});
  return out;
}

void ExpertSplitOptimizer::update(const AdamWOptions& opt) {
  dense_->update(opt);
  experts_->update(opt);
}

std::vector<Optimizer::Slot> ExpertSplitOptimizer::gather_state(bool keep) {
  std::vector<Slot> out = dense_->gather_state(keep);
  for (Slot& s : experts_->gather_state(keep_experts_)) out.push_back(std::move(s));
  return out;
}

void ExpertSplitOptimizer::load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool partial) {
  dense_->load_state(fill, partial);
  experts_->load_state(fill, partial);
}

GradStats read_grad_stats(const std::vector<Tensor>& xs, const StepCheck* check, std::vector<double>* along) {
  if (!check) return grad_stats(xs);
  const int64_t n = check->read_along.numel();
  Tensor both = f64_zeros(2 + n, check->read_along.device());  // (2 + n): the statistics, then read_along
  Tensor stats = both.slice(0, 2);
  grad_stats(xs, stats);
  both.slice(2, 2 + n).copy_from(check->read_along);
  const std::vector<double> v = read_f64(both);  // the one read of the device
  along->assign(v.begin() + 2, v.end());
  return GradStats{.sum_squares = v[0], .found_inf = v[1] != 0.0};
}

std::vector<GradNormGroup> Optimizer::norm_groups() {
  return {GradNormGroup{.grads = counted_grads(), .sum = [this](double x) { return sum_over_state_shards(x); }}};
}

StepResult Optimizer::step(double lr, double loss_scale, const StepCheck* check) {
  std::vector<double> along;
  const std::vector<GradNormGroup> groups = norm_groups();
  GradStats stats;
  if (groups.size() == 1) {
    stats = read_grad_stats(groups[0].grads, check, &along);  // the step's one read of the device
    // Host exchanges of the double partial sums; an inf/NaN flag needs none, as it makes the sum non-finite on
    // every rank.
    stats.sum_squares = groups[0].sum(stats.sum_squares);
  } else {
    const std::vector<GradStats> each = read_grad_stats(groups, check, &along);  // one read for every group
    for (size_t g = 0; g < groups.size(); ++g) {
      stats.sum_squares += groups[g].sum(each[g].sum_squares);
      stats.found_inf = stats.found_inf || each[g].found_inf;
    }
  }
  if (cfg_.sum_across_ranks) stats.sum_squares = cfg_.sum_across_ranks(stats.sum_squares);
  double grad_scale = 0;
  StepResult r = grad_norm_verdict(stats, loss_scale, cfg_.grad_clip, &grad_scale);
  if (check && check->veto(along, r) && !r.found_inf) r.vetoed = true;
  if (r.found_inf || r.vetoed) return r;
  ++steps_;
  update(adamw_options(cfg_, lr, steps_, grad_scale));
  return r;
}

std::vector<Tensor> AdamW::counted_grads() const {
  std::vector<Tensor> counted;
  for (const Slot& s : slots_)
    if (counts_in_grad_norm(*s.param, cfg_)) counted.push_back(s.param->grad);
  return counted;
}

void AdamW::load_state(const std::function<void(const std::vector<Slot>&)>& fill, bool /*partial*/) {
  fill(slots_);  // in place: what a partial load skips keeps its initial state
  sync_values_from_master();
}

AdamW::~AdamW() = default;

void AdamW::update(const AdamWOptions& opt) {
  if (offload_) {
    std::vector<Tensor> grads, values;
    for (const Slot& s : slots_) {
      grads.push_back(s.param->grad.view({s.param->grad.numel()}));
      values.push_back(s.param->value.view({s.param->value.numel()}));
    }
    return offload_->step(opt, grads, values);
  }
  std::vector<AdamWTensors> ts;
  ts.reserve(slots_.size());
  for (Slot& s : slots_)
    ts.push_back({.master = s.master,
                  .grad = s.param->grad,
                  .exp_avg = s.exp_avg,
                  .exp_avg_sq = s.exp_avg_sq,
                  .value = s.master.raw() == s.param->value.raw() ? Tensor() : s.param->value,
                  .decay = s.param->weight_decay});
  adamw_multi_step(ts, opt);
}

}  // namespace mt
