// cublaslt_api.h: the cuBLASLt entry points core/cuda/gemm.cpp calls, resolved from libcublasLt at the first GEMM
// rather than linked. libcublasLt's static initialisers cost every process ~0.1 s of CPU and ~0.3 s of wall time
// at start (measured: an empty program linked to it, `perf stat`), paid by every CPU rank and every test process
// that never runs a GPU GEMM; loaded on demand, only a CUDA run pays, once.
#pragma once

#include <cublasLt.h>

namespace mt::cuda {

struct CublasLtApi {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtGetVersion) GetVersion;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// The library (libcublasLt.so.<major> of the CUDA headers compiled against, found as the dynamic linker finds
// any: LD_LIBRARY_PATH, the executable's run path, the system), loaded once, thread-safe. Throws, naming the file
// and the loader's reason, when it or one of the entry points is missing.
const CublasLtApi& cublaslt();

// The file cublaslt() opens.
const char* cublaslt_library_name();

}  // namespace mt::cuda
