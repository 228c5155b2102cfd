// cmd_info.cpp: megatrain info: what this binary was built with and which devices it can use here, so a
// user (and the GPU tests) can tell at once whether training.device: cuda will work.
#include <fmt/format.h>

#include "app/cli/commands.h"

#include "core/tensor/backend.h"

namespace mt::app {

void add_info_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("info", "Print the build's backends and the GPUs this process can use");
  auto require_gpu = std::make_shared<bool>(false);
  cmd->add_flag("--require-gpu", *require_gpu, "Exit with status 3 when no GPU can be used");
  cmd->callback([require_gpu] {
    fmt::print("megatrain {}\n", MEGATRAIN_VERSION);
    DeviceRuntime* cuda = find_runtime(Device::cuda);
    fmt::print("cuda backend: {}\n", cuda ? "built" : "not built (no CUDA toolkit at build time)");
#if defined(MEGATRAIN_WITH_NCCL)
    fmt::print("nccl: built\n");
#else
    fmt::print("nccl: not built\n");
#endif
    int gpus = 0;
    bool usable = false;  // a GPU, and the libraries to train on it
    if (cuda) {
      // The libraries the backend loads (cuDNN: the one loaded now and the one built against; cuBLASLt: loaded at
      // the first GPU GEMM), so a missing library shows here rather than mid-run.
      usable = true;
      for (const RuntimeLibrary& lib : cuda->libraries()) {
        fmt::print("{}: {}\n", lib.name, lib.status);
        usable = usable && lib.usable;
      }
      gpus = cuda->device_count();
      if (gpus == 0)
        fmt::print("gpus: 0 ({})\n", cuda->unavailable_reason());
      else
        fmt::print("gpus: {}\ngpu 0: {}\n", gpus, cuda->device_description());
      usable = usable && gpus > 0;
    } else {
      fmt::print("cudnn: not built (the CUDA backend is not built)\ngpus: 0 (the CUDA backend is not built)\n");
    }
    fmt::print("training.device auto: {}\n", gpus > 0 ? "cuda" : "cpu");
    if (*require_gpu && !usable) throw CLI::RuntimeError(3);
  });
}

}  // namespace mt::app
