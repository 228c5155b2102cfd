// test_cuda_ops.packed_documents.cpp: packed documents (data.sft_packing: pack) on the GPU against the CPU reference:
// attention (the megatrain kernel; cuDNN refuses positions and auto falls back to it), RoPE and the learned
// position table with positions that restart at document boundaries.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace)

// Documents of several lengths, across the kernels' row tiles (16 rows a block) and key tiles (32), some of one
// token; with and without dropout, GPT's layout and grouped-query attention.
TEST_F(CudaOps, PackedAttentionMatchesCpu) {
  const int64_t B = 2, T = 130;
  const Both pos = document_positions({{1, 40, 33, 7}, {64, 1, 1}}, T);
  for (const auto [G, R, D] : {std::tuple<int64_t, int64_t, int64_t>{3, 1, 16}, {2, 2, 64}})
    for (float p : {0.f, 0.1f}) {
      const int64_t H = G * R;
      for (DType dt : kFloatTypes) {
        const Both qkv = both(rand_vec(B * T * G * (R + 2) * D, 401, -2, 2), {B, T, G, R + 2, D}, dt);
        const Both dout = both(rand_vec(B * T * H * D, 402), {B, T, H, D}, dt);
        Both out = poisoned({B, T, H, D}, dt), lse = poisoned({B, H, T}, DType::f32);
        Both dqkv = poisoned({B, T, G, R + 2, D}, dt);
        for (auto d : kDevices) {
          const AttentionOptions opt{
              .dropout_p = p, .seed = 5, .site = stream_id("layers.0.attn.probs"), .positions = pos.*d};
          attention_forward(qkv.*d, out.*d, lse.*d, opt);
          attention_backward(qkv.*d, out.*d, lse.*d, dout.*d, dqkv.*d, opt);
        }
        const std::string what = str(" G", G, " R", R, " D", D, " p", p, " ", dtype_name(dt));
        expect_match(out, tol_for(dt), "packed attention out" + what);
        expect_match(lse, tol_for(dt), "packed attention lse" + what);
        expect_match(dqkv, tol_for(dt), "packed attention dqkv" + what);
      }
    }
}

// RoPE at the documents' positions: the same table rows as the CPU's.
TEST_F(CudaOps, PackedRopeMatchesCpu) {
  const int64_t B = 2, T = 37, G = 2, R = 2, D = 16;
  const Both pos = document_positions({{5, 20}, {1, 1, 30}}, T);
  for (bool inverse : {false, true})
    for (DType dt : kFloatTypes) {
      Both qkv = both(rand_vec(B * T * G * (R + 2) * D, 403), {B, T, G, R + 2, D}, dt);
      for (auto d : kDevices) rope_(qkv.*d, {.inverse = inverse, .positions = pos.*d});
      expect_match(qkv, tol_for(dt), str("packed rope_ ", inverse ? "inverse " : "", dtype_name(dt)));
    }
}

// The position table's rows of a sequence shard [offset, offset + len) of packed samples, forward and backward
// (the backward adds every token's gradient in token order, as the CPU).
TEST_F(CudaOps, PackedPositionEmbeddingMatchesCpu) {
  const int64_t B = 3, T = 40, C = 24, P = 64, offset = 8, len = 20;
  const Both pos = document_positions({{3, 10}, {40}, {1, 1, 1}}, T);
  for (DType dt : kFloatTypes) {
    Both x = both(rand_vec(B * len * C, 404), {B, len, C}, dt);
    const Both wpe = both(rand_vec(P * C, 405), {P, C}, dt), dout = both(rand_vec(B * len * C, 406), {B, len, C}, dt);
    Both dwpe = both(rand_vec(P * C, 407), {P, C}, DType::f32);
    for (auto d : kDevices) {
      const EmbeddingOptions opt{.position_offset = offset, .positions = pos.*d};
      position_embedding_add(x.*d, wpe.*d, opt);
      position_embedding_backward(dout.*d, dwpe.*d, opt);
    }
    expect_match(x, tol_for(dt), str("packed position_embedding_add ", dtype_name(dt)));
    expect_exact(dwpe, str("packed position_embedding_backward ", dtype_name(dt)));
  }
}

}  // namespace
}  // namespace mt
