// test_cuda_ops.attention_context.cpp: context-parallel attention's blocks on the GPU against the CPU reference
// (core/cpu/attention_context.cpp): packing, a block's partial attention and lse under each kind of chunk pair
// (diagonal, full, a jump inside the queries, invisible), the merge, the block backward and the qkv gradient, in
// fp32, bf16 and f16, grouped-query and GPT's layout; and with dropout on the probabilities, keyed by the chunks'
// global positions (the same mask as the CPU's). Those run megatrain's block kernels (MEGATRAIN_ATTENTION=kernel);
// cuDNN's fused attention as the ring's block (bf16 / fp16) has its own test, forced onto cuDNN. Skips where no GPU
// can run it.
#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/attention_backend.h"
#endif

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace): Vec, rand_vec, Both, CudaOps, the checks

struct BlockCase {
  int64_t B, T, G, R, D;
  AttentionBlockOptions opt;
};

class CudaAttentionBlocks : public CudaOps {};

TEST_F(CudaAttentionBlocks, BlocksMergeAndBackwardMatchCpu) {
  const AttentionModeScope kernels("kernel");  // the block kernels (f32 partial outputs even from bf16 inputs)
  const int64_t c = 8;                         // chunk length: local sequences of 2c tokens, CP = 2
  const SequencePositions rank0{.position_offset = 0, .split_at = c, .split_position = 3 * c};
  const SequencePositions rank1{.position_offset = c, .split_at = c, .split_position = 2 * c};
  // Attention dropout keyed as one rank's over the 4c tokens: (query, key) at their global positions.
  auto dropped = [&](SequencePositions q, SequencePositions k) {
    return AttentionBlockOptions{.q = q,
                                 .k = k,
                                 .dropout_p = 0.3f,
                                 .seed = 77,
                                 .site = 12,
                                 .sample_offset = 5,
                                 .head_offset = 2,
                                 .seq_length = 4 * c};
  };
  const BlockCase cases[] = {
      {2, 2 * c, 2, 2, 16, {.q = rank0, .k = rank0}},  // own block: diagonal-causal chunks
      {1, 2 * c, 3, 1, 32, {.q = rank0, .k = rank1}},  // rank 1's keys: some full, some invisible
      {1, 2 * c, 1, 4, 64, {.q = rank1, .k = rank0}},  // multi-query
      {1, 2 * c, 2, 1, 40, {.q = {.position_offset = 0}, .k = {.position_offset = 100}}},  // nothing visible
      {2, 2 * c, 2, 2, 16, dropped(rank0, rank0)},  // the same with dropout: the CPU's mask at global positions
      {1, 2 * c, 3, 1, 32, dropped(rank0, rank1)},
      {1, 2 * c, 1, 4, 64, dropped(rank1, rank0)},
  };
  for (const BlockCase& k : cases)
    for (DType dt : kFloatTypes) {
      const int64_t H = k.G * k.R;
      const std::string what = str(" ", dtype_name(dt), " G=", k.G, " R=", k.R, " D=", k.D);
      const Both qkv = both(rand_vec(k.B * k.T * k.G * (k.R + 2) * k.D, 40, -2, 2), {k.B, k.T, k.G, k.R + 2, k.D}, dt);
      Both kv = poisoned({k.B, k.T, k.G, 2, k.D}, dt);
      Both out = poisoned({k.B, k.T, H, k.D}, DType::f32), lse = poisoned({k.B, H, k.T}, DType::f32);
      for (auto d : kDevices) {
        attention_kv_pack(qkv.*d, kv.*d);
        attention_block_forward(qkv.*d, kv.*d, out.*d, lse.*d, k.opt);
      }
      expect_exact(kv, "kv_pack" + what);
      expect_match(out, tol_for(DType::f32), "block out" + what);
      expect_match(lse, tol_for(DType::f32), "block lse" + what);
      // Merge a second block (the same keys seen without the mask) into the first.
      Both out2 = poisoned(out.cpu.shape(), DType::f32), lse2 = poisoned(lse.cpu.shape(), DType::f32);
      const AttentionBlockOptions full{.q = k.opt.q, .k = k.opt.k, .causal = false};
      for (auto d : kDevices) {
        attention_block_forward(qkv.*d, kv.*d, out2.*d, lse2.*d, full);
        attention_merge(out.*d, lse.*d, out2.*d, lse2.*d);
      }
      expect_match(out, tol_for(DType::f32), "merged out" + what);
      expect_match(lse, tol_for(DType::f32), "merged lse" + what);
      // Backward of the causal block from the merged statistics (any out and lse the forward could give).
      const Both o = both(values(out.cpu), {k.B, k.T, H, k.D}, dt);
      const Both dout = both(rand_vec(k.B * k.T * H * k.D, 41), {k.B, k.T, H, k.D}, dt);
      Both dq = both(rand_vec(k.B * k.T * H * k.D, 42), {k.B, k.T, H, k.D}, DType::f32);  // accumulated into
      Both dkv = both(rand_vec(k.B * k.T * k.G * 2 * k.D, 43), {k.B, k.T, k.G, 2, k.D}, DType::f32);
      Both dqkv = poisoned(qkv.cpu.shape(), dt);
      for (auto d : kDevices) {
        attention_block_backward(qkv.*d, kv.*d, o.*d, lse.*d, dout.*d, dq.*d, dkv.*d, k.opt);
        attention_qkv_grad(dq.*d, dkv.*d, dqkv.*d);
      }
      expect_match(dq, tol_for(dt), "dq" + what);
      expect_match(dkv, tol_for(dt), "dkv" + what);
      expect_match(dqkv, tol_for(dt), "dqkv" + what);
    }
}

// cuDNN's fused attention as the ring's block, forced (MEGATRAIN_ATTENTION=cudnn: a block cuDNN refused would throw,
// not fall back): each CP 2 rank's two blocks (its own, causal; the other rank's, one full call over a chunk of rows)
// merged by their Stats (log-sum-exp), then each block's backward from the merged out and lse (cuDNN's dQ, dK, dV
// added to f32 sums), against the CPU reference, bf16 and fp16, grouped-query and GPT's layout.
TEST_F(CudaAttentionBlocks, CudnnRingBlocksMatchCpu) {
#if defined(MEGATRAIN_WITH_CUDA)
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  const AttentionModeScope mode("cudnn");
  const int64_t c = 32, T = 2 * c;
  const SequencePositions pos[2] = {{.position_offset = 0, .split_at = c, .split_position = 3 * c},
                                    {.position_offset = c, .split_at = c, .split_position = 2 * c}};
  struct Shape {
    int64_t B, G, R, D;
  };
  for (const Shape s : {Shape{2, 2, 2, 64}, Shape{1, 4, 1, 32}})
    for (DType dt : {DType::bf16, DType::f16}) {
      const int64_t H = s.G * s.R;
      const std::string what = str(" cuDNN ", dtype_name(dt), " G=", s.G, " R=", s.R, " D=", s.D);
      std::vector<Both> qkv, kv;
      for (int r = 0; r < 2; ++r) {
        qkv.push_back(both(rand_vec(s.B * T * s.G * (s.R + 2) * s.D, 60 + r, -2, 2), {s.B, T, s.G, s.R + 2, s.D}, dt));
        kv.push_back(poisoned({s.B, T, s.G, 2, s.D}, dt));
        for (auto d : kDevices) attention_kv_pack(qkv[r].*d, kv[r].*d);
      }
      std::vector<Both> dkv;
      for (int r = 0; r < 2; ++r)
        dkv.push_back(both(Vec(s.B * T * s.G * 2 * s.D, 0.0), {s.B, T, s.G, 2, s.D}, DType::f32));
      for (int r = 0; r < 2; ++r) {
        const int other = 1 - r;
        Both out = poisoned({s.B, T, H, s.D}, DType::f32), lse = poisoned({s.B, H, T}, DType::f32);
        Both part = poisoned(out.cpu.shape(), DType::f32), part_lse = poisoned(lse.cpu.shape(), DType::f32);
        for (auto d : kDevices) {
          attention_block_forward(qkv[r].*d, kv[r].*d, out.*d, lse.*d, {.q = pos[r], .k = pos[r]});
          attention_block_forward(qkv[r].*d, kv[other].*d, part.*d, part_lse.*d, {.q = pos[r], .k = pos[other]});
        }
        expect_match(part, tol_for(dt), "other rank's block out of rank " + std::to_string(r) + what);
        for (auto d : kDevices) attention_merge(out.*d, lse.*d, part.*d, part_lse.*d);
        expect_match(out, tol_for(dt), "merged out of rank " + std::to_string(r) + what);
        expect_match(lse, tol_for(dt), "merged lse of rank " + std::to_string(r) + what);
        // Backward of both blocks from the CPU's merged statistics (the same inputs on both devices).
        const Both o = both(values(out.cpu), {s.B, T, H, s.D}, dt), l = both(values(lse.cpu), {s.B, H, T}, DType::f32);
        const Both dout = both(rand_vec(s.B * T * H * s.D, 62 + r), {s.B, T, H, s.D}, dt);
        Both dq = both(Vec(s.B * T * H * s.D, 0.0), {s.B, T, H, s.D}, DType::f32);
        for (auto d : kDevices)
          for (int src : {r, other})
            attention_block_backward(qkv[r].*d, kv[src].*d, o.*d, l.*d, dout.*d, dq.*d, dkv[src].*d,
                                     {.q = pos[r], .k = pos[src]});
        expect_match(dq, tol_for(dt), "dq of rank " + std::to_string(r) + what);
      }
      for (int r = 0; r < 2; ++r) expect_match(dkv[r], tol_for(dt), "dkv of rank " + std::to_string(r) + what);
    }
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

}  // namespace
}  // namespace mt
