// launch.h: the launch arithmetic of the CUDA backend's kernels (blocks, threads, grid dimensions, chunks and
// 16-byte vector splits), in plain C++ so that tests/unit/core/cuda/test_cuda_launch.cpp checks it on any machine, with
// or without a GPU or the CUDA toolkit. Every size is int64_t and every result is clamped before it is
// narrowed, so tensors of more than 2^31 elements give valid launches.
//
// CUDA's limits (every compute capability megatrain builds for): gridDim.x <= 2^31 - 1, gridDim.y and
// gridDim.z <= 65535, blockDim.x <= 1024. What each kernel assumes:
//  * grid-stride kernels over n elements (elementwise, convert, swiglu, rope, fill, adamw): grid_1d, at most
//    kMaxStrideBlocks blocks, any n;
//  * one block per row with a grid-stride loop over rows (layernorm, rmsnorm, add_bias, embeddings): row_grid,
//    any number of rows;
//  * one block per row without a loop (cross-entropy): N <= 2^31 - 1 rows, refused by name beyond;
//  * a row's units on grid x and rows on grid y in a grid-stride loop (dropout, dropout_add): row_units_grid,
//    any N, grid x bounded by the row's length;
//  * column reductions (bias, norm parameter gradients): column_chunks, at most 65535 row chunks on grid y.
#pragma once
#include <algorithm>
#include <cstdint>

namespace mt::cuda {

inline constexpr int64_t kMaxGridX = 2147483647;  // 2^31 - 1
inline constexpr int64_t kMaxGridYZ = 65535;
inline constexpr int kMaxBlockThreads = 1024;
// Blocks of a grid-stride loop over elements: enough to fill any GPU many times over.
inline constexpr int64_t kMaxStrideBlocks = 65535 * 8;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of `threads` threads covering n elements: at least one, at most gridDim.x's limit (a kernel whose n
// could exceed threads * (2^31 - 1) must loop; none here comes near it).
constexpr unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, kMaxGridX));
}

// Blocks of a grid-stride loop over n units of `threads` threads each: blocks_for(n), at most `cap`.
constexpr unsigned grid_1d(int64_t n, int threads, int64_t cap = kMaxStrideBlocks) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, std::min(cap, kMaxGridX)));
}

// Blocks of a kernel that takes one row per block in a grid-stride loop over `rows` rows: at least one, at
// most `cap`.
constexpr unsigned row_grid(int64_t rows, int64_t cap) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, std::min(cap, kMaxGridX)));
}

// Threads of a block that walks the C columns of a row: C rounded up to a warp, at most `max_threads`.
constexpr int threads_for_cols(int64_t C, int max_threads = 256) {
  const int64_t t = ceil_div(std::max<int64_t>(C, 1), 32) * 32;
  return static_cast<int>(std::min<int64_t>(t, max_threads));
}

// Threads of the block that normalises one row of C columns (layernorm, rmsnorm): about 8 columns a thread,
// a multiple of 32, 32 to 1024.
constexpr int norm_row_threads(int64_t C) {
  const int64_t t = ceil_div(ceil_div(std::max<int64_t>(C, 1), 8), 32) * 32;
  return static_cast<int>(std::clamp<int64_t>(t, 32, kMaxBlockThreads));
}

// Blocks of the norm row kernels (grid-stride over the N rows).
inline constexpr int64_t kNormRowBlocks = 65535 * 32;

// How a deterministic column reduction over N rows of C columns splits its work: blocks of `threads`
// columns (grid x) times chunks of rows_per rows (grid y), about 1024 blocks in all, at least 32 rows a chunk
// and at most 65535 chunks. Each block writes per-chunk partials; a second kernel sums them in chunk order.
struct ColumnChunks {
  int64_t col_blocks, rows_per, chunks;
};
constexpr ColumnChunks column_chunks(int64_t N, int64_t C, int threads) {
  const int64_t col_blocks = ceil_div(C, threads);
  const int64_t want = std::max<int64_t>(1, 1024 / col_blocks);
  const int64_t rows_per = std::max({int64_t{32}, ceil_div(N, want), ceil_div(N, kMaxGridYZ)});
  return {col_blocks, rows_per, ceil_div(N, rows_per)};
}

// A 2-D launch over N rows of `units` units each (Philox blocks, vectors): one thread per unit of a row, the
// units on grid x (blocks of a multiple of 32 threads, at most max_threads), the rows on grid y, at most 65535
// (a kernel strides over rows beyond that).
struct RowUnitsGrid {
  int threads;
  unsigned grid_x, grid_y;
};
constexpr RowUnitsGrid row_units_grid(int64_t N, int64_t units, int max_threads = 256) {
  const int threads = threads_for_cols(units, max_threads);
  return {threads, static_cast<unsigned>(std::clamp<int64_t>(ceil_div(units, threads), 1, kMaxGridX)),
          static_cast<unsigned>(std::clamp<int64_t>(N, 1, kMaxGridYZ))};
}

// The launch of a kernel that draws dropout masks over N rows of C >= 1 columns starting at global column
// col_offset: one thread per Philox block of 4 global columns (core/base/rng.h's dropout_block), the blocks a row
// touches on grid x, rows on grid y (a kernel strides over rows beyond 65535).
struct DropoutGrid {
  uint64_t col0, first_block, blocks_per_row;
  RowUnitsGrid grid;
};
constexpr DropoutGrid dropout_grid(int64_t N, int64_t C, int64_t col_offset) {
  const uint64_t col0 = static_cast<uint64_t>(col_offset);
  const uint64_t first_block = col0 >> 2;
  const uint64_t last_block = (col0 + static_cast<uint64_t>(C) - 1) >> 2;
  const uint64_t blocks_per_row = last_block - first_block + 1;
  return {col0, first_block, blocks_per_row, row_units_grid(N, static_cast<int64_t>(blocks_per_row))};
}

// ---- 16-byte vectors -------------------------------------------------------------------------------
// A vectorised kernel moves 16 bytes per access: 4 fp32 or 8 bf16/fp16 elements. It needs every pointer it
// reads or writes as vectors 16-byte aligned, and a row kernel also needs its row length C to be a multiple
// of the vector width (so each row starts aligned); otherwise the kernel's scalar form (width 1) runs.

inline constexpr int kVecBytes = 16;

// Elements of `elem_bytes` bytes in one 16-byte vector.
constexpr int vec_width(int elem_bytes) { return kVecBytes / elem_bytes; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0; }

// Every pointer 16-byte aligned (null pointers, unused arguments, count as aligned).
template <class... P>
bool all_aligned16(const P*... ptrs) {
  return (aligned16(ptrs) && ...);
}

// A row kernel over rows of C elements may move `width` elements at a time when every pointer it reads or
// writes as vectors is 16-byte aligned and C is a multiple of width (so every row starts aligned).
template <class... P>
bool rows_take_vectors(int64_t C, int width, const P*... ptrs) {
  return C % width == 0 && all_aligned16(ptrs...);
}

// The dropout kernels' vector form also needs each vector to cover whole Philox blocks of 4 global columns
// (width is 4 or 8): col_offset a multiple of 4. Otherwise a vector would straddle a block boundary.
template <class... P>
bool dropout_rows_take_vectors(int64_t C, int64_t col_offset, int width, const P*... ptrs) {
  return width % 4 == 0 && col_offset % 4 == 0 && rows_take_vectors(C, width, ptrs...);
}

// A flat range of n elements taken `width` at a time: vecs whole vectors over [0, tail_begin), then
// n - tail_begin < width elements one by one.
struct VecSplit {
  int64_t vecs, tail_begin;
};
constexpr VecSplit vec_split(int64_t n, int width) { return {n / width, n / width * width}; }

// Units of work of a flat kernel over n elements `width` at a time: a thread per whole vector, and the tail's
// elements on the first threads (the tail is shorter than a vector, so the vectors' threads cover it).
constexpr int64_t vec_units(int64_t n, int width) { return ceil_div(n, width); }

}  // namespace mt::cuda
