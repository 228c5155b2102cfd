// time_model.cpp: the step-time prediction (see time_model.h for what it assumes of the code).
#include "plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/base/dtype.h"
#include "models/gpt.h"
#include "models/pipeline_schedule.h"
#include "parallel/pipeline/schedule.h"
#include "plan/memory_model.h"
#include "plan/model_shapes.h"
#include "plan/time_model_costs.h"

namespace mt::plan {

namespace {

using namespace time_detail;  // NOLINT(google-build-using-namespace): the costs of the parts

// Expert-parallel groups (parallel/topology): a stage's ranks i = tp + TP dp refold as i = etp + ETP (ep + EP edp)
// (ranks: tp fastest, then dp, then pp; with context parallelism `dp` is the context x data place), so a group is EP
// ranks ETP apart (with ETP = TP, EP consecutive data-parallel ranks): over every rank, the most of its EP - 1 peers
// in other nodes of `gpus_per_node` ranks (0: every group inside a node).
double ep_peers_off_node(int64_t tp, int64_t dp, int64_t pp, int64_t ep, int64_t etp, int64_t gpus_per_node) {
  if (ep <= 1) return 0;
  int64_t most = 0;
  for (int64_t rank = 0; rank < tp * dp * pp; ++rank) {
    const int64_t stage = rank / (tp * dp), i = rank % (tp * dp);
    const int64_t first = i % etp + i / (etp * ep) * etp * ep;  // the group's first member (ep = 0)
    int64_t off = 0;
    for (int64_t j = 0; j < ep; ++j)
      off += (stage * tp * dp + first + j * etp) / gpus_per_node != rank / gpus_per_node ? 1 : 0;
    most = std::max(most, off);
  }
  return static_cast<double>(most);
}

// CPU ranks beyond the machine's cores share them: each rank computes that many times slower.
double cpu_ranks_per_core(const Hardware& hw, int64_t world) {
  if (hw.is_gpu || hw.cores <= 0) return 1;
  const double on_machine = static_cast<double>(std::min<int64_t>(world, std::max(1, hw.gpus_per_node)));
  return std::max(1.0, on_machine / hw.cores);
}

struct StageCost {
  Parts work;                // one microbatch through all of this stage's chunks, forward and backward
  double backward = 0;       // the backward part of it
  double p2p = 0;            // exposed transfers of one microbatch
  double params = 0;         // this rank's, its E / EP experts' included
  double expert_params = 0;  // with expert parallelism, those of its experts (their own buffer and optimizer)
};

}  // namespace

StepTime predict_time(const Config& c, const Hardware& hw) {
  const ModelConfig& m = c.model;
  const ParallelConfig& par = c.parallel;
  const int64_t tp = par.tensor, p = par.pipeline, v = par.virtual_pipeline, dp = par.data, cp = par.context;
  const int64_t ep = std::max<int64_t>(1, par.expert), etp = par.experts_tensor();
  const int gpn = std::max(1, hw.gpus_per_node);
  const Shapes s{.B = static_cast<double>(c.training.micro_batch_size),
                 .T = static_cast<double>(m.seq_length / cp),
                 .cp = static_cast<double>(cp),
                 .cp_allgather = par.context_comm == ContextComm::allgather,
                 .m = model_shapes(m, tp, ep, etp),
                 .tp = static_cast<double>(tp),
                 .d = static_cast<double>(dtype_size(dtype_of(c.training.precision))),
                 .ep = static_cast<double>(ep),
                 .ep_peers_off_node = ep_peers_off_node(tp, cp * dp, p, ep, etp, gpn),
                 .sp = par.sequence_parallel && tp > 1,
                 .fp32 = c.training.precision == Precision::fp32,
                 .recompute = c.training.recompute == Recompute::full,
                 .selective = SelectiveRecompute::of(c.training.recompute_modules),
                 .dropout = m.dropout > 0,
                 .attention_dropout = m.attention_dropout > 0,
                 .oversubscribed = cpu_ranks_per_core(hw, par.world_size),
                 .fp8 = c.training.fp8.enabled(),
                 .fp8_rate = fp8_gemm_speedup(hw)};
  // Ranks: tp fastest, then cp, then dp, then pp (parallel/topology). A group stays in a node when its span fits.
  // Expert-parallel ranks are drawn from the data-parallel (and with folding the tensor-parallel) ones
  // (ep_peers_off_node); the expert-data-parallel group spans at most what the data-parallel group spans.
  const Costs costs(s, hw, link(hw, tp <= gpn), link(hw, tp * cp <= gpn));
  // Block recomputes the first recompute_num_layers layers of each chunk (all when 0); uniform recomputes every
  // layer, in groups (models/gpt.h), so each layer's forward runs twice as under block with 0.
  const int64_t par_recompute_layers = c.training.recompute_method == "uniform" ? 0 : c.training.recompute_num_layers;
  const Link dp_link = link(hw, tp * cp * dp <= gpn);
  const Link pp_link = link(hw, tp * cp * dp * std::min<int64_t>(p, 2) <= gpn);

  const int64_t vstages = p * v;
  // A dense layer's and a MoE layer's parts.
  const Parts lf = costs.layer_forward(false), lb = costs.layer_backward(false);
  const Parts mf = s.m.moe.E > 0 ? costs.layer_forward(true) : Parts{},
              mb = s.m.moe.E > 0 ? costs.layer_backward(true) : Parts{};
  const double C = s.m.C, Vt = s.m.Vt;
  const double msg = s.Ns() * C * s.d;

  std::vector<StageCost> stages(static_cast<size_t>(p));
  for (int64_t st = 0; st < p; ++st) {
    StageCost& sc = stages[static_cast<size_t>(st)];
    for (const ChunkLayers& ch : stage_chunks(par, m.num_layers, st)) {  // as the trainer builds them
      const int64_t vs = ch.virtual_stage, begin = ch.layer_begin, n = ch.layers;
      const double Lm = static_cast<double>(s.m.moe_count(begin, n)), L = static_cast<double>(n) - Lm;
      Parts f = lf * L, b = lb * L;
      f += mf * Lm;
      b += mb * Lm;
      if (s.recompute) {  // the chunk's first recompute_num_layers layers (all when 0 or uniform), dense or MoE
        const int64_t k = par_recompute_layers > 0 ? std::min(n, par_recompute_layers) : n;
        const double km = static_cast<double>(s.m.moe_count(begin, k));
        b += lf * (static_cast<double>(k) - km);
        b += mf * km;
      } else if (s.selective.any()) {
        b += costs.selective_recompute(false) * L;
        b += costs.selective_recompute(true) * Lm;
      }
      for (int64_t l = begin; l < begin + n; ++l) {
        sc.params += s.m.layer_parameter_count(l);
        if (s.m.moe.apart() && s.m.is_moe(l)) sc.expert_params += s.m.moe.El * (s.m.moe.fc1 + s.m.moe.Ft) * C;
      }
      if (vs == 0) {
        f += costs.embedding_forward();
        b += costs.embedding_backward();
        sc.params += Vt * C + s.m.P * C;  // word and (GPT) position embeddings
      }
      if (vs == vstages - 1) {
        f += costs.head_forward();
        b += costs.head_backward();
        sc.params += s.m.norm_parameters() + ((m.tie_embeddings && vs != 0) || !m.tie_embeddings ? Vt * C : 0);
      }
      sc.work += f;
      sc.work += b;
      sc.backward += b.sum();
      // Transfers to the neighbouring virtual stages on other ranks (none across the turn of zb-v's V).
      auto remote = [&](int64_t other) {
        return stage_chunk(training_chunk_placement(par), static_cast<int>(p), static_cast<int>(other)).stage != st;
      };
      if (p > 1)
        sc.p2p +=
            ((vs > 0 && remote(vs - 1) ? 1 : 0) + (vs + 1 < vstages && remote(vs + 1) ? 1 : 0)) * pp_link.p2p(msg);
    }
  }
  const StageCost* slow = &stages[0];
  for (const StageCost& sc : stages)
    if (sc.work.sum() + sc.p2p > slow->work.sum() + slow->p2p) slow = &sc;
  const double M = static_cast<double>(c.training.num_microbatches);
  const double per_mb = slow->work.sum() + slow->p2p;

  StepTime t;
  t.gemm = M * slow->work.gemm;
  t.attention = M * slow->work.attention;
  t.elementwise = M * slow->work.elementwise;
  t.compute = t.gemm + t.attention + t.elementwise;
  t.tp_comm = M * slow->work.tp;
  t.ep_comm = M * slow->work.ep;
  t.cp_comm = M * slow->work.cp;
  t.all_to_all_bytes_per_token = all_to_all_bytes_per_token(s.m.moe, C, s.d, s.ep);
  t.pp_comm = M * slow->p2p;
  // Fill and drain: the schedule simulator (parallel/pipeline/schedule.h) runs the training schedule with the slowest
  // stage's costs per microbatch (its transfers split between forward and backward): F, B (the input gradient)
  // and W (the weight gradients, taken as a third of the GEMM time of a forward and backward, half the
  // backward's: what a zero-bubble schedule defers). The bubble is its makespan less the stage's work. 1F1B gives
  // (p - 1) stage-microbatches, interleaving 1/v of that, ZB-H1 (p - 1) (F + B - W).
  if (p > 1) {
    const double f = per_mb - slow->backward - slow->p2p / 2;
    const double w = std::min(slow->backward, slow->work.gemm / 3);
    const double b = per_mb - f - w;
    const ScheduleSpec spec = planned_training_schedule(c, M, hw.is_gpu ? Backend::cuda : Backend::cpu);
    t.bubble = static_cast<double>(p - 1) / static_cast<double>(v) * per_mb;  // if the schedule cannot be built
    try {
      const ScheduleReport sim =
          check_schedule(spec, build_schedule(spec), {.forward = f, .backward_input = b, .backward_weight = w});
      if (sim.ok) t.bubble = std::max(0.0, sim.makespan - M * per_mb);
    } catch (const std::invalid_argument&) {
      // a layout the trainer refuses (plan/layout.h runtime_refusal says why)
    }
  }

  // Data parallelism and the optimizer, on the rank with the most parameters. With expert parallelism (or
  // folding) the experts' gradients reduce (ZeRO: reduce-scatter, then the values' all-gather) over the
  // expert-data-parallel ranks, and their optimizer state is sharded over those.
  const StageCost* big = &stages[0];
  for (const StageCost& sc : stages)
    if (sc.params > big->params) big = &sc;
  const double n = big->params, ne = big->expert_params, nd = n - ne;
  // The gradients reduce (ZeRO: are sharded) over the data x context ranks holding the same weights.
  const double dpn = static_cast<double>(dp * cp), edp = static_cast<double>(par.expert_data());
  const double bw_elem = hw.hbm_bytes_per_s * hw.elementwise_efficiency / s.oversubscribed;
  if (par.shard >= ShardStage::optimizer) {
    const double reduce_scatter = dp_link.gather(dpn, 4 * nd) + dp_link.gather(edp, 4 * ne);
    t.dp_comm = reduce_scatter + dp_link.gather(dpn, s.d * nd) + dp_link.gather(edp, s.d * ne);
    // ZeRO-2 reduce-scatters every microbatch (parallel/sharding/grad_buffer.h): the earlier ones beside their backward.
    if (par.shard >= ShardStage::gradients && M > 1)
      t.dp_comm += (M - 1) * std::max(0.0, reduce_scatter - slow->backward);
    // ZeRO-3 gathers the values around every microbatch's forward and backward instead of once after the step
    // (parallel/sharding/sharded_parameters.h): 1.5x the all-reduce's bytes with one microbatch. Each gather is prefetched
    // beside the unit before it: what outlasts the compute shows, priced on top of ZeRO-2's time (the first
    // unit's gather is exposed as the step's gather is, and the gathers share the links), so the search takes it
    // only where it is what fits.
    if (par.shard >= ShardStage::parameters) {
      // Uniform recomputation gathers a layer a third time for its group's forward in backward, all but the
      // group's last (whose forward runs inside its backward's gather): 1 - groups / layers of a chunk's layers.
      double regathered = 0;
      if (s.recompute && c.training.recompute_method == "uniform") {
        const double per_chunk = static_cast<double>(m.num_layers) / static_cast<double>(vstages);
        const double group = static_cast<double>(c.training.recompute_num_layers);
        regathered = 1 - std::ceil(per_chunk / group) / per_chunk;
      }
      // The experts' values are gathered over the expert-data-parallel ranks that shard them.
      const double gathers =
          (2 + regathered) * static_cast<double>(M) * (dp_link.gather(dpn, s.d * nd) + dp_link.gather(edp, s.d * ne));
      t.dp_comm += std::max(0.0, gathers - t.compute);
    }
    const double shard = nd / dpn + ne / edp;
    t.optimizer = (4 * n + shard * (4 + 28 + s.d) + 2 * s.d * n) / bw_elem;
  } else {
    const double reduce = dp_link.all_reduce(dpn, 4 * nd) + dp_link.all_reduce(edp, 4 * ne);
    const double bucket_fraction = std::min(1.0, static_cast<double>(par.grad_bucket_size) / std::max(n, 1.0));
    // Buckets reduce while the last microbatch's backward runs on; the last bucket waits for the end.
    t.dp_comm = dp * cp > 1 ? std::max(reduce * bucket_fraction, reduce - slow->backward) : 0;
    t.optimizer = (4 * n + n * (4 + 28 + (s.d != 4 ? s.d + 4 : 0))) / bw_elem;
  }
  t.total = t.compute + t.tp_comm + t.ep_comm + t.cp_comm + t.pp_comm + t.bubble + t.dp_comm + t.optimizer;

  const double seq = static_cast<double>(m.seq_length);
  const double tokens = static_cast<double>(c.training.global_batch_size) * seq;
  const double world = static_cast<double>(par.world_size);
  t.tokens_per_s = tokens / t.total;
  t.model_tflops_per_gpu = model_flops_per_iteration(m, static_cast<int64_t>(tokens)) / t.total / world / 1e12;
  // Narayanan et al. (2021) eq. 3 generalised to any architecture: the layers' GEMMs (2 FLOPs per weight and
  // token: 8h^2 + 4hF for GPT, GQA's narrower K/V and SwiGLU's three matrices for Llama) and (uncausal)
  // attention 3 or 4 times (with recomputation), the logits 3 times.
  // A MoE layer's GEMMs are those a token passes through: the router, its top_k experts, the shared expert.
  const double h = C, L = static_cast<double>(m.num_layers), V = static_cast<double>(m.padded_vocab_size);
  const ModelShapes whole = model_shapes(m, 1);
  double layers_gemm_flops = 0;
  for (int64_t l = 0; l < m.num_layers; ++l) layers_gemm_flops += 2 * whole.layer_gemm_weights(l);
  // With block's recompute_num_layers, the share of the layers recomputed (the first that many of each model chunk).
  const double recomputed =
      !s.recompute ? 0
      : par_recompute_layers == 0
          ? 1
          : std::min(1.0, static_cast<double>(par_recompute_layers * vstages) / static_cast<double>(m.num_layers));
  const double passes = 3 + recomputed;
  const double hw_flops = passes * tokens * (layers_gemm_flops + L * 4 * seq * h) + 6 * tokens * h * V;
  t.hardware_tflops_per_gpu = hw_flops / t.total / world / 1e12;
  t.mfu = t.model_tflops_per_gpu * 1e12 / hw.peak_flops;
  return t;
}

}  // namespace mt::plan