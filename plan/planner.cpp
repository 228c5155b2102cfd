// planner.cpp: predict() ties the memory and time models together; search() enumerates layouts.
#include "plan/planner.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

namespace mt::plan {

Backend backend_for(const Hardware& hw) { return hw.is_gpu ? Backend::cuda : Backend::cpu; }

namespace {

// The prediction of `c` whose memory is measured already.
Prediction predict_with(const Config& c, const Hardware& hw, MemoryPlan memory) {
  Prediction p{.config = c, .layout = layout_of(c), .memory = std::move(memory)};
  p.time = predict_time(c, hw);
  p.fits = fits(c, p.memory, hw);
  return p;
}

}  // namespace

Prediction predict(const Config& c, const Hardware& hw) {
  if (const std::string why = runtime_refusal(c); !why.empty()) throw std::invalid_argument(why);
  return predict_with(c, hw, predict_memory(c, backend_for(hw)));
}

double max_host_bytes(const MemoryPlan& m) {
  double most = 0;
  for (const StageMemory& s : m.stages) most = std::max(most, s.bytes[MemKind::host]);
  return most;
}

bool host_fits(const Config& c, const MemoryPlan& m) {
  const double budget = c.optimizer.offload_host_memory_gib;
  return budget <= 0 || max_host_bytes(m) <= budget * 1073741824.0;
}

bool fits(const Config& c, const MemoryPlan& m, const Hardware& hw) {
  return m.max_total() <= hw.memory_bytes && host_fits(c, m);
}

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The tensor and context-parallel sizes to search (CP ranks between the tensor and data-parallel ones, both the
// ring and the all-gather): CP only where config/config_rules.cpp resolve_context accepts the model (seq_length cut
// into 2 CP chunks, none of the features it does not split), checked here to skip the layouts it would refuse; and
// chunks of at least SearchOptions::min_context_chunk tokens.
struct TensorContext {
  int64_t tp, cp;
  bool cp_allgather;
};
std::vector<TensorContext> tensor_context_sizes(const Config& c, int64_t world, int64_t min_chunk) {
  const ModelConfig& m = c.model;
  std::vector<TensorContext> out;
  for (int64_t tp : divisors(world))
    for (int64_t cp : divisors(world / tp)) {
      if (cp > 1 && (m.seq_length % (2 * cp) != 0 || m.seq_length / (2 * cp) < min_chunk)) continue;
      out.push_back({tp, cp, false});
      if (cp > 1) out.push_back({tp, cp, true});
    }
  return out;
}

}  // namespace

std::vector<Prediction> search(const Config& base, int64_t world, const Hardware& hw, const SearchOptions& opt) {
  const ModelConfig& m = base.model;
  const int64_t G = base.training.global_batch_size;
  // Recomputation only where keeping the activations does not fit (it is never faster): selective (every module)
  // before full.
  // Optimizer offload (optimizer.offload) after that, where the state does not fit on the device otherwise, and only
  // with a host budget (optimizer.offload_host_memory_gib) to hold the host state against.
  const bool try_offload = !base.optimizer.offload && base.optimizer.offload_host_memory_gib > 0;
  auto fastest_fitting = [&](Layout l) -> std::optional<Prediction> {
    for (bool offload : {base.optimizer.offload, true}) {
      if (offload && !base.optimizer.offload && !try_offload) break;
      for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
        if (rc != Recompute::none && !opt.allow_recompute) continue;
        l.recompute = rc;
        try {
          Config c = apply_layout(base, l);
          c.optimizer.offload = offload;
          if (!runtime_refusal(c).empty()) continue;
          // What the set-up holds before any activation (recomputation does not change it): no mode fits above it.
          if (rc == Recompute::none && setup_memory(c, backend_for(hw), hw.memory_bytes) > hw.memory_bytes) break;
          // The memory first: the time (the schedule simulation) only for the mode that fits.
          MemoryPlan memory = predict_memory(c, backend_for(hw), hw.memory_bytes);
          if (!fits(c, memory, hw)) continue;
          return predict_with(c, hw, std::move(memory));
        } catch (const std::exception&) {
          continue;  // a rule refuses it
        }
      }
      if (base.optimizer.offload) break;  // already offloaded: nothing more to try
    }
    return std::nullopt;
  };
  std::vector<Layout> layouts;
  for (const auto& [tp, cp, cp_allgather] : tensor_context_sizes(base, world, opt.min_context_chunk)) {
    // Tensor parallelism inside a node, dividing heads, key/value heads and ffn (the config rules say so too;
    // checked early here to skip the rest of the loop).
    if (tp > hw.gpus_per_node || m.num_heads % tp != 0 || m.kv_heads() % tp != 0 || m.ffn_hidden_size % tp != 0)
      continue;
    // MoE: the shared expert is split over the tensor-parallel ranks as the dense MLP.
    if (m.moe.enabled() && m.moe.shared_expert_ffn_hidden_size % tp != 0) continue;
    for (int64_t pp : divisors(world / (tp * cp))) {
      if (pp > m.num_layers) continue;
      const int64_t dp = world / (tp * cp * pp);
      if (G % dp != 0) continue;
      for (int64_t vp = 1; vp <= (pp > 1 ? opt.max_virtual_pipeline : 1); ++vp) {
        if (m.num_layers % (pp * vp) != 0) continue;
        for (int64_t mbs : opt.micro_batch_sizes) {
          if (G % (mbs * dp) != 0) continue;
          if (vp > 1 && (G / (mbs * dp)) % pp != 0) continue;
          for (bool sp : {false, true}) {
            if (sp && (tp == 1 || (m.seq_length / cp) % tp != 0)) continue;
            // ZeRO stages: none, optimizer (ZeRO-1), gradients (ZeRO-2), parameters (ZeRO-3); the time model prices
            // the first three alike and ZeRO-3's gathers above them, so a higher stage is chosen only where it is
            // what fits. With context parallelism ZeRO-3 shards over data x context, the experts over their own
            // expert-data-parallel ranks.
            for (ShardStage zero :
                 {ShardStage::none, ShardStage::optimizer, ShardStage::gradients, ShardStage::parameters}) {
              if (zero != ShardStage::none && (!opt.allow_zero || dp == 1)) continue;
              // Expert parallelism (MoE): 1, 2, 4, ... ranks dividing the experts, drawn from the data-parallel
              // ranks with the experts split over the tensor ranks (ETP = TP), or with parallel folding (ETP a
              // divisor of TP below it) from the tensor and data-parallel ranks.
              for (int64_t etp : m.moe.enabled() ? divisors(tp) : std::vector<int64_t>{tp}) {
                if (m.moe.enabled() && m.moe.ffn_hidden_size % etp != 0) continue;
                // With context parallelism the context ranks fold in beside the data-parallel ones.
                for (int64_t ep = 1; ep <= (m.moe.enabled() ? tp * cp * dp / etp : 1); ep *= 2) {
                  if ((tp * cp * dp) % (ep * etp) != 0 || m.moe.num_experts % ep != 0) continue;
                  if (etp == tp && (cp * dp) % ep != 0) continue;
                  layouts.push_back(Layout{.tensor = tp,
                                           .pipeline = pp,
                                           .virtual_pipeline = vp,
                                           .data = dp,
                                           .micro_batch_size = mbs,
                                           .sequence_parallel = sp,
                                           .shard = zero,
                                           .expert = ep,
                                           .expert_tensor = etp == tp ? 0 : etp,
                                           .context = cp,
                                           .context_allgather = cp_allgather});
                }
              }
            }
          }
        }
      }
    }
  }
  // Each layout measured on a thread of its own (each has its own meta device), the results in the layouts' order.
  std::vector<std::optional<Prediction>> found(layouts.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (size_t i; (i = next++) < layouts.size();) found[i] = fastest_fitting(layouts[i]);
    } catch (...) {
      const std::lock_guard lock(error_mu);
      if (!error) error = std::current_exception();
      next = layouts.size();
    }
  };
  const size_t threads = std::clamp<size_t>(
      opt.threads > 0 ? static_cast<size_t>(opt.threads) : std::max(1u, std::thread::hardware_concurrency()), 1,
      std::max<size_t>(layouts.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  std::vector<Prediction> out;
  for (std::optional<Prediction>& p : found)
    if (p) out.push_back(std::move(*p));
  std::stable_sort(out.begin(), out.end(),
                   [](const Prediction& a, const Prediction& b) { return a.time.total < b.time.total; });
  return out;
}

}  // namespace mt::plan
