// test_cuda_ops.attention_window_context.cpp: context-parallel attention's blocks with a sliding window
// (AttentionBlockOptions::window: key j visible to query i iff attention_key_visible(position(i), position(j), causal,
// window)) on the GPU against the CPU reference: the block kernels (fp32, bf16, f16, dropout, the zigzag chunks of
// CP 2, a block the window hides wholly), and cuDNN's fused attention where one call expresses the block (a band on
// consecutive positions, a block the window hides or keeps whole), with auto falling back to the kernels for a
// chunk pair the window cuts partly. Packed documents (AttentionBlockOptions::positions, alone and with a window):
// the block kernels against the CPU on every zigzag chunk pair, cuDNN refusing them (auto falls back to the kernels),
// and the rotary embedding of a rank's packed positions. Without a GPU: which one cuDNN call a windowed block is
// (cudnn_block_of).
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); the GPU tests skip where no GPU can run them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/attention_backend.h"
#include "core/cuda/attention_cudnn.h"
#endif

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace): Vec, rand_vec, Both, CudaOps, the checks

#if defined(MEGATRAIN_WITH_CUDA)

// CP 2's zigzag chunks of c tokens: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (local rows 2c).
SequencePositions zigzag(int rank, int64_t c) {
  return rank == 0 ? SequencePositions{.position_offset = 0, .split_at = c, .split_position = 3 * c}
                   : SequencePositions{.position_offset = c, .split_at = c, .split_position = 2 * c};
}

struct BlockShape {
  int64_t B, T, G, R, D;
};

// One block's forward on both devices, then its backward from the block's own out and lse (a softmax the forward
// gives), dq and dkv accumulated into random values; each compared with the CPU, the forward's f32 out and lse
// within out_tol (fp32's on the block kernels, which widen bf16 / fp16 inputs as the CPU does; the dtype's on cuDNN).
// `positions`: packed documents' positions of the query rows (B, T) on each device, or null.
void expect_block_matches(const BlockShape& s, const AttentionBlockOptions& options, DType dt, double out_tol,
                          uint32_t seed, const std::string& what, const Both* positions = nullptr) {
  const int64_t B = s.B, T = s.T, G = s.G, R = s.R, D = s.D, H = G * R;
  const Both qkv = both(rand_vec(B * T * G * (R + 2) * D, seed, -2, 2), {B, T, G, R + 2, D}, dt);
  Both kv = poisoned({B, T, G, 2, D}, dt);
  Both out = poisoned({B, T, H, D}, DType::f32), lse = poisoned({B, H, T}, DType::f32);
  auto on = [&](Tensor Both::*d) {  // the options with the device's own positions
    AttentionBlockOptions o = options;
    if (positions) o.positions = (*positions).*d;
    return o;
  };
  for (auto d : kDevices) {
    attention_kv_pack(qkv.*d, kv.*d);
    attention_block_forward(qkv.*d, kv.*d, out.*d, lse.*d, on(d));
  }
  expect_match(out, out_tol, "block out" + what);
  expect_match(lse, out_tol, "block lse" + what);
  const Both o = both(values(out.cpu), {B, T, H, D}, dt), l = both(values(lse.cpu), {B, H, T}, DType::f32);
  const Both dout = both(rand_vec(B * T * H * D, seed + 1), {B, T, H, D}, dt);
  Both dq = both(rand_vec(B * T * H * D, seed + 2), {B, T, H, D}, DType::f32);
  Both dkv = both(rand_vec(B * T * G * 2 * D, seed + 3), {B, T, G, 2, D}, DType::f32);
  for (auto d : kDevices) attention_block_backward(qkv.*d, kv.*d, o.*d, l.*d, dout.*d, dq.*d, dkv.*d, on(d));
  expect_match(dq, tol_for(dt), "block dq" + what);
  expect_match(dkv, tol_for(dt), "block dkv" + what);
}

// Forced cuDNN (MEGATRAIN_ATTENTION=cudnn) throws on each of `blocks` (bf16 on the GPU), which it cannot express.
void expect_cudnn_refuses(const BlockShape& s, const std::vector<AttentionBlockOptions>& blocks, uint32_t seed) {
  const AttentionModeScope mode("cudnn");
  const int64_t T = s.T;
  const Tensor qkv =
      make(rand_vec(s.B * T * s.G * (s.R + 2) * s.D, seed), {s.B, T, s.G, s.R + 2, s.D}, DType::bf16).to(Device::cuda);
  Tensor kv = Tensor::empty({s.B, T, s.G, 2, s.D}, DType::bf16, Device::cuda);
  Tensor out = Tensor::empty({s.B, T, s.G * s.R, s.D}, DType::f32, Device::cuda);
  Tensor lse = Tensor::empty({s.B, s.G * s.R, T}, DType::f32, Device::cuda);
  attention_kv_pack(qkv, kv);
  for (const AttentionBlockOptions& opt : blocks)
    EXPECT_THROW(attention_block_forward(qkv, kv, out, lse, opt), std::runtime_error);
}

class CudaWindowBlocks : public CudaOps {};

// The block kernels (MEGATRAIN_ATTENTION=kernel): every chunk pair of CP 2 under windows of 1, 5 and 17 positions
// (a window cuts the own block's diagonal chunks and the other rank's chunks partly), one sequence's own block, and
// a block causality shows but the window hides (out 0, lse -inf, no gradient); with dropout keyed at global positions.
TEST_F(CudaWindowBlocks, KernelBlocksMatchCpu) {
  const AttentionModeScope kernels("kernel");
  const int64_t c = 8;
  const SequencePositions one{.position_offset = 0};
  for (int64_t window : {1, 5, 17})
    for (float p : {0.f, 0.3f})
      for (const auto& [q, k, s] :
           {std::tuple{zigzag(0, c), zigzag(0, c), BlockShape{2, 2 * c, 2, 2, 16}},
            std::tuple{zigzag(0, c), zigzag(1, c), BlockShape{1, 2 * c, 3, 1, 32}},
            std::tuple{zigzag(1, c), zigzag(0, c), BlockShape{1, 2 * c, 1, 4, 64}},
            std::tuple{one, one, BlockShape{2, 2 * c, 2, 2, 16}},
            std::tuple{SequencePositions{.position_offset = 100}, one, BlockShape{1, 2 * c, 2, 1, 16}}})
        for (DType dt : kFloatTypes) {
          const AttentionBlockOptions opt{.q = q,
                                          .k = k,
                                          .dropout_p = p,
                                          .seed = 78,
                                          .site = 13,
                                          .sample_offset = 1,
                                          .head_offset = 2,
                                          .seq_length = 200,
                                          .window = window};
          expect_block_matches(s, opt, dt, tol_for(DType::f32), 50,
                               str(" window ", window, " p ", p, " q at ", q.position_offset, " k at ",
                                   k.position_offset, " ", dtype_name(dt), " G=", s.G, " R=", s.R, " D=", s.D));
        }
}

// cuDNN's fused attention as a windowed ring block, forced (MEGATRAIN_ATTENTION=cudnn: a block cuDNN refused would
// throw): a band on one sequence's own block, a window too wide to bind (the zigzag own block, causal as without
// it; another rank's keys, one full call), and a block the window hides (the call writes out 0, lse -inf).
TEST_F(CudaWindowBlocks, CudnnBlocksMatchCpu) {
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  const AttentionModeScope mode("cudnn");
  const int64_t c = 32, T = 2 * c;
  const SequencePositions one{.position_offset = 0};
  struct Case {
    SequencePositions q, k;
    int64_t window;
  };
  const Case cases[] = {{one, one, 1},
                        {one, one, 5},
                        {one, one, 17},
                        {zigzag(0, c), zigzag(0, c), 4 * c},
                        {zigzag(1, c), zigzag(0, c), 4 * c},
                        {{.position_offset = 200}, one, 17}};
  for (const Case& k : cases)
    for (const BlockShape s : {BlockShape{2, T, 2, 2, 64}, BlockShape{1, T, 4, 1, 32}})
      for (DType dt : {DType::bf16, DType::f16})
        expect_block_matches(s, {.q = k.q, .k = k.k, .window = k.window}, dt, tol_for(dt), 60,
                             str(" cuDNN window ", k.window, " q at ", k.q.position_offset, " k at ",
                                 k.k.position_offset, " ", dtype_name(dt), " G=", s.G, " R=", s.R, " D=", s.D));
}

// A chunk pair the window cuts partly is no one cuDNN call: forced cuDNN fails loudly, auto runs the block kernels
// (bf16 without dropout would otherwise take cuDNN) and matches the CPU.
TEST_F(CudaWindowBlocks, PartlyVisibleBlocksFallBackToTheKernels) {
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  const int64_t c = 32, T = 2 * c;
  const BlockShape s{1, T, 2, 2, 64};
  const AttentionBlockOptions own{.q = zigzag(0, c), .k = zigzag(0, c), .window = 5};
  const AttentionBlockOptions other{.q = zigzag(1, c), .k = zigzag(0, c), .window = 17};
  expect_cudnn_refuses(s, {own, other}, 70);
  const AttentionModeScope mode("auto");
  for (const AttentionBlockOptions& opt : {own, other})
    expect_block_matches(s, opt, DType::bf16, tol_for(DType::f32), 71, str(" auto, window ", opt.window));
}

// ---- packed documents (AttentionBlockOptions::positions: a query row sees its own document's keys only) ----

// Rank `rank`'s columns (zigzag chunks of c) of packed positions (B, 4c), on both devices.
Both zigzag_columns(const Both& positions, int rank, int64_t c) {
  const int64_t B = positions.cpu.dim(0), T = positions.cpu.dim(1);
  const int64_t starts[2] = {rank == 0 ? 0 : c, rank == 0 ? 3 * c : 2 * c};
  std::vector<int32_t> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t start : starts)
      for (int64_t t = start; t < start + c; ++t) v.push_back(positions.cpu.data<int32_t>()[b * T + t]);
  return both_ints(v, {B, 2 * c});
}

// The block kernels with packed documents: every chunk pair of CP 2, documents that end inside a chunk, span chunks
// and (sample 1) start before the sample; with a window and dropout as well.
TEST_F(CudaWindowBlocks, PackedKernelBlocksMatchCpu) {
  const AttentionModeScope kernels("kernel");
  const int64_t c = 8;
  const Both docs = document_positions({{3, 20, 1}, {5, 9}}, 4 * c);
  for (int64_t window : {0, 5})
    for (float p : {0.f, 0.3f})
      for (const auto& [qr, kr, s] :
           {std::tuple{0, 0, BlockShape{2, 2 * c, 2, 2, 16}}, std::tuple{0, 1, BlockShape{2, 2 * c, 3, 1, 32}},
            std::tuple{1, 0, BlockShape{2, 2 * c, 1, 4, 64}}, std::tuple{1, 1, BlockShape{2, 2 * c, 2, 2, 16}}})
        for (DType dt : kFloatTypes) {
          const AttentionBlockOptions opt{.q = zigzag(qr, c),
                                          .k = zigzag(kr, c),
                                          .dropout_p = p,
                                          .seed = 79,
                                          .site = 14,
                                          .sample_offset = 1,
                                          .head_offset = 2,
                                          .seq_length = 4 * c,
                                          .window = window};
          const Both rows = zigzag_columns(docs, qr, c);
          expect_block_matches(s, opt, dt, tol_for(DType::f32), 80,
                               str(" packed, window ", window, " p ", p, " q rank ", qr, " k rank ", kr, " ",
                                   dtype_name(dt), " G=", s.G, " R=", s.R, " D=", s.D),
                               &rows);
        }
}

// Packed documents are not built into the cuDNN graphs: forced cuDNN fails loudly on such a block, auto runs the
// block kernels (bf16 without dropout would otherwise take cuDNN) and matches the CPU.
TEST_F(CudaWindowBlocks, PackedBlocksFallBackToTheKernels) {
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  const int64_t c = 32, T = 2 * c;
  const BlockShape s{2, T, 2, 2, 64};
  const Both rows = zigzag_columns(document_positions({{40, 3}, {70}}, 4 * c), 1, c);
  const AttentionBlockOptions opt{.q = zigzag(1, c), .k = zigzag(0, c)};
  AttentionBlockOptions packed = opt;
  packed.positions = rows.gpu;
  expect_cudnn_refuses(s, {packed}, 72);
  const AttentionModeScope mode("auto");
  expect_block_matches(s, opt, DType::bf16, tol_for(DType::f32), 73, " auto, packed", &rows);
}

// Rotary embeddings of a rank's packed positions, which reach past its 2c rows (position_rows = 4c), as the CPU's.
TEST_F(CudaWindowBlocks, RopeOfPackedChunksMatchesCpu) {
  const int64_t c = 8, B = 2, G = 2, S = 4, D = 16;
  const Both rows = zigzag_columns(document_positions({{3, 20, 1}, {5, 9}}, 4 * c), 0, c);
  for (DType dt : kFloatTypes)
    for (bool inverse : {false, true}) {
      Both qkv = both(rand_vec(B * 2 * c * G * S * D, 90), {B, 2 * c, G, S, D}, dt);
      for (auto d : kDevices)
        rope_(qkv.*d, {.theta = 10000.f, .inverse = inverse, .positions = rows.*d, .position_rows = 4 * c});
      expect_match(qkv, tol_for(dt), str(" rope of packed chunks ", dtype_name(dt), inverse ? " inverse" : ""));
    }
}

// ---- which one cuDNN call a windowed block is, without a GPU ----

TEST(CudnnWindowBlocks, OneCallEachOrRefused) {
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  const int64_t c = 8, T = 2 * c;
  const SequencePositions r0 = zigzag(0, c), r1 = zigzag(1, c), one{.position_offset = 0};
  auto call = [](const cuda::CudnnBlock& b) { return std::tuple(b.q0, b.q_rows, b.k0, b.k_rows, b.causal, b.window); };
  std::string why;
  // One sequence's own block: causal with the band.
  cuda::CudnnBlock b = cuda::cudnn_block_of(T, T, {.q = one, .k = one, .window = 5}, &why);
  EXPECT_EQ(why, "");
  EXPECT_EQ(call(b), std::tuple(int64_t{0}, T, int64_t{0}, T, true, int64_t{5}));
  // A window no visible pair reaches past is none: the own zigzag block (positions 0..31) is causal as without it.
  b = cuda::cudnn_block_of(T, T, {.q = r0, .k = r0, .window = 32}, &why);
  EXPECT_EQ(why, "");
  EXPECT_EQ(call(b), std::tuple(int64_t{0}, T, int64_t{0}, T, true, int64_t{0}));
  b = cuda::cudnn_block_of(T, T, {.q = r1, .k = r0, .window = 24}, &why);  // rank 0's first chunk, every query
  EXPECT_EQ(why, "");
  EXPECT_EQ(call(b), std::tuple(int64_t{0}, T, int64_t{0}, c, false, int64_t{0}));
  // A binding window over the zigzag own block: the band over local rows is not the one over positions.
  cuda::cudnn_block_of(T, T, {.q = r0, .k = r0, .window = 5}, &why);
  EXPECT_NE(why.find("not consecutive positions"), std::string::npos) << why;
  // Rank 0's first chunk (0..7) is cut by a window of 4 for rank 1's queries 8..15: partly visible.
  cuda::cudnn_block_of(T, T, {.q = r1, .k = r0, .window = 4}, &why);
  EXPECT_NE(why.find("partly visible"), std::string::npos) << why;
  // Keys causality shows wholly but the window hides wholly: no call.
  b = cuda::cudnn_block_of(T, T, {.q = {.position_offset = 100}, .k = one, .window = 8}, &why);
  EXPECT_EQ(why, "");
  EXPECT_TRUE(b.empty());
  // Without the window the same block is one full call.
  b = cuda::cudnn_block_of(T, T, {.q = {.position_offset = 100}, .k = one}, &why);
  EXPECT_EQ(why, "");
  EXPECT_EQ(call(b), std::tuple(int64_t{0}, T, int64_t{0}, T, false, int64_t{0}));
}

#endif  // MEGATRAIN_WITH_CUDA

}  // namespace
}  // namespace mt
