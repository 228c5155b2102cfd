// pipeline_schedule.h: the pipeline schedule a resolved config trains with (parallel.pipeline_schedule), as
// parallel/pipeline/schedule.h names it: one stage runs no pipelining; auto is 1F1B, interleaved with virtual_pipeline > 1.
#pragma once
#include <cstdint>
#include <vector>

#include "core/config/config.h"
#include "parallel/pipeline/schedule.h"

namespace mt {

inline ScheduleKind training_schedule_kind(const ParallelConfig& p) {
  if (p.pipeline == 1 && p.virtual_pipeline == 1) return ScheduleKind::no_pipelining;
  switch (p.pipeline_schedule) {
    case PipelineSchedule::zb_h1:
      return ScheduleKind::zb_h1;
    case PipelineSchedule::zb_v:
      return ScheduleKind::zb_v;
    case PipelineSchedule::automatic:
    case PipelineSchedule::one_f_one_b:
    case PipelineSchedule::interleaved:
      break;
  }
  return p.virtual_pipeline > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
}

// Where the model chunks sit (zb-v: in a V, otherwise looped), for training and evaluation alike.
inline ChunkPlacement training_chunk_placement(const ParallelConfig& p) {
  return chunk_placement(training_schedule_kind(p));
}

// What F, B (input gradient) and W (weight gradients) of one layer cost relative to each other, from its floating-point
// work per token: the GEMMs (QKV, projection, MLP) do the same work in each; causal attention's core is work of F
// and twice that of B, none of W. zb-v times its list schedule with them (schedule.h).
inline ScheduleCosts layer_costs(const ModelConfig& m) {
  const double C = static_cast<double>(m.hidden_size), s = static_cast<double>(m.seq_length);
  const double kv = static_cast<double>(m.kv_heads() * m.head_dim), f = static_cast<double>(m.ffn_hidden_size);
  const double gemm = 2 * (C * (C + 2 * kv) + C * C + (m.arch == Arch::llama ? 3 : 2) * C * f);
  const double core = 2 * s * C;  // QK^T and PV over half the sequence on average
  return {.forward = gemm + core, .backward_input = gemm + 2 * core, .backward_weight = gemm};
}

// The schedule one training step runs with `microbatches` per data-parallel rank.
inline ScheduleSpec training_schedule(const Config& c, int64_t microbatches) {
  const ParallelConfig& p = c.parallel;
  return {.kind = training_schedule_kind(p),
          .stages = static_cast<int>(p.pipeline),
          .microbatches = static_cast<int>(microbatches),
          .chunks = static_cast<int>(p.virtual_pipeline),
          .placement = training_chunk_placement(p),
          .costs = layer_costs(c.model)};
}

// One model chunk of a pipeline rank: its virtual stage and its layers (parallel.layers_per_stage, or an even
// split), the embedding on virtual stage 0 and the head on the last.
struct ChunkLayers {
  int64_t virtual_stage = 0;
  int64_t layer_begin = 0;
  int64_t layers = 0;
  bool has_embedding = false;
  bool has_head = false;
};

// The chunks pipeline rank `stage` holds, in chunk order (the trainer builds them, the planner prices them).
inline std::vector<ChunkLayers> stage_chunks(const ParallelConfig& p, int64_t num_layers, int64_t stage) {
  const int64_t vstages = p.pipeline * p.virtual_pipeline;
  std::vector<int64_t> layers = p.layers_per_stage;
  if (layers.empty()) layers.assign(static_cast<size_t>(vstages), num_layers / vstages);
  std::vector<ChunkLayers> out;
  for (int64_t c = 0; c < p.virtual_pipeline; ++c) {
    const int64_t vs = virtual_stage(training_chunk_placement(p), static_cast<int>(p.pipeline),
                                     {static_cast<int>(stage), static_cast<int>(c)});
    int64_t begin = 0;
    for (int64_t i = 0; i < vs; ++i) begin += layers[static_cast<size_t>(i)];
    out.push_back({.virtual_stage = vs,
                   .layer_begin = begin,
                   .layers = layers[static_cast<size_t>(vs)],
                   .has_embedding = vs == 0,
                   .has_head = vs == vstages - 1});
  }
  return out;
}

// Evaluation's forward_only schedule over the same chunk placement.
inline ScheduleSpec evaluation_schedule(const Config& c, int64_t microbatches) {
  ScheduleSpec spec = training_schedule(c, microbatches);
  spec.kind = ScheduleKind::forward_only;
  return spec;
}

}  // namespace mt
