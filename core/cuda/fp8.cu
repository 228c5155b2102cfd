// fp8.cu: the fp8 scaling ops on the GPU: amax, the scaled saturating cast to e4m3 / e5m2 (with its amax fused; and
// fused with the transpose, for the layouts of the fp8 GEMMs) and the cast back, bit for bit the CPU reference (core/cpu/fp8.cpp): products in fp32 with __fmul_rn, each
// rounded once (kernels.cuh's F32Convert: round to nearest even, __NV_SATFINITE, NaN -> 0x7f).
//
// The amax is deterministic and needs no atomics: a max over the bits of |x| (for non-negative floats the
// unsigned order is the value order, and a NaN comes above +inf, so it propagates) per block into a workspace,
// then one block takes the max of those and combines it with amax as the CPU does.
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kQuietNan = 0x7fc00000u;  // std::numeric_limits<float>::quiet_NaN(), as the CPU writes

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// The max of v over the block (blockDim.x a multiple of 32, at most 1024); thread 0 gets it.
__device__ unsigned block_max_bits(unsigned v) {
  __shared__ unsigned partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0u;
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_max[blockIdx.x] = the bits of max |x| over the elements this block visits.
template <class T, int E>
__global__ void amax_partials_kernel(const T* x, int64_t n, unsigned* block_max) {
  unsigned m = 0;
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float f[W];
    load_f32s<W>(x + i, f);
#pragma unroll
    for (int j = 0; j < W; ++j) m = max(m, abs_bits(f[j]));
  });
  m = block_max_bits(m);
  if (threadIdx.x == 0) block_max[blockIdx.x] = m;
}

// *amax = max(*amax, max of block_max[0, blocks)), NaN when either is NaN (one block; core/cpu/fp8.cpp's
// combine_amax: an explicit comparison, so a zero result keeps amax's sign).
__global__ void amax_finish_kernel(const unsigned* block_max, unsigned blocks, float* amax) {
  unsigned m = 0;
  for (unsigned b = threadIdx.x; b < blocks; b += blockDim.x) m = max(m, block_max[b]);
  m = block_max_bits(m);
  if (threadIdx.x == 0) {
    const float x = __uint_as_float(m), a = *amax;
    *amax = isnan(a) || isnan(x) ? __uint_as_float(kQuietNan) : (x > a ? x : a);
  }
}

// out[i] = saturate_cast(x[i] * scale[0]); with kAmax also block_max as amax_partials_kernel.
template <class T, class Q, int E, bool kAmax>
__global__ void quantize_kernel(const T* x, const float* scale, Q* out, int64_t n, unsigned* block_max) {
  const float s = *scale;
  unsigned m = 0;
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float f[W];
    load_f32s<W>(x + i, f);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if constexpr (kAmax) m = max(m, abs_bits(f[j]));
      f[j] = __fmul_rn(f[j], s);
    }
    store_f32s<W>(out + i, f);
  });
  if constexpr (kAmax) {
    m = block_max_bits(m);
    if (threadIdx.x == 0) block_max[blockIdx.x] = m;
  }
}

// out[i] = float(q[i]) * scale_inv[0], rounded once to T.
template <class Q, class T, int E>
__global__ void dequantize_kernel(const Q* q, const float* scale_inv, T* out, int64_t n) {
  const float s = *scale_inv;
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float f[W];
    load_f32s<W>(q + i, f);
#pragma unroll
    for (int j = 0; j < W; ++j) f[j] = __fmul_rn(f[j], s);
    store_f32s<W>(out + i, f);
  });
}

// ---- the fused cast-and-transpose ----------------------------------------------------------------------------
// x (R, C) in kTile x kTile tiles, one tile per block at a time (a grid-stride loop over the tiles). A block reads
// its tile row by row, V elements a thread per access (consecutive threads on consecutive vectors of a row:
// coalesced), casts them (quantize_kernel's arithmetic), writes them to out row-major and keeps the bytes in shared
// memory; then it writes the tile's transpose to out_t, again V bytes a thread along out_t's rows (coalesced),
// gathered from a column of the shared tile. V = 8 where R and C are multiples of 8 and the pointers are 16-byte
// aligned, else 1. With kAmax, block_max as amax_partials_kernel (the max over every element the block read).
constexpr int kTile = 64;
constexpr int kTileThreads = 256;
constexpr int kTilePad = 8;  // bytes after each shared row: rows stay 8-byte aligned for the vector stores

template <class T, class Q, int V, bool kAmax>
__global__ void __launch_bounds__(kTileThreads)
    quantize_transpose_kernel(const T* x, const float* scale, Q* out, Q* out_t, int64_t R, int64_t C, int64_t tiles_c,
                              int64_t tiles, unsigned* block_max) {
  __shared__ alignas(16) uint8_t tile[kTile][kTile + kTilePad];
  constexpr int kVecs = kTile / V;                      // accesses per tile row
  constexpr int kSteps = kTile * kVecs / kTileThreads;  // accesses per thread per tile and direction
  static_assert(kSteps * kTileThreads == kTile * kVecs, "the threads cover the tile");
  const float s = *scale;
  unsigned m = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int idx = k * kTileThreads + static_cast<int>(threadIdx.x);
      const int lr = idx / kVecs, lc = idx % kVecs * V;
      const int64_t r = r0 + lr, c = c0 + lc;
      if (r >= R || c >= C) continue;  // V divides C: a vector lies wholly inside or outside
      float f[V];
      load_f32s<V>(x + r * C + c, f);
      Pack<Q, V> q;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if constexpr (kAmax) m = max(m, abs_bits(f[j]));
        q.v[j] = from_f32<Q>(__fmul_rn(f[j], s));
      }
      if (out) store_pack<Q, V>(out + r * C + c, q);
      *reinterpret_cast<Pack<Q, V>*>(&tile[lr][lc]) = q;
    }
    __syncthreads();
    if (out_t) {
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        const int idx = k * kTileThreads + static_cast<int>(threadIdx.x);
        const int lc = idx / kVecs, lr = idx % kVecs * V;  // out_t's row lc of the tile, its bytes [lr, lr + V)
        const int64_t r = r0 + lr, c = c0 + lc;
        if (r >= R || c >= C) continue;  // V divides R
        Pack<Q, V> q;
#pragma unroll
        for (int j = 0; j < V; ++j) q.v[j].__x = tile[lr + j][lc];
        store_pack<Q, V>(out_t + c * R + r, q);
      }
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
  if constexpr (kAmax) {
    m = block_max_bits(m);
    if (threadIdx.x == 0) block_max[blockIdx.x] = m;
  }
}

// A workspace for one unsigned per block of a flat launch over n elements (the scalar form's grid, the largest).
Tensor block_max_workspace(int64_t n) {
  return Tensor::empty({static_cast<int64_t>(grid_1d(n, kThreads))}, DType::i32, Device::cuda, MemKind::workspace);
}

void finish_amax(const Tensor& partial, unsigned blocks, Tensor& amax) {
  amax_finish_kernel<<<1, kThreads, 0, stream()>>>(static_cast<const unsigned*>(partial.raw()), blocks,
                                                   amax.data<float>());
  MT_CUDA_LAUNCHED("amax_finish_kernel");
}

template <class T, class Q>
void quantize_as(const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out) {
  const int64_t n = x.numel();
  const T* px = x.data<T>();
  Q* po = out.data<Q>();
  const float* ps = scale.data<float>();
  Tensor partial = amax_out ? block_max_workspace(n) : Tensor();
  unsigned* part = amax_out ? static_cast<unsigned*>(partial.raw()) : nullptr;
  unsigned blocks = 0;
  launch_flat<kVec<T>>(
      n, kThreads,
      [&](auto e, unsigned grid) {
        blocks = grid;
        if (amax_out)
          quantize_kernel<T, Q, decltype(e)::value, true><<<grid, kThreads, 0, stream()>>>(px, ps, po, n, part);
        else
          quantize_kernel<T, Q, decltype(e)::value, false><<<grid, kThreads, 0, stream()>>>(px, ps, po, n, part);
      },
      px, po);
  MT_CUDA_LAUNCHED("quantize_kernel");
  if (amax_out) finish_amax(partial, blocks, *amax_out);
}

template <class T, class Q>
void quantize_transpose_as(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax_out) {
  const int64_t R = x.dim(0), C = x.dim(1);
  const int64_t tiles_c = ceil_div(C, kTile), tiles = ceil_div(R, kTile) * tiles_c;
  const unsigned grid = grid_1d(tiles, 1);  // a block per tile, at most kMaxStrideBlocks (they loop)
  const T* px = x.data<T>();
  Q* po = out.defined() ? out.data<Q>() : nullptr;
  Q* pt = out_t.defined() ? out_t.data<Q>() : nullptr;
  const float* ps = scale.data<float>();
  Tensor partial =
      amax_out ? Tensor::empty({static_cast<int64_t>(grid)}, DType::i32, Device::cuda, MemKind::workspace) : Tensor();
  unsigned* part = amax_out ? static_cast<unsigned*>(partial.raw()) : nullptr;
  auto launch = [&](auto v) {
    constexpr int V = decltype(v)::value;
    if (amax_out)
      quantize_transpose_kernel<T, Q, V, true>
          <<<grid, kTileThreads, 0, stream()>>>(px, ps, po, pt, R, C, tiles_c, tiles, part);
    else
      quantize_transpose_kernel<T, Q, V, false>
          <<<grid, kTileThreads, 0, stream()>>>(px, ps, po, pt, R, C, tiles_c, tiles, part);
  };
  if (R % 8 == 0 && C % 8 == 0 && all_aligned16(px, po, pt))
    launch(std::integral_constant<int, 8>{});
  else
    launch(std::integral_constant<int, 1>{});
  MT_CUDA_LAUNCHED("quantize_transpose_kernel");
  if (amax_out) finish_amax(partial, grid, *amax_out);
}

template <class Q, class T>
void dequantize_as(const Tensor& q, const Tensor& scale_inv, Tensor& out) {
  const int64_t n = q.numel();
  const Q* pq = q.data<Q>();
  T* po = out.data<T>();
  const float* ps = scale_inv.data<float>();
  launch_flat<kVec<T>>(
      n, kThreads,
      [&](auto e, unsigned grid) {
        dequantize_kernel<Q, T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(pq, ps, po, n);
      },
      pq, po);
  MT_CUDA_LAUNCHED("dequantize_kernel");
}

}  // namespace

void fp8_amax(const Tensor& x, Tensor& amax) {
  const int64_t n = x.numel();
  if (n == 0) return;
  Tensor partial = block_max_workspace(n);
  unsigned* part = static_cast<unsigned*>(partial.raw());
  unsigned blocks = 0;
  MT_DISPATCH_FLOAT(x.dtype(), "fp8_amax", T, {
    const T* px = x.data<T>();
    launch_flat<kVec<T>>(
        n, kThreads,
        [&](auto e, unsigned grid) {
          blocks = grid;
          amax_partials_kernel<T, decltype(e)::value><<<grid, kThreads, 0, stream()>>>(px, n, part);
        },
        px);
  });
  MT_CUDA_LAUNCHED("amax_partials_kernel");
  finish_amax(partial, blocks, amax);
}

void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out) {
  if (x.numel() == 0) return;
  MT_DISPATCH_FLOAT(x.dtype(), "fp8_quantize", T,
                    MT_DISPATCH_FP8(out.dtype(), "fp8_quantize", Q, quantize_as<T, Q>(x, scale, out, amax_out)));
}

void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax_out) {
  if (x.numel() == 0) return;
  const DType q = out.defined() ? out.dtype() : out_t.dtype();
  MT_DISPATCH_FLOAT(
      x.dtype(), "fp8_quantize_transpose", T,
      MT_DISPATCH_FP8(q, "fp8_quantize_transpose", Q, quantize_transpose_as<T, Q>(x, scale, out, out_t, amax_out)));
}

void fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& out) {
  if (q.numel() == 0) return;
  MT_DISPATCH_FP8(q.dtype(), "fp8_dequantize", Q,
                  MT_DISPATCH_FLOAT(out.dtype(), "fp8_dequantize", T, dequantize_as<Q, T>(q, scale_inv, out)));
}

namespace {

// One thread per row: roll the history, take its max (or newest entry), update the scale as the CPU does
// (core/cpu/fp8.cpp: the same fp32 operations in the same order, so the same bits).
__global__ void update_scale_kernel(const float* amax, float* history, float* scale, float* scale_inv,
                                    const float* fp8_max, int64_t n, int64_t H, float pow2_margin, bool use_max) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float* row = history + i * H;
  for (int64_t j = H - 1; j > 0; --j) row[j] = row[j - 1];
  row[0] = amax[i];
  float m = row[0];
  if (use_max)
    for (int64_t j = 1; j < H; ++j) m = isnan(row[j]) || row[j] > m ? row[j] : m;
  if (isfinite(m) && m > 0.f) {
    const float sf = __fdiv_rn(__fdiv_rn(fp8_max[i], m), pow2_margin);
    scale[i] = isinf(sf) ? 3.402823466e+38f : sf;
  }
  scale_inv[i] = __fdiv_rn(1.f, scale[i]);
}

// out (C, R) = q (R, C)^T, bytes, through 32 x 32 shared-memory tiles.
__global__ void fp8_transpose_kernel(const uint8_t* q, uint8_t* out, int64_t R, int64_t C) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < R && c < C) tile[k][threadIdx.x] = q[r * C + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < R && c < C) out[c * R + r] = tile[threadIdx.x][k];
  }
}

}  // namespace

void fp8_update_scale(const Tensor& amax, Tensor& history, Tensor& scale, Tensor& scale_inv, const Tensor& fp8_max,
                      Fp8ScaleOptions opt) {
  const int64_t n = amax.numel();
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  update_scale_kernel<<<blocks, kThreads, 0, stream()>>>(
      static_cast<const float*>(amax.raw()), static_cast<float*>(history.raw()), static_cast<float*>(scale.raw()),
      static_cast<float*>(scale_inv.raw()), static_cast<const float*>(fp8_max.raw()), n, history.dim(1),
      ldexpf(1.f, opt.margin), opt.use_max);
  MT_CUDA_LAUNCHED("update_scale_kernel");
}

void fp8_transpose(const Tensor& q, Tensor& out) {
  const int64_t R = q.dim(0), C = q.dim(1);
  if (R == 0 || C == 0) return;
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>((R + 31) / 32)), block(32, 8);
  fp8_transpose_kernel<<<grid, block, 0, stream()>>>(static_cast<const uint8_t*>(q.raw()),
                                                     static_cast<uint8_t*>(out.raw()), R, C);
  MT_CUDA_LAUNCHED("fp8_transpose_kernel");
}

}  // namespace mt::cuda
