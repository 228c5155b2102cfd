// backend_cpu.cpp: the CPU's op table (core/tensor/backend.h), filled from core/tensor/backend_ops.inc with the
// functions of ops_cpu.h. The CPU is the host: it has no runtime.
#include "core/cpu/ops_cpu.h"
#include "core/tensor/backend.h"

namespace mt::cpu {

void register_backend() {
  static const BackendOps table = [] {
    BackendOps t;
#define MT_BACKEND_OP(name, params) t.name = &name;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
    // The CPU's attention counts its calls here, as the CUDA backend's chooser does (core/tensor/ops.h).
    t.attention_forward = [](const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
      cpu::attention_forward(qkv, out, lse, opt);
      count_attention_call(AttentionImpl::cpu);
    };
    t.attention_backward = [](const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dqkv,
                              const AttentionOptions& opt) {
      cpu::attention_backward(qkv, out, lse, dout, dqkv, opt);
      count_attention_call(AttentionImpl::cpu);
    };
    return t;
  }();
  mt::register_backend(Device::cpu, table, nullptr);
}

}  // namespace mt::cpu
