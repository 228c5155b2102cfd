// ops.h: every tensor operation the models use, forward and backward, as free functions with one
// signature for every device. Each dispatches on its tensors' device (core/cpu/ now, core/cuda/ later).
//
// Conventions:
//  * Values are stored in f32, bf16 or f16; ops compute in fp32 and round once when they store. The fp8
//    dtypes (e4m3, e5m2) are storage only: fp8_quantize writes them, fp8_dequantize reads them.
//  * Outputs are written (not accumulated) unless the option struct says `accumulate`.
//  * Parameter gradients (dweight, dbias, dgamma, ...) are f32 buffers and are always accumulated into,
//    so microbatches sum their gradients in place.
//  * "N" is the number of rows (tokens) of a 2-D view; callers reshape (B, T, C) to (B*T, C) with view().
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/base/enum_names.h"
#include "core/tensor/tensor.h"

namespace mt {

// ---- GEMM ----------------------------------------------------------------------------------------
// ---- GEMM epilogues (bias, GELU, their gradients) ----
// What the GEMM does with its product P = alpha * op(a) @ op(b) (+ beta * out) before it stores it:
enum class Epilogue {
  none,         // out = P
  bias,         // out = P + bias[n]                                   (bias (N), any floating dtype)
  gelu_bias,    // aux = P + bias[n], out = gelu(aux)                  (aux (M, N) like out; beta must be 0)
  dgelu_bgrad,  // out = P * gelu'(aux), dbias (N) f32 += column sums of out      (aux read; beta must be 0)
  bgrad_a,      // out = P, dbias (M) f32 += sum over k of op(a)[m, k] (trans_a, alpha 1: the bias gradient
                //   of a weight-gradient GEMM dW = dout^T x, with a = dout stored (K, M))
};
template <>
struct EnumNames<Epilogue> {
  static constexpr std::array<const char*, 5> names = {"none", "bias", "gelu_bias", "dgelu_bgrad", "bgrad_a"};
};
// ---- end GEMM epilogues ----
struct GemmOptions {
  bool trans_a = false;  // use a^T; a is stored (K, M) instead of (M, K)
  bool trans_b = false;  // use b^T; b is stored (N, K) instead of (K, N)
  float alpha = 1.f;
  float beta = 0.f;  // out = alpha * op(a) @ op(b) + beta * out
  // The epilogue and its vectors (null unless the epilogue names them).
  Epilogue epilogue = Epilogue::none;
  const Tensor* bias = nullptr;  // (N): bias, gelu_bias
  Tensor* aux = nullptr;         // (M, N), out's dtype: gelu_bias writes the pre-activation, dgelu_bgrad reads it
  Tensor* dbias = nullptr;       // f32, accumulated: (N) for dgelu_bgrad, (M) for bgrad_a
};
// out (M, N) = op(a) (M, K) @ op(b) (K, N), then the epilogue. a and b share a dtype; out may be that dtype
// or f32. Accumulates in fp32 (OpenBLAS sgemm on the CPU).
// Epilogue numerics: the CPU runs the plain GEMM and then the separate ops (add_bias, gelu_forward,
// gelu_backward, bias_backward) exactly as a caller would, rounding after each; the CUDA backend fuses them
// into cuBLASLt's epilogues and rounds once, so it matches the CPU within the dtype tolerance, not bit for
// bit (and composes the separate kernels itself where cuBLASLt offers no fused algorithm).
void gemm(const Tensor& a, const Tensor& b, Tensor& out, GemmOptions opt = {});
// C_g = alpha * op(A_g) op(B_g) + beta * C_g for every group g (shapes may differ per group; no epilogues, no bias):
// one call for MoE's per-expert GEMMs. Groups with an empty C_g (M or N zero) are skipped; one with K = 0 scales C_g
// by beta, as gemm does. Every backend computes each group as gemm does (the CPU bit for bit). a, b and c hold one
// tensor per group with gemm's rules for each (a and b share a dtype, c that dtype or f32); all groups share the
// dtypes and opt.
void gemm_grouped(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                  const GemmOptions& opt = {});  // opt.epilogue must be none (checked)

// x (N, C) += bias (C), in place.
void add_bias(Tensor& x, const Tensor& bias);
// dbias (C) f32 += sum over rows of dout (N, C).
void bias_backward(const Tensor& dout, Tensor& dbias);

// ---- elementwise ---------------------------------------------------------------------------------
// out = a + b (same shape; out may alias a or b).
void add(const Tensor& a, const Tensor& b, Tensor& out);
// x *= s, in place.
void scale_(Tensor& x, float s);
// GELU, tanh approximation (GPT-2's "gelu_new").
void gelu_forward(const Tensor& x, Tensor& out);
// dx = dout * gelu'(x).
void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx);

// ---- SwiGLU (Llama's MLP activation) ----
// x (N, 2F) holds the (gate, up) pair of unit f at columns (2f, 2f + 1): the fc1 weight interleaves the gate
// and up rows, so a tensor-parallel column block of the fc1 output holds whole pairs.
// out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(const Tensor& x, Tensor& out);
// dx (N, 2F) written from the forward's x and dout (N, F): dgate = dout * up * silu'(gate), dup = dout * silu(gate).
void swiglu_backward(const Tensor& x, const Tensor& dout, Tensor& dx);

// ---- block transpose ---------------------------------------------------------------------------
// out (Q, P, L) = x (P, Q, L) with the two leading dimensions swapped: out[q, p, :] = x[p, q, :], each block
// of L elements moved as bytes (any dtype, values unchanged). Sequence parallelism's rank-major copies: the
// shards of a (B, T, C) activation are its (B, t, T/t * C) blocks, and collectives want them (t, B, T/t * C).
void transpose_blocks(const Tensor& x, Tensor& out);

// ---- LayerNorm over the last dimension -----------------------------------------------------------
struct LayerNormOptions {
  float eps = 1e-5f;
};
// x (N, C), weight (C), bias (C) -> out (N, C); mean (N) and rstd (N) are f32, saved for backward.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out, Tensor& mean,
                       Tensor& rstd, LayerNormOptions opt = {});
// dx (N, C) written; dweight (C) and dbias (C) f32 accumulated.
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias);

// ---- RMSNorm over the last dimension (Llama) -----------------------------------------------------
struct RmsNormOptions {
  float eps = 1e-5f;
};
// x (N, C), weight (C) -> out (N, C) = x * rstd * weight; rstd (N) f32 = 1 / sqrt(mean_c(x^2) + eps), saved.
void rmsnorm_forward(const Tensor& x, const Tensor& weight, Tensor& out, Tensor& rstd, RmsNormOptions opt = {});
// dx (N, C) written; dweight (C) f32 accumulated. With xhat = x * rstd and g = dout * weight:
// dx = rstd * (g - xhat * mean_c(g * xhat)), dweight += sum_n dout * xhat.
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                      Tensor& dweight);

// ---- embeddings ----------------------------------------------------------------------------------
struct EmbeddingOptions {
  int64_t vocab_start = 0;      // first row of the full table this shard holds (vocabulary-parallel)
  int64_t position_offset = 0;  // global position of column 0 of ids (sequence-parallel shards)
  // Context parallelism (a rank's two chunks): when split_at > 0, column t >= split_at is at position
  // split_position + t - split_at instead (position_at below).
  int64_t split_at = 0;
  int64_t split_position = 0;
  // Packed documents (data.sft_packing: pack): (B, Tfull) i32 on the tensors' device, the position of token (b, t)
  // within its document; when defined, token t of this call (sequence shard) is at positions[b, position_offset + t]
  // instead (split_at must be 0). Position ids thus restart at 0 at every document boundary.
  Tensor positions;
};
// Position of column / token t under (position_offset, split_at, split_position) of EmbeddingOptions or RopeOptions.
template <class Opt>
int64_t position_at(const Opt& opt, int64_t t) {
  return opt.split_at > 0 && t >= opt.split_at ? opt.split_position + (t - opt.split_at) : opt.position_offset + t;
}
// ids (B, T) i32, table (V, C) -> out (B, T, C): out[b, t] = table[ids[b, t] - vocab_start], or zeros
// when the id falls outside this shard's rows.
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, EmbeddingOptions opt = {});
// dtable (V, C) f32 += the rows of dout (B, T, C) scattered by ids (ids outside the shard skipped).
// Deterministic: rows are summed in token order.
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, EmbeddingOptions opt = {});
// x (B, T, C) += wpe[position_offset + t] with wpe (P, C).
void position_embedding_add(Tensor& x, const Tensor& wpe, EmbeddingOptions opt = {});
// dwpe (P, C) f32 += sum over b of dout[b, t] at row position_offset + t.
void position_embedding_backward(const Tensor& dout, Tensor& dwpe, EmbeddingOptions opt = {});

// ---- dropout, keyed by global coordinates --------------------------------------------------------
// Element (b, t, c) of a (B, T, C) tensor keeps or drops by
// dropout_uniform(seed, site, sample_offset + b, dropout_row(opt, t), col_offset + c) >= p (core/base/rng.h),
// so the mask is the same whatever slice of the global tensor a rank holds.
struct DropoutOptions {
  float p = 0.f;
  uint64_t seed = 0;
  uint64_t site = 0;          // stream_id of the layer and place, e.g. "layers.3.attn_out"
  int64_t sample_offset = 0;  // global sample index of b = 0
  int64_t row_offset = 0;     // global row (sequence position) of t = 0
  int64_t col_offset = 0;     // global column of c = 0
  // Context parallelism (a rank's two chunks, parallel/layers/context_parallel.h): when split_at > 0, row t >= split_at
  // is at global row split_position + t - split_at instead (dropout_row below), so the mask is one rank's.
  int64_t split_at = 0;
  int64_t split_position = 0;
};
// The global row of local row t under opt (row_offset + t, or past split_at the second chunk's).
inline int64_t dropout_row(const DropoutOptions& opt, int64_t t) {
  return opt.split_at > 0 && t >= opt.split_at ? opt.split_position + (t - opt.split_at) : opt.row_offset + t;
}
// out = x * mask / (1 - p); p == 0 copies.
void dropout_forward(const Tensor& x, Tensor& out, const DropoutOptions& opt);
// dx = dout * mask / (1 - p), the mask regenerated from the same options.
void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutOptions& opt);

// ---- fused residual + dropout ----
// out = residual + dropout(x), all (B, T, C) of one dtype, the mask that of dropout_forward with the same
// options. Equals dropout_forward(x, tmp) then add(residual, tmp, out) bit for bit on every backend: the
// dropped value is rounded to the storage dtype before the add rounds again. out may alias x or residual.
// (The backward needs no fused op: dresidual = dout, dx = dropout_backward(dout).)
void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutOptions& opt);
// ---- end fused residual + dropout ----

// ---- causal multi-head attention (grouped-query) ---------------------------------------------------
// qkv (B, T, G, R + 2, D): G query groups, per group its R query heads (slots 0..R-1), then its key (slot R),
// then its value (slot R + 1) (Megatron's per-group interleaving, so a tensor-parallel rank's groups are one
// contiguous column block of the QKV GEMM output). Local query head h = g * R + r reads query slot r of
// group g and that group's key and value; H = G * R. R is qkv.dim(3) - 2: GPT's (B, T, H, 3, D) is R = 1
// (G = H), multi-query attention is G = 1.
// out (B, T, H, D), or its (B, T, H * D) view; lse (B, H, T) f32 saves each row's log-sum-exp of the scaled
// scores for backward. Scores are scaled by 1/sqrt(D); softmax in fp32. Dropout on the probabilities uses
// coordinates (sample_offset + b, (head_offset + h) * T + i, j), h the local query head.
struct AttentionOptions {
  bool causal = true;
  float dropout_p = 0.f;
  uint64_t seed = 0;
  uint64_t site = 0;
  int64_t sample_offset = 0;
  int64_t head_offset = 0;  // global index of local query head 0 (tensor parallelism splits groups)
  // Packed documents (data.sft_packing: pack): (B, T) i32 on qkv's device, the position of token (b, t) within its
  // document. When defined, query i of sample b sees keys [i - positions[b, i], i] only (its own document; needs
  // causal), and a row's dropout coordinates stay those above. Empty: every earlier key (one sequence a sample).
  Tensor positions;
  // Sliding window (Mistral's; needs causal): when > 0 query i sees only keys [i - window + 1, i] (HF's kv_idx >
  // q_idx - sliding_window) of its document; dropout coordinates as above. 0: no window.
  int64_t window = 0;
};
// The first key query i sees: the latest of 0, its document's start (i - position; position = i without documents)
// and its window's start. Nondecreasing in i.
inline int64_t attention_first_key(int64_t i, int64_t position, int64_t window) {
  return std::max({int64_t{0}, i - position, window > 0 ? i - window + 1 : 0});
}

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt);
// dqkv (B, T, G, R + 2, D) written from dout (B, T, H, D) and the forward's qkv, out and lse. A group's key
// and value gradients are the sums over its R query heads, added in fp32 in the order r = 0..R-1 and rounded
// once when stored (deterministic).
void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt);
// Which implementation ran an attention call: the CPU reference, cuDNN's fused attention or megatrain's CUDA kernel
// (a cuDNN call refused at run time falls back to the kernel). Counted per forward and per backward call since
// the process started, so the log and metrics.jsonl say what ran, not what was expected.
enum class AttentionImpl { cpu, cudnn, kernel };
struct AttentionCalls {
  int64_t cpu = 0, cudnn = 0, kernel = 0;
};
AttentionCalls attention_calls();
void count_attention_call(AttentionImpl impl);  // the backends, once per call they run

// ---- context-parallel attention: a query block against one key/value block, merged by log-sum-exp ---------
// Context parallelism (parallel/layers/context_parallel.h) holds two chunks of each sequence per rank; its attention
// runs block by block: the rank's queries against each rank's keys and values in turn, each block's partial
// softmax merged into the running one by its log-sum-exp (the flash-attention merge). Positions say which keys a
// causal query sees: key j is visible to query i when position(j) <= position(i) (position_at of each side), so
// a block is full, diagonal-causal or empty as the chunk pair is. Softmax statistics and partial outputs are f32.
struct SequencePositions {
  int64_t position_offset = 0;  // position of row 0
  int64_t split_at = 0;         // > 0: rows t >= split_at are at split_position + t - split_at
  int64_t split_position = 0;
};
struct AttentionBlockOptions {
  SequencePositions q, k;  // the query rows of qkv, the key rows of kv
  bool causal = true;
  // Dropout on the probabilities, keyed as attention_forward's over the whole sequence: query row i and key j of
  // local head h at (sample_offset + b, (head_offset + h) * seq_length + position(i), position(j)), so a block's
  // mask is the one-rank mask at those global positions. seq_length: the whole (global) sequence length.
  float dropout_p = 0.f;
  uint64_t seed = 0, site = 0;
  int64_t sample_offset = 0, head_offset = 0, seq_length = 0;
  int64_t window = 0;  // AttentionOptions::window's (0: none)
  // Packed documents (needs causal): (B, Tq) i32 on qkv's device, each query row's position within its document (a
  // context rank's chunks of AttentionOptions::positions): row i at qp sees only keys kp >= qp - positions[b, i].
  Tensor positions;
};
// Whether a key at position kp is visible to a query at position qp under a block's causality, window (kp > qp -
// window) and the query's document start doc_start = qp - its position in the document (0 without documents).
inline bool attention_key_visible(int64_t qp, int64_t kp, bool causal, int64_t window, int64_t doc_start = 0) {
  return (!causal || kp <= qp) && (window <= 0 || kp > qp - window) && kp >= doc_start;
}
// kv (B, Tk, G, 2, D) <- the key (slot R) and value (slot R + 1) of every group of qkv (B, Tk, G, R + 2, D).
void attention_kv_pack(const Tensor& qkv, Tensor& kv);
// The queries of qkv (B, Tq, G, R + 2, D) against kv (B, Tk, G, 2, D): out (B, Tq, H, D) f32 the block's softmax
// over the visible keys times their values, lse (B, H, Tq) f32 its log-sum-exp (-inf, with out 0, for a row that
// sees no key of the block). With dropout, out is (P o Z) V, Z the block's mask scaled by 1 / (1 - p), lse that of
// the undropped scores (so the merge is that of the whole attention).
void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                             const AttentionBlockOptions& opt);
// (out, lse) <- the merge of (out, lse) and (out_b, lse_b): lse' = log(e^lse + e^lse_b),
// out' = e^(lse - lse') out + e^(lse_b - lse') out_b; all f32, out (B, T, H, D), lse (B, H, T).
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
// One block's share of the backward, from the whole attention's out (B, Tq, H, D) (qkv's dtype) and lse (B, H, Tq)
// and dout: dq (B, Tq, H, D) f32 += dS K, dkv (B, Tk, G, 2, D) f32 += (dS^T Q, P^T dO) summed over each group's
// query heads. dS = P o (dP - rowsum(dO o O)) / sqrt(D), P = exp(S - lse). With dropout: dkv's value part
// += (P o Z)^T dO and dP = (dO V^T) o Z (rowsum(dO o O) is still the row sum of P o dP over all blocks).
void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt);
// dqkv (B, T, G, R + 2, D) <- dq (B, T, H, D) f32 in the query slots and dkv (B, T, G, 2, D) f32 in the key and
// value slots, rounded once.
void attention_qkv_grad(const Tensor& dq, const Tensor& dkv, Tensor& dqkv);

// ---- rotary position embedding (Llama) -----------------------------------------------------------
// In place on the query and key slots of qkv (B, T, G, R + 2, D) (slots 0..R inclusive: R query heads and the
// key of each of the G groups; the value slot R + 1 untouched; GPT's layout is G = H, R = 1).
// Non-interleaved ("rotate_half", HF Llama and Megatron's default): for i < D/2 the pair (x_i, x_{i+D/2}) at
// position p = position_offset + t is rotated by angle a = float(p) * inv_freq_i (an fp32 product),
// inv_freq_i = float(1 / theta^(2i/D)) computed in double and rounded:
//   x_i' = x_i cos a - x_{i+D/2} sin a,   x_{i+D/2}' = x_{i+D/2} cos a + x_i sin a
// with cos and sin of the fp32 angle taken in double and rounded to fp32, then (scaled rotary embeddings, yarn)
// multiplied by attention_factor in fp32. inverse rotates by -a, which is the backward (the gradient of a scaled
// rotation is the scaled inverse rotation). D must be even (and at most 512 on CUDA).
struct RopeOptions {
  float theta = 10000.f;  // HF's rope_theta (model.rotary_base), when inv_freq is empty
  // The frequencies (D/2) a scaled model rotates by (core/base/rope_scaling.h rope_frequencies); empty: the plain
  // inv_freq_i above, from theta.
  std::span<const float> inv_freq;
  float attention_factor = 1.f;  // cos and sin multiplied by it (yarn's)
  int64_t position_offset = 0;   // global position of t = 0 (sequence-parallel shards, generation)
  bool inverse = false;          // rotate by -a: the backward
  int64_t split_at = 0;          // context parallelism: as EmbeddingOptions' (t >= split_at at split_position + ...)
  int64_t split_position = 0;
  // Packed documents: (B, T) i32 on qkv's device; when defined token (b, t) is rotated at position positions[b, t],
  // in [0, position_rows) (0: T; a context rank's chunks reach T * C); position_offset and split_at must be 0.
  Tensor positions;
  int64_t position_rows = 0;
};
void rope_(Tensor& qkv, const RopeOptions& opt);
// The inv_freq (D/2) rope_ rotates by: opt.inv_freq, or the plain frequencies of opt.theta. What every backend's
// rope_ computes its table from.
std::vector<float> rope_inv_freq(const RopeOptions& opt, int64_t D);

// ---- softmax cross-entropy, split so a vocabulary-parallel version only exchanges per-row scalars ----
// logits (N, V) hold columns [vocab_start, vocab_start + V) of the full vocabulary; targets (N) i32 hold
// full-vocabulary ids. All per-row statistics are f32 (N).
struct CrossEntropyOptions {
  int64_t vocab_start = 0;
  // Columns whose full-vocabulary id is >= vocab_size are padding (the vocabulary is padded for GEMM
  // shapes and tensor parallelism): left out of the softmax, their gradient 0. -1: no padding.
  int64_t vocab_size = -1;
};
// rowmax[n] = max_v logits[n, v] over the non-padding columns (-inf when the shard holds only padding)
void cross_entropy_rowmax(const Tensor& logits, Tensor& rowmax, CrossEntropyOptions opt = {});
// Given the (global) row max: sumexp[n] = sum_v exp(logits[n, v] - rowmax[n]) and target_logit[n] =
// logits[n, targets[n] - vocab_start] when the target lies in this shard, else 0.
void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, Tensor& sumexp,
                            Tensor& target_logit, CrossEntropyOptions opt = {});
// losses[n] = log(sumexp[n]) + rowmax[n] - target_logit[n]
void cross_entropy_loss(const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit, Tensor& losses);
// dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss[n], dloss (N) f32.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, const Tensor& sumexp,
                            const Tensor& dloss, Tensor& dlogits, CrossEntropyOptions opt = {});

// ---- optimizer and reductions over f32 buffers ---------------------------------------------------
// sum of squares of x (f32), in double.
double sum_squares(const Tensor& x);
// The sum of squares of all of xs (f32, one device) at once: one wait for the device, not one per tensor
// (the global gradient norm over hundreds of parameters).
double sum_squares(const std::vector<Tensor>& xs);
// true when x (f32) holds an inf or NaN.
bool has_inf_or_nan(const Tensor& x);

struct AdamWOptions {
  float lr = 0.f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  int64_t step = 1;        // 1-based, for the bias corrections
  float grad_scale = 1.f;  // grads are multiplied by this first (unscaling and clipping folded in)
};
// One AdamW step on f32 master (N), grad (N), exp_avg (N), exp_avg_sq (N), decoupled weight decay.
void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWOptions& opt);

// ==== fused step ops: one pass over all of a rank's tensors, results left on the device ================
// (the GPU step waits for the device at most once: see app/train/trainer.cpp's train_step)
//
// Small double results live on the tensors' device as f64 bits in i64 storage (megatrain has no f64 dtype):
// make them with f64_zeros, read them with read_f64 (one copy to the host).
Tensor f64_zeros(int64_t n, Device device, MemKind kind = MemKind::workspace);
std::vector<double> read_f64(const Tensor& t);

// The grad-norm inputs of a step, in one pass over all of xs (f32, one device).
struct GradStats {
  double sum_squares = 0;  // as sum_squares(xs): in double, in the same order on the CPU
  bool found_inf = false;  // some element is inf or NaN
};
// stats (2) f64 := [sum of squares, 1 when some element is inf or NaN else 0], on the device, without waiting.
void grad_stats(const std::vector<Tensor>& xs, Tensor& stats);
// The same, read back with one copy to the host.
GradStats grad_stats(const std::vector<Tensor>& xs);

// One tensor of a multi-tensor AdamW step.
struct AdamWTensors {
  Tensor master, grad, exp_avg, exp_avg_sq;  // f32, n elements each (any shapes)
  Tensor value;       // the parameter in its compute dtype (n): := the updated master, rounded; undefined: none
  bool decay = true;  // opt.weight_decay applies (false: biases and norms)
};
// adamw_step on every entry with weight decay opt.weight_decay where `decay` (0 elsewhere), bit for bit the
// same per element, and the rounded master written into `value`: one pass (a few launches on CUDA), no cast
// afterwards. Every defined `value` has one dtype.
void adamw_multi_step(const std::vector<AdamWTensors>& ts, const AdamWOptions& opt);

// sum (1) f64 += the mean of x (N) f32 summed in double, rounded to f32: what a host reading of the loss
// gave, accumulated on the device (training losses are read once per logging interval).
void accumulate_mean(const Tensor& x, Tensor& sum);
// sum (1) f64 += sum over i of x[i] * w[i] (x, w (N) f32; each product in f32, summed in double): the loss of a
// masked batch (supervised fine-tuning), w holding each token's weight in the step's mean (0 where masked).
void accumulate_weighted_sum(const Tensor& x, const Tensor& w, Tensor& sum);
// x := v in x's dtype (any floating dtype).
void fill_(Tensor& x, float v);

// ---- fp8 scaling (docs/fp8.md) ----------------------------------------------------------------------
// A tensor enters an fp8 GEMM as q = saturate_cast(x * scale) in e4m3 or e5m2 (core/base/dtype.h: round to
// nearest even, beyond the largest finite value -> +-max, NaN -> NaN), and leaves it as q * scale_inv. The scale
// comes from the amax (largest |x|) of earlier steps; it stays on the device (a (1) f32 tensor), never read by
// the host. An amax is a max, so the amaxes of the shards of one logical tensor (TP, SP) combine by a max
// all-reduce, and every layout quantises alike.
//
// amax (1) f32 := max(amax, max over i of |x[i]|) (x any floating dtype, any shape; NaN when x or amax holds a
// NaN; x empty: amax unchanged). Start from 0 (Tensor::zeros) for the amax of x alone.
void fp8_amax(const Tensor& x, Tensor& amax);
// out (x's shape, e4m3 or e5m2)[i] = saturate_cast(x[i] * scale[0]), the product in fp32 rounded once (x any
// floating dtype, scale (1) f32). amax_out, when given, is updated as fp8_amax(x, *amax_out) in the same pass
// (the fused cast-and-amax of Transformer Engine). Every backend gives the same bits.
void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out = nullptr);
// out (q's shape, any floating dtype)[i] = float(q[i]) * scale_inv[0] in fp32, rounded once to out's dtype (q e4m3
// or e5m2, scale_inv (1) f32).
void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& out);
// Transformer Engine's scale update for n tensors at once, on the device: for each row i, history (n, H) f32 is
// rolled by one (entry j moves to j + 1, the last drops) and history[i][0] := amax[i]; a := the row's max
// (use_max) or its entry 0; then, where a is finite and positive, scale[i] := fp8_max[i] / a / 2^margin (FLT_MAX
// when that overflows), else scale[i] is kept; scale_inv[i] := 1 / scale[i]. amax, scale, scale_inv and fp8_max
// are (n) f32. With H = 1 this is current scaling: the scale of one amax.
struct Fp8ScaleOptions {
  int margin = 0;
  bool use_max = true;  // false: the most recent amax
};
void fp8_update_scale(const Tensor& amax, Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& fp8_max,
                      Fp8ScaleOptions opt = {});
// The fp8 GEMM: out = scale_inv_a[0] * scale_inv_b[0] * op(a) @ op(b) (times opt.alpha) + beta * out, then the
// epilogue, as gemm's (a and b e4m3 or e5m2, each with a (1) f32 scale_inv; out bf16, f16 or f32), cuBLASLt's fp8
// matmul: the products of the fp8 values are exact in fp32 and accumulate in fp32, the scales apply once to the
// sum. The CPU widens a and b exactly to bf16 (every e4m3 and e5m2 value is a bf16 value) and runs gemm with the
// scales folded into alpha, so it computes gemm's arithmetic on the fp8 values.
void gemm_fp8(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, Tensor& out,
              GemmOptions opt = {});

// ---- mixture of experts ----------------------------------------------------------------------------
// The MoE router of one layer: each token (row) picks top_k of E experts and weights their outputs. (RouterScore
// mirrors model.moe.score_function, MoeScore of core/config, which this layer cannot see.)
// The most experts a router row may hold (the CUDA kernel keeps a row in shared memory); model.moe.num_experts
// is bounded by it.
inline constexpr int64_t kMaxRouterExperts = 1024;
enum class RouterScore {
  softmax,  // scores = softmax over the row's E logits (fp32, max subtracted, the sum of exps in double)
  sigmoid,  // scores = 1 / (1 + exp(-logit)) per element (DeepSeek-V3)
};
struct MoeRouterOptions {
  int top_k = 1;                             // experts per token, 1 <= top_k <= E
  RouterScore score = RouterScore::softmax;  // how logits become scores
  bool norm_topk_prob = false;               // divide the k weights by their sum (fp32, summed in the k order)
};
// logits (N, E) f32 with E <= 1024 experts; bias (E) f32 or an undefined Tensor: DeepSeek-V3's aux-loss-free
// expert bias, added to the scores for the choice only, never to the weights.
// scores (N, E) f32 := the scores of every expert (saved for backward and the auxiliary loss).
// experts (N, top_k) i32 := the top_k experts by score + bias[e] (fp32 sum; NaN ranks below everything),
// in descending order of that key, equal keys in ascending expert order (the lower index wins a tie).
// probs (N, top_k) f32 := the selected experts' (unbiased) scores, divided by their sum if norm_topk_prob.
// Deterministic on every backend: the same choice, fixed summation orders, no atomics.
void moe_router_forward(const Tensor& logits, const Tensor& bias, Tensor& scores, Tensor& experts, Tensor& probs,
                        const MoeRouterOptions& opt);
// dlogits (N, E) f32 written from dprobs (N, top_k) f32 and the forward's scores and experts (distinct, in
// [0, E)). With p the selected scores: norm_topk_prob: S = sum_j p_j, w_j = p_j / S, dp_j = (dw_j - sum_i dw_i
// w_i) / S, else dp_j = dw_j (sums in the k order); dscore holds dp_j at expert j's column, 0 elsewhere.
// softmax: dlogit_e = s_e * (dscore_e - sum_j dp_j s_{expert j}); sigmoid: dlogit_e = dscore_e * s_e * (1 - s_e).
void moe_router_backward(const Tensor& scores, const Tensor& experts, const Tensor& dprobs, Tensor& dlogits,
                         const MoeRouterOptions& opt);
// Load balancing of one router (model.moe.aux_loss_coeff and z_loss_coeff, Megatron-Core's forms). With a_{n,e}
// the auxiliary loss's scores: softmax: a = scores; sigmoid: a_{n,e} = s_{n,e} / (sum_e' s_{n,e'} + 1e-20) (row sum
// in fp32, e order):
// moe_router_loss_stats: score_sums (E) f32 := sum over rows n of a_{n,e}; lse_sq_sum (1) f32 := sum over rows of
// logsumexp(logits_n)^2 (logsumexp in fp32: max + log of the sum of exps, that sum in double; squared in fp32). The
// sums over rows in double, rounded once; deterministic on every backend (fixed order, no atomics). N = 0: zeros.
void moe_router_loss_stats(const Tensor& logits, const Tensor& scores, RouterScore score, Tensor& score_sums,
                           Tensor& lse_sq_sum);
// moe_router_loss_backward: dlogits (N, E) f32 += for every row n the gradient of
//   sum_e score_grad[e] * a_{n,e}   (score_grad (E) f32; an undefined Tensor: no such term), i.e.
//     softmax: s_e (g_e - sum_j g_j s_j);  sigmoid: S = sum_j s_j + 1e-20, ds_e = (g_e - sum_j g_j a_j) / S,
//     dlogit_e = ds_e s_e (1 - s_e)
//   + z_grad * 2 * lse_n * softmax(logits_n)_e   (z_grad a host float; 0: no such term; softmax of the logits even
//     when score is sigmoid)
// in fp32, the sums over a row's experts in double (rounded once); the two terms are added, then added to dlogits.
// No term at all (score_grad undefined, z_grad 0): dlogits is left as it is.
void moe_router_loss_backward(const Tensor& logits, const Tensor& scores, const Tensor& score_grad, float z_grad,
                              RouterScore score, Tensor& dlogits);

// ---- mixture of experts: token dispatch ----
// A MoE layer sends each token's top_k choices (experts (N, k) i32, e.g. from the router) to their experts as
// rows of one permuted activation, expert by expert, so that each expert's MLP runs on a contiguous row slice:
//   moe_dispatch_index  row_of (N, k) i32: the row of choice (n, j); counts (E) i32: the choices per expert. The rows
//                       of expert e are contiguous, experts in order, and within an expert in (n, j) order (stable: the
//                       same on every device and layout). An expert id outside [0, E) is an error.
//   moe_permute         out (R, C) [row_of[n, j]] = w[n, j] * x[n] (x (N, C); w = probs (N, k) f32, or 1 when probs is
//                       null), rounded once to out's dtype (x's); a choice with row_of -1 (dropped) is skipped.
//   moe_unpermute       out (N, C) [n] = sum over j of w[n, j] * y[row_of[n, j]] (y (R, C)), in fp32 in j order,
//                       rounded once; dropped choices add nothing. The backward of moe_permute with the same w.
//   moe_unpermute_backward_probs
//                       dprobs (N, k) f32 [n, j] = sum over c of dout[n, c] * y[row_of[n, j], c] (0 when dropped),
//                       written. With moe_permute(dout, row_of, probs) (the gradient of y), unpermute's backward.
void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts);
// Token dropping (model.moe capacity factors): each expert keeps at most `capacity` of its choices.
struct MoeCapacityOptions {
  int64_t capacity = 0;           // most choices each expert keeps (0: no limit, dropless)
  const Tensor* probs = nullptr;  // (N, k) f32: keep the heaviest (Megatron-Core's "probs" drop policy); null: the
                                  // first in (n, j) order ("position" policy)
  const Tensor* order = nullptr;  // (N) i32 permutation: token n's one-rank place, ties by (order[n], j); null: n
  int64_t part_begin = 0;         // row_of (P, k) and counts: tokens [part_begin, part_begin + P) only, from row 0
};
// moe_dispatch_index with a capacity: row_of[n, j] = -1 for a dropped choice; counts (E) the kept choices per expert.
// Kept rows stay expert-major and within an expert in (n, j) order (not in weight order), so capacity 0 is the op
// above exactly. Weights compare by value (-0 as 0, a NaN below every number); ties keep the lower (n, j).
// Deterministic on every backend. A part's drops (context parallelism) are decided over all N tokens.
void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts, const MoeCapacityOptions& cap);
void moe_permute(const Tensor& x, const Tensor& row_of, const Tensor* probs, Tensor& out);
void moe_unpermute(const Tensor& y, const Tensor& row_of, const Tensor* probs, Tensor& out);
void moe_unpermute_backward_probs(const Tensor& dout, const Tensor& y, const Tensor& row_of, Tensor& dprobs);

}  // namespace mt
