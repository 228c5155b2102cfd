// backend_meta.cpp: the meta device's op table, runtime and allocator (core/meta/meta.h). Every op of
// backend_ops.inc is counted by one template (its calls and the bytes of its tensors); the GEMMs and attention add
// their FLOPs, the GEMMs mirror the backend's workspaces, and moe_dispatch_index writes balanced counts.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/meta/meta.h"
#include "core/tensor/backend.h"

namespace mt::meta {

namespace {

// Unbacked allocations get addresses from here up: above every user-space address, never dereferenced.
constexpr uintptr_t kUnbackedBase = uintptr_t{1} << 60;
// core/cuda/gemm.cpp kWorkspaceBytes: the cuBLASLt workspace a CUDA process keeps from its first GEMM on.
constexpr int64_t kCublasLtWorkspaceBytes = int64_t{32} << 20;

// Each thread has its own (State below): a meta measurement runs on one thread, and several run side by side.
class MetaAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemKind kind) override {
    record_alloc(bytes, kind);
    if (bytes <= kShadowBytes) {
      void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
      if (!p) throw std::bad_alloc();
      return p;
    }
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + 63) / 64 * 64;
    return p;
  }
  void deallocate(void* ptr, size_t bytes, MemKind kind) override {
    record_free(bytes, kind);
    if (!is_unbacked(ptr)) std::free(ptr);
  }
  Device device() const override { return Device::meta; }
  void restart() { stats_ = MemoryStats{}; }

 private:
  uintptr_t next_ = kUnbackedBase;
};

// The meta device of one thread: its allocator, its session's mirror and op counts.
struct State {
  MetaAllocator allocator;
  bool in_session = false;
  Mirror mirror = Mirror::cpu;
  Counts counts;
  std::optional<Tensor> cublaslt_workspace;  // Mirror::cuda: made at the session's first GEMM
};

State& state() {
  thread_local State s;
  return s;
}

void tally(const char* op, double flops, double bytes) {
  OpCount& c = state().counts.ops[op];
  ++c.calls;
  c.flops += flops;
  c.bytes += bytes;
}

// The bytes an op's argument moves: its tensors', nothing for options.
template <class T>
double arg_bytes(const T&) {
  return 0;
}
double arg_bytes(const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0; }
double arg_bytes(const Tensor* t) { return t ? arg_bytes(*t) : 0; }
double arg_bytes(const std::vector<Tensor>& v) {
  double b = 0;
  for (const Tensor& t : v) b += arg_bytes(t);
  return b;
}
double arg_bytes(const std::vector<AdamWTensors>& v) {
  double b = 0;
  for (const AdamWTensors& t : v)
    b += arg_bytes(t.master) + arg_bytes(t.grad) + arg_bytes(t.exp_avg) + arg_bytes(t.exp_avg_sq) + arg_bytes(t.value);
  return b;
}

// An op name as a template argument.
template <size_t L>
struct OpName {
  char s[L];
  constexpr OpName(const char (&x)[L]) { std::copy_n(x, L, s); }  // NOLINT: implicit by design
};

// The table entry of an op with no work of its own: counted.
template <OpName N, class F>
struct Counted;
template <OpName N, class... A>
struct Counted<N, void (*)(A...)> {
  static void fn(A... a) { tally(N.s, 0, (0.0 + ... + arg_bytes(a))); }
};

// A workspace as a backend allocates it inside an op.
Tensor workspace(const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, Device::meta, MemKind::workspace);
}

// What a GEMM of a (M, K) and b (K, N) into out allocates inside the backend: the CPU's fp32 copies of out (unless
// it is f32), a and b (unless they are); cuBLASLt's one workspace.
void gemm_workspaces(const Tensor& a, const Tensor& b, const Tensor& out, std::vector<Tensor>& held) {
  if (state().mirror == Mirror::cuda) {
    if (!state().cublaslt_workspace) state().cublaslt_workspace = workspace({kCublasLtWorkspaceBytes / 4}, DType::f32);
    return;
  }
  for (const Tensor* t : {&out, &a, &b})
    if (t->dtype() != DType::f32) held.push_back(workspace(t->shape(), DType::f32));
}

double gemm_flops(const Tensor& a, const Tensor& out, const GemmOptions& opt) {
  const double K = static_cast<double>(opt.trans_a ? a.dim(0) : a.dim(1));
  return 2 * static_cast<double>(out.numel()) * K;
}

void gemm(const Tensor& a, const Tensor& b, Tensor& out, const GemmOptions& opt) {
  std::vector<Tensor> held;
  if (out.numel() > 0) gemm_workspaces(a, b, out, held);
  tally("gemm", gemm_flops(a, out, opt), arg_bytes(a) + arg_bytes(b) + arg_bytes(out) + arg_bytes(opt.bias));
}

void gemm_grouped(const std::vector<Tensor>& a, const std::vector<Tensor>& b, std::vector<Tensor>& c,
                  const GemmOptions& opt) {
  double flops = 0;
  for (size_t g = 0; g < c.size(); ++g) {
    if (!c[g].defined() || c[g].numel() == 0) continue;
    std::vector<Tensor> held;  // the CPU runs the groups one after the other
    gemm_workspaces(a[g], b[g], c[g], held);
    flops += gemm_flops(a[g], c[g], opt);
  }
  tally("gemm_grouped", flops, arg_bytes(a) + arg_bytes(b) + arg_bytes(c));
}

void gemm_fp8(const Tensor& a, const Tensor&, const Tensor& b, const Tensor&, Tensor& out, const GemmOptions& opt) {
  std::vector<Tensor> held;
  if (state().mirror == Mirror::cpu) {  // core/cpu/fp8.cpp: both operands dequantized to bf16, then the bf16 GEMM
    const Tensor wa = workspace(a.shape(), DType::bf16), wb = workspace(b.shape(), DType::bf16);
    gemm_workspaces(wa, wb, out, held);
  } else {
    gemm_workspaces(a, b, out, held);
  }
  tally("gemm_fp8", gemm_flops(a, out, opt), arg_bytes(a) + arg_bytes(b) + arg_bytes(out));
}

void fp8_quantize_transpose(const Tensor& x, const Tensor& scale, Tensor& out, Tensor& out_t, Tensor* amax) {
  Tensor q;  // core/cpu/fp8.cpp: the cast goes through a workspace when out is not wanted
  if (state().mirror == Mirror::cpu && !out.defined()) q = workspace(x.shape(), out_t.dtype());
  tally("fp8_quantize_transpose", 0,
        arg_bytes(x) + arg_bytes(scale) + arg_bytes(out) + arg_bytes(out_t) + arg_bytes(amax));
}

// Attention's FLOPs: Q K^T and P V, 2 * 2 * rows * keys * D per head, half of it under a causal mask.
double attention_flops(const Tensor& qkv, double keys, bool causal) {
  const double B = static_cast<double>(qkv.dim(0)), T = static_cast<double>(qkv.dim(1));
  const double H = static_cast<double>(qkv.dim(2) * (qkv.dim(3) - 2)), D = static_cast<double>(qkv.dim(4));
  return 4 * B * H * T * keys * D * (causal ? 0.5 : 1);
}

void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  tally("attention_forward", attention_flops(qkv, static_cast<double>(qkv.dim(1)), opt.causal),
        arg_bytes(qkv) + arg_bytes(out) + arg_bytes(lse));
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                        const AttentionOptions& opt) {
  // The backward recomputes the probabilities and makes three gradient products: 2.5 times the forward.
  tally("attention_backward", 2.5 * attention_flops(qkv, static_cast<double>(qkv.dim(1)), opt.causal),
        arg_bytes(qkv) + arg_bytes(out) + arg_bytes(lse) + arg_bytes(dout) + arg_bytes(dqkv));
}

void attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                             const AttentionBlockOptions& opt) {
  tally("attention_block_forward", attention_flops(qkv, static_cast<double>(kv.dim(1)), opt.causal),
        arg_bytes(qkv) + arg_bytes(kv) + arg_bytes(out) + arg_bytes(lse));
}

void attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt) {
  tally("attention_block_backward", 2.5 * attention_flops(qkv, static_cast<double>(kv.dim(1)), opt.causal),
        arg_bytes(qkv) + arg_bytes(kv) + arg_bytes(out) + arg_bytes(lse) + arg_bytes(dout) + arg_bytes(dq) +
            arg_bytes(dkv));
}

// Balanced routing: of the part's P * k choices each expert gets an equal share (the first ones one more), at most
// the part's share of cap.capacity (P / N of it, rounded up: the capacity holds for all N tokens) when there is one.
void moe_dispatch_index(const Tensor& experts, Tensor& row_of, Tensor& counts, const MoeCapacityOptions& cap) {
  tally("moe_dispatch_index", 0, arg_bytes(experts) + arg_bytes(row_of) + arg_bytes(counts));
  if (is_unbacked(counts.raw())) return;
  const int64_t E = counts.numel(), R = row_of.numel(), N = std::max<int64_t>(experts.dim(0), 1);
  const int64_t capacity = (cap.capacity * row_of.dim(0) + N - 1) / N;
  auto* c = counts.data<int32_t>();
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = R / E + (e < R % E ? 1 : 0);
    if (cap.capacity > 0) n = std::min(n, capacity);
    c[e] = static_cast<int32_t>(n);
  }
}

// The meta device's runtime: one device, no streams (every op is done when it returns), copies that move values
// only between memory that exists (an unbacked source reads as zeros).
class MetaRuntime final : public DeviceRuntime {
 public:
  int device_count() const noexcept override { return 1; }
  std::string unavailable_reason() const override { return ""; }
  void select_device(int) override {}
  std::string device_description() const override { return "meta (shapes and bytes, no values)"; }
  double peak_bf16_tflops() const override { return 0; }
  std::vector<RuntimeLibrary> libraries() const override { return {}; }
  std::string attention_description(DType, float) const override { return "meta: counted, not computed"; }
  void synchronize() override {}
  void* create_timing_event() override { return new int; }
  void record_timing_event(void*) override {}
  float elapsed_ms(void*, void*) override { return 0; }
  void destroy_timing_event(void* event) noexcept override { delete static_cast<int*>(event); }
  void* create_copy_stream() override { return new int; }
  void destroy_copy_stream(void* stream) noexcept override { delete static_cast<int*>(stream); }
  void* create_sync_event() override { return new int; }
  void destroy_sync_event(void* event) noexcept override { delete static_cast<int*>(event); }
  void record_event(void*, void*) override {}
  void stream_wait_event(void*, void*) override {}
  void wait_event(void*) override {}
  void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) override { copy(dst, src, bytes); }
  void copy_async(void* dst, const void* src, size_t bytes, void*) override { copy(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override {
    if (!is_unbacked(dst)) std::memset(dst, 0, bytes);
  }
  void convert(const void*, DType, void* dst, DType dst_dtype, int64_t n) override {
    fill_zero(dst, static_cast<size_t>(n) * dtype_size(dst_dtype));  // no values to convert: zeros
  }
  Allocator& allocator() override { return state().allocator; }
  void* alloc_pinned(size_t bytes) override { return std::malloc(bytes); }
  void free_pinned(void* ptr) noexcept override { std::free(ptr); }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (is_unbacked(dst) || bytes == 0) return;
    if (is_unbacked(src))
      std::memset(dst, 0, bytes);
    else
      std::memmove(dst, src, bytes);
  }
};

}  // namespace

double Counts::flops() const {
  double f = 0;
  for (const auto& [name, c] : ops) f += c.flops;
  return f;
}

double Counts::bytes() const {
  double b = 0;
  for (const auto& [name, c] : ops) b += c.bytes;
  return b;
}

bool is_unbacked(const void* p) { return reinterpret_cast<uintptr_t>(p) >= kUnbackedBase; }

Session::Session(Mirror mirror) {
  State& s = state();
  if (s.in_session) throw std::logic_error("meta::Session: this thread measures on the meta device already");
  s.in_session = true;
  s.mirror = mirror;
  s.allocator.restart();
  s.counts = Counts{};
}

Session::~Session() {
  State& s = state();
  s.cublaslt_workspace.reset();
  s.mirror = Mirror::cpu;
  s.in_session = false;
}

const MemoryStats& Session::memory() const { return state().allocator.stats(); }

void Session::reset_peaks() { state().allocator.reset_peaks(); }

Counts Session::counts() const { return state().counts; }

void register_backend() {
  static const BackendOps table = [] {
    BackendOps t;
#define MT_BACKEND_OP(name, params) t.name = &Counted<#name, decltype(t.name)>::fn;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
    t.gemm = &meta::gemm;
    t.gemm_grouped = &meta::gemm_grouped;
    t.gemm_fp8 = &meta::gemm_fp8;
    t.fp8_quantize_transpose = &meta::fp8_quantize_transpose;
    t.attention_forward = &meta::attention_forward;
    t.attention_backward = &meta::attention_backward;
    t.attention_block_forward = &meta::attention_block_forward;
    t.attention_block_backward = &meta::attention_block_backward;
    t.moe_dispatch_index = &meta::moe_dispatch_index;
    return t;
  }();
  static MetaRuntime runtime;
  mt::register_backend(Device::meta, table, &runtime);
}

}  // namespace mt::meta
