// backend_registry.cpp: the registry of core/tensor/backend.h, and the one place that knows which backends this
// build has: the CPU and the meta device always, CUDA when the toolkit was found at build time
// (MEGATRAIN_WITH_CUDA). The backends' register functions are declared here rather than included, so that
// core/tensor includes no backend's header.
#include <array>
#include <cctype>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "core/tensor/backend.h"

namespace mt {

namespace cpu {
void register_backend();  // core/cpu/backend_cpu.cpp
}  // namespace cpu
namespace meta {
void register_backend();  // core/meta/backend_meta.cpp
}  // namespace meta
#if defined(MEGATRAIN_WITH_CUDA)
namespace cuda {
void register_backend();  // core/cuda/backend_cuda.cpp
}  // namespace cuda
#endif

namespace {

constexpr size_t kMaxDevices = 8;  // room for the Device values to come

struct Entry {
  const BackendOps* ops = nullptr;
  DeviceRuntime* runtime = nullptr;
};

std::array<Entry, kMaxDevices>& entries() {
  static std::array<Entry, kMaxDevices> e;
  return e;
}

size_t index_of(Device d) {
  const auto i = static_cast<size_t>(d);
  if (i >= kMaxDevices) throw std::logic_error(fmt::format("backend registry: device {} out of range", i));
  return i;
}

// The built-in backends register once, at the first lookup (not from static initialisers, which a static library
// would drop with their otherwise unreferenced object files).
const std::array<Entry, kMaxDevices>& registered() {
  static const bool builtins = [] {
    cpu::register_backend();
    meta::register_backend();
#if defined(MEGATRAIN_WITH_CUDA)
    cuda::register_backend();
#endif
    return true;
  }();
  (void)builtins;
  return entries();
}

std::string without(Device d) {
  std::string name(device_name(d));
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return fmt::format("this megatrain was built without the {} backend", name);
}

}  // namespace

void register_backend(Device d, const BackendOps& ops, DeviceRuntime* runtime) {
#define MT_BACKEND_OP(name, params) \
  if (!ops.name) throw std::logic_error(fmt::format("register_backend: the {} table has no " #name, device_name(d)));
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
  entries()[index_of(d)] = Entry{.ops = &ops, .runtime = runtime};
}

bool has_backend(Device d) { return registered()[index_of(d)].ops != nullptr; }

const BackendOps& backend(Device d, const char* op) {
  const BackendOps* ops = registered()[index_of(d)].ops;
  if (!ops) throw std::runtime_error(fmt::format("{}: {}; use training.device: cpu", op, without(d)));
  return *ops;
}

DeviceRuntime* find_runtime(Device d) { return registered()[index_of(d)].runtime; }

DeviceRuntime& device_runtime(Device d, const char* what) {
  DeviceRuntime* rt = find_runtime(d);
  if (!rt) throw std::runtime_error(fmt::format("{}: {}", what, without(d)));
  return *rt;
}

}  // namespace mt
