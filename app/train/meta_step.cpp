// meta_step.cpp: the trainer's step on the meta device (meta_step.h).
#include "app/train/meta_step.h"

#include <algorithm>
#include <numeric>

#include "app/runtime/distributed.h"
#include "app/train/trainer_impl.h"
#include "models/pipeline_schedule.h"

namespace mt::app {

namespace {

// Samples with no values that matter, shaped as the config's data would give them: token ids, and the loss masks
// (every target counted) and document positions where the config asks for them.
DataSources meta_data(const Config& cfg) {
  DataSources ds;
  ds.train = [](int64_t, std::span<int32_t> out) { std::fill(out.begin(), out.end(), 0); };
  if (cfg.data.loss_mask == LossMaskChoice::on || cfg.data.sft_packing == SftPacking::pad)
    ds.train_mask = [](int64_t, std::span<int32_t> out) { std::fill(out.begin(), out.end(), 1); };
  if (cfg.data.sft_packing == SftPacking::pack)
    ds.train_positions = [](int64_t, std::span<int32_t> out) { std::iota(out.begin(), out.end(), 0); };
  ds.description = "meta: no values";
  return ds;
}

int world_size(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  return static_cast<int>(p.tensor * p.pipeline * p.data * p.context);
}

// The meta rank of pipeline stage `stage` at tensor, context and data-parallel rank 0.
std::unique_ptr<Distributed> stage_rank(const Config& cfg, int stage, meta::Mirror mirror, double receive_factor) {
  const int rank = topology_of(cfg, world_size(cfg)).rank({.tp = 0, .dp = 0, .pp = stage, .cp = 0});
  return meta_distributed(cfg, world_size(cfg), rank,
                          {.gloo = mirror == meta::Mirror::cpu, .moe_receive_factor = receive_factor});
}

int64_t activation_bytes(const meta::Session& s) {
  return s.memory().current[static_cast<size_t>(MemKind::activation)];
}

// The most (microbatch, chunk) pairs forwarded and not yet through their backward at once in `program`.
int peak_in_flight(const std::vector<PipeInstr>& program) {
  int now = 0, peak = 0;
  for (const PipeInstr& in : program) {
    if (in.op == PipeOp::forward) peak = std::max(peak, ++now);
    if (in.op == PipeOp::backward || in.op == PipeOp::backward_weight) --now;
  }
  return peak;
}

}  // namespace

int64_t peaks_microbatches(const Config& cfg) {
  const int64_t M = cfg.training.num_microbatches, p = cfg.parallel.pipeline;
  // Sharded gradients (ZeRO-2/3) reduce and free their buckets each microbatch: the second one finds the first's.
  if (p == 1) return std::min<int64_t>(M, cfg.parallel.shard >= ShardStage::gradients ? 2 : 1);
  // A multiple of p, as interleaving needs; ZB-V's list fills its stages with a third round.
  return std::min(M, (training_schedule_kind(cfg.parallel) == ScheduleKind::zb_v ? 3 : 2) * p);
}

MetaStep measure_step(const Config& cfg_in, int stage, const MetaStepOptions& opt) {
  Config cfg = cfg_in;
  cfg.logging.dir = "";  // nothing written
  cfg.logging.tensorboard = false;
  cfg.checkpoint.save_dir = "";
  if (opt.microbatches > 0 && opt.microbatches != cfg.training.num_microbatches) {
    cfg.training.global_batch_size = cfg.training.global_batch_size / cfg.training.num_microbatches * opt.microbatches;
    cfg.training.num_microbatches = opt.microbatches;
  }
  ScheduleMemory zb_v = opt.zb_v ? *opt.zb_v : measure_schedule_memory(cfg, opt.mirror);
  const ScheduleSpec spec = [&] {
    ScheduleSpec s = training_schedule(cfg, cfg.training.num_microbatches);
    s.memory = zb_v;
    return s;
  }();
  MetaStep out;
  out.peak_in_flight = peak_in_flight(build_schedule(spec).at(static_cast<size_t>(stage)));
  for (const ChunkLayers& ch : stage_chunks(cfg.parallel, cfg.model.num_layers, stage)) out.layers += ch.layers;
  meta::Session session(opt.mirror);
  {
    std::unique_ptr<Distributed> dist = stage_rank(cfg, stage, opt.mirror, opt.moe_receive_factor);
    std::optional<Trainer> trainer;
    {
      const ParametersOnMeta on_meta;
      trainer.emplace(cfg, TrainOptions{}, *dist, meta_data(cfg), std::move(zb_v));
    }
    if (opt.step) trainer->step_once();
    out.memory = session.memory();
    out.parameters = trainer->num_parameters();
    out.transient_grad_bytes = trainer->largest_transient_grad_bytes();
  }
  out.counts = session.counts();
  return out;
}

ScheduleMemory measure_schedule_memory(const Config& cfg, meta::Mirror mirror) {
  if (training_schedule_kind(cfg.parallel) != ScheduleKind::zb_v) return {};
  const int p = static_cast<int>(cfg.parallel.pipeline);
  const DType dtype = dtype_of(cfg.training.precision);
  std::vector<double> forward(static_cast<size_t>(2 * p)), backward(static_cast<size_t>(2 * p));
  meta::Session session(mirror);
  for (int s = 0; s < p; ++s) {
    std::unique_ptr<Distributed> dist = stage_rank(cfg, s, mirror, 1);
    std::vector<std::unique_ptr<GptModel>> chunks;
    {
      const ParametersOnMeta on_meta;
      chunks = build_chunks(cfg, *dist, dtype);
    }
    const DataSources data = meta_data(cfg);
    const Microbatches batches(cfg, *dist, data);
    const StageActivation act = stage_activation(cfg, *dist, dtype);
    TrainingStage stage(
        chunks, act, [&](int m, bool head) { return batches.train(0, m, head); }, 1.f, f64_zeros(1, Device::meta));
    for (int c = 0; c < 2; ++c) {
      const auto vs = static_cast<size_t>(virtual_stage(ChunkPlacement::v_shape, p, {.stage = s, .chunk = c}));
      // Forward: what it keeps, without its input (received) and its output (sent on).
      {
        const Tensor input = Tensor::empty(act.shape, act.dtype, act.device);
        const int64_t before = activation_bytes(session);
        Tensor output = stage.forward(0, c, input);
        output = Tensor();
        forward[vs] = static_cast<double>(activation_bytes(session) - before);
      }
      // B: what it frees and keeps for W, without the gradient it receives and the one it sends.
      const int64_t before = activation_bytes(session);
      {
        const Tensor grad = Tensor::empty(act.shape, act.dtype, act.device);
        Tensor input_grad = stage.backward_input(0, c, grad);
      }
      backward[vs] = static_cast<double>(activation_bytes(session) - before);
      stage.backward_weight(0, c);
    }
  }
  const double unit = forward[static_cast<size_t>(p - 1)];  // stage p - 1's first chunk: layers only
  if (unit <= 0) return {};
  auto ratio = [&](double bytes) { return std::round(64 * bytes / unit) / 64; };
  ScheduleMemory m;
  for (size_t vs = 0; vs < forward.size(); ++vs) {
    m.forward.push_back(ratio(forward[vs]));
    m.backward_input.push_back(ratio(backward[vs]));
  }
  return m;
}

}  // namespace mt::app
