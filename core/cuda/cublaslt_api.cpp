// cublaslt_api.cpp: dlopen of libcublasLt and dlsym of the entry points gemm.cpp calls (cublaslt_api.h says why).
#include "core/cuda/cublaslt_api.h"
#include "core/cuda/runtime.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace mt::cuda {

namespace {

#define MT_STRINGIFY_(x) #x
#define MT_STRINGIFY(x) MT_STRINGIFY_(x)
constexpr const char* kLibrary = "libcublasLt.so." MT_STRINGIFY(CUBLAS_VER_MAJOR);

template <class F>
void resolve(void* lib, F& slot, const char* name) {
  void* sym = ::dlsym(lib, name);
  if (!sym) throw std::runtime_error(fmt::format("{}: no entry point {} ({})", kLibrary, name, ::dlerror()));
  slot = reinterpret_cast<F>(sym);
}

CublasLtApi load() {
  void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    throw std::runtime_error(
        fmt::format("cannot load {} (cuBLASLt, for the CUDA GEMMs): {}; put its folder on "
                    "LD_LIBRARY_PATH (scripts/gpu-run.sh does so for the GPU bundle)",
                    kLibrary, ::dlerror()));
  CublasLtApi api{};
#define MT_RESOLVE(name) resolve(lib, api.name, "cublasLt" #name)
  MT_RESOLVE(Create);
  MT_RESOLVE(GetStatusString);
  MT_RESOLVE(GetVersion);
  MT_RESOLVE(Matmul);
  MT_RESOLVE(MatmulAlgoGetHeuristic);
  MT_RESOLVE(MatmulDescCreate);
  MT_RESOLVE(MatmulDescDestroy);
  MT_RESOLVE(MatmulDescSetAttribute);
  MT_RESOLVE(MatmulPreferenceCreate);
  MT_RESOLVE(MatmulPreferenceDestroy);
  MT_RESOLVE(MatmulPreferenceSetAttribute);
  MT_RESOLVE(MatrixLayoutCreate);
  MT_RESOLVE(MatrixLayoutDestroy);
#undef MT_RESOLVE
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load();
  return api;
}

const char* cublaslt_library_name() { return kLibrary; }

std::string cublaslt_status(bool* ok) {
  try {
    const size_t version = cublaslt().GetVersion();
    *ok = true;
    return fmt::format("{} (version {})", kLibrary, version);
  } catch (const std::exception& e) {
    *ok = false;
    return e.what();
  }
}

}  // namespace mt::cuda
