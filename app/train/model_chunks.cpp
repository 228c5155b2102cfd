#include "app/train/model_chunks.h"

#include "models/pipeline_schedule.h"

namespace mt::app {

std::vector<std::unique_ptr<GptModel>> build_chunks(const Config& cfg, const Distributed& dist, DType dtype) {
  std::vector<std::unique_ptr<GptModel>> chunks;
  for (const ChunkLayers& ch : stage_chunks(cfg.parallel, cfg.model.num_layers, dist.pp_rank())) {
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
                              .stage = StageLayout{.has_embedding = ch.has_embedding,
                                                   .has_head = ch.has_head,
                                                   .layer_begin = ch.layer_begin,
                                                   .layer_end = ch.layer_begin + ch.layers},
                              .lora = cfg.finetune.lora}));
  }
  return chunks;
}

std::vector<Parameter*> all_parameters(const std::vector<std::unique_ptr<GptModel>>& chunks) {
  std::vector<Parameter*> out;
  for (const auto& c : chunks) out.insert(out.end(), c->parameters().begin(), c->parameters().end());
  return out;
}

}  // namespace mt::app
