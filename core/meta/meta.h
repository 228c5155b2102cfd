// meta.h: the meta device (Device::meta), a third backend behind core/tensor/backend_ops.inc that computes nothing.
// Its tensors have shapes, dtypes and sizes but no values; every op is checked by the same entry points as on the
// CPU and CUDA (core/tensor/ops*.cpp) and then only counted: calls, FLOPs (the GEMMs' 2 M N K, attention's) and the
// bytes of its operands. Its allocator keeps the same per-kind accounting as the others (core/tensor/allocator.h),
// so running the real model's forward and backward on it gives the real allocation peaks without the memory: the
// planner's memory (`megatrain plan`) is measured this way, not modelled.
//
// What the meta device mirrors of a real backend (Mirror): the allocations a backend makes inside an op, which are
// not the model's. The CPU reference widens bf16/fp16 GEMM operands into fp32 workspaces (core/cpu/gemm.cpp) and
// dequantizes fp8 ones to bf16 (core/cpu/fp8.cpp); CUDA keeps one cuBLASLt workspace for the process
// (core/cuda/gemm.cpp). Gloo's fp32 reduction copies are the meta communicator's (parallel/comm/comm_meta.cpp).
//
// Values: allocations of at most kShadowBytes are real, zeroed host memory, so the few small tensors whose values
// steer the host (an MoE layer's counts per expert, read to size its GEMMs; the step's grad-norm verdict) have
// them; larger ones are addresses no one may read. The meta ops write only the counts of moe_dispatch_index: every
// expert gets its balanced share of the choices (capped by the capacity), as the planner assumes.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/tensor/allocator.h"

namespace mt::meta {

// Allocations of at most this many bytes have host memory behind them (see above).
inline constexpr size_t kShadowBytes = 4096;

enum class Mirror { cpu, cuda };

struct OpCount {
  int64_t calls = 0;
  double flops = 0;  // multiply-adds count two
  double bytes = 0;  // operands read and written, each once
};

struct Counts {
  std::map<std::string, OpCount> ops;  // by op name (backend_ops.inc)
  double flops() const;
  double bytes() const;
};

// The meta device of this thread for one measurement: its memory statistics and op counts starting from zero, the
// backend's in-op allocations mirrored as `mirror` says. Each thread has a meta device of its own (its allocator and
// counts), so measurements run side by side on several threads; one session at a time on a thread (a second is a
// std::logic_error). The tensors of a session are made and dropped on its thread, all of them before it ends.
// (Ops that the session's code hands to other threads, the offloaded optimizer's host workers, count there.)
class Session {
 public:
  explicit Session(Mirror mirror);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const MemoryStats& memory() const;
  // Peaks from now on start at the bytes live now (Allocator::reset_peaks).
  void reset_peaks();
  Counts counts() const;
};

// Whether `p` is a meta address with no memory behind it.
bool is_unbacked(const void* p);

}  // namespace mt::meta
