// attention_backend.cpp: picks cuDNN's fused attention or megatrain's kernel for each attention call
// (attention_backend.h says when each runs), and describes the choice for the start log and `megatrain info`.
#include "core/cuda/attention_backend.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/cuda/attention_cudnn.h"

namespace mt::cuda {

namespace {

std::atomic<AttentionPath> g_last_path{AttentionPath::kernel};

std::string version_string(int64_t v) {  // cuDNN 9's encoding: major * 10000 + minor * 100 + patch
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

// Under auto, a call cuDNN refuses (its shape, an unaligned view) runs on the kernel; the reason is logged once
// per distinct reason (the reasons name the shape), so a run that silently loses the fused path is visible.
void warn_once(const std::string& reason) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard lock(mu);
  if (seen.insert(reason).second)
    spdlog::warn("attention: cuDNN cannot run this call ({}); using the megatrain kernel", reason);
}

// `whole`: a whole attention call (recorded as the last path and counted); false for a ring block.
bool run_on_cudnn(const char* op, DType dtype, float dropout_p, const std::function<std::string()>& run,
                  bool whole = true) {
  if (attention_path(dtype, dropout_p) != AttentionPath::cudnn) return false;
  const std::string refused = run();
  if (refused.empty()) {
    if (whole) {
      g_last_path = AttentionPath::cudnn;
      count_attention_call(AttentionImpl::cudnn);
    }
    return true;
  }
  if (attention_mode() == AttentionMode::cudnn)
    throw std::runtime_error(
        fmt::format("{}: MEGATRAIN_ATTENTION=cudnn, but cuDNN cannot run this call: {}", op, refused));
  warn_once(refused);
  return false;
}

}  // namespace

std::string_view attention_path_name(AttentionPath p) { return p == AttentionPath::cudnn ? "cudnn" : "kernel"; }

AttentionMode attention_mode() {
  const char* v = std::getenv("MEGATRAIN_ATTENTION");
  const std::string_view s = v ? v : "";
  if (s.empty() || s == "auto") return AttentionMode::automatic;
  if (s == "cudnn") return AttentionMode::cudnn;
  if (s == "kernel") return AttentionMode::kernel;
  throw std::runtime_error(fmt::format("MEGATRAIN_ATTENTION={}: expected auto, cudnn or kernel", s));
}

AttentionPath attention_path(DType dtype, float dropout_p, std::string* why) {
  const AttentionMode mode = attention_mode();
  std::string reason;
  // What the op asks for first, then what the build has: the log then names the reason a user can act on.
  if (mode == AttentionMode::kernel)
    reason = "MEGATRAIN_ATTENTION=kernel";
  else if (dtype != DType::bf16 && dtype != DType::f16)
    reason = fmt::format("{}: cuDNN's fused attention takes bf16 or fp16", dtype_name(dtype));
  else if (dropout_p != 0.f)
    reason = fmt::format("dropout {:g} needs layout-invariant masks", dropout_p);
  else if (!cudnn_attention_built())
    reason = "this megatrain was built without cuDNN";
  if (reason.empty()) {
    if (why)
      *why = fmt::format("{}, {} backward",
                         mode == AttentionMode::cudnn ? "MEGATRAIN_ATTENTION=cudnn" : "bf16/fp16 without dropout",
                         cudnn_backward_deterministic() ? "deterministic" : "non-deterministic");
    return AttentionPath::cudnn;
  }
  if (mode == AttentionMode::cudnn)
    throw std::runtime_error("MEGATRAIN_ATTENTION=cudnn, but cuDNN's fused attention cannot run: " + reason);
  if (why) *why = reason;
  return AttentionPath::kernel;
}

std::string attention_path_description(DType dtype, float dropout_p) {
  std::string why;
  if (attention_path(dtype, dropout_p, &why) == AttentionPath::cudnn)
    return fmt::format("cuDNN fused (flash), cuDNN {} ({})", version_string(cudnn_runtime_version()), why);
  return fmt::format("megatrain kernel ({})", why);
}

bool cudnn_built() { return cudnn_attention_built(); }

std::string cudnn_version() {
  if (!cudnn_attention_built()) return "not built (no cuDNN or cuDNN frontend headers at build time)";
  return fmt::format("{} (built with {}, frontend {})", version_string(cudnn_runtime_version()),
                     version_string(cudnn_compiled_version()), cudnn_frontend_version());
}

AttentionPath last_attention_path() { return g_last_path; }

void note_attention_kernel() {
  g_last_path = AttentionPath::kernel;
  count_attention_call(AttentionImpl::kernel);
}

bool cudnn_backward_deterministic() {
  const char* v = std::getenv("MEGATRAIN_CUDNN_BACKWARD");
  const std::string_view s = v ? v : "";
  if (s.empty() || s == "deterministic") return true;
  if (s == "nondeterministic" || s == "non-deterministic") return false;
  throw std::runtime_error(fmt::format("MEGATRAIN_CUDNN_BACKWARD={}: expected deterministic or nondeterministic", s));
}

namespace {
// Packed documents' positions: megatrain's cuDNN graphs are built for one causal sequence a sample (no ragged
// offsets / per-document sequence lengths yet), so such a call runs on the kernel (refused under
// MEGATRAIN_ATTENTION=cudnn).
constexpr const char* kPackedRefusal =
    "packed documents' positions (data.sft_packing: pack) are not built into the cuDNN graphs yet";
}  // namespace

bool attention_forward_on_cudnn(const Tensor& qkv, Tensor& out, Tensor& lse, const AttentionOptions& opt) {
  return run_on_cudnn("attention_forward", qkv.dtype(), opt.dropout_p, [&]() -> std::string {
    if (opt.positions.defined()) return kPackedRefusal;
    return cudnn_attention_forward(qkv, out, lse, opt.causal, opt.window);
  });
}

bool attention_backward_on_cudnn(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                 Tensor& dqkv, const AttentionOptions& opt) {
  return run_on_cudnn("attention_backward", qkv.dtype(), opt.dropout_p, [&]() -> std::string {
    if (opt.positions.defined()) return kPackedRefusal;
    return cudnn_attention_backward(qkv, out, lse, dout, dqkv, opt.causal, opt.window);
  });
}

// The first ring block that runs on cuDNN says so once (the log of a CP run then shows which path its blocks took;
// a block cuDNN refuses is warned about once per reason, as a whole call is).
void note_cudnn_block() {
  static std::once_flag once;
  std::call_once(once, [] { spdlog::info("attention: context-parallel ring blocks run on cuDNN's fused attention"); });
}

bool attention_block_forward_on_cudnn(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                      const AttentionBlockOptions& opt) {
  const bool done = run_on_cudnn(
      "attention_block_forward", qkv.dtype(), opt.dropout_p,
      [&]() -> std::string {
        if (opt.positions.defined()) return kPackedRefusal;
        return cudnn_attention_block_forward(qkv, kv, out, lse, opt);
      },
      false);
  if (done) note_cudnn_block();
  return done;
}

bool attention_block_backward_on_cudnn(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                       const Tensor& dout, Tensor& dq, Tensor& dkv, const AttentionBlockOptions& opt) {
  return run_on_cudnn(
      "attention_block_backward", qkv.dtype(), opt.dropout_p,
      [&]() -> std::string {
        if (opt.positions.defined()) return kPackedRefusal;
        return cudnn_attention_block_backward(qkv, kv, out, lse, dout, dq, dkv, opt);
      },
      false);
}

}  // namespace mt::cuda
