// gemm.cpp: out (M, N) = alpha * op(a) @ op(b) + beta * out on the GPU with cuBLASLt.
//
// Row-major to column-major: a row-major (R, C) buffer is the column-major (C, R) matrix, its transpose.
// So the row-major product out = op(a) op(b) is computed as the column-major product
//   out^T (N, M) = op(b)^T (N, K) @ op(a)^T (K, M)
// with cuBLASLt's "A" the b buffer and its "B" the a buffer:
//   * b not transposed (stored (K, N) row-major = (N, K) column-major, ld N): A layout N x K, ld N, TRANSA = N.
//     b transposed (stored (N, K) row-major = (K, N) column-major, ld K):     A layout K x N, ld K, TRANSA = T.
//   * a not transposed (stored (M, K) row-major = (K, M) column-major, ld K): B layout K x M, ld K, TRANSB = N.
//     a transposed (stored (K, M) row-major = (M, K) column-major, ld M):     B layout M x K, ld M, TRANSB = T.
//   * C = D = out (M, N) row-major = (N, M) column-major, ld N, in out's dtype.
//
// Every dtype accumulates in fp32 (CUBLAS_COMPUTE_32F; plain fp32 for fp32 inputs, never TF32) with fp32
// alpha and beta. One handle and one 32 MiB workspace serve the process; the descriptors and the algorithm
// the heuristic picks are cached per (shape, transposes, dtypes, epilogue, pointer alignments). Everything
// is enqueued on the compute stream.
//
// Epilogues (GemmOptions::epilogue) in this column-major picture, D = out^T (N, M):
//   * bias:        CUBLASLT_EPILOGUE_BIAS. The bias vector runs along D's rows (length N, out's columns) and
//                  is broadcast over D's columns (out's rows): out[m, n] += bias[n].
//   * gelu_bias:   CUBLASLT_EPILOGUE_GELU_AUX_BIAS: aux = op(a) op(b) + bias (the pre-activation, out's dtype,
//                  leading dimension N, which cuBLASLt wants divisible by 8), out = gelu(aux), cuBLASLt's
//                  GELU being the tanh approximation as ours.
//   * dgelu_bgrad: CUBLASLT_EPILOGUE_DGELU_BGRAD: out = (op(a) op(b)) * gelu'(aux) and the bias gradient,
//                  the sum of each row of D (length N: over out's rows, the tokens).
//   * bgrad_a:     the weight-gradient GEMM dW (M, N) = dout^T x with a = dout stored (K, M), trans_a: the
//                  bias gradient sum_k op(a)[m, k] is a reduction of our a, which is cuBLASLt's B, over the
//                  GEMM's k: CUBLASLT_EPILOGUE_BGRADB (length M, the number of D's columns).
// cuBLASLt writes a bias gradient, it cannot add to one, so the bias gradient goes to an fp32 workspace
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = fp32) and one small add kernel accumulates it into dbias. Whenever a
// combination is not available (the heuristic finds no algorithm, cuBLASLt refuses it at launch, an
// unaligned aux, N not a multiple of 8 for the GELU aux, an empty dimension, GELU in fp32: see gemm_fused)
// the same GEMM runs without the epilogue followed by the separate kernels, in the order of the CPU
// reference (core/cpu/gemm.cpp).
// The fused results round once (the CPU rounds the GEMM, then the bias add or GELU); they match the CPU
// within the dtype tolerance, not bit for bit.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "core/cuda/cublaslt_api.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_types.h"
#include "core/cuda/ops_cuda.h"

namespace mt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw std::runtime_error(fmt::format("cuBLASLt error {} ({}) in {} at {}:{}", cublaslt().GetStatusString(status),
                                       static_cast<int>(status), call, file, line));
}

#define MT_CUBLAS_CHECK(call)                                                                           \
  do {                                                                                                  \
    cublasStatus_t mt_status_ = (call);                                                                 \
    if (mt_status_ != CUBLAS_STATUS_SUCCESS) throw_cublas_error(mt_status_, #call, __FILE__, __LINE__); \
  } while (0)

// The process's cuBLASLt handle, created on first use (after the device is selected), never destroyed:
// destroying it at exit could run after the CUDA context is gone.
cublasLtHandle_t handle() {
  static cublasLtHandle_t h = [] {
    current_device();  // selects device 0 unless the process already chose one
    cublasLtHandle_t created = nullptr;
    MT_CUBLAS_CHECK(cublaslt().Create(&created));
    return created;
  }();
  return h;
}

// The workspace, allocated once from the caching allocator and kept for the life of the process (leaked on
// purpose: a static Tensor would be freed into the allocator during static destruction, in an unknown order).
void* workspace() {
  static Tensor* ws = new Tensor(Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / sizeof(float))}, DType::f32,
                                               Device::cuda, MemKind::workspace));
  return ws->raw();
}

// The largest power of two (at most 256) dividing the address: the heuristic assumes 256-byte aligned
// buffers unless told otherwise, and row slices of a tensor are often less aligned.
uint32_t alignment_of(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  if (x == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(256, x & (~x + 1)));
}

struct Key {
  int64_t m, n, k;
  bool trans_a, trans_b;
  DType in, out;
  uint32_t align_a, align_b, align_c;
  Epilogue epilogue = Epilogue::none;
  DType bias = DType::f32;                 // the bias (or bias-gradient) vector's dtype; epilogues only
  uint32_t align_bias = 0, align_aux = 0;  // the heuristic reads these pointers' alignments
  DType in_b = DType::f32;                 // b's dtype: a's, except in an fp8 GEMM (e5m2 dY times e4m3 W)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0xcbf29ce484222325ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    mix(static_cast<uint64_t>(k.m));
    mix(static_cast<uint64_t>(k.n));
    mix(static_cast<uint64_t>(k.k));
    mix((static_cast<uint64_t>(k.trans_a) << 1) | static_cast<uint64_t>(k.trans_b));
    mix((static_cast<uint64_t>(k.in) << 8) | static_cast<uint64_t>(k.out));
    mix((static_cast<uint64_t>(k.align_a) << 32) | (static_cast<uint64_t>(k.align_b) << 16) | k.align_c);
    mix((static_cast<uint64_t>(k.epilogue) << 40) | (static_cast<uint64_t>(k.bias) << 32) |
        (static_cast<uint64_t>(k.align_bias) << 16) | k.align_aux);
    mix(static_cast<uint64_t>(k.in_b));
    return h;
  }
};

// The descriptors and algorithm of one GEMM configuration (never destroyed: the cache lives as long as the
// process).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our b), B (our a), C = D (out)
  cublasLtMatmulAlgo_t algo{};
  bool usable = true;  // false: an epilogue cuBLASLt cannot run here; the caller composes separate kernels
};

// The vectors and matrices an epilogue reads or writes, as raw device pointers.
struct EpiloguePointers {
  const void* bias = nullptr;  // bias (N) to add, or the bias-gradient workspace to write
  void* aux = nullptr;         // the GELU pre-activation (M, N) row-major
};

// Destroys the descriptors of a plan that never made it into the cache (the heuristic found nothing).
struct PlanGuard {
  Plan* plan;
  ~PlanGuard() {
    if (!plan) return;
    if (plan->c) cublaslt().MatrixLayoutDestroy(plan->c);
    if (plan->b) cublaslt().MatrixLayoutDestroy(plan->b);
    if (plan->a) cublaslt().MatrixLayoutDestroy(plan->a);
    if (plan->op) cublaslt().MatmulDescDestroy(plan->op);
  }
};

struct PreferenceGuard {
  cublasLtMatmulPreference_t pref = nullptr;
  ~PreferenceGuard() {
    if (pref) cublaslt().MatmulPreferenceDestroy(pref);
  }
};

std::string describe_key(const Key& k) {
  return fmt::format(
      "M={} N={} K={} trans_a={} trans_b={} a/b dtype {} out dtype {} (alignments a {} B, b {} B, "
      "out {} B)",
      k.m, k.n, k.k, k.trans_a, k.trans_b, dtype_name(k.in), dtype_name(k.out), k.align_a, k.align_b, k.align_c);
}

bool has_bias_grad(Epilogue e) { return e == Epilogue::dgelu_bgrad || e == Epilogue::bgrad_a; }
bool has_aux(Epilogue e) { return e == Epilogue::gelu_bias || e == Epilogue::dgelu_bgrad; }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_bias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu_bgrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case Epilogue::bgrad_a:
      return CUBLASLT_EPILOGUE_BGRADB;  // our a is cuBLASLt's B (see the top of the file)
  }
  throw std::invalid_argument("gemm: unknown epilogue");
}

// Points the descriptor's epilogue at this call's vectors (the pointers differ per call; the cached plan
// was made for pointers of the same alignments).
void set_epilogue_pointers(cublasLtMatmulDesc_t op, Epilogue e, const EpiloguePointers& p) {
  MT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  if (has_aux(e))
    MT_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)));
}

Plan make_plan(const Key& key, const EpiloguePointers& ptrs) {
  Plan plan;
  PlanGuard guard{&plan};
  const auto M = static_cast<uint64_t>(key.m), N = static_cast<uint64_t>(key.n), K = static_cast<uint64_t>(key.k);
  const cudaDataType_t in = cuda_data_type(key.in, "gemm"), out = cuda_data_type(key.out, "gemm");
  const cudaDataType_t in_b = cuda_data_type(key.in_b, "gemm");

  MT_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our b, its B our a (see the top of the file).
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));

  // Layouts describe the buffers as stored (column-major, before the transpose is applied).
  if (key.trans_b)
    MT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&plan.a, in_b, K, N, static_cast<int64_t>(K)));
  else
    MT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&plan.a, in_b, N, K, static_cast<int64_t>(N)));
  if (key.trans_a)
    MT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&plan.b, in, M, K, static_cast<int64_t>(M)));
  else
    MT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&plan.b, in, K, M, static_cast<int64_t>(K)));
  MT_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&plan.c, out, N, M, static_cast<int64_t>(N)));

  if (key.epilogue != Epilogue::none) {
    const auto epi = static_cast<uint32_t>(lt_epilogue(key.epilogue));
    MT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const auto bias_type = static_cast<int32_t>(cuda_data_type(key.bias, "gemm"));
    MT_CUBLAS_CHECK(
        cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    if (has_aux(key.epilogue)) {
      const auto aux_ld = static_cast<int64_t>(N);  // aux is (M, N) row-major: column-major (N, M), ld N
      MT_CUBLAS_CHECK(
          cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    set_epilogue_pointers(plan.op, key.epilogue, ptrs);  // the heuristic reads their alignments
  }

  PreferenceGuard pref;
  MT_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref.pref));
  const uint64_t ws_bytes = kWorkspaceBytes;
  MT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &ws_bytes, sizeof(ws_bytes)));
  // cuBLASLt's A is our b and its B our a.
  MT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                          &key.align_b, sizeof(key.align_b)));
  MT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                          &key.align_a, sizeof(key.align_a)));
  MT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                          &key.align_c, sizeof(key.align_c)));
  MT_CUBLAS_CHECK(cublaslt().MatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                          &key.align_c, sizeof(key.align_c)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublaslt().MatmulAlgoGetHeuristic(handle(), plan.op, plan.a, plan.b, plan.c, plan.c,
                                                                  pref.pref, 1, &result, &found);
  if (key.epilogue != Epilogue::none &&
      (status != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS)) {
    Plan unusable;  // no fused algorithm: cached as such (no descriptors), the caller composes separate kernels
    unusable.usable = false;
    return unusable;  // the guard destroys this attempt's descriptors
  }
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0))
    throw std::runtime_error(fmt::format("gemm: cuBLASLt has no algorithm for {} (fp32 compute)", describe_key(key)));
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("cuBLASLt error {} ({}) in cublasLtMatmulAlgoGetHeuristic for gemm {}",
                                         cublaslt().GetStatusString(status), static_cast<int>(status),
                                         describe_key(key)));
  if (result.state != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("gemm: cuBLASLt's heuristic returned an unusable algorithm ({}) for {}",
                                         cublaslt().GetStatusString(result.state), describe_key(key)));
  plan.algo = result.algo;
  guard.plan = nullptr;  // the cache owns the descriptors from here on
  return plan;
}

// The cached plan for key, made on first use. Entries are never erased and unordered_map nodes never move,
// so the returned reference stays valid after the lock is released.
std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}

Plan& plan_for(const Key& key, const EpiloguePointers& ptrs = {}) {
  static auto* cache = new std::unordered_map<Key, Plan, KeyHash>();
  std::lock_guard lock(cache_mutex());
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  return cache->emplace(key, make_plan(key, ptrs)).first->second;
}

// An empty GEMM's result, done (true) when M, N or K is zero: nothing to write, or with K = 0 op(a) op(b) is the zero
// matrix, so out = beta * out (beta == 0 ignores out, NaNs included).
bool empty_product(Tensor& out, float beta, int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0) return true;
  if (K != 0) return false;
  if (beta == 0.f)
    out.zero_();
  else if (beta != 1.f)
    mt::cuda::scale_(out, beta);
  return true;
}

// The GEMM without its epilogue (opt.epilogue and the vectors are ignored).
void gemm_plain(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt);

// The epilogue as separate kernels after the plain GEMM `plain` (which writes its argument), in the CPU
// reference's order (core/cpu/gemm.cpp). `a` is the GEMM's a (bgrad_a sums it).
template <class Plain>
void compose_epilogue(const Tensor& a, Tensor& out, const GemmOptions& opt, const Plain& plain) {
  switch (opt.epilogue) {
    case Epilogue::none:
      plain(out);
      return;
    case Epilogue::bias:
      plain(out);
      mt::cuda::add_bias(out, *opt.bias);
      return;
    case Epilogue::gelu_bias:
      plain(*opt.aux);
      mt::cuda::add_bias(*opt.aux, *opt.bias);
      mt::cuda::gelu_forward(*opt.aux, out);
      return;
    case Epilogue::dgelu_bgrad:
      plain(out);
      mt::cuda::gelu_backward(*opt.aux, out, out);
      mt::cuda::bias_backward(out, *opt.dbias);
      return;
    case Epilogue::bgrad_a:
      plain(out);
      mt::cuda::bias_backward(a, *opt.dbias);  // a (K, M): its column sums are op(a)'s row sums
      return;
  }
}

void gemm_composed(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  compose_epilogue(a, out, opt, [&](Tensor& dst) { gemm_plain(a, b, dst, opt); });
}

// The configuration of the plain GEMM out (M, N) = op(a) (M, K) op(b) (K, N); a fused epilogue's call adds its
// own fields to it.
Key plain_key(const Tensor& a, const Tensor& b, const Tensor& out, const GemmOptions& opt, int64_t M, int64_t N,
              int64_t K) {
  return Key{M,
             N,
             K,
             opt.trans_a,
             opt.trans_b,
             a.dtype(),
             out.dtype(),
             alignment_of(a.raw()),
             alignment_of(b.raw()),
             alignment_of(out.raw()),
             Epilogue::none,
             DType::f32,
             0,
             0,
             b.dtype()};
}

// Runs the GEMM with its epilogue fused by cuBLASLt; false (nothing enqueued) when that is not available.
bool gemm_fused(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  const int64_t M = out.dim(0), N = out.dim(1);
  const int64_t K = opt.trans_a ? a.dim(0) : a.dim(1);
  if (M == 0 || N == 0 || K == 0) return false;
  const Epilogue e = opt.epilogue;
  if (has_aux(e) && (N % 8 != 0 || alignment_of(opt.aux->raw()) < 16)) return false;
  // How cuBLASLt evaluates GELU's tanh is not documented; a fast approximation would show above the fp32
  // tolerance (1e-5), not under a half dtype's rounding. So fp32, the reference precision, keeps the separate
  // kernels (the CPU's exact formula) and only bf16/f16 fuse the GELU epilogues.
  if (has_aux(e) && out.dtype() == DType::f32) return false;

  Tensor grad_ws;  // (len) f32: cuBLASLt writes the bias gradient here, then it is added into dbias
  EpiloguePointers ptrs;
  DType bias_dtype = DType::f32;
  if (has_bias_grad(e)) {
    grad_ws = Tensor::empty({opt.dbias->numel()}, DType::f32, Device::cuda, MemKind::workspace);
    ptrs.bias = grad_ws.raw();
  } else {
    ptrs.bias = opt.bias->raw();
    bias_dtype = opt.bias->dtype();
  }
  if (has_aux(e)) ptrs.aux = opt.aux->raw();

  Key key = plain_key(a, b, out, opt, M, N, K);
  key.epilogue = e;
  key.bias = bias_dtype;
  key.align_bias = alignment_of(ptrs.bias);
  key.align_aux = has_aux(e) ? alignment_of(ptrs.aux) : 0u;
  Plan& plan = plan_for(key, ptrs);
  {
    // The cached descriptor is shared: set this call's pointers and enqueue under the cache's lock.
    std::lock_guard lock(cache_mutex());
    if (!plan.usable) return false;
    set_epilogue_pointers(plan.op, e, ptrs);
    const float alpha = opt.alpha, beta = opt.beta;
    const cublasStatus_t status =
        cublaslt().Matmul(handle(), plan.op, &alpha, b.raw(), plan.a, a.raw(), plan.b, &beta, out.raw(), plan.c,
                          out.raw(), plan.c, &plan.algo, workspace(), kWorkspaceBytes, stream());
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
      plan.usable = false;  // refused at launch (nothing enqueued): compose from now on
      return false;
    }
    if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(status, "cublasLtMatmul (epilogue)", __FILE__, __LINE__);
  }
  MT_CUDA_LAUNCHED("cublasLtMatmul");
  if (has_bias_grad(e)) mt::cuda::add(grad_ws, *opt.dbias, *opt.dbias);  // parameter gradients accumulate
  return true;
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  if (opt.epilogue == Epilogue::none) return gemm_plain(a, b, out, opt);
  if (!gemm_fused(a, b, out, opt)) gemm_composed(a, b, out, opt);
}

namespace {

void gemm_plain(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  const int64_t M = out.dim(0), N = out.dim(1);
  const int64_t K = opt.trans_a ? a.dim(0) : a.dim(1);
  if (empty_product(out, opt.beta, M, N, K)) return;

  const Key key = plain_key(a, b, out, opt, M, N, K);
  const Plan& plan = plan_for(key);  // throws when the heuristic finds nothing (no epilogue to drop)
  void* ws = workspace();
  const float alpha = opt.alpha, beta = opt.beta;
  // cuBLASLt's A is b, its B is a; C and D are both out (in place), so beta == 0 never reads out.
  MT_CUBLAS_CHECK(cublaslt().Matmul(handle(), plan.op, &alpha, b.raw(), plan.a, a.raw(), plan.b, &beta, out.raw(),
                                    plan.c, out.raw(), plan.c, &plan.algo, ws, kWorkspaceBytes, stream()));
  MT_CUDA_LAUNCHED("cublasLtMatmul");
}

}  // namespace

// ---- fp8 -----------------------------------------------------------------------------------------------------
// cuBLASLt's fp8 matmul: D = alpha * scaleA * scaleB * op(A) op(B) + beta * C with the scales read from the device
// (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER: our scale_invs, no host read), fp32 accumulation (fast
// accumulation off, as the CPU's fp32 sums). Hopper's fp8 kernels take only the "TN" form, cuBLASLt's A
// transposed and B not: in our row-major picture trans_b and not trans_a, the forward's y = x W^T. The gradients'
// GEMMs (dx = dY W, dW = dY^T x) get their operands transposed first (fp8_transpose; 1 byte per element). The
// epilogues run as the separate kernels after the GEMM (compose_epilogue), in the CPU's order.
void gemm_fp8(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, Tensor& out,
              const GemmOptions& opt) {
  // The scale pointers 16-byte aligned, as every pointer cuBLASLt reads: the H200 refused the delayed recipe's first
  // fp8 GEMM (status 15, "not supported") when a scale_inv was a slice 4 bytes into an array, where fresh tensors
  // ran. Refused here by name rather than by cuBLASLt's status.
  for (const auto& [name, s] : {std::pair{"scale_inv_a", &scale_inv_a}, std::pair{"scale_inv_b", &scale_inv_b}})
    if (alignment_of(s->raw()) < 16)
      throw std::invalid_argument(
          fmt::format("gemm_fp8: {} lies {}-byte aligned; cuBLASLt's fp8 GEMM needs its scale pointers 16-byte aligned "
                      "(a tensor of its own, not a slice)",
                      name, alignment_of(s->raw())));
  auto transposed = [](const Tensor& q) {
    Tensor t = Tensor::empty({q.dim(1), q.dim(0)}, q.dtype(), Device::cuda, MemKind::workspace);
    fp8_transpose(q, t);
    return t;
  };
  const Tensor a_n = opt.trans_a ? transposed(a) : a;  // (M, K)
  const Tensor b_t = opt.trans_b ? b : transposed(b);  // (N, K)
  GemmOptions tn = opt;
  tn.trans_a = false;
  tn.trans_b = true;
  const int64_t M = out.dim(0), N = out.dim(1), K = a_n.dim(1);
  compose_epilogue(a, out, opt, [&](Tensor& dst) {
    if (empty_product(dst, tn.beta, M, N, K)) return;
    const Key key = plain_key(a_n, b_t, dst, tn, M, N, K);
    Plan& plan = plan_for(key);
    std::lock_guard lock(cache_mutex());  // the cached descriptor is shared: this call's scale pointers
    // cuBLASLt's A is our b, its B our a.
    const void* sa = scale_inv_b.raw();
    const void* sb = scale_inv_a.raw();
    MT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    MT_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    const float alpha = tn.alpha, beta = tn.beta;
    try {
      MT_CUBLAS_CHECK(cublaslt().Matmul(handle(), plan.op, &alpha, b_t.raw(), plan.a, a_n.raw(), plan.b, &beta,
                                        dst.raw(), plan.c, dst.raw(), plan.c, &plan.algo, workspace(), kWorkspaceBytes,
                                        stream()));
    } catch (const std::runtime_error& e) {  // name the operands: which of a layer's GEMMs cuBLASLt refused
      throw std::runtime_error(
          fmt::format("{}: gemm_fp8 of {} ({}x{}, trans_a {}) and {} ({}x{}, trans_b {}) into {} "
                      "({}x{}), beta {}",
                      e.what(), dtype_name(a.dtype()), a.dim(0), a.dim(1), opt.trans_a, dtype_name(b.dtype()), b.dim(0),
                      b.dim(1), opt.trans_b, dtype_name(dst.dtype()), M, N, beta));
    }
    MT_CUDA_LAUNCHED("cublasLtMatmul (fp8)");
  });
}

}  // namespace mt::cuda
