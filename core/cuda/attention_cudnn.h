// attention_cudnn.h: cuDNN's fused flash attention (core/cuda/attention_cudnn.cpp, the only file that includes
// the cuDNN frontend) and the dispatch that attention.cu's entry points ask first (attention_backend.cpp).
// Plain C++: no CUDA or cuDNN headers.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor/ops.h"

namespace mt::cuda {

// ---- cuDNN (attention_cudnn.cpp; stubs when the build has no cuDNN path) ----------------------------------

bool cudnn_attention_built();
int64_t cudnn_runtime_version();       // cudnnGetVersion(): 91900 for 9.19.0; 0 when not built
int64_t cudnn_compiled_version();      // CUDNN_VERSION of the headers built against; 0 when not built
std::string cudnn_frontend_version();  // "1.32.0"; empty when not built

// Causal (or full) grouped-query SDPA of bf16 / fp16 qkv (B, T, G, R + 2, D): out (B, T, H = G R, D) and lse
// (B, H, T) f32, the natural-log log-sum-exp of each row of scaled scores (cuDNN's "Stats", the CPU's lse). K and
// V are read in place through strides; so is Q when R = 1 (GPT's (B, T, H, 3, D)), while R > 1 gathers the
// queries into a contiguous buffer first. `window` > 0 (causal): query i sees keys j > i - window only
// (AttentionOptions::window), cuDNN's diagonal band. Returns "" once enqueued on the compute stream; otherwise why
// cuDNN cannot run this call (nothing written). Graphs are built once per (dtype, B, T, G, R, D, causal, window):
// strides follow from the shape, tensors being contiguous views.
std::string cudnn_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, bool causal, int64_t window);
// dqkv (B, T, G, R + 2, D) from dout (B, T, H, D) and the forward's out and lse: dk, dv (summed over each
// group's heads by cuDNN) written in place through strides, dq too when R = 1, else through a contiguous
// (B, T, H, D) buffer scattered into the query slots.
// Deterministic (cuDNN's deterministic SDPA backward algorithm: the same inputs give the same bits) unless
// cudnn_backward_deterministic() says otherwise.
std::string cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     Tensor& dqkv, bool causal, int64_t window);

// cuDNN's SDPA backward algorithm: deterministic (default: the same inputs give the same bits; on Hopper it needs
// a B H T^2 workspace) or not (faster, less memory; for benchmarks). MEGATRAIN_CUDNN_BACKWARD=deterministic |
// nondeterministic, read on every call; throws on another value.
bool cudnn_backward_deterministic();

// One graph the code builds, for checks without a device: dtype bf16 or f16, qkv (B, T, G, R + 2, D).
struct CudnnSdpaGraph {
  bool backward = false;
  DType dtype = DType::bf16;
  int64_t B = 1, T = 1, G = 1, R = 1, D = 64;
  bool causal = true;
  bool deterministic = true;  // backward only
  // A context-parallel ring block when q_rows > 0: q_rows of the T query rows against k_rows of the Tk keys and
  // values of a packed kv (B, Tk, G, 2, D), causal only for a rank's own block (q_rows = T = k_rows = Tk).
  int64_t q_rows = 0, Tk = 0, k_rows = 0;
  int64_t window = 0;  // a sliding window (causal only): key j visible to query i iff j > i - window; 0: none
};
// Builds the graph as a call would and runs the cuDNN frontend's validate() for the SM version `sm` (90: Hopper)
// without touching a device: "" when it validates, else why not. The later steps (operation graph, heuristics,
// plans) need a device and run on the first call.
std::string cudnn_attention_validate(const CudnnSdpaGraph& graph, int sm);

// ---- context-parallel ring blocks (core/tensor/ops.h's attention_block_forward / _backward) ------------------------
// A ring block's chunk pair as one cuDNN SDPA call: query rows [q0, q0 + q_rows) of the local sequence against key
// rows [k0, k0 + k_rows) of the block, causal (top-left, only for a rank's own block, whose two chunks are in
// position order on both sides) or full. cudnn_block_of says which call a block is, or why it is none.
// A sliding window (AttentionBlockOptions::window) is a band on a causal call whose rows are consecutive positions
// (window > 0 here); a full call is one whose every (query, key) pair the window keeps, and chunk pairs the window
// cuts partly are refused (the kernels run them).
struct CudnnBlock {
  int64_t q0 = 0, q_rows = 0, k0 = 0, k_rows = 0;
  bool causal = false;
  int64_t window = 0;  // causal only: key row j visible to query row i iff j > i - window; 0: none
  bool empty() const { return q_rows == 0 || k_rows == 0; }
};
// The one call of a block of Tq query rows and Tk key rows under `opt`'s positions, or "" in *why (with an empty
// call when no query sees a key); a non-empty *why names what one call cannot express (a block needing two calls).
CudnnBlock cudnn_block_of(int64_t Tq, int64_t Tk, const AttentionBlockOptions& opt, std::string* why);
// out (B, Tq, H, D) f32 and lse (B, H, Tq) f32 of the block: cuDNN's O (bf16 / fp16, widened to f32) and Stats on
// the call's rows, 0 and -inf on the others (rows that see no key of the block). Returns "" once enqueued, else
// why cuDNN cannot run it (nothing written).
std::string cudnn_attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                          const AttentionBlockOptions& opt);
// The block's share of the backward through cuDNN's SDPA backward from the merged out (qkv's dtype) and lse (the
// whole attention's, so cuDNN's P and Delta = rowsum(dO o O) are the whole softmax's): dq (f32) += its dQ,
// dkv (f32) += its dK and dV (widened from bf16 / fp16).
std::string cudnn_attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                           const Tensor& dout, Tensor& dq, Tensor& dkv,
                                           const AttentionBlockOptions& opt);

// ---- dispatch (attention_backend.cpp) ---------------------------------------------------------------------

// Run the op on cuDNN when MEGATRAIN_ATTENTION, the dtype, the dropout and the shape allow it: true when done,
// false when the caller runs the kernel. Throws when MEGATRAIN_ATTENTION=cudnn and cuDNN cannot run the call.
bool attention_forward_on_cudnn(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt);
bool attention_backward_on_cudnn(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                 Tensor& dqkv, const AttentionOptions& opt);
// A context-parallel ring block on cuDNN (cudnn_attention_block_forward / _backward) when MEGATRAIN_ATTENTION, the
// dtype, the dropout and the chunk pair allow it: true when done, false when the caller runs megatrain's block
// kernels (the reason logged once). Not counted in attention_calls() (neither are the kernels' blocks).
bool attention_block_forward_on_cudnn(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                      const AttentionBlockOptions& opt);
bool attention_block_backward_on_cudnn(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                       const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt);
// Records that the kernel ran (last_attention_path()).
void note_attention_kernel();

}  // namespace mt::cuda
