#include "app/train/model_chunks.h"

namespace mt::app {

std::vector<std::unique_ptr<GptModel>> build_chunks(const Config& cfg, const Distributed& dist, DType dtype) {
  const int64_t p = dist.pp_size(), v = cfg.parallel.virtual_pipeline, vstages = p * v;
  std::vector<int64_t> layers = cfg.parallel.layers_per_stage;
  if (layers.empty()) layers.assign(static_cast<size_t>(vstages), cfg.model.num_layers / vstages);
  std::vector<std::unique_ptr<GptModel>> chunks;
  for (int64_t c = 0; c < v; ++c) {
    const int64_t vs = c * p + dist.pp_rank();
    int64_t begin = 0;
    for (int64_t i = 0; i < vs; ++i) begin += layers[static_cast<size_t>(i)];
    chunks.push_back(std::make_unique<GptModel>(
        cfg.model, GptOptions{.dtype = dtype,
                              .device = dist.placement.device,
                              .seed = static_cast<uint64_t>(cfg.training.seed),
                              .recompute = cfg.training.recompute == Recompute::full,
                              .recompute_layers = cfg.training.recompute_num_layers,
                              .selective = SelectiveRecompute::of(cfg.training.recompute_modules),
                              .tp = TensorParallel{.comm = dist.tp.get(),
                                                   .rank = dist.tp_rank(),
                                                   .size = dist.tp_size(),
                                                   .sequence_parallel = cfg.parallel.sequence_parallel},
                              .ep = ExpertParallel{.comm = dist.ep_size() > 1 ? dist.ep.get() : nullptr,
                                                   .rank = dist.ep_rank(),
                                                   .size = dist.ep_size(),
                                                   .tensor = dist.etp_size()},
                              .cp = ContextParallel{.comm = dist.cp.get(),
                                                    .rank = dist.cp_rank(),
                                                    .size = dist.cp_size(),
                                                    .all_gather = cfg.parallel.context_comm == ContextComm::allgather},
                              .stage = StageLayout{.has_embedding = vs == 0,
                                                   .has_head = vs == vstages - 1,
                                                   .layer_begin = begin,
                                                   .layer_end = begin + layers[static_cast<size_t>(vs)]}}));
  }
  return chunks;
}

std::vector<Parameter*> all_parameters(const std::vector<std::unique_ptr<GptModel>>& chunks) {
  std::vector<Parameter*> out;
  for (const auto& c : chunks) out.insert(out.end(), c->parameters().begin(), c->parameters().end());
  return out;
}

}  // namespace mt::app
