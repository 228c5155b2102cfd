#include "app/runtime/device.h"

#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/base/dtype.h"
#include "core/tensor/backend.h"

namespace mt::app {

namespace {

Backend choose_backend(const Config& cfg, Device device) {
  const BackendChoice b = cfg.parallel.backend;
  if (b == BackendChoice::gloo) return Backend::gloo;
#if defined(MEGATRAIN_WITH_NCCL)
  const bool have_nccl = true;
#else
  const bool have_nccl = false;
#endif
  if (b == BackendChoice::nccl) {
    if (device != Device::cuda)
      throw std::runtime_error(fmt::format("{}: parallel.backend: nccl needs training.device: cuda", cfg.source));
    if (!have_nccl)
      throw std::runtime_error(
          fmt::format("{}: parallel.backend: nccl, but this megatrain was built without NCCL "
                      "(set parallel.backend: gloo for host-staged communication)",
                      cfg.source));
    return Backend::nccl;
  }
  return device == Device::cuda && have_nccl ? Backend::nccl : Backend::gloo;
}

}  // namespace

Placement place_rank(const Config& cfg, const LaunchEnv& env) {
  Placement p;
  const DeviceChoice want = cfg.training.device;
  DeviceRuntime* cuda = find_runtime(Device::cuda);
  if (!cuda && want == DeviceChoice::cuda)
    throw std::runtime_error(
        fmt::format("{}: training.device: cuda, but this megatrain was built without the CUDA "
                    "backend",
                    cfg.source));
  const int gpus = !cuda || want == DeviceChoice::cpu ? 0 : cuda->device_count();
  if (want == DeviceChoice::cuda && gpus == 0)
    throw std::runtime_error(
        fmt::format("{}: training.device: cuda, but no GPU can be used: {}", cfg.source, cuda->unavailable_reason()));
  p.device = gpus > 0 ? Device::cuda : Device::cpu;
  p.backend = choose_backend(cfg, p.device);
  if (p.device == Device::cpu) {
    p.description = "cpu";
    return p;
  }
  // LOCAL_RANK picks the GPU. A rank that sees fewer GPUs than its local rank either was bound to its own
  // GPU by the launcher (srun --gpus-per-task=1 leaves one visible GPU per task) or shares one with other
  // ranks: it takes LOCAL_RANK modulo the visible count. Sharing works with host-staged Gloo; NCCL refuses
  // it when it creates the communicators, naming both ranks.
  p.ordinal = env.local_rank % gpus;
  if (env.local_rank >= gpus && p.backend == Backend::nccl)
    spdlog::warn(
        "LOCAL_RANK={} sees {} GPU(s): using GPU {}. This is right when the launcher gives each rank its "
        "own GPU (CUDA_VISIBLE_DEVICES per task); if ranks share a GPU, NCCL will refuse: start at most "
        "{} rank(s) per node, or set parallel.backend: gloo (host-staged, for testing)",
        env.local_rank, gpus, p.ordinal, gpus);
  cuda->select_device(p.ordinal);
  p.description = fmt::format("cuda:{} ({})", p.ordinal, cuda->device_description());
  p.peak_tflops = cuda->peak_bf16_tflops();
  // Which attention training runs (cuDNN's fused flash attention or megatrain's kernel) and why; a forced
  // MEGATRAIN_ATTENTION=cudnn that cannot run fails here, at start.
  spdlog::info("attention: {}",
               cuda->attention_description(dtype_of(cfg.training.precision), cfg.model.attention_dropout));
  return p;
}

const MemoryStats& device_memory(const Placement& p) { return allocator_for(p.device).stats(); }

}  // namespace mt::app
