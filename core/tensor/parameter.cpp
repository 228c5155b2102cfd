#include "core/tensor/parameter.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "core/base/rng.h"

namespace mt {

namespace {
// U(-1, 1) number `index` of stream (seed, stream): 53 random bits.
double symmetric_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return 2.0 * static_cast<double>(random_u64_at(seed, stream, index) >> 11) * 0x1p-53 - 1.0;
}
}  // namespace

void initial_values(const Parameter& p, uint64_t seed, Tensor& out) {
  float* dst = out.data<float>();
  const Shape& local = out.shape();
  if (p.init == Init::zeros || p.init == Init::ones) {
    float v = p.init == Init::ones ? 1.f : 0.f;
    for (int64_t i = 0; i < out.numel(); ++i) dst[i] = v;
    return;
  }
  // Map each local element to its row-major index in the global tensor, so a slice draws exactly the
  // numbers the whole tensor would hold there. Every element is a pure function of its global index, so
  // large tensors are drawn by several threads (a 1.3B model takes minutes on one core).
  const uint64_t stream = stream_id(p.name);
  const int nd = static_cast<int>(local.size());
  auto draw = [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(nd, 0);  // the local multi-index of element `begin`
    for (int64_t d = nd - 1, r = begin; d >= 0; --d) {
      idx[d] = r % local[d];
      r /= local[d];
    }
    for (int64_t i = begin; i < end; ++i) {
      int64_t g = 0;
      for (int d = 0; d < nd; ++d) g = g * p.global_shape[d] + (p.start.empty() ? 0 : p.start[d]) + idx[d];
      const auto at = static_cast<uint64_t>(g);
      dst[i] = static_cast<float>(
          (p.init == Init::uniform ? symmetric_uniform_at(seed, stream, at) : normal_at(seed, stream, at)) *
          p.init_std);
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < local[d]) break;
        idx[d] = 0;
      }
    }
  };
  constexpr int64_t kPerThread = 1 << 20;
  const int64_t n = out.numel();
  const int64_t threads = std::clamp<int64_t>(n / kPerThread, 1, std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 1) return draw(0, n);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(draw, n * t / threads, n * (t + 1) / threads);
  for (auto& th : pool) th.join();
}

namespace {
thread_local bool parameters_on_meta = false;
}  // namespace

ParametersOnMeta::ParametersOnMeta() : outer_(parameters_on_meta) { parameters_on_meta = true; }
ParametersOnMeta::~ParametersOnMeta() { parameters_on_meta = outer_; }

Parameter make_parameter_slice(std::string name, TensorBlock block, DType dtype, Init init, float init_std,
                               uint64_t seed) {
  const Shape local = std::move(block.local);
  Parameter p;
  p.name = std::move(name);
  p.tensor_parallel = local != block.global;
  p.global_shape = std::move(block.global);
  p.start = std::move(block.start);
  p.init = init;
  p.init_std = init_std;
  p.weight_decay = local.size() > 1;
  if (parameters_on_meta) {
    p.value = Tensor::empty(local, dtype, Device::meta, MemKind::parameter);
    p.grad = Tensor::zeros(local, DType::f32, Device::meta, MemKind::gradient);
    return p;
  }
  Tensor init_f32 = Tensor::empty(local, DType::f32, Device::cpu, MemKind::workspace);
  initial_values(p, seed, init_f32);
  p.value = Tensor::empty(local, dtype, Device::cpu, MemKind::parameter);
  p.value.copy_from(init_f32);
  p.grad = Tensor::zeros(local, DType::f32, Device::cpu, MemKind::gradient);
  return p;
}

Parameter make_parameter(std::string name, Shape shape, DType dtype, Init init, float init_std, uint64_t seed) {
  std::vector<int64_t> start(shape.size(), 0);
  return make_parameter_slice(std::move(name), TensorBlock{.global = shape, .start = std::move(start), .local = shape},
                              dtype, init, init_std, seed);
}

void move_to_device(Parameter& p, Device device) {
  if (device == Device::cpu || p.value.device() == device) return;  // there already (or nothing to move)
  p.value = p.value.to(device, MemKind::parameter);
  if (p.grad.defined()) p.grad = p.grad.to(device, MemKind::gradient);
}

}  // namespace mt
