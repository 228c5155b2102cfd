// time_model_costs.cpp: the time of each part of one microbatch on one rank (time_model_costs.h's Costs): a layer's
// forward and backward, dense or MoE, with selective recomputation and context parallelism's transfers, the head
// and the embeddings, each as the code runs it.
#include "plan/time_model_costs.h"

namespace mt::plan::time_detail {

double Costs::gemm(double m, double n, double k) const {
  return s.oversubscribed * (2 * m * n * k / gemm_rate(hw, m, n, k, s.fp32) + hw.kernel_overhead_s);
}

double Costs::linear(double m, double n, double k) const {
  if (!s.fp8) return gemm(m, n, k);
  return s.oversubscribed * (2 * m * n * k / (s.fp8_rate * gemm_rate(hw, m, n, k, false)) + hw.kernel_overhead_s);
}

double Costs::pass(double elements, double passes, double s_per_element) const {
  // The CPU backend widens bf16/fp16 to fp32 around each op: count the wider traffic.
  const double widen = (!hw.is_gpu && s.d != 4) ? 4 / s.d + 1 : 1;
  const double by_bytes = elements * passes * s.d * widen / (hw.hbm_bytes_per_s * hw.elementwise_efficiency);
  return s.oversubscribed * std::max(by_bytes, elements * s_per_element);
}

double Costs::attention(double flops) const {
  return s.oversubscribed *
         (flops / attention_rate(hw, s.T, s.m.D, s.attention_dropout, s.fp32) + hw.kernel_overhead_s);
}

Parts Costs::layer_forward(bool moe) const {
  const ModelShapes& m = s.m;
  const double N = s.N(), Ns = s.Ns(), C = m.C;
  Parts p;
  p.gemm = linear(N, m.qkv, C) + linear(N, C, m.Ct) + (moe ? 0 : linear(N, m.fc1, C) + linear(N, C, m.Ft));
  p.attention = attention(attention_flops());  // QK^T and PV, causal: half of 4 B H T^2 D
  // fp8: the inputs of the four linears cast (their amaxes first). The weights are cast once per step
  // (parallel/layers/fp8_linear.h Fp8Link::weight), not counted: under 1% of a step at any size a GPU trains.
  p.elementwise += fp8_cast(N, C) + fp8_cast(N, m.Ct) + (moe ? 0 : fp8_cast(N, C) + fp8_cast(N, m.Ft));
  // Two norms (read, write), two dropout-adds (two reads, a write), the biases after the reductions: 14
  // (Ns, C) passes; the epilogues of QKV and fc1 (bias, GELU) are fused on GPUs, separate passes on the
  // CPU. Llama has no epilogues but runs the rotary embeddings on q and k and SwiGLU as passes of their own.
  const ElementwiseCosts& e = hw.elementwise_costs;
  double t =
      2 * pass(Ns * C, 2, e.norm_forward) + 2 * pass(Ns * C, 3, s.dropout ? e.dropout_forward : 0) + pass(Ns * C, 4, 0);
  double kernels = 12;
  if (m.gelu_epilogue) {
    if (!hw.is_gpu) t += pass(N * m.qkv, 2, 0) + (moe ? 0 : pass(N * m.Ft, 2, 0) + pass(N * m.Ft, 2, e.act_forward));
  } else {
    t += pass(N * (m.qkv - m.Gt * m.D), 2, 0);        // rope on q, k
    if (!moe) t += pass(N * m.Ft, 3, e.act_forward);  // SwiGLU
    kernels += moe ? 1 : 2;
  }
  if (m.qk_norm) {  // models/qk_norm.cpp: qkv slot-major and back, the q and k rows normalized and copied
    t += 2 * pass(N * m.qkv, 2, 0) + pass(N * (m.qkv - m.Gt * m.D), 2, e.norm_forward) + pass(N * m.qkv, 2, 0);
    kernels += 6;
  }
  if (s.sp) t += pass(N * C, 4, 0);  // the rank-major permutes around the gathers and reduce-scatters
  p.elementwise += t + launches(kernels);
  if (s.tp > 1) p.tp = s.sp ? 4 * tp_gather() : 2 * tp_all_reduce();
  p.cp = context_forward();
  p.elementwise += context_merges();
  if (moe) p += moe_forward();
  return p;
}

Parts Costs::moe_forward() const {
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

double Costs::context_forward() const {
  if (s.cp <= 1) return 0;
  if (s.cp_allgather) return cpl.gather(s.cp, s.cp * kv_bytes());
  const double block = attention(attention_flops()) / s.cp;
  return (s.cp - 1) * std::max(0.0, cpl.p2p(kv_bytes()) - block);
}

double Costs::context_merges() const {
  if (s.cp <= 1) return 0;
  const double f32 = 4 / s.d;
  return s.cp * pass(s.N() * s.m.Ct * f32, 3, 0) + launches(s.cp);
}

double Costs::context_backward() const {
  if (s.cp <= 1) return 0;
  const double grads = kv_bytes() * 4 / s.d;
  if (s.cp_allgather) return cpl.gather(s.cp, s.cp * kv_bytes()) + cpl.gather(s.cp, s.cp * grads);
  const double block = 2.5 * attention(attention_flops()) / s.cp;
  return (s.cp - 1) * std::max(0.0, cpl.p2p(kv_bytes()) - block) + s.cp * cpl.p2p(grads);
}

double Costs::moe_all_to_all() const {
  const double bytes = s.N() * all_to_all_bytes_per_token(s.m.moe, s.m.C, s.d, s.ep) / 4 / s.m.moe.folds;
  if (bytes <= 0) return 0;
  const double off = s.ep_peers_off_node / (s.ep - 1);  // the fraction of the bytes leaving the node
  const double inside = off < 1 ? intra.all_to_all(s.ep - s.ep_peers_off_node, bytes * (1 - off)) : 0;
  const double across = off > 0 ? inter.all_to_all(s.ep_peers_off_node + 1, bytes * off) : 0;
  return 2 * std::max(inside, across);
}

Parts Costs::selective_recompute(bool moe) const {
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

Parts Costs::layer_backward(bool moe) const {
  const ModelShapes& m = s.m;
  const double N = s.N(), Ns = s.Ns(), C = m.C;
  Parts p;
  p.gemm =
      linear_bwd(N, m.qkv, C) + linear_bwd(N, C, m.Ct) + (moe ? 0 : linear_bwd(N, m.fc1, C) + linear_bwd(N, C, m.Ft));
  p.attention = attention(2.5 * attention_flops());  // flash backward: ~2.5x the forward
  // fp8: the output gradients cast, and the inputs again (parallel/layers/parallel_linear.cpp).
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
  if (m.qk_norm) {  // dqkv slot-major and back, the q and k rows' norm backward and copies
    t += 2 * pass(N * m.qkv, 2, 0) + pass(N * (m.qkv - m.Gt * m.D), 4, e.norm_backward) +
         pass(N * (m.qkv - m.Gt * m.D), 2, 0);
    kernels += 6;
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

Parts Costs::moe_backward() const {
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

Parts Costs::head_forward() const {
  const double N = s.N(), Ns = s.Ns(), C = s.m.C, Vt = s.m.Vt;
  Parts p;
  p.gemm = gemm(N, Vt, C);
  const ElementwiseCosts& e = hw.elementwise_costs;
  p.elementwise = pass(Ns * C, 2, e.norm_forward) + pass(N * Vt, 3, e.cross_entropy_forward) + launches(5);
  if (s.tp > 1) p.tp = (s.sp ? tp_gather() : 0) + 2 * tpl.all_reduce(s.tp, 2 * N * 4);
  return p;
}

Parts Costs::head_backward() const {
  const double N = s.N(), Ns = s.Ns(), C = s.m.C, Vt = s.m.Vt;
  Parts p;
  p.gemm = gemm_bwd(N, Vt, C);
  const ElementwiseCosts& e = hw.elementwise_costs;
  p.elementwise = pass(Ns * C, 3, e.norm_backward) + pass(N * Vt, 2, e.cross_entropy_backward) + launches(4);
  if (s.tp > 1) p.tp = s.sp ? tp_gather() : tp_all_reduce();
  return p;
}

Parts Costs::embedding_forward() const {
  Parts p;
  p.elementwise = pass(s.N() * s.m.C, 4, 0) + launches(3);
  if (s.tp > 1) p.tp = s.sp ? tp_gather() : tp_all_reduce();
  return p;
}

Parts Costs::embedding_backward() const {
  Parts p;
  p.elementwise = pass(s.N() * s.m.C, 4, 0) + launches(3);
  if (s.tp > 1 && s.sp) p.tp = tp_gather();
  return p;
}

}  // namespace mt::plan::time_detail
