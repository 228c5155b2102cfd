// embedding.cu: token and position embeddings on the GPU, with vocabulary shards (vocab_start) and sequence
// shards (position_offset), as core/cpu/embedding.cpp.
//
// embedding_backward is deterministic and sums each table row's gradients in token order, in fp32 starting
// from dtable's value, exactly as the CPU: the token positions are stably radix-sorted by shard row (CUB;
// tokens outside the shard get the key V and sort last), then one block per run of equal keys (a grid-stride
// loop over the sorted positions, a block acting on the positions that start a run) adds that run's dout
// rows in sorted = token order, its threads striding over the columns.
//
// Token ids are not checked on the device: a negative id (the CPU throws) is treated like any id outside
// the shard (a zero row forward, skipped backward).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/radix_sort.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

// ---- forward -------------------------------------------------------------------------------------

// out[i] = table[ids[i] - vocab_start], or zeros outside [0, V). Rows in a grid-stride loop over blocks.
template <class TT, class TO>
__global__ void embedding_forward_kernel(const int32_t* ids, const TT* table, TO* out, int64_t BT, int64_t V, int64_t C,
                                         int64_t vocab_start) {
  for (int64_t i = blockIdx.x; i < BT; i += gridDim.x) {
    const int64_t r = static_cast<int64_t>(ids[i]) - vocab_start;
    TO* dst = out + i * C;
    if (r >= 0 && r < V) {
      const TT* src = table + r * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = from_f32<TO>(to_f32<TT>(src[c]));
    } else {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = from_f32<TO>(0.f);
    }
  }
}

template <class TO>
void launch_embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  const int64_t BT = ids.numel(), V = table.dim(0), C = table.dim(1);
  MT_DISPATCH_FLOAT(table.dtype(), "embedding_forward", TT,
                    embedding_forward_kernel<TT, TO>
                    <<<row_grid(BT, kMaxStrideBlocks), threads_for_cols(C, kThreads), 0, stream()>>>(
                        ids.data<int32_t>(), table.data<TT>(), out.data<TO>(), BT, V, C, vocab_start));
}

// ---- backward ------------------------------------------------------------------------------------

// keys[i] = the shard row of token i, or V when its id lies outside the shard; pos[i] = i.
__global__ void embedding_keys_kernel(const int32_t* ids, int64_t vocab_start, int64_t V, uint32_t* keys, int32_t* pos,
                                      int64_t BT) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < BT;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = static_cast<int64_t>(ids[i]) - vocab_start;
    keys[i] = r >= 0 && r < V ? static_cast<uint32_t>(r) : static_cast<uint32_t>(V);
    pos[i] = static_cast<int32_t>(i);
  }
}

// keys (BT) sorted ascending with pos (BT) the token positions, stably (equal keys in token order). A block
// takes sorted positions i in a grid-stride loop; where i starts a run of equal keys k < V, it finds the run's
// end and adds dout[pos[j]] for j over the run, in order, into dtable[k]; its threads (and gridDim.y) stride
// over the columns. No block-wide synchronisation, so the divergent exits are safe.
template <class T>
__global__ void embedding_backward_kernel(const uint32_t* keys, const int32_t* pos, const T* dout, float* dtable,
                                          int64_t BT, uint32_t V, int64_t C) {
  for (int64_t i = blockIdx.x; i < BT; i += gridDim.x) {
    const uint32_t key = keys[i];
    if (key >= V) break;                        // out-of-shard tokens sort last: none of ours remain
    if (i > 0 && keys[i - 1] == key) continue;  // not the start of its run
    // end = the first j > i with keys[j] != key (or BT): galloping, then binary search.
    int64_t lo = i + 1, hi = BT, step = 1;  // keys[lo - 1] == key
    while (true) {
      const int64_t probe = lo + step - 1;
      if (probe >= BT) break;  // hi = BT
      if (keys[probe] != key) {
        hi = probe;
        break;
      }
      lo = probe + 1;
      step *= 2;
    }
    while (lo < hi) {  // keys[lo - 1] == key; keys[hi] != key or hi == BT
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] == key)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int64_t end = lo;
    float* row = dtable + static_cast<int64_t>(key) * C;
    for (int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
         c += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      float acc = row[c];
#pragma unroll 8
      for (int64_t j = i; j < end; ++j) acc = __fadd_rn(acc, to_f32<T>(dout[static_cast<int64_t>(pos[j]) * C + c]));
      row[c] = acc;
    }
  }
}

// ---- position embeddings -------------------------------------------------------------------------

// position_at (core/tensor/ops.h) on the device: offset + t, or split_position + t - split_at from split_at on; with
// packed documents' positions (ids, (B, cols) i32), ids[b, offset + t] (not checked on the device: the CPU throws for
// a position outside the table).
struct Positions {
  int64_t offset, split_at, split_position;
  const int32_t* ids;  // null: no packed documents
  int64_t cols;
  __device__ int64_t at(int64_t b, int64_t t) const {
    if (ids) return ids[b * cols + offset + t];
    return split_at > 0 && t >= split_at ? split_position + (t - split_at) : offset + t;
  }
};
Positions positions_of(const EmbeddingOptions& opt) {
  const bool packed = opt.positions.defined();
  return {opt.position_offset, opt.split_at, opt.split_position, packed ? opt.positions.data<int32_t>() : nullptr,
          packed ? opt.positions.dim(1) : 0};
}

// x (B*T rows, C) += wpe[position_offset + t], t = row % T (or the packed position of row (b, t)). Rows in a
// grid-stride loop over blocks.
template <class T, class W>
__global__ void position_add_kernel(T* x, const W* wpe, int64_t N, int64_t T_len, int64_t C, Positions pos) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t t = n % T_len;
    const W* p = wpe + pos.at(n / T_len, t) * C;
    T* row = x + n * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      row[c] = from_f32<T>(__fadd_rn(to_f32<T>(row[c]), to_f32<W>(p[c])));
  }
}

template <class T>
void launch_position_add(Tensor& x, const Tensor& wpe, Positions position_offset) {
  const int64_t N = x.dim(0) * x.dim(1), T_len = x.dim(1), C = x.dim(2);
  MT_DISPATCH_FLOAT(wpe.dtype(), "position_embedding_add", W,
                    position_add_kernel<T, W>
                    <<<row_grid(N, kMaxStrideBlocks), threads_for_cols(C, kThreads), 0, stream()>>>(
                        x.data<T>(), wpe.data<W>(), N, T_len, C, position_offset));
}

// dwpe[position_offset + t, c] += sum over b of dout[b, t, c], in double in b order (as the CPU), one thread
// per (t, c): columns over gridDim.x * blockDim.x, positions t in a grid-stride loop over gridDim.y.
template <class T>
__global__ void position_backward_kernel(const T* dout, float* dwpe, int64_t B, int64_t T_len, int64_t C,
                                         Positions pos) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t t = blockIdx.y; t < T_len; t += gridDim.y) {
    double acc = 0.0;
    for (int64_t b = 0; b < B; ++b) acc += static_cast<double>(to_f32<T>(dout[(b * T_len + t) * C + c]));
    dwpe[pos.at(0, t) * C + c] += static_cast<float>(acc);
  }
}

// Packed documents: dwpe[position of (b, t), c] += dout[b, t, c] for every token in order b, t, in fp32 (as the
// CPU), one thread per column c walking all tokens: many tokens share a position, so a column's adds stay in one
// thread (deterministic, no atomics).
template <class T>
__global__ void packed_position_backward_kernel(const T* dout, float* dwpe, int64_t B, int64_t T_len, int64_t C,
                                                Positions pos) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_len; ++t) {
      float* dst = dwpe + pos.at(b, t) * C + c;
      *dst = __fadd_rn(*dst, to_f32<T>(dout[(b * T_len + t) * C + c]));
    }
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, const EmbeddingOptions& opt) {
  if (ids.numel() == 0 || table.dim(1) == 0) return;
  MT_DISPATCH_FLOAT(out.dtype(), "embedding_forward", TO,
                    launch_embedding_forward<TO>(ids, table, out, opt.vocab_start));
  MT_CUDA_LAUNCHED("embedding_forward_kernel");
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, const EmbeddingOptions& opt) {
  const int64_t BT = ids.numel(), V = dtable.dim(0), C = dtable.dim(1);
  if (BT == 0 || V == 0 || C == 0) return;
  if (BT > INT_MAX)
    throw std::invalid_argument("embedding_backward: " + std::to_string(BT) +
                                " tokens, more than the CUDA "
                                "backend sorts (2^31 - 1)");
  if (V >= static_cast<int64_t>(UINT32_MAX))
    throw std::invalid_argument("embedding_backward: " + std::to_string(V) +
                                " table rows, more than the CUDA "
                                "backend handles (2^32 - 2)");

  Tensor keys_in = Tensor::empty({BT}, DType::i32, Device::cuda, MemKind::workspace);  // uint32 keys
  Tensor keys_out = Tensor::empty({BT}, DType::i32, Device::cuda, MemKind::workspace);
  Tensor pos_in = Tensor::empty({BT}, DType::i32, Device::cuda, MemKind::workspace);
  Tensor pos_out = Tensor::empty({BT}, DType::i32, Device::cuda, MemKind::workspace);
  uint32_t* kin = static_cast<uint32_t*>(keys_in.raw());
  uint32_t* kout = static_cast<uint32_t*>(keys_out.raw());
  int32_t* pin = pos_in.data<int32_t>();
  int32_t* pout = pos_out.data<int32_t>();

  const unsigned key_blocks = grid_1d(BT, kThreads);
  embedding_keys_kernel<<<key_blocks, kThreads, 0, stream()>>>(ids.data<int32_t>(), opt.vocab_start, V, kin, pin, BT);
  MT_CUDA_LAUNCHED("embedding_keys_kernel");

  stable_sort_pairs(kin, kout, pin, pout, BT, static_cast<uint64_t>(V));  // keys lie in [0, V]

  const int threads = threads_for_cols(C, kThreads);
  const int64_t col_chunks = std::min<int64_t>(ceil_div(C, threads), kMaxGridYZ);
  const int64_t runs_grid = std::min<int64_t>(BT, std::max<int64_t>(1, 4096 / col_chunks));
  const dim3 grid(static_cast<unsigned>(runs_grid), static_cast<unsigned>(col_chunks));
  MT_DISPATCH_FLOAT(dout.dtype(), "embedding_backward", T,
                    embedding_backward_kernel<T><<<grid, threads, 0, stream()>>>(
                        kout, pout, dout.data<T>(), dtable.data<float>(), BT, static_cast<uint32_t>(V), C));
  MT_CUDA_LAUNCHED("embedding_backward_kernel");
}

void position_embedding_add(Tensor& x, const Tensor& wpe, const EmbeddingOptions& opt) {
  if (x.numel() == 0) return;
  MT_DISPATCH_FLOAT(x.dtype(), "position_embedding_add", T, launch_position_add<T>(x, wpe, positions_of(opt)));
  MT_CUDA_LAUNCHED("position_add_kernel");
}

void position_embedding_backward(const Tensor& dout, Tensor& dwpe, const EmbeddingOptions& opt) {
  const int64_t B = dout.dim(0), T_len = dout.dim(1), C = dout.dim(2);
  if (B == 0 || T_len == 0 || C == 0) return;
  if (opt.positions.defined()) {
    MT_DISPATCH_FLOAT(dout.dtype(), "position_embedding_backward", T,
                      packed_position_backward_kernel<T>
                      <<<static_cast<unsigned>(ceil_div(C, kThreads)), kThreads, 0, stream()>>>(
                          dout.data<T>(), dwpe.data<float>(), B, T_len, C, positions_of(opt)));
    MT_CUDA_LAUNCHED("packed_position_backward_kernel");
    return;
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kThreads)),
                  static_cast<unsigned>(std::min<int64_t>(T_len, kMaxGridYZ)));
  MT_DISPATCH_FLOAT(dout.dtype(), "position_embedding_backward", T,
                    position_backward_kernel<T><<<grid, kThreads, 0, stream()>>>(dout.data<T>(), dwpe.data<float>(), B,
                                                                                 T_len, C, positions_of(opt)));
  MT_CUDA_LAUNCHED("position_backward_kernel");
}

}  // namespace mt::cuda
