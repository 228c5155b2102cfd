// context_parallel.cpp: the chunk layout of context parallelism and its attention as a ring (p2p) or over
// all-gathered keys and values (parallel/layers/context_parallel.h).
#include "parallel/layers/context_parallel.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace mt {

namespace {

// Tags of the ring's transfers (Gloo matches them per pair of ranks; NCCL matches in posting order).
constexpr int kTagKv = 0x4350;
constexpr int kTagDkv = 0x4351;

}  // namespace

SequencePositions ContextParallel::positions(int64_t local_len, int64_t offset, int64_t len, int of) const {
  const int r = of < 0 ? rank : of;
  if (size == 1) return {.position_offset = offset};
  const int64_t chunk = local_len / 2;
  const int64_t first = r * chunk, second = (2 * static_cast<int64_t>(size) - 1 - r) * chunk;  // chunks' starts
  if (offset >= chunk) return {.position_offset = second + (offset - chunk)};  // all in the second chunk
  if (offset + len <= chunk) return {.position_offset = first + offset};       // all in the first
  return {.position_offset = first + offset, .split_at = chunk - offset, .split_position = second};
}

Tensor context_chunks(const Tensor& tokens, const ContextParallel& cp) {
  if (cp.size == 1) return tokens;
  const int64_t B = tokens.dim(0), T = tokens.dim(1), chunk = T / (2 * cp.size);
  if (T % (2 * cp.size) != 0)
    throw std::invalid_argument(
        fmt::format("context parallelism: a sequence of {} tokens does not split into 2 x {} "
                    "chunks (parallel.context)",
                    T, cp.size));
  Tensor local = Tensor::empty({B, 2 * chunk}, tokens.dtype());
  const auto size = static_cast<int64_t>(dtype_size(tokens.dtype()));  // i32 tokens, f32 loss weights
  const char* in = static_cast<const char*>(tokens.raw());
  char* out = static_cast<char*>(local.raw());
  const int64_t starts[2] = {cp.rank * chunk, (2 * static_cast<int64_t>(cp.size) - 1 - cp.rank) * chunk};
  for (int64_t b = 0; b < B; ++b)
    for (int k = 0; k < 2; ++k)
      std::memcpy(out + (b * 2 * chunk + k * chunk) * size, in + (b * T + starts[k]) * size,
                  static_cast<size_t>(chunk * size));
  return local;
}

Tensor context_token_order(const ContextParallel& cp, int64_t samples, int64_t local_len) {
  const int64_t T = local_len * cp.size;
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(cp.size * samples * local_len));
  for (int r = 0; r < cp.size; ++r)
    for (int64_t b = 0; b < samples; ++b)
      for (int64_t t = 0; t < local_len; ++t)
        order.push_back(static_cast<int32_t>(b * T + cp.positions(local_len, t, 1, r).position_offset));
  return Tensor::from_ints(order, {static_cast<int64_t>(order.size())});
}

namespace {

// Step s of either mode meets the keys and values of context rank (rank - s) mod C: the own block first (every row
// sees a key there, its diagonal), then the ring's order.
int source_of(const ContextParallel& cp, int s) { return (cp.rank - s + cp.size) % cp.size; }

// The block of this rank's queries against context rank src's keys; dropout keyed as one rank's attention_forward
// over the whole sequence of T * C tokens (at the chunks' global positions); packed documents' positions are this
// rank's query rows'.
AttentionBlockOptions block_options(const ContextParallel& cp, int64_t T, int src, const AttentionOptions& att) {
  return {.q = cp.positions(T, 0, T),
          .k = cp.positions(T, 0, T, src),
          .causal = true,
          .dropout_p = att.dropout_p,
          .seed = att.seed,
          .site = att.site,
          .sample_offset = att.sample_offset,
          .head_offset = att.head_offset,
          .seq_length = T * cp.size,
          .window = att.window,
          .positions = att.positions};
}

Shape kv_shape(const Tensor& qkv) { return {qkv.dim(0), qkv.dim(1), qkv.dim(2), 2, qkv.dim(4)}; }

// The keys and values of step s: passed along the ring (p2p) or sliced out of the gathered ones (allgather).
class KvSource {
 public:
  KvSource(const ContextParallel& cp, const Tensor& qkv) : cp_(cp) {
    own_ = Tensor::empty(kv_shape(qkv), qkv.dtype(), qkv.device());
    attention_kv_pack(qkv, own_);
    if (cp.all_gather) {
      const Shape s = kv_shape(qkv);
      gathered_ = Tensor::empty({cp.size * s[0], s[1], s[2], s[3], s[4]}, qkv.dtype(), qkv.device());
      cp.comm->all_gather(own_, gathered_)->wait();
    } else {
      current_ = own_;
      next_ = Tensor::empty(kv_shape(qkv), qkv.dtype(), qkv.device());
    }
  }
  // The block of step s (posting the next step's transfer first on the ring).
  Tensor at(int s) {
    const int src = source_of(cp_, s);
    if (cp_.all_gather) {
      const int64_t B = own_.dim(0);
      return gathered_.slice(src * B, (src + 1) * B);
    }
    if (s + 1 < cp_.size) {
      send_ = cp_.comm->send(current_, (cp_.rank + 1) % cp_.size, kTagKv);
      recv_ = cp_.comm->recv(next_, (cp_.rank - 1 + cp_.size) % cp_.size, kTagKv);
      // On NCCL the pair goes out now, on the communicator's stream after what the compute stream holds so far
      // (this block's keys and values are ready), and travels while this block's attention computes; advance()
      // makes the compute stream wait for it (an event) before the next block is read.
      recv_->start();
    }
    return current_;
  }
  // After step s's compute: the next block has arrived.
  void advance() {
    if (!send_) return;
    send_->wait();
    recv_->wait();
    send_.reset();
    recv_.reset();
    std::swap(current_, next_);
  }

 private:
  const ContextParallel& cp_;
  Tensor own_, gathered_, current_, next_;  // (B, T, G, 2, D); gathered (C * B, ...)
  std::unique_ptr<Work> send_, recv_;
};

}  // namespace

void context_attention_forward(const ContextParallel& cp, const Tensor& qkv, Tensor& out, Tensor& lse,
                               const AttentionOptions& att) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), H = qkv.dim(2) * (qkv.dim(3) - 2), D = qkv.dim(4);
  KvSource kv(cp, qkv);
  Tensor acc = Tensor::empty({B, T, H, D}, DType::f32, qkv.device());    // the merged output so far
  Tensor part = Tensor::empty({B, T, H, D}, DType::f32, qkv.device());   // one block's
  Tensor part_lse = Tensor::empty({B, H, T}, DType::f32, qkv.device());  // and its log-sum-exp
  for (int s = 0; s < cp.size; ++s) {
    const Tensor block = kv.at(s);
    const AttentionBlockOptions opt = block_options(cp, T, source_of(cp, s), att);
    if (s == 0) {
      attention_block_forward(qkv, block, acc, lse, opt);
    } else {
      attention_block_forward(qkv, block, part, part_lse, opt);
      attention_merge(acc, lse, part, part_lse);
    }
    kv.advance();
  }
  Tensor out4 = out.view({B, T, H, D});
  out4.copy_from(acc);
}

void context_attention_backward(const ContextParallel& cp, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                const Tensor& dout, Tensor& dqkv, const AttentionOptions& att) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), H = qkv.dim(2) * (qkv.dim(3) - 2), D = qkv.dim(4);
  const Shape s5 = kv_shape(qkv);
  KvSource kv(cp, qkv);
  Tensor dq = Tensor::zeros({B, T, H, D}, DType::f32, qkv.device());
  Tensor dkv;  // (B, T, G, 2, D) f32: this rank's key/value gradients when done
  if (cp.all_gather) {
    // Every block's gradients in one (C * B, ...) buffer, summed into their owners by one reduce-scatter.
    Tensor all = Tensor::zeros({cp.size * s5[0], s5[1], s5[2], s5[3], s5[4]}, DType::f32, qkv.device());
    for (int s = 0; s < cp.size; ++s) {
      const int src = source_of(cp, s);
      Tensor block_grad = all.slice(src * B, (src + 1) * B);
      attention_block_backward(qkv, kv.at(s), out, lse, dout, dq, block_grad, block_options(cp, T, src, att));
    }
    dkv = Tensor::empty(s5, DType::f32, qkv.device());
    cp.comm->reduce_scatter(all, dkv)->wait();
  } else {
    // The gradient of the block being visited travels with it: started at zero by its owner (step 0), it gains
    // each rank's share and arrives home after the C-th hop.
    dkv = Tensor::zeros(s5, DType::f32, qkv.device());
    Tensor arriving = Tensor::empty(s5, DType::f32, qkv.device());
    for (int s = 0; s < cp.size; ++s) {
      const Tensor block = kv.at(s);
      attention_block_backward(qkv, block, out, lse, dout, dq, dkv, block_options(cp, T, source_of(cp, s), att));
      auto send = cp.comm->send(dkv, (cp.rank + 1) % cp.size, kTagDkv);
      auto recv = cp.comm->recv(arriving, (cp.rank - 1 + cp.size) % cp.size, kTagDkv);
      kv.advance();
      send->wait();
      recv->wait();
      std::swap(dkv, arriving);
    }
  }
  attention_qkv_grad(dq, dkv, dqkv);
}

}  // namespace mt
