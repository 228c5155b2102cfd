#include "models/block_part.h"

#include <cmath>

#include <fmt/format.h>

#include "core/base/rng.h"

namespace mt {

SelectiveRecompute SelectiveRecompute::of(const std::vector<std::string>& modules) {
  SelectiveRecompute s;
  for (const std::string& m : modules) {
    if (m == "core_attn") s.core_attn = true;
    if (m == "layernorm") s.layernorm = true;
    if (m == "mlp_act") s.mlp_act = true;
    if (m == "moe_act") s.moe_act = true;
  }
  return s;
}

std::string PartOptions::name(const char* s) const { return fmt::format("layers.{}.{}", layer, s); }

float output_init_std(const ModelConfig& cfg) {
  return static_cast<float>(cfg.init_std / std::sqrt(2.0 * cfg.num_layers));
}

Tensor BlockPart::decode(const Tensor& x, PartState&, const DecodeStep&) const {
  const StepContext ctx{.training = false};
  PartState scratch;
  return forward(x, scratch, {.ctx = &ctx, .samples = 1, .tokens = x.dim(0)});
}

LinearPair::LinearPair(const PartOptions& opt, const Linear& column_spec, const Linear& row_spec)
    : opt_(opt), column_name_(opt.name(column_spec.name)), row_name_(opt.name(row_spec.name)) {
  auto options = [&](const Linear& l) {
    return LinearOptions{.name = opt.name(l.name),
                         .in_features = l.in,
                         .out_features = l.out,
                         .bias = l.bias,
                         .init_std = l.init_std,
                         .dtype = opt.dtype,
                         .seed = opt.seed};
  };
  auto adapter = [&](const Linear& l) {
    return LoraOptions{.name = opt.name(l.name),
                       .in_features = l.in,
                       .out_features = l.out,
                       .rank = opt.lora.rank,
                       .alpha = static_cast<float>(opt.lora.alpha),
                       .dropout = static_cast<float>(opt.lora.dropout),
                       .dtype = opt.dtype,
                       .seed = opt.seed};
  };
  column = ColumnParallelLinear(options(column_spec), opt.tp);
  row = RowParallelLinear(options(row_spec), opt.tp);
  if (opt.lora.enabled()) {
    if (opt.lora.targets_any(column_spec.target)) column.add_lora(adapter(column_spec));
    if (opt.lora.targets_any(row_spec.target)) row.add_lora(adapter(row_spec));
    site_column_ = stream_id(column_name_ + ".lora_dropout");
    site_row_ = stream_id(row_name_ + ".lora_dropout");
  }
}

LinearPair::Calls LinearPair::lora_calls(Saved& saved, const PartStep& step) const {
  const StepContext& ctx = *step.ctx;
  const int64_t T = step.tokens;
  auto call = [&](LoraSaved& s, uint64_t site) {
    return LoraCall{.saved = &s,
                    .dropout = opt_.cp.with_rows({.p = ctx.training ? static_cast<float>(opt_.lora.dropout) : 0.f,
                                                  .seed = ctx.seed,
                                                  .site = site,
                                                  .sample_offset = ctx.sample_offset},
                                                 T, 0, T)};
  };
  return {call(saved.column, site_column_), call(saved.row, site_row_)};
}

std::vector<Parameter*> LinearPair::parameters() {
  std::vector<Parameter*> ps = column.parameters();
  for (Parameter* p : row.parameters()) ps.push_back(p);
  return ps;
}

void LinearPair::enable_fp8(const std::shared_ptr<Fp8Context>& ctx) {
  column.enable_fp8(Fp8Link{.ctx = ctx, .id = ctx->add(column_name_)});
  row.enable_fp8(Fp8Link{.ctx = ctx, .id = ctx->add(row_name_)});
}

}  // namespace mt
