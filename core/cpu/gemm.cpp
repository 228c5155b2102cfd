// gemm.cpp: out (M, N) = alpha * op(a) @ op(b) + beta * out on the CPU. bf16/f16 operands are widened to
// fp32 workspaces, OpenBLAS sgemm accumulates in fp32, and a bf16/f16 out is read as fp32 for beta and
// rounded once at the end.
//
// The epilogues (GemmOptions::epilogue) are the plain GEMM followed by the separate ops, in the order and
// with the roundings the models used before the epilogues existed, so CPU losses stay bit for bit:
//   bias:        gemm into out (rounded), add_bias (rounded again)
//   gelu_bias:   gemm into aux, add_bias on aux, gelu_forward(aux) into out
//   dgelu_bgrad: gemm into out, gelu_backward(aux, out) in place, bias_backward(out) into dbias
//   bgrad_a:     gemm into out, bias_backward(a) into dbias (a is stored (K, M): the sums over k of op(a))
// The CUDA backend fuses them into cuBLASLt's epilogues, rounding once (core/cuda/gemm.cpp).
#include <cblas.h>

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// An fp32 view of t: t itself when it is f32, else a widened copy in a workspace buffer.
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor w = Tensor::empty(t.shape(), DType::f32, Device::cpu, MemKind::workspace);
  load_f32(t, 0, t.numel(), w.data<float>());
  return w;
}

// The GEMM without its epilogue.
void gemm_plain(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  const int64_t M = out.dim(0), N = out.dim(1);
  const int64_t K = opt.trans_a ? a.dim(0) : a.dim(1);
  for (int64_t d : {a.dim(0), a.dim(1), b.dim(0), b.dim(1), M, N})
    if (d > INT_MAX)
      throw std::invalid_argument("gemm: dimension " + std::to_string(d) + " exceeds the BLAS int range");
  if (M == 0 || N == 0) return;

  Tensor c32 =
      out.dtype() == DType::f32 ? out : Tensor::empty(out.shape(), DType::f32, Device::cpu, MemKind::workspace);
  float* c = c32.data<float>();
  const int64_t MN = M * N;
  // beta == 0 ignores out entirely (an uninitialised buffer may hold NaNs).
  if (opt.beta == 0.f) {
    for (int64_t i = 0; i < MN; ++i) c[i] = 0.f;
  } else if (c32.raw() != out.raw()) {
    load_f32(out, 0, MN, c);
  }

  if (K == 0) {
    for (int64_t i = 0; i < MN; ++i) c[i] *= opt.beta;
  } else {
    Tensor a32 = as_f32(a), b32 = as_f32(b);
    cblas_sgemm(CblasRowMajor, opt.trans_a ? CblasTrans : CblasNoTrans, opt.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), opt.alpha, a32.data<float>(),
                static_cast<int>(a.dim(1)), b32.data<float>(), static_cast<int>(b.dim(1)), opt.beta, c,
                static_cast<int>(N));
  }
  if (c32.raw() != out.raw()) store_f32(c, MN, out, 0);
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  switch (opt.epilogue) {
    case Epilogue::none:
      gemm_plain(a, b, out, opt);
      return;
    case Epilogue::bias:
      gemm_plain(a, b, out, opt);
      cpu::add_bias(out, *opt.bias);
      return;
    case Epilogue::gelu_bias:
      gemm_plain(a, b, *opt.aux, opt);
      cpu::add_bias(*opt.aux, *opt.bias);
      cpu::gelu_forward(*opt.aux, out);
      return;
    case Epilogue::dgelu_bgrad:
      gemm_plain(a, b, out, opt);
      cpu::gelu_backward(*opt.aux, out, out);
      cpu::bias_backward(out, *opt.dbias);
      return;
    case Epilogue::bgrad_a:
      gemm_plain(a, b, out, opt);
      cpu::bias_backward(a, *opt.dbias);
      return;
  }
}

// One gemm per group: the grouped op is a batching of calls for the GPU, the CPU has nothing to batch.
void gemm_grouped(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                  const GemmOptions& opt) {
  for (size_t g = 0; g < c.size(); ++g) gemm_plain(a[g], b[g], c[g], opt);
}

}  // namespace mt::cpu
