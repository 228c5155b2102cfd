// memory_model.cpp: the static state of a rank (parameters, gradient buffer, optimizer state) as the trainer
// allocates it, and the activation peak from the allocation tape walked through the real pipeline schedule.
#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <stdexcept>

#include "core/base/dtype.h"
#include "core/optim/host_offload.h"
#include "models/pipeline_schedule.h"
#include "parallel/pipeline/schedule.h"
#include "plan/activation_tape.h"

namespace mt::plan {

namespace {

constexpr double kCublasLtWorkspace = 32.0 * 1048576;  // core/cuda/gemm.cpp kWorkspaceBytes, kept for the process

// The chunks of pipeline rank `stage`, as the trainer builds them (models/pipeline_schedule.h stage_chunks).
std::vector<ChunkSpec> chunks_of(const Config& c, int64_t stage) {
  const int64_t p = c.parallel.pipeline, v = c.parallel.virtual_pipeline;
  std::vector<ChunkSpec> out;
  for (const ChunkLayers& ch : stage_chunks(c.parallel, c.model.num_layers, stage))
    out.push_back(ChunkSpec{.has_embedding = ch.has_embedding,
                            .has_head = ch.has_head,
                            .layer_begin = ch.layer_begin,
                            .layers = ch.layers,
                            .pipelined = !(p == 1 && v == 1)});
  return out;
}

// finetune.lora's adapters of one layer on tensor-parallel rank 0, in the layer's parameter order (each linear's
// lora_a then lora_b after its weight and bias): beside qkv and fc1 A (r, C) replicated and B (out/tp, r); beside
// proj and fc2 A (r, in/tp) and B (C, r) replicated (parallel/layers/lora_linear.h).
std::vector<double> lora_layer_parameters(const ModelShapes& m, const LoraConfig& l) {
  const auto r = static_cast<double>(l.rank);
  std::vector<double> n;
  auto add = [&](const char* target, double a, double b) {
    if (!l.targets_any(target)) return;
    n.push_back(a);
    n.push_back(b);
  };
  add("qkv", r * m.C, m.qkv * r);
  add("proj", r * m.Ct, m.C * r);
  add("fc1", r * m.C, m.fc1 * r);
  add("fc2", r * m.Ft, m.C * r);
  return n;
}

// Element counts of one chunk's parameters on tensor-parallel rank 0, in the model's order (models/gpt.cpp
// GptModel's params_, models/transformer_layer.cpp parameters()): the gradient buffer's buckets follow it. With
// `experts` (expert parallelism), the experts' parameters go there, in the same order: their own buffer's.
// `units` (ZeRO-3's gathering units, models/gpt.cpp GptModel::units): each element's unit, numbered from
// `first_unit`: the embeddings, each layer, the final norm with the head (a tied copy of the table on a stage without
// the embedding is the head's).
std::vector<double> chunk_parameters(const ModelShapes& m, const ChunkSpec& ch, std::vector<double>* experts,
                                     std::vector<int>* units = nullptr, int first_unit = 0) {
  std::vector<double> n;
  std::vector<int> u;  // n's units
  const int layer0 = first_unit + (ch.has_embedding ? 1 : 0), head_unit = layer0 + static_cast<int>(ch.layers);
  if (ch.has_embedding || (ch.has_head && m.tie_embeddings)) n.push_back(m.Vt * m.C);  // word embeddings (or copy)
  if (ch.has_embedding && m.P > 0) n.push_back(m.P * m.C);                             // position embeddings (GPT)
  u.resize(n.size(), ch.has_embedding ? first_unit : head_unit);
  for (int64_t l = ch.layer_begin; l < ch.layer_begin + ch.layers; ++l) {
    const std::vector<double> layer = m.layer_parameters(l, experts);  // a MoE layer's differ
    n.insert(n.end(), layer.begin(), layer.end());
    u.resize(n.size(), layer0 + static_cast<int>(l - ch.layer_begin));
  }
  if (ch.has_head) {
    n.push_back(m.C);                                // final norm weight
    if (m.layernorm) n.push_back(m.C);               // and LayerNorm's bias
    if (!m.tie_embeddings) n.push_back(m.Vt * m.C);  // untied head
    u.resize(n.size(), head_unit);
  }
  if (units) units->insert(units->end(), u.begin(), u.end());
  return n;
}

// parallel/sharding/grad_buffer.cpp GradBuffer's layout: buckets of whole parameters taken from the last, closed once
// they hold bucket_elements; with the distributed optimizer each bucket padded to a multiple of the DP size.
struct GradLayout {
  double elements = 0;    // the flat fp32 buffer, padding included
  double shard = 0;       // this rank's blocks over all buckets (the distributed optimizer's state)
  double max_bucket = 0;  // the largest bucket, padding included (one collective)
};

// owners: the ranks a bucket is sharded over (hybrid sharding, parallel.shard_group: a divisor of dp; 0: dp).
// units (ZeRO-3): each parameter's unit; a bucket never holds two units' parameters.
GradLayout grad_layout(const std::vector<double>& params, int64_t bucket_elements, int64_t dp, bool shard,
                       int64_t owners = 0, const std::vector<int>* units = nullptr) {
  GradLayout g;
  if (owners == 0) owners = dp;
  if (params.empty()) return g;
  const double n = static_cast<double>(shard ? dp : 1);
  double in_bucket = 0;
  auto close = [&] {
    const double padded = std::ceil(in_bucket / n) * n;
    g.elements += padded;
    g.shard += padded / static_cast<double>(owners);
    g.max_bucket = std::max(g.max_bucket, padded);
    in_bucket = 0;
  };
  for (size_t i = params.size(); i-- > 0;) {
    if (in_bucket > 0 && units && (*units)[i] != (*units)[i + 1]) close();
    in_bucket += params[i];
    if (in_bucket >= static_cast<double>(bucket_elements)) close();
  }
  if (in_bucket > 0) close();
  return g;
}

TapeShapes tape_shapes(const Config& c, Backend backend) {
  const int64_t tp = c.parallel.tensor;
  return TapeShapes{.B = static_cast<double>(c.training.micro_batch_size),
                    .T = static_cast<double>(c.model.seq_length / c.parallel.context),  // this rank's chunks
                    .m = model_shapes(c.model, tp, c.parallel.expert, c.parallel.expert_tensor),
                    .tp = static_cast<double>(tp),
                    .sp = c.parallel.sequence_parallel && tp > 1,
                    .d = static_cast<double>(dtype_size(dtype_of(c.training.precision))),
                    .cpu = backend == Backend::cpu,
                    .recompute = c.training.recompute == Recompute::full,
                    .recompute_layers = c.training.recompute_num_layers,
                    .selective = SelectiveRecompute::of(c.training.recompute_modules),
                    .split_backward = splits_backward(training_schedule_kind(c.parallel)),
                    .cp = static_cast<double>(c.parallel.context),
                    .cp_allgather = c.parallel.context_comm == ContextComm::allgather};
}

struct ActivationPeaks {
  double act = 0, ws = 0, sum = 0;
  int in_flight = 0;
};

// Walks this stage's instruction list as parallel/pipeline/pipeline_executor.cpp runs it: received buffers count from their
// recv; a sent output or input gradient stays until its batch is waited for: the flush before the next compute, or
// under waits on use (ZB-V) the first compute that consumes a tensor received in that batch or a later one (the
// batches complete in order), or the end.
// `spec` is the schedule the trainer runs (planned_training_schedule), built once per prediction.
ActivationPeaks walk_schedule(const Config& c, int64_t stage, const std::vector<ChunkProfile>& prof,
                              const ScheduleSpec& spec) {
  const int p = static_cast<int>(c.parallel.pipeline), v = static_cast<int>(c.parallel.virtual_pipeline);
  ActivationPeaks out;
  auto apply = [&](double& cur, const OpProfile& op) {
    out.act = std::max(out.act, cur + op.peak_act);
    out.sum = std::max(out.sum, cur + op.peak_sum);
    out.ws = std::max(out.ws, op.peak_ws);
    cur += op.delta;
  };
  double cur = 0;
  if (p == 1 && v == 1) {  // the trainer's plain loop: each microbatch forward then backward
    apply(cur, prof[0].forward);
    apply(cur, prof[0].backward);
    out.in_flight = 1;
    return out;
  }
  const bool on_use = waits_on_use(spec.kind);
  const std::vector<PipeInstr> program = build_schedule(spec)[static_cast<size_t>(stage)];
  double made = 0;  // the last compute's output (or input gradient), until it is sent or the next compute
  // The sent bytes of each posted batch not yet waited for (the last one open until the next compute), and which
  // batch brings each received tensor.
  std::vector<double> batches;
  size_t waited = 0;
  bool open = false;
  std::map<std::tuple<PipeOp, int, int>, size_t> batch_of;
  auto post = [&] {
    if (!open) batches.push_back(0);
    open = true;
  };
  auto wait_through = [&](size_t k) {
    for (; waited <= k && waited < batches.size(); ++waited) cur -= batches[waited];
  };
  // Before a compute: what the last one made and did not send is handed over (counted by this op's profile); the
  // batch model waits for everything posted, waits on use for the batch of the tensor this compute consumes.
  auto before_compute = [&](std::optional<std::tuple<PipeOp, int, int>> consumes) {
    cur -= made;
    made = 0;
    open = false;
    if (!on_use) {
      if (!batches.empty()) wait_through(batches.size() - 1);
    } else if (consumes) {
      if (const auto it = batch_of.find(*consumes); it != batch_of.end()) wait_through(it->second);
    }
  };
  // The turn of a V: a chunk's output (input gradient) that the next (previous) virtual stage on this stage takes
  // stays, as a received tensor would, until that chunk consumes it and then as what it keeps.
  auto local = [&](int chunk, int step) {
    return local_neighbour(spec.placement, p, v, {static_cast<int>(stage), chunk}, step).has_value();
  };
  int in_flight = 0;
  for (const PipeInstr& in : program) {
    const ChunkProfile& ch = prof[static_cast<size_t>(in.chunk)];
    switch (in.op) {
      case PipeOp::recv_forward:
      case PipeOp::recv_backward:
        post();
        batch_of[{in.op, in.microbatch, in.chunk}] = batches.size() - 1;
        cur += ch.message;
        break;
      case PipeOp::send_forward:
      case PipeOp::send_backward:
        post();
        batches.back() += made;
        made = 0;
        break;
      case PipeOp::forward:
        before_compute(std::tuple(PipeOp::recv_forward, in.microbatch, in.chunk));
        apply(cur, ch.forward);
        made = local(in.chunk, 1) ? 0 : ch.output;
        out.in_flight = std::max(out.in_flight, ++in_flight);
        break;
      case PipeOp::backward:  // whole (in a zero-bubble schedule a B and W run as one, parallel/pipeline/schedule.h)
        before_compute(std::tuple(PipeOp::recv_backward, in.microbatch, in.chunk));
        apply(cur, ch.whole);
        made = local(in.chunk, -1) ? 0 : ch.input_grad;
        --in_flight;
        break;
      // A split backward (zero-bubble schedules): B frees the activations but keeps what its deferred
      // weight-gradient GEMMs read, the linears' inputs and output gradients, until W (the tape's split_backward).
      case PipeOp::backward_input:
        before_compute(std::tuple(PipeOp::recv_backward, in.microbatch, in.chunk));
        apply(cur, ch.backward);
        made = local(in.chunk, -1) ? 0 : ch.input_grad;
        break;
      case PipeOp::backward_weight:  // waits for nothing: the batch before it stays in flight
        open = false;
        apply(cur, ch.weight);
        --in_flight;
        break;
    }
  }
  return out;
}

// training.fp8's state on a rank holding `layers` layers (parallel/layers/fp8_linear.cpp): per linear (4 a layer) and
// operand (3) a scale, its inverse, a running amax, the format's max and an amax history (H entries with the
// delayed recipe, 1 with current), all fp32; a MoE layer's two (its attention's) only approximately.
double fp8_state_bytes(const Config& c, int64_t layers) {
  const Fp8Config& f = c.training.fp8;
  if (!f.enabled()) return 0;
  const double operands = 3.0 * 4 * static_cast<double>(layers);
  return operands * 4 * (4 + (f.recipe == Fp8Recipe::delayed ? static_cast<double>(f.amax_history_len) : 1));
}

// What training.fp8 holds beside the bf16 model on a rank with `layers` layers (parallel/layers/fp8_linear.cpp,
// parallel/layers/parallel_linear.cpp), per linear of a layer (input width Fin, output Fout on this rank; N = B T tokens, the
// gathered input under SP):
//   cache      each linear's weight in fp8 and its transpose (Fp8Link::weight, both layouts for the TN GEMMs), one
//              byte an element each, cast at the first forward of an iteration and kept: 2 bytes per weight element;
//   transient  in a linear's backward the output gradient in both layouts and the input's transpose (1 byte each):
//              2 N Fout + N Fin, the largest of the layer's;
//   widening   on the CPU only, gemm_fp8 widens both operands of each GEMM to bf16 (a workspace): the largest of the
//              forward (N Fin + Fout Fin), the input gradient (N Fout + Fout Fin) and the weight gradient
//              (N (Fin + Fout)) elements, 2 bytes each.
// A MoE layer's experts are counted as a dense MLP of their width (an approximation, as fp8_state_bytes).
struct Fp8Bytes {
  double cache = 0, transient = 0, widening = 0;
};
Fp8Bytes fp8_bytes(const Config& c, const TapeShapes& s, int64_t layers, Backend backend) {
  if (!c.training.fp8.enabled()) return {};
  const ModelShapes& m = s.m;
  const double N = s.B * s.T;
  const double linears[4][2] = {{m.C, m.qkv}, {m.Ct, m.C}, {m.C, m.fc1}, {m.Ft, m.C}};  // {Fin, Fout}
  Fp8Bytes b;
  for (const auto& [in, out] : linears) {
    b.cache += 2 * in * out * static_cast<double>(layers);
    b.transient = std::max(b.transient, 2 * N * out + N * in);
    if (backend == Backend::cpu)
      b.widening = std::max({b.widening, 2 * (N * in + out * in), 2 * (N * out + out * in), 2 * N * (in + out)});
  }
  return b;
}

double sum_of(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;
  return s;
}

// core/optim/host_offload.cpp's offload_host_bytes for a state of n elements with values of d bytes, in chunks of
// parallel.grad_bucket_size elements (app/train/trainer.cpp).
double offload_host_bytes_of(double n, double d, const Config& c) {
  const OffloadOptions opt{.enabled = true, .chunk_elements = c.parallel.grad_bucket_size};
  const DType value = d == 4 ? DType::f32 : DType::bf16;  // only the size counts
  return static_cast<double>(offload_host_bytes(static_cast<int64_t>(n), value, opt));
}

}  // namespace

double zero_model_state_bytes(double psi, int64_t nd, ShardStage stage, double k) {
  const double n = static_cast<double>(nd);
  const double values = stage >= ShardStage::parameters ? 2 * psi / n : 2 * psi;
  const double grads = stage >= ShardStage::gradients ? 2 * psi / n : 2 * psi;
  const double state = stage >= ShardStage::optimizer ? k * psi / n : k * psi;
  return values + grads + state;
}

double MemoryPlan::max_total() const {
  double m = 0;
  for (const StageMemory& s : stages) m = std::max(m, s.bytes.total);
  return m;
}

ScheduleMemory schedule_memory(const Config& c, Backend backend) {
  if (training_schedule_kind(c.parallel) != ScheduleKind::zb_v) return {};
  const int p = static_cast<int>(c.parallel.pipeline);
  const TapeShapes shapes = tape_shapes(c, backend);
  std::vector<ChunkProfile> profiles;  // per virtual stage
  for (int vs = 0; vs < 2 * p; ++vs) {
    const StageChunk at = stage_chunk(ChunkPlacement::v_shape, p, vs);
    profiles.push_back(profile_chunk(shapes, chunks_of(c, at.stage).at(static_cast<size_t>(at.chunk))));
  }
  const double unit = profiles[static_cast<size_t>(p - 1)].forward.delta;  // stage p - 1's first chunk: layers only
  if (unit <= 0) return {};
  auto ratio = [&](double bytes) { return std::round(64 * bytes / unit) / 64; };
  ScheduleMemory m;
  for (const ChunkProfile& prof : profiles) {
    m.forward.push_back(ratio(prof.forward.delta));
    m.backward_input.push_back(ratio(prof.backward.delta));
  }
  return m;
}

ScheduleSpec planned_training_schedule(const Config& c, int64_t microbatches, Backend backend) {
  ScheduleSpec spec = training_schedule(c, microbatches);
  spec.memory = schedule_memory(c, backend);
  return spec;
}

MemoryPlan predict_memory(const Config& c, Backend backend) {
  // The weights' replicas: the gradients reduce (ZeRO: shard) over data x context ranks (Distributed::weight_replicas).
  const int64_t p = c.parallel.pipeline, dp = c.parallel.data * c.parallel.context;
  const TapeShapes shapes = tape_shapes(c, backend);
  const double d = shapes.d;
  const bool zero = c.parallel.shard >= ShardStage::optimizer;
  const bool zero2 = c.parallel.shard >= ShardStage::gradients;
  const bool zero3 = c.parallel.shard >= ShardStage::parameters;
  // Hybrid sharding (parallel/sharding/hybrid_shard.h): the dense buckets sharded over the shard group (padded to dp still).
  const int64_t sg = c.parallel.shard_group;
  const bool hybrid = zero && sg > 0 && sg < dp;
  // The schedule every stage kind walks (its ZB-V lists weighed once, schedule_memory).
  const ScheduleSpec schedule = planned_training_schedule(c, c.training.num_microbatches, backend);
  std::vector<std::pair<std::string, int64_t>> kinds;
  if (p == 1) {
    kinds = {{"only", 0}};
  } else {
    kinds.push_back({"first", 0});
    if (p > 2) kinds.push_back({"middle", p / 2});
    kinds.push_back({"last", p - 1});
  }
  const int64_t edp = c.parallel.expert_data();
  MemoryPlan plan;
  for (const auto& [kind, stage] : kinds) {
    StageMemory sm{.kind = kind, .stage = stage};
    const std::vector<ChunkSpec> chunks = chunks_of(c, stage);
    std::vector<double> params;  // app/train/trainer.cpp all_parameters: the chunks' parameters in chunk order
    // With expert parallelism or folding the experts' parameters (this rank's E / EP experts) in a buffer of their
    // own, reduced (ZeRO: sharded) over the expert-data-parallel group of TP x DP / (ETP x EP) ranks
    // (app/train/trainer.cpp).
    std::vector<double> experts;
    // finetune.lora: the adapters, the only parameters with gradients and optimizer state (the rest frozen).
    const LoraConfig& lora = c.finetune.lora;
    std::vector<double> adapters;
    std::vector<ChunkProfile> prof;
    double largest_layer = 0, held_through_backward = 0;  // ZeRO-2's transient gradient storage (below)
    // ZeRO-3 (parallel/sharding/sharded_parameters.h): the most elements gathered at once, a unit and the next one
    // (prefetched), in forward order (models/gpt.cpp GptModel::units: the embedding, each layer, the final norm
    // with the head); and the values kept whole (the tied table of a stage without the other end: its buckets
    // are summed over the embedding group first).
    double gathered_pair = 0, kept_whole = 0;
    std::vector<int> param_units;  // each of params' unit (ZeRO-3 cuts the buckets at their borders)
    int next_unit = 0;
    for (const ChunkSpec& ch : chunks) {
      const std::vector<double> more =
          chunk_parameters(shapes.m, ch, shapes.m.moe.apart() ? &experts : nullptr, &param_units, next_unit);
      next_unit += (ch.has_embedding ? 1 : 0) + static_cast<int>(ch.layers) + (ch.has_head ? 1 : 0);
      params.insert(params.end(), more.begin(), more.end());
      sm.layers += ch.layers;
      for (int64_t l = ch.layer_begin; l < ch.layer_begin + ch.layers; ++l) {
        if (lora.enabled())
          for (double x : lora_layer_parameters(shapes.m, lora)) adapters.push_back(x);
        std::vector<double> layer_experts;
        double e = 0;
        for (double x : shapes.m.layer_parameters(l, &layer_experts)) e += x;
        for (double x : layer_experts) e += x;
        largest_layer = std::max(largest_layer, e);
      }
      // The tied table: the head writes its gradient first, the embedding last (held through the backward).
      if (ch.has_embedding && ch.has_head && shapes.m.tie_embeddings) held_through_backward += shapes.m.Vt * shapes.m.C;
      prof.push_back(profile_chunk(shapes, ch));
      const bool table_apart = shapes.m.tie_embeddings && p > 1;
      std::vector<double> units;
      if (ch.has_embedding) units.push_back((table_apart ? 0 : shapes.m.Vt * shapes.m.C) + shapes.m.P * shapes.m.C);
      for (int64_t l = ch.layer_begin; l < ch.layer_begin + ch.layers; ++l) {
        double e = 0;
        for (double x : shapes.m.layer_parameters(l, nullptr)) e += x;
        units.push_back(e);
      }
      if (ch.has_head)
        units.push_back((shapes.m.layernorm ? 2 : 1) * shapes.m.C + (table_apart ? 0 : shapes.m.Vt * shapes.m.C));
      if (table_apart && (ch.has_embedding || ch.has_head)) kept_whole += shapes.m.Vt * shapes.m.C;
      for (size_t u = 0; u < units.size(); ++u)
        gathered_pair = std::max(gathered_pair, units[u] + (u + 1 < units.size() ? units[u + 1] : 0));
    }
    double n = 0;
    for (double e : params) n += e;
    for (double e : experts) n += e;
    double trained = n;  // the elements with gradients and optimizer state
    if (lora.enabled()) {
      trained = 0;
      for (double e : adapters) trained += e;
      n += trained;
      params = adapters;  // the gradient buffer's and optimizer's: app/train/trainer.cpp leaves the frozen out
      largest_layer = 0;
      held_through_backward = 0;
    }
    sm.parameters = static_cast<int64_t>(n);
    const GradLayout dense = grad_layout(params, c.parallel.grad_bucket_size, dp, zero, hybrid ? sg : 0,
                                         zero3 && !lora.enabled() ? &param_units : nullptr),
                     expert = grad_layout(experts, c.parallel.grad_bucket_size, edp, zero);
    const GradLayout g{.elements = dense.elements + expert.elements,
                       .shard = dense.shard + expert.shard,
                       .max_bucket = std::max(dense.max_bucket, expert.max_bucket)};
    KindBytes& b = sm.bytes;
    // ZeRO-3: this rank's blocks in the compute dtype (the fp32 masters themselves when that is fp32) and what is
    // kept whole; the gathered units apart.
    // optimizer.offload (core/optim/host_offload.h): the masters live on the host, so ZeRO-3's blocks are their
    // device copy in the compute dtype, f32 too.
    const bool offload = c.optimizer.offload;
    b[MemKind::parameter] = zero3 ? (d != 4 || offload ? g.shard * d : 0) + kept_whole * d : n * d;
    b[MemKind::gathered] = zero3 ? gathered_pair * d : 0;
    // parallel/sharding/grad_buffer.cpp: one flat fp32 buffer; with ZeRO its buckets are reduce-scattered in place and
    // the distributed optimizer reads its blocks there (no gradient shard of its own).
    // ZeRO-2: no flat buffer; this rank's fp32 blocks for the step, and the transient storage backward writes into:
    // one layer's buckets (the unit the backward hooks prepare and mark, models/gpt.cpp), a bucket it shares with
    // the layer after, the one being reduce-scattered, and a tied table held from the head to the embedding.
    // (Parameters summed over another group first, whose buckets stay whole for the step, are not told apart
    // here: sequence-parallel norms and tied embeddings across stages.)
    // ZeRO-3 cuts the buckets at the units' borders: no bucket is shared with the next layer. Buckets larger than a
    // layer (the default 40M elements) hold at most every bucket at once: the whole buffer.
    const double transient =
        std::min(largest_layer + (zero3 ? 1 : 2) * g.max_bucket + held_through_backward, g.elements);
    b[MemKind::gradient] = zero2 ? 4 * (g.shard + transient) : 4 * g.elements;
    // core/optim/optimizer.cpp: fp32 master (the value itself in fp32) and two moments. ZeRO
    // (parallel/sharding/distributed_optimizer.cpp): master and moments of its blocks, plus the blocks' values in the
    // compute dtype (value_shard_) for the all-gather.
    b[MemKind::optimizer] = zero ? g.shard * (12 + (d != 4 && !zero3 ? d : 0)) : trained * (8 + (d != 4 ? 4 : 0));
    // Offloaded: the host pool holds masters, moments and two chunks of staging per optimizer (the dense one and the
    // experts'); the device keeps only ZeRO's blocks of values for the all-gather (f32 too; ZeRO-3: the parameters
    // above).
    if (offload) {
      const double dense_n = zero ? dense.shard : trained - (lora.enabled() ? 0 : sum_of(experts));
      const double expert_n = zero ? expert.shard : (lora.enabled() ? 0 : sum_of(experts));
      b[MemKind::host] = offload_host_bytes_of(dense_n, d, c) + offload_host_bytes_of(expert_n, d, c);
      b[MemKind::optimizer] = zero && !zero3 ? g.shard * d : 0;
    }
    // Kept for the run: the step-loss slots (f64 per step of a logging interval), cuBLASLt's workspace.
    const double persistent_ws = 8.0 * static_cast<double>(std::min<int64_t>(c.logging.interval, 1024)) +
                                 (backend == Backend::cuda ? kCublasLtWorkspace : 0) + fp8_state_bytes(c, sm.layers);
    // After the last backward, with no activations left but the batch: grad_stats' two doubles; with ZeRO,
    // one after the other, Gloo's reduce-scatter of a bucket (a block from every rank, sent from the fp32 bucket
    // itself: comm_gloo.cpp, run on the gradient buffer's thread) and all_gather_into_values' bucket-sized
    // staging in the gathered dtype (the compute dtype; fp32 masters when it is fp32).
    double step_ws = 16;
    if (zero) {
      // With expert parallelism the expert buffer's reduce-scatter over its expert-data-parallel ranks runs on that
      // buffer's thread while the dense one's is in flight: a bucket of each at once.
      // Hybrid sharding stages each bucket in its owners' order first (hybrid_reduce_scatter): a bucket more, and
      // this rank's 1/dp piece of it before the all-gather over the replicas.
      const double reduce_scatter =
          (backend != Backend::cpu ? 0 : (dp > 1 ? 4 * dense.max_bucket : 0) + (edp > 1 ? 4 * expert.max_bucket : 0)) +
          (hybrid ? 4 * dense.max_bucket * (1 + 1.0 / static_cast<double>(dp)) : 0);
      step_ws += std::max(reduce_scatter, g.max_bucket * (d == 4 ? 4 : d));
    }
    const double step_act = (p == 1) ? 2 * shapes.B * shapes.T * 4 : 0;  // the plain loop's last batch
    ActivationPeaks a = walk_schedule(c, stage, prof, schedule);
    // fp8: the weight caches all along, a linear's backward copies at any peak (an upper bound), and the CPU's
    // widened GEMM operands in the workspace.
    const Fp8Bytes fp8 = fp8_bytes(c, shapes, sm.layers, backend);
    a.act += fp8.cache + fp8.transient;
    a.sum += fp8.cache + fp8.transient;
    a.ws += fp8.widening;
    sm.peak_in_flight = a.in_flight;
    b[MemKind::activation] = std::max(a.act, step_act);
    b[MemKind::workspace] = persistent_ws + std::max(a.ws, step_ws);
    const double fixed =
        b[MemKind::parameter] + b[MemKind::gradient] + b[MemKind::optimizer] + b[MemKind::gathered] + persistent_ws;
    b.total = fixed + std::max(a.sum, step_act + step_ws);
    plan.stages.push_back(sm);
  }
  return plan;
}

}  // namespace mt::plan
