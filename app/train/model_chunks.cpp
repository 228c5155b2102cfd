#include "app/train/model_chunks.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/tensor/allocator.h"
#include "models/pipeline_schedule.h"

namespace mt::app {

namespace {

// optimizer.offload: chunks of a gradient bucket's size; the machine's cores shared by the ranks on it.
OffloadOptions offload_options(const Config& cfg, const Distributed& dist) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return {.enabled = cfg.optimizer.offload,
          .chunk_elements = cfg.parallel.grad_bucket_size,
          .threads = std::max(1, cores / std::max(1, dist.env.local_world_size))};
}

ZeroStage zero_stage(ShardStage s) {
  switch (s) {
    case ShardStage::none:
      return ZeroStage::none;
    case ShardStage::optimizer:
      return ZeroStage::optimizer;
    case ShardStage::gradients:
      return ZeroStage::gradients;
    case ShardStage::parameters:
      return ZeroStage::parameters;
  }
  throw std::logic_error("parallel.shard: unknown stage");
}

}  // namespace

std::vector<std::unique_ptr<GptModel>> build_chunks(const Config& cfg, const Distributed& dist, DType dtype) {
  std::vector<std::unique_ptr<GptModel>> chunks;
  for (const ChunkLayers& ch : stage_chunks(cfg.parallel, cfg.model.num_layers, dist.pp_rank())) {
    chunks.push_back(std::make_unique<GptModel>(
        cfg.model, GptOptions{.dtype = dtype,
                              .device = dist.placement.device,
                              .seed = static_cast<uint64_t>(cfg.training.seed),
                              .recompute = cfg.training.recompute == Recompute::full,
                              .recompute_layers = cfg.training.recompute_num_layers,
                              .recompute_uniform = cfg.training.recompute_method == "uniform",
                              .selective = SelectiveRecompute::of(cfg.training.recompute_modules),
                              .tp = TensorParallel{.comm = &dist.group({"tp"}),
                                                   .rank = dist.tp_rank(),
                                                   .size = dist.tp_size(),
                                                   .sequence_parallel = cfg.parallel.sequence_parallel},
                              .ep = ExpertParallel{.comm = dist.ep_size() > 1 ? &dist.group({"ep"}) : nullptr,
                                                   .rank = dist.ep_rank(),
                                                   .size = dist.ep_size(),
                                                   .tensor = dist.etp_size()},
                              .cp = ContextParallel{.comm = dist.context_parallel(),
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

std::unique_ptr<Parallelized> parallelize_chunks(const Config& cfg, Distributed& dist,
                                                 const std::vector<std::unique_ptr<GptModel>>& chunks,
                                                 const std::vector<Parameter*>& params,
                                                 const std::shared_ptr<Fp8Context>& fp8) {
  if (cfg.parallel.shard >= ShardStage::gradients && dist.dp_size() == 1 && dist.is_logging_rank())
    spdlog::warn(
        "parallel.shard={} with one data-parallel rank: each rank's shard is the whole, so nothing "
        "is saved (the gradients still go through the per-microbatch buckets)",
        name_of(cfg.parallel.shard));
  std::vector<std::vector<std::vector<Parameter*>>> units;  // ZeRO-3's, per chunk
  for (const auto& chunk : chunks) units.push_back(chunk->units());
  auto par = parallelize(
      params, std::move(units),
      DataParallelGroups{.dense_grads = dist.take_dense_grads(),
                         .tensor = &dist.group({"tp"}),
                         .embedding = dist.emb.get(),
                         .replicas = dist.replicas_grads.get(),
                         .shard_owners = &dist.shard_owners(),
                         .experts_apart = dist.experts_apart(),
                         .expert_grads = dist.take_expert_grads(),
                         .expert_data = dist.expert_shard_owners(),
                         .expert_replicas = dist.expert_replicas_grads.get(),
                         .expert = &dist.group({"ep"}),
                         .expert_tensor = dist.groups.find({"etp"}),
                         .counts_expert_replicas = dist.etp_rank() == 0,
                         .first_expert_fold = dist.tp_rank() < dist.etp_size(),
                         .keeps_expert_state = dist.edp_rank() == 0},
      ParallelizeOptions{
          .device = dist.placement.device,
          .zero = zero_stage(cfg.parallel.shard),
          .bucket_elements = cfg.parallel.grad_bucket_size,
          .num_microbatches = cfg.training.num_microbatches,
          .adam = AdamWConfig{.beta1 = cfg.optimizer.betas.at(0),
                              .beta2 = cfg.optimizer.betas.at(1),
                              .eps = cfg.optimizer.eps,
                              .weight_decay = cfg.optimizer.weight_decay,
                              .grad_clip = cfg.optimizer.grad_clip,
                              .count_replicas = dist.tp_rank() == 0,
                              .sum_across_ranks = [&mp = dist.group({"tp", "pp"})](
                                                      double x) { return mp.size() > 1 ? sum_doubles(mp, {x})[0] : x; },
                              .offload = offload_options(cfg, dist)}});
  Parallelized& p = *par;
  for (size_t c = 0; c < chunks.size(); ++c) {
    GptModel& chunk = *chunks[c];
    chunk.set_grads_ready_hook([&p](int mb, const std::vector<Parameter*>& ps) { p.grads_ready(mb, ps); });
    if (p.needs_grads_needed())
      chunk.set_grads_needed_hook([&p](int mb, const std::vector<Parameter*>& ps) { p.grads_needed(mb, ps); });
    if (p.gathers_units())
      chunk.set_unit_hook([&p, c = static_cast<int>(c), fp8](GptModel::UnitEvent e, int unit, int next) {
        const bool begin = e == GptModel::UnitEvent::forward_begin || e == GptModel::UnitEvent::backward_begin;
        if (begin) return p.unit_begin(c, unit, next);
        p.unit_end(c, unit);
        if (fp8) fp8->drop_weights(p.unit_parameters(c, unit));  // the casts go with the weights
      });
  }
  // optimizer.offload_host_memory_gib: the host state this rank holds now (the host pool) within the budget.
  const double budget = cfg.optimizer.offload_host_memory_gib;
  if (const int64_t host = allocator_for(Device::cpu).stats().host_current; budget > 0 && host > budget * (1 << 30))
    throw std::invalid_argument(fmt::format(
        "optimizer.offload_host_memory_gib: rank {} needs {:.3f} GiB of host memory for its offloaded optimizer "
        "state (fp32 masters and moments, 12 bytes per element of its shard, and the staging of two chunks of "
        "parallel.grad_bucket_size={} elements), more than the budget of {} GiB: raise the budget, shard the "
        "state over more data-parallel ranks (parallel.shard) or lower parallel.grad_bucket_size",
        dist.rank(), static_cast<double>(host) / (1 << 30), cfg.parallel.grad_bucket_size, budget));
  return par;
}

}  // namespace mt::app
