// ops_loss_optimizer.cpp: the op entry points for the cross-entropy, the optimizer and the reductions.
#include "core/tensor/ops.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/tensor/backend.h"
#include "core/tensor/op_profile.h"
#include "core/tensor/ops_check.h"

namespace mt {

using namespace ops_check;  // NOLINT(google-build-using-namespace): the checks every entry point makes

// ---- cross-entropy -------------------------------------------------------------------------------

namespace {

void check_logits(const char* op, const Tensor& logits, const Tensor* targets, int64_t vocab_start) {
  check_ndim(op, "logits", logits, 2, "(N, V)");
  if (targets) {
    check_dtype(op, "targets", *targets, DType::i32);
    expect_shape(op, "targets", *targets, {logits.dim(0)});
  }
  check_range(op, "vocab_start", vocab_start >= 0, [&] { return fmt::format("must be >= 0, got {}", vocab_start); });
}

}  // namespace

void cross_entropy_rowmax(const Tensor& logits, Tensor& rowmax, CrossEntropyOptions opt) {
  const char* op = "cross_entropy_rowmax";
  const op_profile::Scope profile(op);
  check_logits(op, logits, nullptr, 0);
  check_f32_shape(op, "rowmax", rowmax, {logits.dim(0)});
  backend(device_of(op, {&logits, &rowmax}), op).cross_entropy_rowmax(logits, rowmax, opt);
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, Tensor& sumexp,
                            Tensor& target_logit, CrossEntropyOptions opt) {
  const char* op = "cross_entropy_partials";
  const op_profile::Scope profile(op);
  check_logits(op, logits, &targets, opt.vocab_start);
  const int64_t N = logits.dim(0);
  check_f32_shape(op, "rowmax", rowmax, {N});
  check_f32_shape(op, "sumexp", sumexp, {N});
  check_f32_shape(op, "target_logit", target_logit, {N});
  backend(device_of(op, {&logits, &targets, &rowmax, &sumexp, &target_logit}), op)
      .cross_entropy_partials(logits, targets, rowmax, sumexp, target_logit, opt);
}

void cross_entropy_loss(const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit, Tensor& losses) {
  const char* op = "cross_entropy_loss";
  const op_profile::Scope profile(op);
  check_ndim(op, "rowmax", rowmax, 1, "(N)");
  const int64_t N = rowmax.dim(0);
  check_f32_shape(op, "rowmax", rowmax, {N});
  check_f32_shape(op, "sumexp", sumexp, {N});
  check_f32_shape(op, "target_logit", target_logit, {N});
  check_f32_shape(op, "losses", losses, {N});
  backend(device_of(op, {&rowmax, &sumexp, &target_logit, &losses}), op)
      .cross_entropy_loss(rowmax, sumexp, target_logit, losses);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, const Tensor& sumexp,
                            const Tensor& dloss, Tensor& dlogits, CrossEntropyOptions opt) {
  const char* op = "cross_entropy_backward";
  const op_profile::Scope profile(op);
  check_logits(op, logits, &targets, opt.vocab_start);
  const int64_t N = logits.dim(0);
  check_f32_shape(op, "rowmax", rowmax, {N});
  check_f32_shape(op, "sumexp", sumexp, {N});
  check_f32_shape(op, "dloss", dloss, {N});
  check_like(op, "dlogits", dlogits, logits, "logits");
  backend(device_of(op, {&logits, &targets, &rowmax, &sumexp, &dloss, &dlogits}), op)
      .cross_entropy_backward(logits, targets, rowmax, sumexp, dloss, dlogits, opt);
}

// ---- optimizer and reductions --------------------------------------------------------------------

double sum_squares(const Tensor& x) {
  check_dtype("sum_squares", "x", x, DType::f32);
  return sum_squares(std::vector<Tensor>{x});
}

double sum_squares(const std::vector<Tensor>& xs) {
  const char* op = "sum_squares";
  const op_profile::Scope profile(op);
  if (xs.empty()) return 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    check_dtype(op, fmt::format("xs[{}]", i).c_str(), xs[i], DType::f32);
    if (xs[i].device() != xs[0].device())
      fail(op, fmt::format("tensors on different devices ({} and {})", device_name(xs[0].device()),
                           device_name(xs[i].device())));
  }
  return grad_stats(xs).sum_squares;  // one pass, one read (the inf/NaN flag comes along)
}

bool has_inf_or_nan(const Tensor& x) {
  check_dtype("has_inf_or_nan", "x", x, DType::f32);
  return grad_stats(std::vector<Tensor>{x}).found_inf;
}

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt) {
  const char* op = "adamw_step";
  const op_profile::Scope profile(op);
  check_dtype(op, "master", master, DType::f32);
  check_like(op, "grad", grad, master, "master");
  check_like(op, "exp_avg", exp_avg, master, "master");
  check_like(op, "exp_avg_sq", exp_avg_sq, master, "master");
  check_range(op, "step", opt.step >= 1, [&] { return fmt::format("must be >= 1 (1-based), got {}", opt.step); });
  check_range(op, "betas", opt.beta1 >= 0.f && opt.beta1 < 1.f && opt.beta2 >= 0.f && opt.beta2 < 1.f,
              fmt::format("must lie in [0, 1), got {} and {}", opt.beta1, opt.beta2));
  backend(device_of(op, {&master, &grad, &exp_avg, &exp_avg_sq}), op)
      .adamw_step(master, grad, exp_avg, exp_avg_sq, opt);
}

// ==== fused step ops ==================================================================================

namespace {

void check_f64(const char* op, const char* name, const Tensor& t, int64_t n) {
  check_dtype(op, name, t, DType::i64);  // f64 bits in i64 storage
  check_range(op, name, t.numel() == n, [&] { return fmt::format("expected {} f64 value(s), got {}", n, t.numel()); });
}

void check_same_device(const char* op, const char* name, size_t i, const Tensor& t, Device d) {
  if (t.device() != d)
    fail(op, fmt::format("{}[{}]: on {}, the others on {}", name, i, device_name(t.device()), device_name(d)));
}

}  // namespace

Tensor f64_zeros(int64_t n, Device device, MemKind kind) { return Tensor::zeros({n}, DType::i64, device, kind); }

std::vector<double> read_f64(const Tensor& t) {
  check_dtype("read_f64", "t", t, DType::i64);
  const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
  const double* v = host.data<double>();
  return std::vector<double>(v, v + host.numel());
}

void grad_stats(const std::vector<Tensor>& xs, Tensor& stats) {
  const char* op = "grad_stats";
  const op_profile::Scope profile(op);
  check_f64(op, "stats", stats, 2);
  for (size_t i = 0; i < xs.size(); ++i) {
    check_dtype(op, fmt::format("xs[{}]", i).c_str(), xs[i], DType::f32);
    check_same_device(op, "xs", i, xs[i], stats.device());
  }
  backend(stats.device(), op).grad_stats(xs, stats);
}

GradStats grad_stats(const std::vector<Tensor>& xs) {
  Tensor stats = f64_zeros(2, xs.empty() ? Device::cpu : xs[0].device());
  grad_stats(xs, stats);
  const std::vector<double> v = read_f64(stats);
  return GradStats{.sum_squares = v[0], .found_inf = v[1] != 0.0};
}

void adamw_multi_step(const std::vector<AdamWTensors>& ts, const AdamWOptions& opt) {
  const char* op = "adamw_multi_step";
  const op_profile::Scope profile(op);
  if (ts.empty()) return;
  check_range(op, "step", opt.step >= 1, [&] { return fmt::format("must be >= 1 (1-based), got {}", opt.step); });
  check_range(op, "betas", opt.beta1 >= 0.f && opt.beta1 < 1.f && opt.beta2 >= 0.f && opt.beta2 < 1.f,
              fmt::format("must lie in [0, 1), got {} and {}", opt.beta1, opt.beta2));
  const Device d = ts[0].master.defined() ? ts[0].master.device() : Device::cpu;
  std::optional<DType> value_dtype;
  for (size_t i = 0; i < ts.size(); ++i) {
    const AdamWTensors& t = ts[i];
    const std::string at = fmt::format("ts[{}]", i);
    const int64_t n = t.master.defined() ? t.master.numel() : 0;
    const std::pair<const char*, const Tensor*> f32s[] = {
        {"master", &t.master}, {"grad", &t.grad}, {"exp_avg", &t.exp_avg}, {"exp_avg_sq", &t.exp_avg_sq}};
    for (auto [name, x] : f32s) {
      const std::string what = fmt::format("{}.{}", at, name);
      check_dtype(op, what.c_str(), *x, DType::f32);
      check_range(op, what.c_str(), x->numel() == n,
                  [&] { return fmt::format("{} elements, master has {}", x->numel(), n); });
      check_same_device(op, "ts", i, *x, d);
    }
    if (!t.value.defined()) continue;
    const std::string what = at + ".value";
    check_floating(op, what.c_str(), t.value);
    check_range(op, what.c_str(), t.value.numel() == n,
                [&] { return fmt::format("{} elements, master has {}", t.value.numel(), n); });
    check_same_device(op, "ts", i, t.value, d);
    if (value_dtype && *value_dtype != t.value.dtype())
      fail(op, fmt::format("{}: dtype {}, an earlier value has {} (one dtype per call)", what,
                           dtype_name(t.value.dtype()), dtype_name(*value_dtype)));
    value_dtype = t.value.dtype();
  }
  backend(d, op).adamw_multi_step(ts, opt);
}

void accumulate_mean(const Tensor& x, Tensor& sum) {
  const char* op = "accumulate_mean";
  const op_profile::Scope profile(op);
  check_dtype(op, "x", x, DType::f32);
  check_f64(op, "sum", sum, 1);
  check_range(op, "x", x.numel() > 0, "the mean of no values");
  backend(device_of(op, {&x, &sum}), op).accumulate_mean(x, sum);
}

void accumulate_weighted_sum(const Tensor& x, const Tensor& w, Tensor& sum) {
  const char* op = "accumulate_weighted_sum";
  const op_profile::Scope profile(op);
  check_dtype(op, "x", x, DType::f32);
  check_dtype(op, "w", w, DType::f32);
  check_f64(op, "sum", sum, 1);
  check_range(op, "w", w.numel() == x.numel(), "one weight per value");
  backend(device_of(op, {&x, &w, &sum}), op).accumulate_weighted_sum(x, w, sum);
}

void fill_(Tensor& x, float v) {
  const char* op = "fill_";
  const op_profile::Scope profile(op);
  check_floating(op, "x", x);
  backend(x.device(), op).fill_(x, v);
}

}  // namespace mt
