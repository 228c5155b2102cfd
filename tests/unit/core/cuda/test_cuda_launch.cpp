// test_cuda_launch.cpp: the CUDA kernels' launch arithmetic (core/cuda/launch.h) on the host, no GPU or CUDA
// toolkit needed: block and grid sizes over edge shapes (0 and 1 elements, multiples of a block and one
// either side, more than 2^31 elements), CUDA's grid limits (gridDim.x <= 2^31 - 1, gridDim.y <= 65535) for
// the largest tensors a GPT run makes (8192 x 50304 logits, 65536 rows), the coverage of the kernels' index
// loops (simulated: every element visited exactly once) and the choice between the 16-byte vector form of a
// kernel and its scalar form (tails, row lengths, misaligned pointers).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/launch.h"

namespace mt::cuda {
namespace {

constexpr int64_t k2to31 = int64_t{1} << 31;

// A pointer with the given address (never dereferenced): alignment checks only look at the bits.
const void* at_address(uintptr_t a) { return reinterpret_cast<const void*>(a); }

// ---- one-dimensional grid-stride launches ----------------------------------------------------------

TEST(CudaLaunch, CeilDiv) {
  EXPECT_EQ(ceil_div(0, 256), 0);
  EXPECT_EQ(ceil_div(1, 256), 1);
  EXPECT_EQ(ceil_div(255, 256), 1);
  EXPECT_EQ(ceil_div(256, 256), 1);
  EXPECT_EQ(ceil_div(257, 256), 2);
  EXPECT_EQ(ceil_div(k2to31 * 256 + 1, 256), k2to31 + 1);  // no int overflow
}

TEST(CudaLaunch, BlocksForCoversNAndStaysWithinGridX) {
  EXPECT_EQ(blocks_for(0, 256), 1u);  // an empty launch still has a block (the kernels return at once)
  EXPECT_EQ(blocks_for(-3, 256), 1u);
  EXPECT_EQ(blocks_for(1, 256), 1u);
  EXPECT_EQ(blocks_for(255, 256), 1u);
  EXPECT_EQ(blocks_for(256, 256), 1u);
  EXPECT_EQ(blocks_for(257, 256), 2u);
  EXPECT_EQ(blocks_for(256 * 1000 - 1, 256), 1000u);
  EXPECT_EQ(blocks_for(256 * 1000 + 1, 256), 1001u);
  EXPECT_EQ(blocks_for(k2to31 + 5, 256), static_cast<unsigned>(ceil_div(k2to31 + 5, 256)));
  // Past what gridDim.x can hold: clamped, never wrapped (2^40 blocks used to truncate to 0 in 32 bits).
  EXPECT_EQ(blocks_for(int64_t{1} << 48, 256), static_cast<unsigned>(kMaxGridX));
  EXPECT_EQ(blocks_for(kMaxGridX * int64_t{256}, 256), static_cast<unsigned>(kMaxGridX));
}

TEST(CudaLaunch, Grid1dIsCappedAndNeverZero) {
  EXPECT_EQ(grid_1d(0, 256), 1u);
  EXPECT_EQ(grid_1d(1, 256), 1u);
  EXPECT_EQ(grid_1d(256, 256), 1u);
  EXPECT_EQ(grid_1d(257, 256), 2u);
  EXPECT_EQ(grid_1d(kMaxStrideBlocks * 256, 256), static_cast<unsigned>(kMaxStrideBlocks));
  EXPECT_EQ(grid_1d(kMaxStrideBlocks * 256 + 1, 256), static_cast<unsigned>(kMaxStrideBlocks));
  // 8192 x 50304 logits (4.1e8 elements), and 2^33 + 7 elements (past int32 and uint32 indices).
  EXPECT_EQ(grid_1d(8192 * int64_t{50304}, 256), static_cast<unsigned>(kMaxStrideBlocks));
  EXPECT_EQ(grid_1d((int64_t{1} << 33) + 7, 256), static_cast<unsigned>(kMaxStrideBlocks));
  // 2^48 elements: the old std::min<unsigned>(blocks_for(n), cap) took the min of a truncated 0.
  EXPECT_EQ(grid_1d(int64_t{1} << 48, 256), static_cast<unsigned>(kMaxStrideBlocks));
  EXPECT_EQ(grid_1d(1000, 256, 3), 3u);
  EXPECT_EQ(grid_1d(int64_t{1} << 48, 32, int64_t{1} << 40), static_cast<unsigned>(kMaxGridX));
}

// for (i = block * threads + thread; i < n; i += blocks * threads): every i in [0, n) exactly once.
std::vector<int> grid_stride_visits(int64_t n, unsigned blocks, int threads) {
  std::vector<int> visits(static_cast<size_t>(n), 0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t t = 0; t < threads; ++t)
      for (int64_t i = b * threads + t; i < n; i += static_cast<int64_t>(blocks) * threads) ++visits[i];
  return visits;
}

TEST(CudaLaunch, GridStrideLoopsVisitEveryElementOnce) {
  for (int64_t n : {0, 1, 31, 32, 33, 255, 256, 257, 1000, 8 * 1024 + 5}) {
    const std::vector<int> v = grid_stride_visits(n, grid_1d(n, 256), 256);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 1) << "n = " << n << ", element " << i;
    const std::vector<int> capped = grid_stride_visits(n, grid_1d(n, 32, 3), 32);  // the loop wraps
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(capped[i], 1) << "n = " << n << " capped, element " << i;
  }
}

// ---- row kernels -----------------------------------------------------------------------------------

TEST(CudaLaunch, RowGridIsClampedToOneAndTheCap) {
  EXPECT_EQ(row_grid(0, kNormRowBlocks), 1u);
  EXPECT_EQ(row_grid(1, kNormRowBlocks), 1u);
  EXPECT_EQ(row_grid(65536, kNormRowBlocks), 65536u);  // B * T = 65536 rows: one block each, on grid x
  EXPECT_EQ(row_grid(kNormRowBlocks + 1, kNormRowBlocks), static_cast<unsigned>(kNormRowBlocks));
  EXPECT_EQ(row_grid(int64_t{1} << 40, kMaxStrideBlocks), static_cast<unsigned>(kMaxStrideBlocks));
  EXPECT_LE(kNormRowBlocks, kMaxGridX);
  EXPECT_LE(kMaxStrideBlocks, kMaxGridX);
}

TEST(CudaLaunch, ThreadsForColsIsAWholeNumberOfWarpsUpToTheCap) {
  EXPECT_EQ(threads_for_cols(0), 32);
  EXPECT_EQ(threads_for_cols(1), 32);
  EXPECT_EQ(threads_for_cols(32), 32);
  EXPECT_EQ(threads_for_cols(33), 64);
  EXPECT_EQ(threads_for_cols(255), 256);
  EXPECT_EQ(threads_for_cols(256), 256);
  EXPECT_EQ(threads_for_cols(257), 256);
  EXPECT_EQ(threads_for_cols(k2to31 + 1), 256);
  EXPECT_EQ(threads_for_cols(2000, 1024), 1024);
  EXPECT_EQ(threads_for_cols(1000, 1024), 1024);
  EXPECT_EQ(threads_for_cols(999, 1024), 1024);
  EXPECT_EQ(threads_for_cols(990, 1024), 992);
}

TEST(CudaLaunch, NormRowThreadsGiveAboutEightColumnsAThread) {
  EXPECT_EQ(norm_row_threads(0), 32);
  EXPECT_EQ(norm_row_threads(1), 32);
  EXPECT_EQ(norm_row_threads(8), 32);
  EXPECT_EQ(norm_row_threads(256), 32);
  EXPECT_EQ(norm_row_threads(257), 64);
  EXPECT_EQ(norm_row_threads(1000), 128);
  EXPECT_EQ(norm_row_threads(1003), 128);
  EXPECT_EQ(norm_row_threads(2048), 256);
  EXPECT_EQ(norm_row_threads(8192), 1024);
  EXPECT_EQ(norm_row_threads(8193), 1024);
  EXPECT_EQ(norm_row_threads(k2to31 + 1), 1024);
  for (int64_t C = 0; C < 20000; C += 37) {
    const int t = norm_row_threads(C);
    ASSERT_EQ(t % 32, 0) << C;
    ASSERT_GE(t, 32) << C;
    ASSERT_LE(t, kMaxBlockThreads) << C;
  }
}

// ---- column reductions ---------------------------------------------------------------------------

TEST(CudaLaunch, ColumnChunksCoverEveryRowAndColumnWithinGridLimits) {
  for (int64_t N : {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{300}, int64_t{1024}, int64_t{65535},
                    int64_t{65536}, int64_t{65535} * 32 + 1, int64_t{100'000'000}, k2to31 + 3})
    for (int64_t C :
         {int64_t{1}, int64_t{8}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{2048}, int64_t{50304}}) {
      const ColumnChunks cc = column_chunks(N, C, 256);
      const std::string what = "N = " + std::to_string(N) + ", C = " + std::to_string(C);
      EXPECT_GE(cc.col_blocks * 256, C) << what;
      EXPECT_LT((cc.col_blocks - 1) * 256, C) << what;
      EXPECT_LE(cc.col_blocks, kMaxGridX) << what;
      EXPECT_GE(cc.rows_per, 32) << what;
      EXPECT_GE(cc.chunks * cc.rows_per, N) << what;        // every row in a chunk
      EXPECT_LT((cc.chunks - 1) * cc.rows_per, N) << what;  // no empty chunk
      EXPECT_GE(cc.chunks, 1) << what;
      EXPECT_LE(cc.chunks, kMaxGridYZ) << what;  // chunks go on grid y
    }
  // About 1024 blocks where the rows allow it.
  const ColumnChunks cc = column_chunks(65536, 2048, 256);
  EXPECT_EQ(cc.col_blocks, 8);
  EXPECT_EQ(cc.rows_per, 512);
  EXPECT_EQ(cc.chunks, 128);
}

// ---- dropout: Philox blocks of a row on grid x, rows on grid y ------------------------------------

TEST(CudaLaunch, RowUnitsGridWithinLimits) {
  for (int64_t units :
       {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{256}, int64_t{257}, int64_t{12576}, k2to31 * 4})
    for (int64_t N : {int64_t{0}, int64_t{1}, int64_t{65535}, int64_t{65536}, int64_t{1} << 40}) {
      const RowUnitsGrid g = row_units_grid(N, units);
      const std::string what = "N = " + std::to_string(N) + ", units = " + std::to_string(units);
      EXPECT_EQ(g.threads % 32, 0) << what;
      EXPECT_GE(g.threads, 32) << what;
      EXPECT_LE(g.threads, 256) << what;
      EXPECT_GE(static_cast<int64_t>(g.grid_x) * g.threads, units) << what;
      EXPECT_LT(static_cast<int64_t>(g.grid_x - 1) * g.threads, units) << what;
      EXPECT_GE(g.grid_y, 1u) << what;
      EXPECT_LE(g.grid_y, static_cast<unsigned>(kMaxGridYZ)) << what;
    }
}

// for (n = blockIdx.y; n < N; n += gridDim.y): every row exactly once, also past 65535 rows.
TEST(CudaLaunch, RowStrideOverGridYVisitsEveryRowOnce) {
  for (int64_t N : {int64_t{1}, int64_t{7}, int64_t{65535}, int64_t{65536}, int64_t{65537}, int64_t{200000}}) {
    const RowUnitsGrid g = row_units_grid(N, 1);
    std::vector<int> visits(static_cast<size_t>(N), 0);
    for (int64_t y = 0; y < g.grid_y; ++y)
      for (int64_t n = y; n < N; n += g.grid_y) ++visits[n];
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(visits[n], 1) << "N = " << N << ", row " << n;
  }
}

// The scalar dropout kernel: thread k of a row takes Philox block first_block + k and the lanes of it that
// fall in [col0, col0 + C). Every column of the row exactly once, for every offset within a block.
TEST(CudaLaunch, DropoutGridCoversEveryColumnOnce) {
  for (int64_t col_offset : {0, 1, 2, 3, 5, 6, 8, 1000003})
    for (int64_t C : {1, 2, 3, 4, 5, 7, 8, 12, 13, 70, 1000, 1003, 8 * 1024 + 5}) {
      const DropoutGrid g = dropout_grid(1, C, col_offset);
      const std::string what = "col_offset = " + std::to_string(col_offset) + ", C = " + std::to_string(C);
      ASSERT_EQ(g.col0, static_cast<uint64_t>(col_offset)) << what;
      std::vector<int> visits(static_cast<size_t>(C), 0);
      for (uint64_t k = 0; k < static_cast<uint64_t>(g.grid.grid_x) * g.grid.threads; ++k) {
        if (k >= g.blocks_per_row) continue;
        for (uint64_t lane = 0; lane < 4; ++lane) {
          const uint64_t gc = (g.first_block + k) * 4 + lane;
          if (gc < g.col0 || gc >= g.col0 + static_cast<uint64_t>(C)) continue;
          ++visits[gc - g.col0];
        }
      }
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(visits[c], 1) << what << ", column " << c;
      // No thread without a column: the first and last blocks each hold one.
      EXPECT_LE(g.first_block * 4, g.col0) << what;
      EXPECT_GT(g.first_block * 4 + 4, g.col0) << what;
      EXPECT_GE((g.first_block + g.blocks_per_row) * 4, g.col0 + C) << what;
      EXPECT_LT((g.first_block + g.blocks_per_row - 1) * 4, g.col0 + C) << what;
    }
}

TEST(CudaLaunch, DropoutGridOfLargeActivations) {
  // B * T = 65536 rows of C = 8192: 2048 Philox blocks a row on 8 blocks of 256 threads, rows on grid y at
  // its limit (the kernel strides).
  const DropoutGrid g = dropout_grid(65536, 8192, 0);
  EXPECT_EQ(g.blocks_per_row, 2048u);
  EXPECT_EQ(g.grid.threads, 256);
  EXPECT_EQ(g.grid.grid_x, 8u);
  EXPECT_EQ(g.grid.grid_y, 65535u);
  // A tensor-parallel shard far along the columns.
  const DropoutGrid s = dropout_grid(4096, 2048, 6 * 2048 + 2);
  EXPECT_EQ(s.first_block, static_cast<uint64_t>(6 * 2048 + 2) / 4);
  EXPECT_EQ(s.blocks_per_row, 513u);  // starts mid-block: one more block than 2048 / 4
}

// ---- 16-byte vectors -----------------------------------------------------------------------------

TEST(CudaLaunch, VectorWidths) {
  EXPECT_EQ(vec_width(4), 4);  // fp32
  EXPECT_EQ(vec_width(2), 8);  // bf16, fp16
  EXPECT_EQ(vec_width(1), 16);
}

TEST(CudaLaunch, Alignment) {
  EXPECT_TRUE(aligned16(nullptr));
  EXPECT_TRUE(aligned16(at_address(0x7f0000000100)));
  EXPECT_TRUE(aligned16(at_address(0x7f0000000110)));
  for (uintptr_t off : {1, 2, 4, 8, 12, 14, 15}) EXPECT_FALSE(aligned16(at_address(0x7f0000000100 + off))) << off;
  const void* a = at_address(0x1000);
  const float* f = static_cast<const float*>(at_address(0x2000));
  const float* f_odd = static_cast<const float*>(at_address(0x2004));
  EXPECT_TRUE(all_aligned16(a, f));
  EXPECT_FALSE(all_aligned16(a, f, f_odd));
  EXPECT_TRUE(all_aligned16());  // no pointers: nothing to misalign
}

TEST(CudaLaunch, RowsTakeVectorsOnlyWhenEveryRowStartsAligned) {
  const void* base = at_address(0x10000);
  const void* odd = at_address(0x10000 + 2);  // a view at an odd bf16 element offset
  const void* eight = at_address(0x10000 + 8);
  // bf16 / fp16 rows (8 elements a vector) and fp32 rows (4).
  for (int64_t C : {8, 16, 1000, 2048, 50304}) EXPECT_TRUE(rows_take_vectors(C, 8, base, base)) << C;
  for (int64_t C : {1, 4, 7, 12, 13, 1003, 8 * 1024 + 5}) EXPECT_FALSE(rows_take_vectors(C, 8, base)) << C;
  for (int64_t C : {4, 8, 12, 1000}) EXPECT_TRUE(rows_take_vectors(C, 4, base)) << C;
  for (int64_t C : {1, 2, 13, 1003}) EXPECT_FALSE(rows_take_vectors(C, 4, base)) << C;
  EXPECT_FALSE(rows_take_vectors(2048, 8, base, odd));
  EXPECT_FALSE(rows_take_vectors(2048, 4, eight));
  // Dropout: also whole Philox blocks (global column offset a multiple of 4).
  EXPECT_TRUE(dropout_rows_take_vectors(2048, 0, 8, base));
  EXPECT_TRUE(dropout_rows_take_vectors(2048, 4096, 8, base));
  EXPECT_TRUE(dropout_rows_take_vectors(1000, 4, 8, base));
  EXPECT_TRUE(dropout_rows_take_vectors(12, 8, 4, base));
  EXPECT_FALSE(dropout_rows_take_vectors(2048, 6, 8, base));
  EXPECT_FALSE(dropout_rows_take_vectors(2048, 2, 4, base));
  EXPECT_FALSE(dropout_rows_take_vectors(70, 0, 8, base));
  EXPECT_FALSE(dropout_rows_take_vectors(2048, 0, 8, base, odd));
}

TEST(CudaLaunch, VecSplitLeavesATailShorterThanAVector) {
  for (int w : {4, 8})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{12}, int64_t{13},
                      int64_t{8 * 1024 + 5}, k2to31 + 3, (int64_t{1} << 33) + 7, 8192 * int64_t{50304}}) {
      const VecSplit s = vec_split(n, w);
      EXPECT_EQ(s.tail_begin, s.vecs * w) << n;
      EXPECT_GE(n - s.tail_begin, 0) << n;
      EXPECT_LT(n - s.tail_begin, w) << n;
      EXPECT_EQ(vec_units(n, w), s.vecs + (n > s.tail_begin ? 1 : 0)) << n;
    }
  EXPECT_EQ(vec_split(8 * 1024 + 5, 8).vecs, 1024);
  EXPECT_EQ(vec_split(8 * 1024 + 5, 8).tail_begin, 8 * 1024);
  EXPECT_EQ(vec_split((int64_t{1} << 33) + 3, 4).vecs, int64_t{1} << 31);  // past int32 vector indices
}

// A flat vectorised kernel: vectors in a grid-stride loop, then the tail's elements in a second grid-stride
// loop; together every element exactly once, whatever the capped grid.
TEST(CudaLaunch, FlatVectorKernelsVisitEveryElementOnce) {
  for (int w : {1, 4, 8})
    for (int64_t n : {0, 1, 3, 7, 8, 9, 12, 13, 1000, 1003, 8 * 1024 + 5})
      for (int64_t cap : {int64_t{1}, int64_t{3}, kMaxStrideBlocks}) {
        const VecSplit s = vec_split(n, w);
        const unsigned blocks = grid_1d(vec_units(n, w), 32, cap);
        std::vector<int> visits(static_cast<size_t>(n), 0);
        const int64_t stride = static_cast<int64_t>(blocks) * 32;
        for (int64_t tid = 0; tid < stride; ++tid) {
          for (int64_t v = tid; v < s.vecs; v += stride)
            for (int j = 0; j < w; ++j) ++visits[v * w + j];
          for (int64_t i = tid; i < n - s.tail_begin; i += stride) ++visits[s.tail_begin + i];
        }
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(visits[i], 1) << "w = " << w << ", n = " << n << ", cap = " << cap << ", element " << i;
      }
}

// A vectorised row kernel: thread t of a row's block takes the vectors t, t + threads, ...; every column once.
TEST(CudaLaunch, RowVectorLoopsVisitEveryColumnOnce) {
  for (int w : {1, 4, 8})
    for (int64_t C : {8, 16, 24, 1000, 2048, 8192, 50304}) {
      if (C % w != 0) continue;
      const int threads = norm_row_threads(C);
      std::vector<int> visits(static_cast<size_t>(C), 0);
      for (int64_t t = 0; t < threads; ++t)
        for (int64_t c = t * w; c < C; c += static_cast<int64_t>(threads) * w)
          for (int j = 0; j < w; ++j) ++visits[c + j];
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(visits[c], 1) << "w = " << w << ", C = " << C << ", column " << c;
    }
}

// The largest shapes of a GPT-1.3B / 8B run are within the limits each kernel assumes.
TEST(CudaLaunch, LargeModelShapesFitTheGrids) {
  // Cross-entropy: one block per row of 8192 x 50304 logits (and 65536 rows): well under gridDim.x's limit;
  // a row's offset n * V needs 64 bits once N * V passes 2^31 (65536 * 50304 = 3.3e9).
  EXPECT_LT(int64_t{65536}, kMaxGridX);
  EXPECT_GT(int64_t{65536} * 50304, k2to31);
  EXPECT_TRUE(rows_take_vectors(50304, 8, at_address(0x100000)));      // the padded vocabulary takes bf16 vectors
  EXPECT_TRUE(rows_take_vectors(50304 / 2, 8, at_address(0x100000)));  // and its TP = 2 shard
  // LayerNorm over 65536 rows of 2048 or 8192.
  EXPECT_EQ(row_grid(65536, kNormRowBlocks), 65536u);
  EXPECT_EQ(norm_row_threads(2048), 256);
  // Elementwise over 65536 x 8192 x 4 (the MLP activation of an 8B model: 2^31 elements).
  EXPECT_EQ(grid_1d(vec_units(int64_t{65536} * 8192 * 4, 8), 256), static_cast<unsigned>(kMaxStrideBlocks));
  // The bias gradient of an 8192 x 50304 GEMM epilogue fallback: chunks on grid y within 65535.
  const ColumnChunks cc = column_chunks(8192, 50304, 256);
  EXPECT_LE(cc.chunks, kMaxGridYZ);
  EXPECT_LE(cc.col_blocks, kMaxGridX);
}

}  // namespace
}  // namespace mt::cuda
