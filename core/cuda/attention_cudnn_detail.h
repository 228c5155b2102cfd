// attention_cudnn_detail.h: what attention_cudnn.cpp (the graphs, through the cuDNN frontend) and
// attention_cudnn_calls.cpp (the calls: pointers, buffers, ring blocks) share. Not an interface: attention_cudnn.h
// is. Plain C++ with cuDNN's C header: the frontend stays in attention_cudnn.cpp.
#pragma once
#include <cudnn.h>

#include <compare>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/base/dtype.h"

namespace mt::cuda::cudnn_detail {

// The graphs' tensor ids (the variant pack's keys).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Key {
  bool backward;
  DType dtype;
  int64_t B, T, G, R, D;  // H = G R query heads
  bool causal;
  bool deterministic;  // the backward's algorithm (true for every forward key)
  // A context-parallel ring block: q_rows of the T query rows against k_rows of the Tk rows of a packed kv
  // (B, Tk, G, 2, D) (cudnn_attention_block_forward / _backward, attention_cudnn_calls.cpp).
  bool block = false;
  int64_t q_rows = 0, Tk = 0, k_rows = 0;
  // Sliding window (causal only): query row i sees key rows j > i - window of the call; 0: none. A window that
  // binds nothing (window >= the call's rows) is 0, so it shares the windowless graph.
  int64_t window = 0;
  auto operator<=>(const Key&) const = default;
  int64_t H() const { return G * R; }
};

// A graph cuDNN built for a Key, its plans and workspace size (attention_cudnn.cpp).
struct Plan;
// The cached graph of a Key (built on first use) with the handle bound to the compute stream, or why cuDNN cannot
// run it.
struct PlannedGraph {
  std::shared_ptr<const Plan> plan;
  cudnnHandle_t handle = nullptr;
  std::string refused;  // "" when cuDNN runs it
};
PlannedGraph plan_for(const Key& k);
// Enqueues the graph on the compute stream with `pack` (Uid -> device pointer); `op` names the call in errors.
void execute(const PlannedGraph& g, std::unordered_map<int64_t, void*>& pack, const char* op);

}  // namespace mt::cuda::cudnn_detail
