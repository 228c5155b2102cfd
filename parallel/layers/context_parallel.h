// context_parallel.h: context parallelism (parallel.context = C), the sequence split across ranks. Each sample's
// T tokens are cut into 2C chunks of T / 2C; context rank r holds chunks r and 2C - 1 - r, in that order, as its
// local sequence of T / C tokens (so under causal masking every rank has the same work: Megatron-Core's
// load-balanced layout). Everything but attention is per token and runs on the local sequence as is (with
// sequence parallelism each tensor rank then holds a shard of it); positions are the chunks' global ones.
// Attention meets the other ranks' keys and values block by block (core/tensor/ops.h's attention blocks), merging
// each block's partial softmax by its log-sum-exp:
//   p2p (ring): step s computes against the keys and values of rank r - s while those of the next step travel
//     one rank along the ring; backward the key/value gradients travel with them and come home after C hops.
//   allgather: all ranks' keys and values gathered at once (C times the memory of one), their gradients
//     reduce-scattered back.
#pragma once
#include <cstdint>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "parallel/comm/communicator.h"

namespace mt {

struct ContextParallel {
  Communicator* comm = nullptr;  // the context-parallel group (ranks ordered by context rank); null when size == 1
  int rank = 0;
  int size = 1;
  bool all_gather = false;  // parallel.context_comm: allgather (true) or p2p, the ring (false)

  bool enabled() const { return size > 1; }
  // Global positions of tokens [offset, offset + len) of a local sequence of local_len = T / C tokens held by
  // context rank `of` (this rank by default).
  SequencePositions positions(int64_t local_len, int64_t offset, int64_t len, int of = -1) const;
  // `keys` with the rows of tokens [offset, offset + len) of this rank's local sequence of local_len tokens: their
  // global positions (row_offset, split_at, split_position), so a dropout mask is one rank's whatever the layout.
  DropoutOptions with_rows(DropoutOptions keys, int64_t local_len, int64_t offset, int64_t len) const {
    const SequencePositions p = positions(local_len, offset, len);
    keys.row_offset = p.position_offset;
    keys.split_at = p.split_at;
    keys.split_position = p.split_position;
    return keys;
  }
};

// This rank's local sequence (B, T / C) of tokens (B, T) on the host (i32 tokens, or f32 loss weights): chunks rank
// and 2C - 1 - rank.
Tensor context_chunks(const Tensor& tokens, const ContextParallel& cp);

// The one-rank order of the microbatch's tokens as an all-gather over the context group lays them out (context rank
// major, then each rank's local sequences (B, local_len)): (C B local_len) i32 on the host, token g's index
// b T + its global position in the microbatch (B, T). What per-microbatch decisions over every token need (the
// MoE capacity's drops, models/moe_mlp.cpp) to be one rank's.
Tensor context_token_order(const ContextParallel& cp, int64_t samples, int64_t local_len);

// Causal attention over the whole sequence for this rank's queries: qkv (B, T/C, G, R + 2, D) its local sequence
// (after the rotary embeddings), out (B, T/C, H * D) of qkv's dtype, lse (B, H, T/C) f32 the log-sum-exp of each
// row over all keys (what the backward takes). att: the dropout on the probabilities (dropout_p, seed, site,
// sample_offset, head_offset as attention_forward's; the mask is one rank's at the chunks' global positions) and its
// sliding window (over global positions: a block wholly before every row's window costs nothing) and packed
// documents' positions (B, T/C) i32, this rank's chunks of the sample's (each row sees its own document's keys
// only); its causal is not read (causal always).
void context_attention_forward(const ContextParallel& cp, const Tensor& qkv, Tensor& out, Tensor& lse,
                               const AttentionOptions& att);
// dqkv (B, T/C, G, R + 2, D) from dout and the forward's qkv, out and lse; the key and value gradients summed
// over every rank's queries.
void context_attention_backward(const ContextParallel& cp, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dqkv, const AttentionOptions& att);

}  // namespace mt
