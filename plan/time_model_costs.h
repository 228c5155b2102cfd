// time_model_costs.h: what time_model.cpp and time_model_costs.cpp share: the shapes of one rank, the links its
// collectives run on, and Costs, the time of each part of one microbatch. Not an interface: time_model.h is.
#pragma once
#include <algorithm>

#include "models/gpt.h"  // SelectiveRecompute
#include "plan/hardware.h"
#include "plan/model_shapes.h"

namespace mt::plan::time_detail {

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

inline Link link(const Hardware& hw, bool inside_node) {
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
inline double all_to_all_bytes_per_token(const MoeShapes& e, double C, double d, double ep) {
  if (e.E == 0 || ep <= 1) return 0;
  return 2 * 2 * e.k * C * d * (ep - 1) / ep;
}

class Costs {
 public:
  Costs(const Shapes& s, const Hardware& hw, const Link& tp_link, const Link& cp_link)
      : s(s), hw(hw), tpl(tp_link), cpl(cp_link), intra(link(hw, true)), inter(link(hw, false)) {}

  double gemm(double m, double n, double k) const;
  // A forward GEMM (m, n, k) and its two backward GEMMs (input and weight gradients).
  double gemm_bwd(double m, double n, double k) const { return gemm(m, k, n) + gemm(n, k, m); }
  // The same of a layer's linear (QKV, proj, fc1, fc2): in fp8 at fp8_rate times the rate.
  double linear(double m, double n, double k) const;
  double linear_bwd(double m, double n, double k) const { return linear(m, k, n) + linear(n, k, m); }
  // fp8's scaling of one (rows, cols) GEMM input: its amax (a read) and the cast (a read, a one-byte write).
  double fp8_cast(double rows, double cols) const { return s.fp8 ? pass(rows * cols, 2 + 1 / s.d, 0) : 0; }
  // An elementwise op over `elements` elements making `passes` passes over memory (reads and writes), whose
  // measured cost per element is `s_per_element` (0: bandwidth-bound): the slower of the two.
  double pass(double elements, double passes, double s_per_element) const;
  double launches(double kernels) const { return s.oversubscribed * kernels * hw.kernel_overhead_s; }
  // Causal attention of `flops` (forward, or backward counted as 2.5 forwards) at this shape's T and D.
  double attention(double flops) const;
  // One (N, C) activation's collectives over the tensor-parallel group.
  double tp_all_reduce() const { return tpl.all_reduce(s.tp, s.N() * s.m.C * s.d); }
  double tp_gather() const { return tpl.gather(s.tp, s.N() * s.m.C * s.d); }

  // The GEMMs as the code runs them: QKV (G/tp groups of R query, a key and a value head), proj, fc1 (GPT: F/tp
  // columns; Llama: gate and up as one 2F/tp-column GEMM) and fc2.
  // A MoE layer (`moe`) runs its router and experts in place of fc1 and fc2 (moe_forward).
  Parts layer_forward(bool moe) const;
  // models/moe_mlp.cpp MoeMlp::forward, routing balanced (N k / E rows per expert from each rank): the router's
  // GEMM, one GEMM pair per expert this rank holds (E / EP of them, each N k EP / (E folds) rows), the shared
  // expert's; the router, dispatch, permute, the activations, unpermute and the shared expert's add as passes;
  // with expert parallelism the all-to-alls of dispatch and combine, and the received rows' reorder there and
  // back; with parallel folding the share's gather and its scatter back among zeros.
  Parts moe_forward() const;
  // Causal attention of this rank's B T queries over the whole sequence, 2 B H T^2 D at cp 1: with context
  // parallelism a rank's two chunks hold 1/cp of the causal work (parallel/layers/context_parallel.h); sliding
  // windows' layers less (ModelShapes::attention_work).
  double attention_flops() const { return 2 * s.B * s.m.Ht * s.T * (s.T * s.cp) * s.m.D * s.m.attention_work; }
  // parallel/layers/context_parallel.cpp: the (B, T, Gt, 2, D) key/value block of a rank in the compute dtype.
  double kv_bytes() const { return s.B * s.T * s.m.Gt * 2 * s.m.D * s.d; }
  // context_attention_forward's exposed transfers: the ring's cp - 1 blocks, each sent while the block before is
  // computed (what exceeds a block's attention), or one all-gather of every block before any compute.
  double context_forward() const;
  // The merges of the cp - 1 later blocks' partial outputs into the f32 accumulator, (B, T, Ht, D) f32 each,
  // read twice and written once, and the final copy out.
  double context_merges() const;
  // context_attention_backward: the keys and values again as forward, and their f32 gradients: on the ring each
  // of the cp hops waited right after its block's compute (exposed); with allgather one reduce-scatter of all cp
  // blocks' gradients.
  double context_backward() const;
  // The dispatch and combine all-to-alls of one MoE layer's forward or backward: each sends this rank's share of
  // the N k permuted rows (all of them, or 1 / folds with parallel folding) but the 1/EP staying on this rank (a
  // quarter of the step's all_to_all_bytes_per_token, per token and fold). The share for peers in other nodes goes
  // over the inter-node link, the rest over NVLink, at once: the slower of the two.
  double moe_all_to_all() const;
  // TransformerLayer::recompute_selected at the start of a layer's backward: the norms, the attention forward, the
  // MLP (or MoE) activation again, as their forwards cost.
  Parts selective_recompute(bool moe) const;
  Parts layer_backward(bool moe) const;
  // MoeMlp::backward: each forward GEMM's two, the permutes of dout and dx, the probabilities' gradient, the
  // activations' backward, the router's backward (and the aux and z losses'), the shared expert's add.
  Parts moe_backward() const;
  Parts head_forward() const;
  Parts head_backward() const;
  Parts embedding_forward() const;
  Parts embedding_backward() const;

 private:
  const Shapes& s;
  const Hardware& hw;
  Link tpl, cpl, intra, inter;
};

}  // namespace mt::plan::time_detail
