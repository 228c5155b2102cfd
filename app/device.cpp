#include "app/device.h"

#include <stdexcept>

#include <fmt/format.h>

#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/runtime.h"
#endif

namespace mt::app {

namespace {

Backend choose_backend(const Config& cfg, Device device) {
  const std::string& b = cfg.parallel.backend;
  if (b == "gloo") return Backend::gloo;
#if defined(MEGATRAIN_WITH_NCCL)
  const bool have_nccl = true;
#else
  const bool have_nccl = false;
#endif
  if (b == "nccl") {
    if (device != Device::cuda)
      throw std::runtime_error(fmt::format("{}: parallel.backend: nccl needs training.device: cuda", cfg.source));
    if (!have_nccl)
      throw std::runtime_error(fmt::format("{}: parallel.backend: nccl, but this megatrain was built without NCCL "
                                           "(set parallel.backend: gloo for host-staged communication)", cfg.source));
    return Backend::nccl;
  }
  return device == Device::cuda && have_nccl ? Backend::nccl : Backend::gloo;
}

}  // namespace

Placement place_rank(const Config& cfg, const LaunchEnv& env) {
  Placement p;
  const std::string& want = cfg.training.device;
#if defined(MEGATRAIN_WITH_CUDA)
  const int gpus = want == "cpu" ? 0 : cuda::device_count();
  if (want == "cuda" && gpus == 0)
    throw std::runtime_error(fmt::format("{}: training.device: cuda, but no GPU can be used: {}", cfg.source,
                                         cuda::unavailable_reason()));
  p.device = gpus > 0 ? Device::cuda : Device::cpu;
#else
  if (want == "cuda")
    throw std::runtime_error(fmt::format("{}: training.device: cuda, but this megatrain was built without the CUDA "
                                         "backend", cfg.source));
  p.device = Device::cpu;
#endif
  p.backend = choose_backend(cfg, p.device);
  if (p.device == Device::cpu) {
    p.description = "cpu";
    return p;
  }
#if defined(MEGATRAIN_WITH_CUDA)
  if (env.local_rank < gpus) {
    p.ordinal = env.local_rank;
  } else if (p.backend == Backend::gloo) {
    p.ordinal = env.local_rank % gpus;  // ranks share GPUs; host-staged Gloo moves their data
  } else {
    throw std::runtime_error(fmt::format(
        "LOCAL_RANK={} but only {} GPU(s) are visible; NCCL cannot run two ranks on one GPU. Start at most {} "
        "rank(s) per node, or set parallel.backend: gloo to share GPUs (host-staged, slow; for testing)",
        env.local_rank, gpus, gpus));
  }
  cuda::select_device(p.ordinal);
  p.description = fmt::format("cuda:{} ({})", p.ordinal, cuda::device_description());
  p.peak_tflops = cuda::peak_bf16_tflops();
#endif
  return p;
}

const MemoryStats& device_memory(const Placement& p) { return allocator_for(p.device).stats(); }

}  // namespace mt::app
