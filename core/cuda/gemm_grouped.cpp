// gemm_grouped.cpp: C_g = alpha * op(A_g) op(B_g) + beta * C_g for every group on the GPU, as one
// cublasGemmGroupedBatchedEx call (cuBLAS 12.5+), one cuBLAS group per problem.
//
// Row-major to column-major as in core/cuda/gemm.cpp: each row-major product out = op(a) op(b) is the column-major
//   out^T (N, M) = op(b)^T (N, K) @ op(a)^T (K, M)
// with cuBLAS's A the b buffer (ld b.dim(1), transposed when trans_b), its B the a buffer (ld a.dim(1), transposed
// when trans_a), and C = out (ld N). Compute is CUBLAS_COMPUTE_32F with fp32 alpha and beta (plain fp32 for fp32
// inputs, never TF32), as gemm. The A, B and C pointer arrays are uploaded once per call (one workspace buffer,
// ordered on the compute stream); the shapes, leading dimensions, alpha and beta are host arrays.
//
// cublasGemmGroupedBatchedEx takes A, B and C of one dtype (f32, bf16 or f16) only. The groups it cannot take run
// as a loop of the existing gemm (cuBLASLt): an fp32 output from bf16/f16 inputs, K = 0 (out = beta * out), a
// dimension beyond int. So does a call with a single problem (cuBLASLt's tuned GEMM is the better choice there),
// and every problem of a call that cuBLAS refuses as not supported.
//
// libcublas is loaded on first use, as libcublasLt is (core/cuda/cublaslt_api.h says why): only a CUDA run that
// reaches a grouped GEMM pays its start-up cost.
#include <dlfcn.h>

#include <climits>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_types.h"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/runtime.h"

namespace mt::cuda {

namespace {

#define MT_STRINGIFY_(x) #x
#define MT_STRINGIFY(x) MT_STRINGIFY_(x)
constexpr const char* kCublasLibrary = "libcublas.so." MT_STRINGIFY(CUBLAS_VER_MAJOR);

// The cuBLAS entry points this file calls, resolved from libcublas at the first grouped GEMM.
struct CublasApi {
  decltype(&::cublasCreate_v2) Create;
  decltype(&::cublasSetStream_v2) SetStream;
  decltype(&::cublasGetStatusString) GetStatusString;
  decltype(&::cublasGemmGroupedBatchedEx) GemmGroupedBatchedEx;
};

template <class F>
void resolve(void* lib, F& slot, const char* name) {
  void* sym = ::dlsym(lib, name);
  if (!sym) throw std::runtime_error(fmt::format("{}: no entry point {} ({})", kCublasLibrary, name, ::dlerror()));
  slot = reinterpret_cast<F>(sym);
}

const CublasApi& cublas() {
  static const CublasApi api = [] {
    void* lib = ::dlopen(kCublasLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw std::runtime_error(
          fmt::format("cannot load {} (cuBLAS, for the grouped GEMMs): {}; put its folder on LD_LIBRARY_PATH "
                      "(it ships beside libcublasLt)",
                      kCublasLibrary, ::dlerror()));
    CublasApi a{};
    resolve(lib, a.Create, "cublasCreate_v2");
    resolve(lib, a.SetStream, "cublasSetStream_v2");
    resolve(lib, a.GetStatusString, "cublasGetStatusString");
    resolve(lib, a.GemmGroupedBatchedEx, "cublasGemmGroupedBatchedEx");
    return a;  // the library stays loaded for the life of the process
  }();
  return api;
}

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(
        fmt::format("cuBLAS error {} ({}) in {}", cublas().GetStatusString(status), static_cast<int>(status), call));
}

// The process's cuBLAS handle, created on first use (after the device is selected), never destroyed (see
// gemm.cpp's handle()). The mutex guards its stream setting and the call that follows.
cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    current_device();  // selects device 0 unless the process already chose one
    cublasHandle_t created = nullptr;
    check(cublas().Create(&created), "cublasCreate");
    return created;
  }();
  return h;
}

std::mutex& handle_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

void gemm_grouped(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                  const GemmOptions& opt) {
  const DType in = a.front().dtype(), out = c.front().dtype();
  std::vector<size_t> grouped;  // the problems the grouped call takes; the rest run as gemm
  for (size_t g = 0; g < c.size(); ++g) {
    const int64_t K = opt.trans_a ? a[g].dim(0) : a[g].dim(1);
    bool fits = out == in && K > 0;
    for (int64_t d : {a[g].dim(0), a[g].dim(1), b[g].dim(0), b[g].dim(1), c[g].dim(0), c[g].dim(1)})
      fits = fits && d <= INT_MAX;
    if (fits)
      grouped.push_back(g);
    else
      mt::cuda::gemm(a[g], b[g], c[g], opt);
  }
  if (grouped.size() == 1) mt::cuda::gemm(a[grouped[0]], b[grouped[0]], c[grouped[0]], opt);
  if (grouped.size() <= 1) return;

  const auto G = static_cast<int>(grouped.size());
  std::vector<cublasOperation_t> trans_a(grouped.size()), trans_b(grouped.size());  // cuBLAS's A (b), B (a)
  std::vector<int> m(grouped.size()), n(grouped.size()), k(grouped.size()), lda(grouped.size()), ldb(grouped.size()),
      ldc(grouped.size()), group_size(grouped.size(), 1);
  std::vector<float> alpha(grouped.size(), opt.alpha), beta(grouped.size(), opt.beta);
  std::vector<const void*> ptrs(3 * grouped.size());  // A (our b) pointers, then B (our a), then C
  for (size_t i = 0; i < grouped.size(); ++i) {
    const size_t g = grouped[i];
    trans_a[i] = opt.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    trans_b[i] = opt.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = static_cast<int>(c[g].dim(1));  // N
    n[i] = static_cast<int>(c[g].dim(0));  // M
    k[i] = static_cast<int>(opt.trans_a ? a[g].dim(0) : a[g].dim(1));
    lda[i] = static_cast<int>(b[g].dim(1));
    ldb[i] = static_cast<int>(a[g].dim(1));
    ldc[i] = static_cast<int>(c[g].dim(1));
    ptrs[i] = b[g].raw();
    ptrs[grouped.size() + i] = a[g].raw();
    ptrs[2 * grouped.size() + i] = c[g].raw();
  }
  // The pointer arrays on the device, one upload (staged, no wait); the buffer returns to the caching allocator
  // after the call, ordered on the compute stream behind the GEMM that reads it.
  const size_t bytes = ptrs.size() * sizeof(void*);
  Tensor dev_ptrs = Tensor::empty({static_cast<int64_t>(ptrs.size())}, DType::i64, Device::cuda, MemKind::workspace);
  copy_bytes(dev_ptrs.raw(), Device::cuda, ptrs.data(), Device::cpu, bytes);
  const auto* dev = static_cast<const void* const*>(dev_ptrs.raw());
  const cudaDataType_t type = cuda_data_type(in, "gemm_grouped");
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  {
    std::lock_guard lock(handle_mutex());
    check(cublas().SetStream(handle(), stream()), "cublasSetStream");
    status = cublas().GemmGroupedBatchedEx(handle(), trans_a.data(), trans_b.data(), m.data(), n.data(), k.data(),
                                           alpha.data(), dev, type, lda.data(), dev + grouped.size(), type, ldb.data(),
                                           beta.data(), const_cast<void* const*>(dev + 2 * grouped.size()), type,
                                           ldc.data(), G, group_size.data(), CUBLAS_COMPUTE_32F);
  }
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH) {
    // Refused (nothing enqueued), e.g. by an older libcublas or device: the same problems as gemm calls.
    for (size_t g : grouped) mt::cuda::gemm(a[g], b[g], c[g], opt);
    return;
  }
  check(status, "cublasGemmGroupedBatchedEx");
  MT_CUDA_LAUNCHED("cublasGemmGroupedBatchedEx");
}

}  // namespace mt::cuda
