// activation_tape.cpp: the allocation replay of one microbatch through one model chunk (see activation_tape.h).
#include "plan/activation_tape.h"

#include <algorithm>
#include <vector>

namespace mt::plan {

namespace {

// Current activation bytes and the peaks since the last mark; workspaces are transient (one op each).
class Tape {
 public:
  void alloc(double bytes) {
    act_ += bytes;
    peak_act_ = std::max(peak_act_, act_);
    peak_sum_ = std::max(peak_sum_, act_);
  }
  void free(double bytes) { act_ -= bytes; }
  void workspace(double bytes) {
    if (bytes <= 0) return;
    peak_ws_ = std::max(peak_ws_, bytes);
    peak_sum_ = std::max(peak_sum_, act_ + bytes);
  }
  void mark() {
    start_ = peak_act_ = peak_sum_ = act_;
    peak_ws_ = 0;
  }
  OpProfile since_mark() const {
    return OpProfile{
        .peak_act = peak_act_ - start_, .peak_ws = peak_ws_, .peak_sum = peak_sum_ - start_, .delta = act_ - start_};
  }

 private:
  double act_ = 0, start_ = 0, peak_act_ = 0, peak_sum_ = 0, peak_ws_ = 0;
};

// The ops whose memory depends on the backend, on top of a Tape and the microbatch's shapes.
class Replay {
 public:
  Replay(Tape& tape, const TapeShapes& s) : t(tape), s(s) {}

  // core/cpu/gemm.cpp: bf16/fp16 operands widened to fp32 (as_f32), and an fp32 out buffer unless out is fp32
  // (the f32 gradients of weight-gradient GEMMs). Elements of a, b and out; out_f32: out is an f32 tensor.
  void gemm(double a, double b, double out, bool out_f32 = false) {
    if (!s.cpu || s.d == 4) return;
    t.workspace(4 * (a + b + (out_f32 ? 0 : out)));
  }
  // parallel/sequence_parallel.cpp sequence_to_full: with SP a new (N, C) activation gathered through a
  // (tp, B, Ts, C) workspace; without, the same tensor. Returns the bytes allocated.
  double to_full() {
    if (!s.sp) return 0;
    const double full = s.N() * s.C * s.d;
    t.alloc(full);
    t.workspace(full);  // gathered
    return full;
  }
  // sequence_shard_sum: with SP a reduce-scatter into a new (Ns, C) shard through a rank-major workspace (plus
  // Gloo's fp32 accumulator and incoming block on the CPU); without SP an all-reduce in place (Gloo reduces
  // 16-bit types in an fp32 copy). Returns the bytes allocated.
  double shard_sum(double rows) {
    const double NC = rows * s.C;
    if (!s.sp) {
      if (s.tp > 1 && s.cpu && s.d != 4) t.workspace(4 * NC);
      return 0;
    }
    const double shard = s.Ns() * s.C * s.d;
    t.alloc(shard);
    t.workspace(NC * s.d + (s.cpu ? 4 * NC + 4 * s.Ns() * s.C : 0));
    return shard;
  }

  // models/transformer_layer.cpp TransformerLayer::run: returns the bytes kept for backward (the Activations
  // less x); leaves `out` (Ns, C) allocated for the caller.
  double layer_run(bool keep) {
    const double N = s.N(), Ns = s.Ns(), C = s.C, d = s.d;
    double kept = 0;
    auto keep_alloc = [&](double bytes) {
      t.alloc(bytes);
      kept += bytes;
    };
    keep_alloc(Ns * C * d + 2 * Ns * 4);  // ln1, ln1_mean, ln1_rstd
    keep_alloc(N * 3 * s.Ct * d);         // qkv
    const double full1 = to_full();       // sequence_to_full(ln1), a temporary of the call
    gemm(N * C, 3 * s.Ct * C, N * 3 * s.Ct);
    t.free(full1);
    keep_alloc(N * s.Ct * d + s.B * s.Ht * s.T * 4);  // att, att_lse
    t.alloc(N * C * d);                               // proj_partial
    gemm(N * s.Ct, C * s.Ct, N * C);
    const double proj = shard_sum(N);
    keep_alloc(Ns * C * d);               // x2
    keep_alloc(Ns * C * d + 2 * Ns * 4);  // ln2 and its statistics
    keep_alloc(2 * N * s.Ft * d);         // fc1 (the GELU's aux), gelu
    const double full2 = to_full();       // sequence_to_full(ln2)
    gemm(N * C, s.Ft * C, N * s.Ft);      // into aux, then GELU
    t.free(full2);
    t.alloc(N * C * d);  // mlp_partial
    gemm(N * s.Ft, C * s.Ft, N * C);
    const double mlp = shard_sum(N);
    t.alloc(Ns * C * d);  // out
    if (!keep) t.free(kept);
    t.free(N * C * d + proj + N * C * d + mlp);  // run()'s locals: proj_partial, proj, mlp_partial, mlp
    return keep ? kept : 0;
  }
  double layer_forward() { return layer_run(!s.recompute); }

  // TransformerLayer::backward: frees the layer's activations and input x; leaves dx (Ns, C) allocated.
  void layer_backward(double kept) {
    const double N = s.N(), Ns = s.Ns(), C = s.C, d = s.d, Ft = s.Ft, Ct = s.Ct;
    if (s.recompute) {
      kept = layer_run(true);
      t.free(Ns * C * d);  // the recomputed out, a discarded temporary
    }
    double locals = 0;
    auto local = [&](double bytes) {
      t.alloc(bytes);
      locals += bytes;
    };
    local(Ns * C * d);             // dmlp
    locals += to_full();           // dmlp_full
    gemm(N * C, N * Ft, 0, true);  // dW fc2 (f32 grad), bias grad from the epilogue
    local(N * Ft * d);             // dfc1
    gemm(N * C, C * Ft, N * Ft);
    local(N * C * d);  // dln2_partial
    const double full2 = to_full();
    gemm(N * Ft, N * C, 0, true);
    gemm(N * Ft, Ft * C, N * C);
    t.free(full2);
    locals += shard_sum(N);  // dln2
    local(Ns * C * d);       // dx2
    local(Ns * C * d);       // dproj
    locals += to_full();     // dproj_full
    local(N * Ct * d);       // datt
    gemm(N * C, N * Ct, 0, true);
    gemm(N * C, C * Ct, N * Ct);
    local(N * 3 * Ct * d);  // dqkv
    local(N * C * d);       // dln1_partial
    const double full1 = to_full();
    gemm(N * 3 * Ct, N * C, 0, true);
    gemm(N * 3 * Ct, 3 * Ct * C, N * C);
    t.free(full1);
    locals += shard_sum(N);              // dln1
    t.alloc(Ns * C * d);                 // dx, returned
    t.free(locals + kept + Ns * C * d);  // the locals, the activations and the input x
  }

  // models/gpt.cpp forward_impl, the head part; returns the bytes HeadActivations keeps (final_in aside).
  double head_forward() {
    const double N = s.N(), Ns = s.Ns(), C = s.C, d = s.d;
    double kept = 0;
    t.alloc(Ns * C * d + 2 * Ns * 4);  // lnf, lnf_mean, lnf_rstd
    kept += Ns * C * d + 2 * Ns * 4;
    const double full = to_full();  // h.lnf (the gathered rows with SP)
    kept += full;
    t.alloc(N * s.Vt * d);  // logits
    kept += N * s.Vt * d;
    gemm(N * C, s.Vt * C, N * s.Vt);
    t.alloc(2 * N * 4);  // rowmax, sumexp
    kept += 2 * N * 4;
    t.alloc(2 * N * 4);  // target_logit, losses
    if (s.tp > 1) {
      t.alloc(2 * N * 4);  // both
      t.free(2 * N * 4);
    }
    t.free(2 * N * 4);
    if (s.sp) {  // the shard lnf, a local of forward_impl
      t.free(Ns * C * d);
      kept -= Ns * C * d;
    }
    return kept;
  }
  // GptModel::backward_stage, the head part: frees HeadActivations (final_in included); leaves dx (Ns, C).
  void head_backward(double kept) {
    const double N = s.N(), Ns = s.Ns(), C = s.C, d = s.d;
    double locals = 0;
    auto local = [&](double bytes) {
      t.alloc(bytes);
      locals += bytes;
    };
    local(N * 4);          // dlosses
    local(N * s.Vt * d);   // dlogits
    t.free(N * s.Vt * d);  // h.logits released
    kept -= N * s.Vt * d;
    gemm(N * s.Vt, N * C, 0, true);  // dW of the head (f32 grad)
    local(N * C * d);                // dlnf
    gemm(N * s.Vt, s.Vt * C, N * C);
    locals += shard_sum(N);              // dlnf_shard
    t.alloc(Ns * C * d);                 // dx
    t.free(locals + kept + Ns * C * d);  // h (final_in too) and the locals
  }

  // forward_impl, the embedding part: leaves x (Ns, C) allocated.
  void embedding_forward() {
    const double N = s.N(), C = s.C, d = s.d;
    t.alloc(N * C * d);  // partial (B, T, C)
    const double shard = shard_sum(N);
    if (shard > 0) t.free(N * C * d);  // with SP the shard is x and partial goes at the end of the block
  }
  // backward_stage, the embedding part: frees dx (Ns, C) (gathered to full rows with SP on the way).
  void embedding_backward() {
    const double full = to_full();
    t.free(s.Ns() * s.C * s.d + full);
  }

  Tape& t;
  const TapeShapes& s;
};

}  // namespace

ChunkProfile profile_chunk(const TapeShapes& s, const ChunkSpec& chunk) {
  Tape tape;
  Replay r(tape, s);
  ChunkProfile out;
  const double hidden = s.Ns() * s.C * s.d;  // one (B, T/sp, C) activation: what crosses between stages
  const double tokens = s.B * s.T * 4;       // (B, T) i32
  out.message = hidden;

  // Forward: the trainer's load_batch, then GptModel::forward_stage. A received input is already counted.
  tape.mark();
  tape.alloc(2 * tokens);  // tokens, targets
  if (chunk.has_embedding) r.embedding_forward();
  std::vector<double> kept(static_cast<size_t>(chunk.layers));
  for (auto& k : kept) k = r.layer_forward();
  double head_kept = 0;
  if (chunk.has_head) head_kept = r.head_forward();
  // IterationStage::forward's batch is freed unless the model keeps it: embedded_ holds tokens, the head
  // tokens and targets (the plain loop's locals hold both until the next microbatch anyway).
  const double batch_kept = (chunk.has_head || !chunk.pipelined) ? 2 * tokens : chunk.has_embedding ? tokens : 0;
  tape.free(2 * tokens - batch_kept);
  out.forward = tape.since_mark();
  out.output = chunk.has_head ? 0 : hidden;

  // Backward. Without the head, the received output gradient is already counted (the executor holds it
  // until the backward returns).
  tape.mark();
  bool dx_is_received = !chunk.has_head;
  if (chunk.has_head) r.head_backward(head_kept);
  for (auto k = kept.rbegin(); k != kept.rend(); ++k) {
    r.layer_backward(*k);
    if (!dx_is_received) tape.free(hidden);  // the previous dx, replaced by the layer's
    dx_is_received = false;
  }
  if (chunk.has_embedding) {
    r.embedding_backward();
  } else {
    out.input_grad = hidden;
  }
  tape.free(batch_kept);
  if (!chunk.has_head) tape.free(hidden);  // the executor's received gradient
  out.backward = tape.since_mark();
  return out;
}

}  // namespace mt::plan
