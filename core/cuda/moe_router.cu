// moe_router.cu: the mixture-of-experts router on the device, the CPU reference's (core/cpu/moe_router.cpp)
// arithmetic element for element: explicitly rounded intrinsics (no contraction into FMAs), the softmax's sum of
// exps in double, the sums over the k selected experts in the k order.
//
// One block per row (a grid-stride loop over rows), E <= 1024 experts a row held in shared memory. The top-k
// choice ranks each expert by counting the experts that come before it (key descending, then index ascending: a
// strict total order, so every rank is unique and the result equals the CPU's sort), stopping once it reaches k;
// an expert of rank j < k is the j-th choice. Sums over the k choices run on one thread, in order. Deterministic:
// no atomics, every reduction's order fixed by the launch shape.
//
// Below the router, the load-balancing losses' statistics and gradient (moe_router_loss_stats,
// moe_router_loss_backward; their layout is described there).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda/kernels.cuh"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr int kMaxThreads = 256;

// The selection key of an expert: its score plus its bias (if any), NaN ranked below every number.
__device__ __forceinline__ float router_key(float score, const float* __restrict__ bias, int e) {
  const float k = bias ? __fadd_rn(score, bias[e]) : score;
  return isnan(k) ? -INFINITY : k;
}

// Expert a (key ka) is chosen before expert b (key kb).
__device__ __forceinline__ bool chosen_before(float ka, int a, float kb, int b) {
  return ka > kb || (ka == kb && a < b);
}

// Per row: scores (E), the top-k experts and their weights. Dynamic shared memory: 2E + 2K words.
__global__ void __launch_bounds__(kMaxThreads)
    moe_router_forward_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                              float* __restrict__ scores, int32_t* __restrict__ experts, float* __restrict__ probs,
                              int64_t N, int E, int K, bool softmax, bool norm) {
  extern __shared__ float smem[];
  float* s_score = smem;                         // (E)
  float* s_key = s_score + E;                    // (E)
  float* s_p = s_key + E;                        // (K) the chosen experts' scores, in rank order
  int* s_idx = reinterpret_cast<int*>(s_p + K);  // (K) the chosen experts, in rank order
  __shared__ float s_sum;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = logits + n * E;
    float* sr = scores + n * E;
    if (softmax) {
      float m = -INFINITY;
      for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, xr[e]);
      m = block_max(m);  // every thread reaches it
      double sum = 0.0;
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float v = expf(__fsub_rn(xr[e], m));
        s_score[e] = v;
        sum += static_cast<double>(v);
      }
      const float total = static_cast<float>(block_sum(sum));
      for (int e = threadIdx.x; e < E; e += blockDim.x) s_score[e] = __fdiv_rn(s_score[e], total);
    } else {
      for (int e = threadIdx.x; e < E; e += blockDim.x) s_score[e] = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-xr[e])));
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      sr[e] = s_score[e];
      s_key[e] = router_key(s_score[e], bias, e);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float k = s_key[e];
      int rank = 0;
      for (int f = 0; f < E && rank < K; ++f) rank += chosen_before(s_key[f], f, k, e) ? 1 : 0;
      if (rank < K) {
        s_idx[rank] = e;
        s_p[rank] = s_score[e];
      }
    }
    __syncthreads();
    if (norm && threadIdx.x == 0) {
      float S = 0.f;
      for (int j = 0; j < K; ++j) S = __fadd_rn(S, s_p[j]);
      s_sum = S;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
      experts[n * K + j] = s_idx[j];
      probs[n * K + j] = norm ? __fdiv_rn(s_p[j], s_sum) : s_p[j];
    }
    __syncthreads();  // the next row reuses the shared memory
  }
}

// Per row: dlogits (E) from dprobs (K). Dynamic shared memory: E words (dscore).
__global__ void __launch_bounds__(kMaxThreads)
    moe_router_backward_kernel(const float* __restrict__ scores, const int32_t* __restrict__ experts,
                               const float* __restrict__ dprobs, float* __restrict__ dlogits, int64_t N, int E, int K,
                               bool softmax, bool norm) {
  extern __shared__ float s_dscore[];  // (E)
  __shared__ float s_dot;              // sum_e dscore_e s_e
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* sr = scores + n * E;
    float* dr = dlogits + n * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) s_dscore[e] = 0.f;
    __syncthreads();
    if (threadIdx.x == 0) {
      const int32_t* er = experts + n * K;
      const float* dw = dprobs + n * K;
      // An expert id outside [0, E) (never one the forward wrote) counts as a score of 0 and is not scattered.
      auto p = [&](int j) { return er[j] >= 0 && er[j] < E ? sr[er[j]] : 0.f; };
      float S = 0.f, dot = 0.f;  // sum_j p_j, sum_i dw_i w_i
      if (norm) {
        for (int j = 0; j < K; ++j) S = __fadd_rn(S, p(j));
        for (int j = 0; j < K; ++j) dot = __fadd_rn(dot, __fmul_rn(dw[j], __fdiv_rn(p(j), S)));
      }
      float dot2 = 0.f;
      for (int j = 0; j < K; ++j) {
        const float dp = norm ? __fdiv_rn(__fsub_rn(dw[j], dot), S) : dw[j];
        if (er[j] >= 0 && er[j] < E) s_dscore[er[j]] = dp;
        dot2 = __fadd_rn(dot2, __fmul_rn(dp, p(j)));
      }
      s_dot = dot2;
    }
    __syncthreads();
    const float dot = s_dot;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float s = sr[e], ds = s_dscore[e];
      dr[e] = softmax ? __fmul_rn(s, __fsub_rn(ds, dot)) : __fmul_rn(__fmul_rn(ds, s), __fsub_rn(1.f, s));
    }
    __syncthreads();  // the next row reuses the shared memory
  }
}

// ---- load-balancing losses ----
// moe_router_loss_stats runs in two kernels: one block per row writes the row's lse^2 and (sigmoid) the denominator
// sum_e s_e + 1e-20 to a workspace; then a block per 32 columns sums a_{n,e} over rows (lane = column, 32 row
// lanes striding over rows, a double partial each, the 32 partials of a column summed in order) and one more block
// sums the rows' lse^2 the same way. No atomics; every order fixed by the launch shape.

constexpr int kSumCols = 32, kSumRows = 32;       // the column sums' block: 32 columns x 32 row lanes
constexpr int kSumThreads = kSumCols * kSumRows;  // 1024

// Per row: lse_sq[n] = logsumexp(logits_n)^2, and for sigmoid denom[n] = sum_e s_{n,e} + 1e-20 (fp32, e order, on
// one thread). Dynamic shared memory: E words for sigmoid (the row's scores), else none.
__global__ void __launch_bounds__(kMaxThreads)
    moe_router_loss_rows_kernel(const float* __restrict__ logits, const float* __restrict__ scores,
                                float* __restrict__ lse_sq, float* __restrict__ denom, int64_t N, int E) {
  extern __shared__ float s_row[];  // (E) for sigmoid
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = logits + n * E;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, xr[e]);
    m = block_max(m);
    double sum = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) sum += static_cast<double>(expf(__fsub_rn(xr[e], m)));
    const float total = static_cast<float>(block_sum(sum));
    if (denom) {
      for (int e = threadIdx.x; e < E; e += blockDim.x) s_row[e] = scores[n * E + e];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const float lse = __fadd_rn(m, logf(total));
      lse_sq[n] = __fmul_rn(lse, lse);
      if (denom) {
        float S = 0.f;
        for (int e = 0; e < E; ++e) S = __fadd_rn(S, s_row[e]);
        denom[n] = __fadd_rn(S, 1e-20f);
      }
    }
    __syncthreads();  // the next row reuses the shared memory
  }
}

// Blocks [0, col_blocks): score_sums[e] = sum over rows of a_{n,e} for 32 columns; block col_blocks: lse_sq_sum =
// sum over rows of lse_sq. denom null: softmax (a = s).
__global__ void __launch_bounds__(kSumThreads)
    moe_router_loss_sums_kernel(const float* __restrict__ scores, const float* __restrict__ denom,
                                const float* __restrict__ lse_sq, float* __restrict__ score_sums,
                                float* __restrict__ lse_sq_sum, int64_t N, int E, int col_blocks) {
  __shared__ double s_part[kSumRows][kSumCols];
  const int c = threadIdx.x % kSumCols, r = threadIdx.x / kSumCols;
  double acc = 0.0;
  if (static_cast<int>(blockIdx.x) < col_blocks) {
    const int e = static_cast<int>(blockIdx.x) * kSumCols + c;
    if (e < E) {
#pragma unroll 4
      for (int64_t n = r; n < N; n += kSumRows) {
        const float s = scores[n * E + e];
        acc += static_cast<double>(denom ? __fdiv_rn(s, denom[n]) : s);
      }
    }
    s_part[r][c] = acc;
    __syncthreads();
    if (r == 0 && e < E) {
      double t = 0.0;
      for (int i = 0; i < kSumRows; ++i) t += s_part[i][c];
      score_sums[e] = static_cast<float>(t);
    }
  } else {
#pragma unroll 4
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) acc += static_cast<double>(lse_sq[n]);
    s_part[r][c] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int i = 0; i < kSumRows; ++i)
        for (int j = 0; j < kSumCols; ++j) t += s_part[i][j];
      lse_sq_sum[0] = static_cast<float>(t);
    }
  }
}

// Per row: dlogits (E) += the score term (g non-null) + the z term (z != 0); see core/tensor/ops.h. The sums over
// the row in double (block_sum), rounded once.
__global__ void __launch_bounds__(kMaxThreads)
    moe_router_loss_backward_kernel(const float* __restrict__ logits, const float* __restrict__ scores,
                                    const float* __restrict__ g, float z, float* __restrict__ dlogits, int64_t N, int E,
                                    bool softmax) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float* xr = logits + n * E;
    const float* sr = scores + n * E;
    float* dr = dlogits + n * E;
    float S = 1.f, dot = 0.f;  // sigmoid: sum_j s_j + 1e-20; sum_j g_j a_j
    if (g) {
      if (!softmax) {
        double sum = 0.0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) sum += static_cast<double>(sr[e]);
        S = __fadd_rn(static_cast<float>(block_sum(sum)), 1e-20f);
      }
      double d = 0.0;
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float a = softmax ? sr[e] : __fdiv_rn(sr[e], S);
        d = __dadd_rn(d, __dmul_rn(static_cast<double>(g[e]), static_cast<double>(a)));  // exact products
      }
      dot = static_cast<float>(block_sum(d));
    }
    float m = 0.f, total = 1.f, c = 0.f;  // the z term: c * exp(x_e - m) / total, c = 2 z lse
    if (z != 0.f) {
      m = -INFINITY;
      for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, xr[e]);
      m = block_max(m);
      double sum = 0.0;
      for (int e = threadIdx.x; e < E; e += blockDim.x) sum += static_cast<double>(expf(__fsub_rn(xr[e], m)));
      total = static_cast<float>(block_sum(sum));
      c = __fmul_rn(__fmul_rn(2.f, z), __fadd_rn(m, logf(total)));
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      float ts = 0.f, tz = 0.f;
      if (g) {
        const float se = sr[e];
        ts = softmax ? __fmul_rn(se, __fsub_rn(g[e], dot))
                     : __fmul_rn(__fmul_rn(__fdiv_rn(__fsub_rn(g[e], dot), S), se), __fsub_rn(1.f, se));
      }
      if (z != 0.f) tz = __fmul_rn(c, __fdiv_rn(expf(__fsub_rn(xr[e], m)), total));
      dr[e] = __fadd_rn(dr[e], __fadd_rn(ts, tz));
    }
  }
}

}  // namespace

void moe_router_forward(const Tensor& logits, const Tensor& bias, Tensor& scores, Tensor& experts, Tensor& probs,
                        const MoeRouterOptions& opt) {
  const int64_t N = logits.dim(0);
  const int E = static_cast<int>(logits.dim(1)), K = opt.top_k;
  if (N == 0) return;
  const int threads = threads_for_cols(E, kMaxThreads);
  const size_t smem = (2 * static_cast<size_t>(E) + 2 * static_cast<size_t>(K)) * sizeof(float);
  moe_router_forward_kernel<<<row_grid(N, kMaxStrideBlocks), threads, smem, stream()>>>(
      logits.data<float>(), bias.defined() ? bias.data<float>() : nullptr, scores.data<float>(),
      experts.data<int32_t>(), probs.data<float>(), N, E, K, opt.score == RouterScore::softmax, opt.norm_topk_prob);
  MT_CUDA_LAUNCHED("moe_router_forward_kernel");
}

void moe_router_backward(const Tensor& scores, const Tensor& experts, const Tensor& dprobs, Tensor& dlogits,
                         const MoeRouterOptions& opt) {
  const int64_t N = scores.dim(0);
  const int E = static_cast<int>(scores.dim(1)), K = opt.top_k;
  if (N == 0) return;
  const int threads = threads_for_cols(E, kMaxThreads);
  const size_t smem = static_cast<size_t>(E) * sizeof(float);
  moe_router_backward_kernel<<<row_grid(N, kMaxStrideBlocks), threads, smem, stream()>>>(
      scores.data<float>(), experts.data<int32_t>(), dprobs.data<float>(), dlogits.data<float>(), N, E, K,
      opt.score == RouterScore::softmax, opt.norm_topk_prob);
  MT_CUDA_LAUNCHED("moe_router_backward_kernel");
}

void moe_router_loss_stats(const Tensor& logits, const Tensor& scores, RouterScore score, Tensor& score_sums,
                           Tensor& lse_sq_sum) {
  const int64_t N = logits.dim(0);
  const int E = static_cast<int>(logits.dim(1));
  const bool sigmoid = score == RouterScore::sigmoid;
  const int64_t rows = std::max<int64_t>(N, 1);
  Tensor lse_sq = Tensor::empty({rows}, DType::f32, Device::cuda, MemKind::workspace);  // (N)
  Tensor denom;                                                                         // (N), sigmoid only
  if (sigmoid) denom = Tensor::empty({rows}, DType::f32, Device::cuda, MemKind::workspace);
  float* denom_p = sigmoid ? denom.data<float>() : nullptr;
  if (N > 0) {
    const size_t smem = sigmoid ? static_cast<size_t>(E) * sizeof(float) : 0;
    moe_router_loss_rows_kernel<<<row_grid(N, kMaxStrideBlocks), threads_for_cols(E, kMaxThreads), smem, stream()>>>(
        logits.data<float>(), scores.data<float>(), lse_sq.data<float>(), denom_p, N, E);
    MT_CUDA_LAUNCHED("moe_router_loss_rows_kernel");
  }
  const int col_blocks = (E + kSumCols - 1) / kSumCols;
  moe_router_loss_sums_kernel<<<col_blocks + 1, kSumThreads, 0, stream()>>>(
      scores.data<float>(), denom_p, lse_sq.data<float>(), score_sums.data<float>(), lse_sq_sum.data<float>(), N, E,
      col_blocks);
  MT_CUDA_LAUNCHED("moe_router_loss_sums_kernel");
}

void moe_router_loss_backward(const Tensor& logits, const Tensor& scores, const Tensor& score_grad, float z_grad,
                              RouterScore score, Tensor& dlogits) {
  const int64_t N = logits.dim(0);
  const int E = static_cast<int>(logits.dim(1));
  if (N == 0 || (!score_grad.defined() && z_grad == 0.f)) return;
  moe_router_loss_backward_kernel<<<row_grid(N, kMaxStrideBlocks), threads_for_cols(E, kMaxThreads), 0, stream()>>>(
      logits.data<float>(), scores.data<float>(), score_grad.defined() ? score_grad.data<float>() : nullptr, z_grad,
      dlogits.data<float>(), N, E, score == RouterScore::softmax);
  MT_CUDA_LAUNCHED("moe_router_loss_backward_kernel");
}

}  // namespace mt::cuda
