// attention_backend.h: which implementation runs attention_forward / attention_backward on the GPU, in plain
// C++ (no CUDA or cuDNN headers), so that app/ can say it at start and tests can force either one.
//
// Two paths:
//   cudnn   cuDNN's fused flash attention (core/cuda/attention_cudnn.cpp): bf16 / fp16, no attention dropout
//           (cuDNN draws its own dropout masks, which depend on how heads and samples are split over ranks,
//           so they would break layout invariance), head dimensions cuDNN supports.
//   kernel  megatrain's tiled kernel (core/cuda/attention.cu): every dtype, the CPU's dropout masks bit for bit.
// MEGATRAIN_ATTENTION=auto (default) takes cudnn where it can run and the kernel elsewhere; =cudnn forces cuDNN
// (an error where it cannot run); =kernel forces the kernel.
// Everything here exists only when MEGATRAIN_WITH_CUDA is defined.
#pragma once
#include <string>
#include <string_view>

#include "core/base/dtype.h"

namespace mt::cuda {

enum class AttentionPath { cudnn, kernel };
enum class AttentionMode { automatic, cudnn, kernel };

std::string_view attention_path_name(AttentionPath p);  // "cudnn" or "kernel"

// MEGATRAIN_ATTENTION, read on every call (tests change it); throws on a value other than auto, cudnn, kernel.
AttentionMode attention_mode();

// The path attention takes for a dtype and attention dropout p, before the per-call shape check (a shape
// cuDNN rejects runs on the kernel under auto). `why`, when given, gets the reason in a few words.
// Throws when MEGATRAIN_ATTENTION=cudnn and cuDNN cannot run this dtype or dropout, or is not built.
AttentionPath attention_path(DType dtype, float dropout_p, std::string* why = nullptr);

// For the start log: "cuDNN fused (flash), cuDNN 9.19.0" or
// "megatrain kernel (dropout 0.1 needs layout-invariant masks)".
std::string attention_path_description(DType dtype, float dropout_p);

// "9.19.0 (built with 9.19.0, frontend 1.32.0)": cudnnGetVersion() of the library loaded now and the
// CUDNN_VERSION compiled against; "not built (...)" when this build has no cuDNN path.
std::string cudnn_version();
bool cudnn_built();

// The path the latest attention_forward or attention_backward call of this process took (tests).
AttentionPath last_attention_path();

}  // namespace mt::cuda
