// time_model.cpp: the step-time prediction (see time_model.h for what it assumes of the code).
#include "plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/base/dtype.h"
#include "models/gpt.h"
#include "models/pipeline_schedule.h"
#include "parallel/schedule.h"
#include "plan/memory_model.h"
#include "plan/model_shapes.h"

namespace mt::plan {

namespace {

struct Shapes {
  double B, T;                // micro batch, this rank's sequence (seq_length / cp with context parallelism)
  double cp = 1;              // context-parallel size: attention meets the keys of all cp ranks
  bool cp_allgather = false;  // parallel.context_comm: allgather (else the ring)
  ModelShapes m;              // the architecture's widths on this rank
  double tp, d;
  double ep = 1;                 // expert-parallel size
  double ep_peers_off_node = 0;  // of a rank's EP - 1 peers, the most in other nodes (ep_peers_off_node)
  bool sp, fp32, recompute;
  SelectiveRecompute selective;     // training.recompute: selective (without full recomputation)
  bool dropout, attention_dropout;  // residual dropout / dropout on the attention probabilities (p > 0)
  double oversubscribed = 1;        // CPU ranks per core, when more ranks than cores share a machine
  // training.fp8: the layers' linear GEMMs run in fp8 (with their amax and cast passes); fp8_rate: their GEMM rate
  // over bf16's (2 on fp8 hardware, Hopper and later; 1 elsewhere: the CPU emulates, an A100 has no fp8).
  bool fp8 = false;
  double fp8_rate = 1;
  double N() const { return B * T; }
  double Ns() const { return sp ? N() / tp : N(); }
};

// A collective over `n` ranks moving `bytes` per rank, on links of `bw` bytes/s with `lat` per step.
struct Link {
  double bw = 1, lat = 0;
  double ring(double n, double bytes, double steps_factor) const {  // steps_factor: 1 gather/scatter, 2 reduce
    if (n <= 1 || bytes <= 0) return 0;
    return steps_factor * ((n - 1) / n * bytes / bw + (n - 1) * lat);
  }
  // An all-to-all over `n` ranks sending `bytes` to the others (what leaves the rank, not what it holds).
  double all_to_all(double n, double bytes) const {
    if (n <= 1 || bytes <= 0) return 0;
    return bytes / bw + (n - 1) * lat;
  }
  double all_reduce(double n, double bytes) const { return ring(n, bytes, 2); }
  double gather(double n, double bytes) const { return ring(n, bytes, 1); }  // all-gather or reduce-scatter
  double p2p(double bytes) const { return lat + bytes / bw; }
};

Link link(const Hardware& hw, bool inside_node) {
  return inside_node ? Link{hw.intra_node_bytes_per_s * hw.collective_efficiency, hw.intra_node_latency_s}
                     : Link{hw.inter_node_bytes_per_s * hw.collective_efficiency, hw.inter_node_latency_s};
}

// Time of the parts of one microbatch on one rank.
struct Parts {
  double gemm = 0, attention = 0, elementwise = 0, tp = 0;
  double ep = 0;  // the MoE layers' expert-parallel all-to-alls
  double cp = 0;  // context parallelism's key/value transfers (exposed)
  double sum() const { return gemm + attention + elementwise + tp + ep + cp; }
  Parts& operator+=(const Parts& o) {
    gemm += o.gemm, attention += o.attention, elementwise += o.elementwise, tp += o.tp, ep += o.ep, cp += o.cp;
    return *this;
  }
  Parts operator*(double n) const { return {gemm * n, attention * n, elementwise * n, tp * n, ep * n, cp * n}; }
};

// Bytes one token moves over the expert-parallel all-to-alls of one MoE layer in one training step: dispatch and
// combine (2), forward and backward (2), each of its top_k copies of C values, the share going to other ranks.
double all_to_all_bytes_per_token(const MoeShapes& e, double C, double d, double ep) {
  if (e.E == 0 || ep <= 1) return 0;
  return 2 * 2 * e.k * C * d * (ep - 1) / ep;
}

class Costs {
 public:
  Costs(const Shapes& s, const Hardware& hw, const Link& tp_link, const Link& cp_link)
      : s(s), hw(hw), tpl(tp_link), cpl(cp_link), intra(link(hw, true)), inter(link(hw, false)) {}

  double gemm(double m, double n, double k) const {
    return s.oversubscribed * (2 * m * n * k / gemm_rate(hw, m, n, k, s.fp32) + hw.kernel_overhead_s);
  }
  // A forward GEMM (m, n, k) and its two backward GEMMs (input and weight gradients).
  double gemm_bwd(double m, double n, double k) const { return gemm(m, k, n) + gemm(n, k, m); }
  // The same of a layer's linear (QKV, proj, fc1, fc2): in fp8 at fp8_rate times the rate.
  double linear(double m, double n, double k) const {
    if (!s.fp8) return gemm(m, n, k);
    return s.oversubscribed * (2 * m * n * k / (s.fp8_rate * gemm_rate(hw, m, n, k, false)) + hw.kernel_overhead_s);
  }
  double linear_bwd(double m, double n, double k) const { return linear(m, k, n) + linear(n, k, m); }
  // fp8's scaling of one (rows, cols) GEMM input: its amax (a read) and the cast (a read, a one-byte write).
  double fp8_cast(double rows, double cols) const { return s.fp8 ? pass(rows * cols, 2 + 1 / s.d, 0) : 0; }
  // An elementwise op over `elements` elements making `passes` passes over memory (reads and writes), whose
  // measured cost per element is `s_per_element` (0: bandwidth-bound): the slower of the two.
  double pass(double elements, double passes, double s_per_element) const {
    // The CPU backend widens bf16/fp16 to fp32 around each op: count the wider traffic.
    const double widen = (!hw.is_gpu && s.d != 4) ? 4 / s.d + 1 : 1;
    const double by_bytes = elements * passes * s.d * widen / (hw.hbm_bytes_per_s * hw.elementwise_efficiency);
    return s.oversubscribed * std::max(by_bytes, elements * s_per_element);
  }
  double launches(double kernels) const { return s.oversubscribed * kernels * hw.kernel_overhead_s; }
  // Causal attention of `flops` (forward, or backward counted as 2.5 forwards) at this shape's T and D.
  double attention(double flops) const {
    return s.oversubscribed *
           (flops / attention_rate(hw, s.T, s.m.D, s.attention_dropout, s.fp32) + hw.kernel_overhead_s);
  }
  // One (N, C) activation's collectives over the tensor-parallel group.
  double tp_all_reduce() const { return tpl.all_reduce(s.tp, s.N() * s.m.C * s.d); }
  double tp_gather() const { return tpl.gather(s.tp, s.N() * s.m.C * s.d); }

  // The GEMMs as the code runs them: QKV (G/tp groups of R query, a key and a value head), proj, fc1 (GPT: F/tp
  // columns; Llama: gate and up as one 2F/tp-column GEMM) and fc2.
  // A MoE layer (`moe`) runs its router and experts in place of fc1 and fc2 (moe_forward).
  Parts layer_forward(bool moe) const {
    const ModelShapes& m = s.m;
    const double N = s.N(), Ns = s.Ns(), C = m.C;
    Parts p;
    p.gemm = linear(N, m.qkv, C) + linear(N, C, m.Ct) + (moe ? 0 : linear(N, m.fc1, C) + linear(N, C, m.Ft));
    p.attention = attention(attention_flops());  // QK^T and PV, causal: half of 4 B H T^2 D
    // fp8: the inputs of the four linears cast (their amaxes first). The weights are cast once per step
    // (parallel/fp8_linear.h Fp8Link::weight), not counted: under 1% of a step at any size a GPU trains.
    p.elementwise += fp8_cast(N, C) + fp8_cast(N, m.Ct) + (moe ? 0 : fp8_cast(N, C) + fp8_cast(N, m.Ft));
    // Two norms (read, write), two dropout-adds (two reads, a write), the biases after the reductions: 14
    // (Ns, C) passes; the epilogues of QKV and fc1 (bias, GELU) are fused on GPUs, separate passes on the
    // CPU. Llama has no epilogues but runs the rotary embeddings on q and k and SwiGLU as passes of their own.
    const ElementwiseCosts& e = hw.elementwise_costs;
    double t = 2 * pass(Ns * C, 2, e.norm_forward) + 2 * pass(Ns * C, 3, s.dropout ? e.dropout_forward : 0) +
               pass(Ns * C, 4, 0);
    double kernels = 12;
    if (m.gelu_epilogue) {
      if (!hw.is_gpu) t += pass(N * m.qkv, 2, 0) + (moe ? 0 : pass(N * m.Ft, 2, 0) + pass(N * m.Ft, 2, e.act_forward));
    } else {
      t += pass(N * (m.qkv - m.Gt * m.D), 2, 0);        // rope on q, k
      if (!moe) t += pass(N * m.Ft, 3, e.act_forward);  // SwiGLU
      kernels += moe ? 1 : 2;
    }
    if (s.sp) t += pass(N * C, 4, 0);  // the rank-major permutes around the gathers and reduce-scatters
    p.elementwise += t + launches(kernels);
    if (s.tp > 1) p.tp = s.sp ? 4 * tp_gather() : 2 * tp_all_reduce();
    p.cp = context_forward();
    p.elementwise += context_merges();
    if (moe) p += moe_forward();
    return p;
  }
  // models/moe_mlp.cpp MoeMlp::forward, routing balanced (N k / E rows per expert from each rank): the router's
  // GEMM, one GEMM pair per expert this rank holds (E / EP of them, each N k EP / (E folds) rows), the shared
  // expert's; the router, dispatch, permute, the activations, unpermute and the shared expert's add as passes;
  // with expert parallelism the all-to-alls of dispatch and combine, and the received rows' reorder there and
  // back; with parallel folding the share's gather and its scatter back among zeros.
  Parts moe_forward() const {
    const MoeShapes& e = s.m.moe;
    const double N = s.N(), C = s.m.C, R = N * e.k, Rd = R / e.folds, n = Rd / e.El;
    const double act_passes = s.m.gelu_epilogue ? 2 : 3;  // GELU reads h, writes act; SwiGLU reads two halves
    const ElementwiseCosts& c = hw.elementwise_costs;
    Parts p;
    p.gemm = gemm(N, e.E, C) + e.El * (gemm(n, e.fc1, C) + gemm(n, C, e.Ft));
    double t = pass(N * e.E, 3, 0) + pass(R * C, 2, 0) + pass(Rd * e.Ft, act_passes, c.act_forward) +
               pass(R * C + N * C, 1, 0);  // router; permute; activation; unpermute (reads y, writes out)
    double kernels = 4 + e.El;             // router, dispatch index, permute, unpermute; an activation per expert
    if (e.ep > 1) {
      t += 2 * pass(Rd * C, 2, 0);  // to_experts' permute by order, from_experts' unpermute
      kernels += 2;
    }
    if (e.folds > 1) {
      t += 2 * pass(Rd * C, 2, 0) + pass(R * C, 1, 0);  // take_share's gather; put_share's zeros and scatter
      kernels += 3;
    }
    if (e.shared()) {
      p.gemm += gemm(N, e.sfc1, C) + gemm(N, C, e.Fst);
      t += pass(N * e.Fst, act_passes, c.act_forward) + pass(N * C, 3, 0);  // its activation, out += ys
      kernels += 2;
    }
    p.elementwise += t + launches(kernels);
    p.ep = moe_all_to_all();
    return p;
  }
  // Causal attention of this rank's B T queries over the whole sequence, 2 B H T^2 D at cp 1: with context
  // parallelism a rank's two chunks hold 1/cp of the causal work (parallel/context_parallel.h).
  double attention_flops() const { return 2 * s.B * s.m.Ht * s.T * (s.T * s.cp) * s.m.D; }
  // parallel/context_parallel.cpp: the (B, T, Gt, 2, D) key/value block of a rank in the compute dtype.
  double kv_bytes() const { return s.B * s.T * s.m.Gt * 2 * s.m.D * s.d; }
  // context_attention_forward's exposed transfers: the ring's cp - 1 blocks, each sent while the block before is
  // computed (what exceeds a block's attention), or one all-gather of every block before any compute.
  double context_forward() const {
    if (s.cp <= 1) return 0;
    if (s.cp_allgather) return cpl.gather(s.cp, s.cp * kv_bytes());
    const double block = attention(attention_flops()) / s.cp;
    return (s.cp - 1) * std::max(0.0, cpl.p2p(kv_bytes()) - block);
  }
  // The merges of the cp - 1 later blocks' partial outputs into the f32 accumulator, (B, T, Ht, D) f32 each,
  // read twice and written once, and the final copy out.
  double context_merges() const {
    if (s.cp <= 1) return 0;
    const double f32 = 4 / s.d;
    return s.cp * pass(s.N() * s.m.Ct * f32, 3, 0) + launches(s.cp);
  }
  // context_attention_backward: the keys and values again as forward, and their f32 gradients: on the ring each
  // of the cp hops waited right after its block's compute (exposed); with allgather one reduce-scatter of all cp
  // blocks' gradients.
  double context_backward() const {
    if (s.cp <= 1) return 0;
    const double grads = kv_bytes() * 4 / s.d;
    if (s.cp_allgather) return cpl.gather(s.cp, s.cp * kv_bytes()) + cpl.gather(s.cp, s.cp * grads);
    const double block = 2.5 * attention(attention_flops()) / s.cp;
    return (s.cp - 1) * std::max(0.0, cpl.p2p(kv_bytes()) - block) + s.cp * cpl.p2p(grads);
  }
  // The dispatch and combine all-to-alls of one MoE layer's forward or backward: each sends this rank's share of
  // the N k permuted rows (all of them, or 1 / folds with parallel folding) but the 1/EP staying on this rank (a
  // quarter of the step's all_to_all_bytes_per_token, per token and fold). The share for peers in other nodes goes
  // over the inter-node link, the rest over NVLink, at once: the slower of the two.
  double moe_all_to_all() const {
    const double bytes = s.N() * all_to_all_bytes_per_token(s.m.moe, s.m.C, s.d, s.ep) / 4 / s.m.moe.folds;
    if (bytes <= 0) return 0;
    const double off = s.ep_peers_off_node / (s.ep - 1);  // the fraction of the bytes leaving the node
    const double inside = off < 1 ? intra.all_to_all(s.ep - s.ep_peers_off_node, bytes * (1 - off)) : 0;
    const double across = off > 0 ? inter.all_to_all(s.ep_peers_off_node + 1, bytes * off) : 0;
    return 2 * std::max(inside, across);
  }
  // TransformerLayer::recompute_selected at the start of a layer's backward: the norms, the attention forward, the
  // MLP (or MoE) activation again, as their forwards cost.
  Parts selective_recompute(bool moe) const {
    const ModelShapes& m = s.m;
    const MoeShapes& e = m.moe;
    const double N = s.N(), Ns = s.Ns(), C = m.C;
    const ElementwiseCosts& c = hw.elementwise_costs;
    const double act_passes = m.gelu_epilogue ? 2 : 3;
    Parts p;
    double kernels = 0;
    if (s.selective.layernorm) {
      p.elementwise += 2 * pass(Ns * C, 2, c.norm_forward);
      kernels += 2;
    }
    if (s.selective.core_attn) {
      p.attention = attention(attention_flops());
      p.cp = context_forward();
      p.elementwise += context_merges();
      kernels += 1;
    }
    if (s.selective.mlp_act && !moe) {
      p.elementwise += pass(N * m.Ft, act_passes, c.act_forward);
      kernels += 1;
    }
    if (s.selective.moe_act && moe) {
      p.elementwise += pass(N * e.k / e.folds * e.Ft + N * e.Fst, act_passes, c.act_forward);
      kernels += 2;
    }
    p.elementwise += launches(kernels);
    return p;
  }
  Parts layer_backward(bool moe) const {
    const ModelShapes& m = s.m;
    const double N = s.N(), Ns = s.Ns(), C = m.C;
    Parts p;
    p.gemm =
        linear_bwd(N, m.qkv, C) + linear_bwd(N, C, m.Ct) + (moe ? 0 : linear_bwd(N, m.fc1, C) + linear_bwd(N, C, m.Ft));
    p.attention = attention(2.5 * attention_flops());  // flash backward: ~2.5x the forward
    // fp8: the output gradients cast, and the inputs again (parallel/parallel_linear.cpp).
    p.elementwise += fp8_cast(N, m.qkv) + fp8_cast(N, C) + fp8_cast(N, C) + fp8_cast(N, m.Ct) +
                     (moe ? 0 : fp8_cast(N, m.fc1) + fp8_cast(N, C) + fp8_cast(N, C) + fp8_cast(N, m.Ft));
    // Two norm backwards (x, dy, dx and the residual gradient's add), two dropout backwards, the rest of the
    // 28 (Ns, C) passes (residual adds, bias gradients); on the CPU the GELU backward and the bias gradients of
    // fc1 and QKV; Llama's inverse rotation on dq, dk and SwiGLU's backward (reads fc1 and dact, writes dfc1).
    const ElementwiseCosts& e = hw.elementwise_costs;
    double t = 2 * pass(Ns * C, 4, e.norm_backward) + 2 * pass(Ns * C, 2, s.dropout ? e.dropout_backward : 0) +
               pass(Ns * C, 16, 0);
    double kernels = 20;
    if (m.gelu_epilogue) {
      if (!hw.is_gpu) t += (moe ? 0 : pass(N * m.Ft, 3, e.act_backward) + pass(N * m.Ft, 1, 0)) + pass(N * m.qkv, 2, 0);
    } else {
      t += pass(N * (m.qkv - m.Gt * m.D), 2, 0);
      if (!moe) t += pass(N * m.Ft, 5, e.act_backward);
      kernels += moe ? 1 : 2;
    }
    if (s.sp) t += pass(N * C, 8, 0);
    p.elementwise += t + launches(kernels);
    // Without SP: two all-reduces (f backward); with SP: gathers of dmlp, dproj, ln2, ln1 and two
    // reduce-scatters. A MoE layer keeps its gathered input: no gather of ln2 (5 with SP), and an all-reduce of
    // the (N, k) f32 dprobs.
    if (s.tp > 1) p.tp = s.sp ? (moe ? 5 : 6) * tp_gather() : 2 * tp_all_reduce();
    p.cp = context_backward();
    if (moe) p += moe_backward();
    return p;
  }
  // MoeMlp::backward: each forward GEMM's two, the permutes of dout and dx, the probabilities' gradient, the
  // activations' backward, the router's backward (and the aux and z losses'), the shared expert's add.
  Parts moe_backward() const {
    const MoeShapes& e = s.m.moe;
    const double N = s.N(), C = s.m.C, R = N * e.k, Rd = R / e.folds, n = Rd / e.El;
    const double act_passes = s.m.gelu_epilogue ? 3 : 5;  // GELU: h, dact -> dh; SwiGLU: h (2F), dact -> dh (2F)
    const ElementwiseCosts& c = hw.elementwise_costs;
    Parts p;
    p.gemm = gemm_bwd(N, e.E, C) + e.El * (gemm_bwd(n, e.fc1, C) + gemm_bwd(n, C, e.Ft));
    double t = pass(R * C, 2, 0) + pass(R * C + N * C, 1, 0) + pass(Rd * e.Ft, act_passes, c.act_backward) +
               pass(R * C + N * C, 1, 0) + pass(N * e.E, 4, 0) + pass(N * e.E, 2, 0);
    // permute dout; dprobs (reads dout, y); the activations; unpermute dxp; the router's backward; dl's cast
    double kernels = 6 + e.El;
    if (e.ep > 1) {
      t += 2 * pass(Rd * C, 2, 0);  // to_experts(dy), from_experts(dxe)
      kernels += 2;
    }
    if (e.folds > 1) {
      t += 2 * pass(Rd * C, 2, 0) + pass(R * C, 1, 0);  // take_share(dy); put_share's zeros and scatter
      kernels += 3;
    }
    if (e.shared()) {
      p.gemm += gemm_bwd(N, e.sfc1, C) + gemm_bwd(N, C, e.Fst);
      t += pass(N * e.Fst, act_passes, c.act_backward) + pass(N * C, 3, 0);
      kernels += 2;
    }
    p.elementwise += t + launches(kernels);
    if (s.tp > 1) p.tp = tpl.all_reduce(s.tp, N * e.k * 4);
    p.ep = moe_all_to_all();
    return p;
  }
  Parts head_forward() const {
    const double N = s.N(), Ns = s.Ns(), C = s.m.C, Vt = s.m.Vt;
    Parts p;
    p.gemm = gemm(N, Vt, C);
    const ElementwiseCosts& e = hw.elementwise_costs;
    p.elementwise = pass(Ns * C, 2, e.norm_forward) + pass(N * Vt, 3, e.cross_entropy_forward) + launches(5);
    if (s.tp > 1) p.tp = (s.sp ? tp_gather() : 0) + 2 * tpl.all_reduce(s.tp, 2 * N * 4);
    return p;
  }
  Parts head_backward() const {
    const double N = s.N(), Ns = s.Ns(), C = s.m.C, Vt = s.m.Vt;
    Parts p;
    p.gemm = gemm_bwd(N, Vt, C);
    const ElementwiseCosts& e = hw.elementwise_costs;
    p.elementwise = pass(Ns * C, 3, e.norm_backward) + pass(N * Vt, 2, e.cross_entropy_backward) + launches(4);
    if (s.tp > 1) p.tp = s.sp ? tp_gather() : tp_all_reduce();
    return p;
  }
  Parts embedding_forward() const {
    Parts p;
    p.elementwise = pass(s.N() * s.m.C, 4, 0) + launches(3);
    if (s.tp > 1) p.tp = s.sp ? tp_gather() : tp_all_reduce();
    return p;
  }
  Parts embedding_backward() const {
    Parts p;
    p.elementwise = pass(s.N() * s.m.C, 4, 0) + launches(3);
    if (s.tp > 1 && s.sp) p.tp = tp_gather();
    return p;
  }

 private:
  const Shapes& s;
  const Hardware& hw;
  Link tpl, cpl, intra, inter;
};

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
  const int64_t par_recompute_layers = c.training.recompute_num_layers;
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
      if (s.recompute) {  // the chunk's first recompute_num_layers layers (all when 0), dense or MoE
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
  // Fill and drain: the schedule simulator (parallel/schedule.h) runs the training schedule with the slowest
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
    // ZeRO-2 reduce-scatters every microbatch (parallel/grad_buffer.h): the earlier ones beside their backward.
    if (par.shard >= ShardStage::gradients && M > 1)
      t.dp_comm += (M - 1) * std::max(0.0, reduce_scatter - slow->backward);
    // ZeRO-3 gathers the values around every microbatch's forward and backward instead of once after the step
    // (parallel/sharded_parameters.h): 1.5x the all-reduce's bytes with one microbatch. Each gather is prefetched
    // beside the unit before it: what outlasts the compute shows, priced on top of ZeRO-2's time (the first
    // unit's gather is exposed as the step's gather is, and the gathers share the links), so the search takes it
    // only where it is what fits.
    if (par.shard >= ShardStage::parameters) {
      const double gathers = 2 * static_cast<double>(M) * dp_link.gather(dpn, s.d * nd);
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
  // With recompute_num_layers, the share of the layers recomputed (the first that many of each model chunk).
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
