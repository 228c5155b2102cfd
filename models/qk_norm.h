// qk_norm.h: QK-norm (Qwen3's q_norm and k_norm): each query head and each key head of a (B, T, G, R + 2, D) qkv
// activation RMS-normalized over its D values, the queries with one weight (D), the keys with another, before the
// rotary embeddings; the value slots pass unchanged. The rows are made slot-major first (transpose_blocks), so the
// queries and the keys are each one contiguous block of rows for the RMSNorm ops of every backend.
//
// The weights are replicated over tensor parallelism while each rank normalizes only its own heads, so their
// gradients are partial sums over the group (grad_sums.tensor), as LoRA's replicated factors' are.
#pragma once
#include <vector>

#include "models/block_part.h"
#include "models/norm.h"

namespace mt {

class QkNorm {
 public:
  QkNorm() = default;
  // Parameters layers.<i>.attn.q_norm.weight (D) and layers.<i>.attn.k_norm.weight (D), ones.
  QkNorm(const PartOptions& opt, int64_t D, float eps);

  struct Saved {
    Tensor slots;      // (R + 2, N G, D): the input slot-major, the norms' input
    Norm::Saved q, k;  // the query rows' (R N G, D) and the key rows' (N G, D)
  };
  // qkv (B, T, G, R + 2, D) -> the same with its query and key heads normalized.
  Tensor forward(const Tensor& qkv, Saved& s) const;
  // dqkv (the forward output's gradient) -> the input's; accumulates the weights' gradients.
  Tensor backward(const Tensor& dqkv, const Saved& s);

  std::vector<Parameter*> parameters();  // q_norm's, then k_norm's

 private:
  Norm q_, k_;
};

}  // namespace mt
