#include "app/train/fp8_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace mt::app {

namespace {

const char* const kFilled = "state.fp8.history_filled";
std::string scale_tensor(const std::string& linear) { return "state.fp8." + linear + ".scale"; }
std::string history_tensor(const std::string& linear) { return "state.fp8." + linear + ".amax_history"; }

}  // namespace

std::shared_ptr<Fp8Context> enable_fp8(const Config& cfg, const std::vector<std::unique_ptr<GptModel>>& chunks,
                                       Device device, Communicator* context_group) {
  const Fp8Config& f = cfg.training.fp8;
  if (!f.enabled()) return nullptr;
  auto ctx =
      std::make_shared<Fp8Context>(Fp8Options{.grad_dtype = f.format == Fp8Format::hybrid ? DType::e5m2 : DType::e4m3,
                                              .delayed = f.recipe == Fp8Recipe::delayed,
                                              .history_len = f.amax_history_len,
                                              .use_max = f.amax_compute_algo == Fp8AmaxAlgo::max,
                                              .margin = static_cast<int>(f.margin)},
                                   device);
  const int64_t last = cfg.model.num_layers - 1;
  for (const auto& chunk : chunks)
    for (TransformerLayer* layer : chunk->layers())
      if (!(f.first_last_bf16 && (layer->index() == 0 || layer->index() == last))) layer->enable_fp8(ctx);
  ctx->allocate();
  ctx->set_context_group(context_group);
  return ctx;
}

void append_fp8_tensors(const Fp8Context& ctx, bool with_count, std::vector<TensorSlice>& out) {
  if (!ctx.options().delayed) return;
  for (size_t id = 0; id < ctx.names().size(); ++id) {
    const int i = static_cast<int>(id);
    const Tensor s = ctx.scales(i).to(Device::cpu), h = ctx.histories(i).to(Device::cpu);
    out.push_back({.name = scale_tensor(ctx.names()[id]), .global_shape = s.shape(), .data = s});
    out.push_back({.name = history_tensor(ctx.names()[id]), .global_shape = h.shape(), .data = h});
  }
  if (with_count)
    out.push_back({.name = kFilled,
                   .global_shape = {1},
                   .data = Tensor::from_floats(std::vector<float>{static_cast<float>(ctx.filled())}, {1})});
}

void load_fp8_tensors(Fp8Context& ctx, const CheckpointReader& reader, const std::string& dir) {
  if (!ctx.options().delayed) return;
  if (!reader.has(kFilled)) {
    spdlog::warn("{}: holds no fp8 amax histories (saved without training.fp8.recipe: delayed): they start empty", dir);
    return;
  }
  const int64_t H = ctx.options().history_len;
  for (size_t id = 0; id < ctx.names().size(); ++id) {
    const std::string& name = ctx.names()[id];
    const std::string st = scale_tensor(name), ht = history_tensor(name);
    if (!reader.has(st) || !reader.has(ht))
      throw CheckpointError(
          fmt::format("{}: holds no fp8 state of {} ({}); was it saved with training.fp8."
                      "first_last_bf16 set otherwise?",
                      dir, name, st));
    const Shape hs = reader.info(ht).global_shape;
    if (hs != Shape{3, H})
      throw CheckpointError(
          fmt::format("{}: {} holds {} entries, training.fp8.amax_history_len is {}; resume with "
                      "the same length",
                      dir, ht, hs.size() == 2 ? hs[1] : 0, H));
    Tensor s = Tensor::empty({3}, DType::f32), h = Tensor::empty({3, H}, DType::f32);
    reader.read(st, s);
    reader.read(ht, h);
    ctx.restore(static_cast<int>(id), s, h);
  }
  Tensor n = Tensor::empty({1}, DType::f32);
  reader.read(kFilled, n);
  ctx.set_filled(static_cast<int64_t>(n.to_floats().at(0)));
}

}  // namespace mt::app
