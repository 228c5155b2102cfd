// activation_tape.cpp: the allocation replay of one microbatch through one model chunk (see activation_tape.h).
#include "plan/activation_tape.h"

#include <algorithm>
#include <vector>

namespace mt::plan {

namespace {

// Current activation and workspace bytes and the peaks since the last mark. A workspace is either transient
// (one op: a GEMM's widened operands, Gloo's copies) or held across ops (the rank-major buffer of a
// sequence-parallel collective in flight while a GEMM runs).
class Tape {
 public:
  void alloc(double bytes) {
    act_ += bytes;
    peak_act_ = std::max(peak_act_, act_);
    peak_sum_ = std::max(peak_sum_, act_ + ws_);
  }
  void free(double bytes) { act_ -= bytes; }
  void workspace(double bytes) {
    if (bytes <= 0) return;
    peak_ws_ = std::max(peak_ws_, ws_ + bytes);
    peak_sum_ = std::max(peak_sum_, act_ + ws_ + bytes);
  }
  void hold(double bytes) {
    ws_ += bytes;
    peak_ws_ = std::max(peak_ws_, ws_);
    peak_sum_ = std::max(peak_sum_, act_ + ws_);
  }
  void release(double bytes) { ws_ -= bytes; }
  void mark() {
    start_ = peak_act_ = peak_sum_ = act_;
    peak_ws_ = 0;
  }
  OpProfile since_mark() const {
    return OpProfile{
        .peak_act = peak_act_ - start_, .peak_ws = peak_ws_, .peak_sum = peak_sum_ - start_, .delta = act_ - start_};
  }

 private:
  double act_ = 0, ws_ = 0, start_ = 0, peak_act_ = 0, peak_sum_ = 0, peak_ws_ = 0;
};

// The ops whose memory depends on the backend, on top of a Tape and the microbatch's shapes. Every
// tensor-parallel collective here moves (rows, C) hidden activations.
class Replay {
 public:
  Replay(Tape& tape, const TapeShapes& s) : t(tape), s(s) {}

  // core/cpu/gemm.cpp: bf16/fp16 operands widened to fp32 (as_f32), and an fp32 out buffer unless out is fp32
  // (the f32 gradients of weight-gradient GEMMs). Elements of a, b and out; out_f32: out is an f32 tensor.
  void gemm(double a, double b, double out, bool out_f32 = false) {
    if (!s.cpu || s.d == 4) return;
    t.workspace(4 * (a + b + (out_f32 ? 0 : out)));
  }

  // A linear's weight-gradient GEMM (dW and the bias gradient on its epilogue, into an f32 gradient) of a and b
  // elements: now, or with split_backward in W (parallel/pipeline/weight_grad.h), where its widened operands are W's workspace.
  void weight_gemm(double a, double b) {
    if (!defer) return gemm(a, b, 0, true);
    if (s.cpu && s.d != 4) w_ws = std::max(w_ws, 4 * (a + b));
  }
  // A tensor the backward would free now that a deferred weight-gradient GEMM captures (with split_backward):
  // freed by W instead. Returns the bytes to free now.
  double unless_kept_for_w(double bytes) {
    if (!defer) return bytes;
    deferred += bytes;
    return 0;
  }

  // parallel/layers/sequence_parallel.cpp SequenceGather: the constructor posts the all-gather of the (Ns, C) shard
  // into a (tp, B, Ts * C) rank-major workspace (with SP; nothing without).
  void gather_begin() {
    if (s.sp) t.hold(s.N() * s.m.C * s.d);  // rank_major_
  }
  // SequenceGather::wait: a new (N, C) activation, the rank-major workspace released after the transpose.
  // Returns the bytes allocated (0 without SP: the shard itself is returned).
  double gather_wait() {
    if (!s.sp) return 0;
    const double full = s.N() * s.m.C * s.d;
    t.alloc(full);
    t.release(full);
    return full;
  }
  // sequence_to_full, the blocking gather.
  double to_full() {
    gather_begin();
    return gather_wait();
  }
  // SequenceReduction's constructor on a (N, C) partial: with SP a rank-major copy (held until wait) and a
  // new (Ns, C) result, reduce-scattered (Gloo: an fp32 block of every rank and, for 16-bit inputs, an fp32
  // copy of the input, transient, comm_gloo.cpp reduce_scatter); without SP an all-reduce in place (Gloo reduces
  // 16-bit types in an fp32 copy). Returns the bytes allocated.
  double reduction_begin() {
    const double NC = s.N() * s.m.C;
    if (!s.sp) {
      if (s.tp > 1 && s.cpu && s.d != 4) t.workspace(4 * NC);
      return 0;
    }
    t.hold(NC * s.d);  // rank_major_
    const double shard = s.Ns() * s.m.C * s.d;
    t.alloc(shard);  // result_
    if (s.cpu) t.workspace((s.d == 4 ? 4 : 8) * NC);
    return shard;
  }
  // SequenceReduction::wait: the rank-major copy released.
  void reduction_wait() {
    if (s.sp) t.release(s.N() * s.m.C * s.d);
  }
  // sequence_shard_sum, the blocking reduction.
  double shard_sum() {
    const double shard = reduction_begin();
    reduction_wait();
    return shard;
  }

  // parallel/layers/parallel_linear.cpp ColumnParallelLinear::forward of the (Ns, C) input into `cols` output
  // columns: the gathered input (a temporary of the call), out (N, cols) and with `gelu` the pre-activation
  // (N, cols). Returns the bytes of what it leaves allocated (out, and the pre-activation).
  double column_forward(double cols, bool gelu = false) {
    const double N = s.N(), C = s.m.C, d = s.d;
    const double full = to_full();  // x_full
    const double out = N * cols * d * (gelu ? 2 : 1);
    t.alloc(out);  // out (and *gelu_preact)
    gemm(N * C, cols * C, N * cols);
    t.free(full);
    return out;
  }
  // RowParallelLinear::forward of the (N, cols) input: partial (N, C), reduced into y (Ns, C) with SP (partial
  // then freed) or in place. Returns the bytes of y left allocated.
  double row_forward(double cols) {
    const double N = s.N(), C = s.m.C, d = s.d;
    t.alloc(N * C * d);  // partial
    gemm(N * cols, C * cols, N * C);
    const double y = shard_sum();
    if (!s.sp) return N * C * d;  // y is partial
    t.free(N * C * d);
    return y;
  }
  // ColumnParallelLinear::backward, dout (N, cols) and the kept (Ns, C) input: the input gathered again while
  // dx is computed, then dx's reduction in flight while dW is computed (both buffers live at once). Returns
  // the bytes of dx (Ns, C) left allocated.
  double column_backward(double cols) {
    const double N = s.N(), C = s.m.C, d = s.d;
    gather_begin();      // SequenceGather input(x)
    t.alloc(N * C * d);  // dx_partial
    gemm(N * cols, cols * C, N * C);
    const double full = gather_wait();  // x_full
    const double shard = reduction_begin();
    weight_gemm(N * cols, N * C);  // dW (an f32 gradient), the bias gradient on its epilogue; W keeps dout, x_full
    reduction_wait();
    t.free(unless_kept_for_w(full));
    if (!s.sp) return N * C * d;  // dx is dx_partial
    t.free(N * C * d);
    return shard;
  }
  // RowParallelLinear::backward, dout (Ns, C) and the kept (N, cols) input: dout gathered (a temporary of the
  // call), dW, then dx (N, cols). Returns the bytes of dx left allocated.
  double row_backward(double cols) {
    const double N = s.N(), C = s.m.C, d = s.d;
    const double full = to_full();  // dout_full
    weight_gemm(N * C, N * cols);   // dW (f32), the bias gradient on its epilogue; W keeps dout_full and x
    t.alloc(N * cols * d);          // dx
    gemm(N * C, C * cols, N * cols);
    t.free(unless_kept_for_w(full));
    return N * cols * d;
  }

  // models/norm.cpp Norm::forward on (Ns, C) rows: out, rstd (and LayerNorm's mean). Returns the bytes.
  double norm_forward() {
    const double bytes = s.Ns() * s.m.C * s.d + s.m.norm_stats() * s.Ns() * 4;
    t.alloc(bytes);
    return bytes;
  }

  // core/cuda/rope.cu rope_: a (T, D/2) cos and sin table in f32 for the call (the CPU's are host vectors).
  void rope() {
    if (s.m.rotary && !s.cpu) t.workspace(s.T * s.m.D * 4);
  }

  // parallel/layers/context_parallel.cpp with context parallelism: the key/value blocks of this rank's (B, T, Gt, 2, D)
  // in the compute dtype, the own one and the ring's next (p2p) or all cp gathered (allgather).
  double kv_elements() const { return s.B * s.T * s.m.Gt * 2 * s.m.D; }
  double kv_blocks_bytes() const { return kv_elements() * s.d * (s.cp_allgather ? 1 + s.cp : 2); }
  // context_attention_forward, the temporaries of the call: the key/value blocks, the merged output and one
  // block's (B, T, Ht, D) f32 and that block's (B, Ht, T) f32 log-sum-exp.
  void context_forward() {
    if (s.cp <= 1) return;
    const double held = kv_blocks_bytes() + 2 * s.B * s.T * s.m.Ct * 4 + s.B * s.m.Ht * s.T * 4;
    t.alloc(held);
    t.free(held);
  }
  // context_attention_backward: the key/value blocks, dq (B, T, Ht, D) f32 and the key/value gradients in f32:
  // with allgather every block's (cp of them), then this rank's (reduce-scattered, Gloo's cp blocks received
  // into an f32 workspace); on the ring the travelling one and the arriving one.
  void context_backward() {
    if (s.cp <= 1) return;
    const double kv = kv_elements() * 4, blocks = kv_blocks_bytes() + s.B * s.T * s.m.Ct * 4;
    if (s.cp_allgather) {
      t.alloc(blocks + s.cp * kv + kv);
      if (s.cpu) t.workspace(s.cp * kv);  // comm_gloo.cpp reduce_scatter's blocks
      t.free(blocks + s.cp * kv + kv);
    } else {
      t.alloc(blocks + 2 * kv);
      t.free(blocks + 2 * kv);
    }
  }

  // models/moe_mlp.cpp MoeMlp::forward on the (Ns, C) rows, routing balanced (each expert N k / E rows of every
  // rank): the Saved tensors, the locals of the call, and the expert GEMMs one after another (their CPU workspaces
  // one at a time). With parallel folding this rank dispatches Rd = N k / folds of the choices (take_share) and
  // puts their outputs back among all N k (put_share); with expert parallelism this rank's E / EP experts get the
  // Rd rows the EP ranks send them (balanced), moved by to_experts and from_experts. Returns the bytes Saved
  // keeps; `out` the bytes of the (Ns, C) output left allocated.
  double moe_forward(double& out) {
    const MoeShapes& e = s.m.moe;
    const bool ep = e.ep > 1, fold = e.folds > 1;
    // Rr: the rows this rank's experts get, Rd each with balanced routing, up to e.imbalance times that with EP.
    const double N = s.N(), C = s.m.C, d = s.d, E = e.E, k = e.k, R = N * k, Rd = R / e.folds,
                 Rr = ep ? Rd * e.imbalance : Rd, n = Rr / e.El;
    double kept = 0, locals = 0;
    auto keep = [&](double bytes) {
      t.alloc(bytes);
      kept += bytes;
    };
    auto local = [&](double bytes) {
      t.alloc(bytes);
      locals += bytes;
    };
    kept += to_full();  // s.x (N, C): every token (gathered with SP; n2's own rows without)
    const double logits = N * E * 4;
    t.alloc(logits);                  // logits (N, E) f32
    gemm(N * C, E * C, N * E, true);  // x Wr^T into the f32 logits
    keep(N * E * 4 + 2 * N * k * 4);  // scores (N, E) f32, experts (N, k) i32, probs (N, k) f32
    if (e.keep_logits) {
      kept += logits;  // s.logits: the same buffer, kept for the aux and z losses
    } else {
      locals += logits;
    }
    keep(N * k * 4);   // row_of (N, k) i32
    local(2 * E * 4);  // counts (E) i32 and its host copy
    if (!ep && !fold) {
      keep(R * C * d);  // xp (R, C)
    } else {
      local(R * C * d);  // xp (R, C): this rank's choices
      if (fold) {
        if (s.cpu) t.alloc(Rd * 4);  // plan_share: share from_ints on the host (the CPU's allocator on CUDA),
        keep(Rd * 4);                // then its device copy: share (Rd, 1) i32
        if (s.cpu) t.free(Rd * 4);
        if (ep) {
          local(Rd * C * d);  // take_share: xd (Rd, C), sent
        } else {
          keep(Rd * C * d);  // take_share: xd (Rd, C), s.xp itself
        }
      }
      if (ep) {
        if (s.cpu) t.alloc(Rr * 4);  // plan_exchange: order from_ints on the host (the CPU's allocator on CUDA),
        keep(Rr * 4);                // then its device copy: order (Rr, 1) i32
        if (s.cpu) t.free(Rr * 4);
        t.alloc(Rr * C * d);  // to_experts: received (Rr, C)
        keep(Rr * C * d);     // s.xp (Rr, C): received, expert-major
        t.free(Rr * C * d);
      }
    }
    keep(Rr * e.fc1 * d);  // h (Re, F1/ETP)
    keep(Rr * e.Ft * d);   // act (Re, F/ETP)
    if (!ep && !fold) {
      keep(R * C * d);  // y (R, C), this rank's partial
    } else {
      local(Rr * C * d);  // ye (Re, C): this rank's experts' outputs
    }
    gemm(n * C, e.fc1 * C, n * e.fc1);  // an expert's fc1 (the largest of its two GEMMs' workspaces with fc2)
    gemm(n * e.Ft, C * e.Ft, n * C);    // and fc2
    if (ep) {
      t.alloc(Rr * C * d);  // from_experts: by_rank (Re, C)
      t.alloc(Rd * C * d);  // its result (Rd, C): this rank's choices' outputs, back
      t.free(Rr * C * d);
      if (!fold) kept += Rd * C * d;  // s.y itself
    }
    if (fold) {
      keep(R * C * d);             // put_share: s.y (R, C), the other folds' rows zero
      if (ep) t.free(Rd * C * d);  // from_experts' result, a temporary
    }
    local(N * C * d);  // out (N, C): the weighted sum (partial over TP)
    if (e.shared()) {
      keep(N * e.sfc1 * d + N * e.Fst * d);  // shared_h, shared_act
      t.alloc(N * C * d);                    // ys (N, C), added to out at the end of its block
      gemm(N * C, e.sfc1 * C, N * e.sfc1);
      gemm(N * e.Fst, C * e.Fst, N * C);
      t.free(N * C * d);
    }
    const double shard = shard_sum();  // sequence_shard_sum(out): a new (Ns, C) shard with SP, else out itself
    if (shard > 0) {
      out = shard;
    } else {
      out = N * C * d;  // out is returned
      locals -= out;
    }
    t.free(locals);
    return kept;
  }

  // MoeMlp::backward of the (Ns, C) output gradient with forward's Saved (freed by the caller): the locals of the
  // call (the shared expert's in a block of their own) and the expert GEMMs one after another. Returns the bytes
  // of dx (Ns, C) left allocated.
  double moe_backward() {
    const MoeShapes& e = s.m.moe;
    const bool ep = e.ep > 1, fold = e.folds > 1;
    const double N = s.N(), C = s.m.C, d = s.d, E = e.E, k = e.k, R = N * k, Rd = R / e.folds,
                 Rr = ep ? Rd * e.imbalance : Rd, n = Rr / e.El;  // as moe_forward's
    double locals = to_full();                                    // dout (N, C), gathered with SP
    auto local = [&](double bytes) {
      t.alloc(bytes);
      locals += bytes;
    };
    local(R * C * d);             // dy (R, C)
    local(N * k * 4);             // dprobs (N, k) f32, all-reduced over TP in place (f32: no copy)
    if (fold) local(Rd * C * d);  // take_share(dy): dyd (Rd, C)
    if (ep) {
      t.alloc(Rr * C * d);  // to_experts(dyd): received (Rr, C)
      local(Rr * C * d);    // dye (Rr, C), expert-major
      t.free(Rr * C * d);
    }
    local(Rr * C * d);                      // dxe (Re, C)
    local(Rr * e.Ft * d + Rr * e.fc1 * d);  // dact (Re, F/ETP), dh (Re, F1/ETP)
    gemm(n * C, C * e.Ft, n * e.Ft);        // an expert's dact = dy W2
    gemm(n * C, n * e.Ft, 0, true);         // dW2 (f32)
    gemm(n * e.fc1, e.fc1 * C, n * C);      // dx = dh W1
    gemm(n * e.fc1, n * C, 0, true);        // dW1 (f32)
    if (ep) {
      t.alloc(Rr * C * d);  // from_experts(dxe): by_rank (Re, C)
      t.alloc(Rd * C * d);  // its result (Rd, C), back on this rank's choices
      t.free(Rr * C * d);
      if (!fold) locals += Rd * C * d;  // dxp itself
    }
    if (fold) {
      local(R * C * d);            // put_share: dxp (R, C), the other folds' rows zero
      if (ep) t.free(Rd * C * d);  // from_experts' result, a temporary
    }
    local(N * C * d);  // dx (N, C)
    if (e.shared()) {
      const double block = N * e.Fst * d + N * e.sfc1 * d + N * C * d;  // sdact, sdh, sdx
      t.alloc(block);
      gemm(N * C, C * e.Fst, N * e.Fst);
      gemm(N * C, N * e.Fst, 0, true);
      gemm(N * e.sfc1, e.sfc1 * C, N * C);
      gemm(N * e.sfc1, N * C, 0, true);
      t.free(block);
    }
    local(N * E * 4);                     // dlogits (N, E) f32
    if (d != 4) local(N * E * d);         // dl: dlogits in the compute dtype
    gemm(N * E, E * C, N * C);            // dx += dl Wr (TP rank 0)
    gemm(N * E, N * C, 0, true);          // dWr (f32)
    const double shard = shard_sum();     // sequence_shard_sum(dx)
    if (shard == 0) locals -= N * C * d;  // dx itself is returned
    t.free(locals);
    return shard > 0 ? shard : N * C * d;
  }

  // models/transformer_layer.cpp TransformerLayer::run: returns the bytes kept for backward (the Activations
  // less x); leaves `out` (Ns, C) allocated for the caller. The rotary embeddings work on qkv in place. `moe`: a
  // MoE layer, a MoeMlp in place of fc1 and fc2.
  double layer_run(bool keep, bool moe) {
    const ModelShapes& m = s.m;
    const double N = s.N(), Ns = s.Ns(), C = m.C, d = s.d;
    double kept = 0;
    auto keep_alloc = [&](double bytes) {
      t.alloc(bytes);
      kept += bytes;
    };
    kept += norm_forward();                           // n1
    kept += column_forward(m.qkv);                    // qkv (B, T, G/tp, R+2, D)
    rope();                                           // on q and k in place
    keep_alloc(N * m.Ct * d + s.B * m.Ht * s.T * 4);  // att, att_lse
    context_forward();                                // attend over the context ranks' keys and values
    const double proj = row_forward(m.Ct);            // proj, a local of run()
    keep_alloc(Ns * C * d);                           // x2
    kept += norm_forward();                           // n2
    double mlp = 0;                                   // mlp (Ns, C)
    if (moe) {
      kept += moe_forward(mlp);  // a.moe
    } else {
      if (m.gelu_epilogue) {
        kept += column_forward(m.Ft, /*gelu=*/true);  // act (GELU), fc1 (the pre-activation)
      } else {
        kept += column_forward(m.fc1);  // fc1 (N, 2F/tp): gate and up
        keep_alloc(N * m.Ft * d);       // act (N, F/tp) = swiglu(fc1)
      }
      mlp = row_forward(m.Ft);
    }
    t.alloc(Ns * C * d);  // out
    if (!keep) t.free(kept);
    t.free(proj + mlp);  // run()'s locals
    return keep ? kept : 0;
  }
  // TransformerLayer::drop_selected / recompute_selected: the bytes of the tensors selective recomputation drops
  // after forward and makes again at the start of backward.
  double selected_bytes(bool moe) const {
    const ModelShapes& m = s.m;
    const MoeShapes& e = m.moe;
    const double N = s.N(), Ns = s.Ns(), C = m.C, d = s.d;
    double bytes = 0;
    if (s.selective.layernorm) bytes += 2 * Ns * C * d;                                     // n1.out, n2.out
    if (s.selective.core_attn) bytes += N * m.Ct * d + s.B * m.Ht * s.T * 4;                // att, att_lse
    if (s.selective.mlp_act && !moe) bytes += N * m.Ft * d;                                 // act
    if (s.selective.moe_act && moe) bytes += N * e.k / e.folds * e.Ft * d + N * e.Fst * d;  // act, shared_act
    return bytes;
  }
  // `full`: this layer recomputes everything (training.recompute: full, within recompute_num_layers).
  double layer_forward(bool moe, bool full) {
    const double kept = layer_run(!full, moe);
    if (full || !s.selective.any()) return kept;
    const double dropped = selected_bytes(moe);
    t.free(dropped);
    return kept - dropped;
  }

  // models/transformer_layer.cpp TransformerLayer::backward: frees the layer's activations and input x; leaves dx
  // (Ns, C) allocated.
  void layer_backward(double kept, bool moe, bool full) {
    const ModelShapes& m = s.m;
    const double N = s.N(), Ns = s.Ns(), C = m.C, d = s.d;
    if (full) {
      kept = layer_run(true, moe);
      t.free(Ns * C * d);  // the recomputed out, a discarded temporary
    } else if (s.selective.any()) {
      const double again = selected_bytes(moe);  // recompute_selected, before anything else
      t.alloc(again);
      kept += again;
      if (s.selective.core_attn) context_forward();  // the attention forward again
    }
    double locals = 0;
    auto local = [&](double bytes) {
      t.alloc(bytes);
      locals += bytes;
    };
    // With split_backward, what the deferred weight-gradient GEMMs capture stays for W: each linear's output
    // gradient and input (with SP its gathered input and output gradient, which column_ and row_backward keep).
    // A MoE MLP's expert and router captures are not counted.
    const double hidden = Ns * C * d, no_sp = s.sp ? 0 : 1;
    double for_w = no_sp * hidden + N * m.Ct * d + no_sp * hidden;  // n1.out, att, dproj
    local(Ns * C * d);                                              // dmlp
    if (moe) {
      locals += moe_backward();  // dln2 = moe_->backward
    } else {
      for_w += N * m.Ft * d + 2 * no_sp * hidden;  // act; n2.out and dmlp
      // The MLP's input-side gradients live in a block of backward(), gone once fc1's backward returns.
      double block = row_backward(m.Ft);  // fc2_.backward: GPT's dfc1 (dGELU, fc1's bias grad on its epilogue); dact
      double dfc1 = block;
      if (!m.gelu_epilogue) {
        t.alloc(N * m.fc1 * d);  // dfc1 = swiglu_backward(fc1, dact)
        block += N * m.fc1 * d;
        dfc1 = N * m.fc1 * d;
      }
      locals += column_backward(m.fc1);  // dln2 = fc1_.backward
      t.free(block - dfc1 + unless_kept_for_w(dfc1));
    }
    local(Ns * C * d);  // dx2
    local(Ns * C * d);  // dproj
    // models/attention.cpp SelfAttention::backward: datt and dqkv are its locals, gone when it returns (dqkv kept
    // for W when deferred).
    const double datt = row_backward(m.Ct);  // datt = proj_.backward
    t.alloc(N * m.qkv * d);                  // dqkv
    context_backward();                      // over the context ranks' keys and values
    rope();                                  // the inverse rotation on dq, dk in place
    locals += column_backward(m.qkv);        // dln1 = qkv_.backward
    t.free(datt + unless_kept_for_w(N * m.qkv * d));
    t.alloc(Ns * C * d);  // dx, returned
    // The locals, the activations and the input x.
    t.free(locals + kept + Ns * C * d - for_w + unless_kept_for_w(for_w));
  }

  // models/gpt.cpp forward_impl, the head part; returns the bytes HeadActivations keeps (final_in aside).
  double head_forward() {
    const double N = s.N();
    double kept = norm_forward();    // lnf: out, rstd (and LayerNorm's mean), the shard rows with SP
    kept += column_forward(s.m.Vt);  // logits = head_.forward(lnf): the gathered lnf is a temporary of the call
    t.alloc(2 * N * 4);              // rowmax, sumexp
    kept += 2 * N * 4;
    t.alloc(2 * N * 4);  // target_logit, losses
    if (s.tp > 1) {
      t.alloc(2 * N * 4);  // both
      t.free(2 * N * 4);
    }
    t.free(2 * N * 4);
    return kept;
  }
  // GptModel::backward_stage, the head part: frees HeadActivations (final_in included); leaves dx (Ns, C).
  void head_backward(double kept) {
    const double N = s.N(), Ns = s.Ns(), C = s.m.C, d = s.d;
    double locals = 0;
    auto local = [&](double bytes) {
      t.alloc(bytes);
      locals += bytes;
    };
    local(N * 4);            // dlosses
    local(N * s.m.Vt * d);   // dlogits
    t.free(N * s.m.Vt * d);  // h.logits released
    kept -= N * s.m.Vt * d;
    defer = false;                      // the head's dW runs in B (models/gpt.cpp)
    locals += column_backward(s.m.Vt);  // dlnf = head_.backward(dlogits, h.lnf): lnf gathered again with SP
    defer = s.split_backward;
    t.alloc(Ns * C * d);                 // dx
    t.free(locals + kept + Ns * C * d);  // h (final_in too) and the locals
  }

  // forward_impl, the embedding part (parallel/layers/vocab_parallel_embedding.cpp forward): leaves x (Ns, C).
  void embedding_forward() {
    const double N = s.N(), C = s.m.C, d = s.d;
    t.alloc(N * C * d);  // partial (B, T, C)
    const double shard = shard_sum();
    if (shard > 0) t.free(N * C * d);  // with SP the shard is x and partial goes at the end of the call
  }
  // backward_stage, the embedding part: frees dx (Ns, C) (gathered to full rows with SP on the way).
  void embedding_backward() {
    const double full = to_full();
    t.free(s.Ns() * s.m.C * s.d + full);
  }

  Tape& t;
  const TapeShapes& s;
  bool defer = s.split_backward;  // weight-gradient GEMMs queued for W (not the head's: WeightGradsNow)
  double deferred = 0;            // the bytes the queued weight-gradient GEMMs keep until W
  double w_ws = 0;                // and W's largest GEMM workspace
};

}  // namespace

ChunkProfile profile_chunk(const TapeShapes& s, const ChunkSpec& chunk) {
  Tape tape;
  Replay r(tape, s);
  ChunkProfile out;
  const double hidden = s.Ns() * s.m.C * s.d;  // one (B, T/sp, C) activation: what crosses between stages
  const double tokens = s.B * s.T * 4;         // (B, T) i32
  out.message = hidden;

  // Forward: the trainer's load_batch, then GptModel::forward_stage. A received input is already counted.
  tape.mark();
  if (s.cp > 1 && s.cpu) {  // load_batch: the whole samples' tokens and targets, cut into this rank's chunks
    const double whole = 2 * tokens * s.cp;
    tape.alloc(whole + tokens);
    tape.free(whole + tokens);
  }
  tape.alloc(2 * tokens);  // tokens, targets
  if (chunk.has_embedding) r.embedding_forward();
  std::vector<double> kept(static_cast<size_t>(chunk.layers));
  for (int64_t l = 0; l < chunk.layers; ++l)
    kept[static_cast<size_t>(l)] = r.layer_forward(s.m.is_moe(chunk.layer_begin + l), s.recomputes(l));
  double head_kept = 0;
  if (chunk.has_head) head_kept = r.head_forward();
  // TrainingStage::forward's batch is freed unless the model keeps it: embedded_ holds tokens, the head
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
  for (int64_t l = chunk.layers; l-- > 0;) {
    r.layer_backward(kept[static_cast<size_t>(l)], s.m.is_moe(chunk.layer_begin + l), s.recomputes(l));
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
  out.whole = out.backward;
  if (s.split_backward) {  // W: the queued GEMMs run and their captures go
    tape.mark();
    tape.workspace(r.w_ws);
    tape.free(r.deferred);
    out.weight = tape.since_mark();
    TapeShapes unsplit = s;
    unsplit.split_backward = false;
    out.whole = profile_chunk(unsplit, chunk).backward;
  }
  return out;
}

}  // namespace mt::plan
