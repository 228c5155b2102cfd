// device.h: where this rank computes (training.device) and how its groups communicate (parallel.backend),
// decided once at start from the config, the build and the machine.
#pragma once
#include <string>

#include "core/tensor/allocator.h"
#include "core/config/config.h"
#include "parallel/store/launch.h"

namespace mt::app {

enum class Backend { gloo, nccl };

struct Placement {
  Device device = Device::cpu;
  int ordinal = -1;  // the CUDA device this rank drives (-1 on the CPU)
  Backend backend = Backend::gloo;
  std::string description;   // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, ...)"
  double peak_tflops = 0.0;  // dense bf16 peak of the device for MFU; 0 when unknown (CPU)
};

// training.device auto picks cuda when this build has the backend and a GPU is visible, else cpu.
// On cuda, LOCAL_RANK picks the GPU (modulo the visible GPUs: launchers that give each task its own GPU
// leave one visible; ranks that really share a GPU need the host-staged Gloo backend, NCCL refuses them). parallel.backend auto is nccl on
// cuda (when built with NCCL) and gloo on cpu. Selects the GPU. Throws std::runtime_error naming the key.
Placement place_rank(const Config& cfg, const LaunchEnv& env);

// The memory statistics of the device that holds the model.
const MemoryStats& device_memory(const Placement& p);

}  // namespace mt::app
