// cmd_bench_kernels.cpp: megatrain bench kernels: measures this machine's GEMM rates by shape, causal attention
// and elementwise bandwidth with megatrain's own ops, and writes the rates file `megatrain plan --rates` reads.
// On the CPU it measures the reference backend (OpenBLAS); with --device cuda it measures the GPU, and says so
// and exits with status 77 when no GPU can be used.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "app/commands.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "plan/hardware.h"

#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/runtime.h"
#endif

namespace mt::app {

namespace {

struct BenchArgs {
  std::string device = "cpu";  // cpu | cuda
  std::string dtype;           // fp32 | bf16 (default: fp32 on cpu, bf16 on cuda)
  std::string output = "rates.yaml";
  double min_seconds = 0.05;  // per measurement
};

void sync(Device d) {
#if defined(MEGATRAIN_WITH_CUDA)
  if (d == Device::cuda) cuda::synchronize();
#else
  (void)d;
#endif
}

// Seconds per call of `fn`, repeated until min_seconds have passed (after one warm-up call).
double time_per_call(Device d, double min_seconds, const std::function<void()>& fn) {
  fn();
  sync(d);
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    sync(d);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / calls;
}

Tensor filled(Shape shape, DType dtype, Device device, float v) {
  Tensor t = Tensor::empty(std::move(shape), dtype, device);
  fill_(t, v);
  return t;
}

void run_bench(const BenchArgs& a) {
  const Device dev = a.device == "cuda" ? Device::cuda : Device::cpu;
  if (dev == Device::cuda) {
#if defined(MEGATRAIN_WITH_CUDA)
    if (cuda::device_count() == 0) {
      fmt::print("bench kernels: skipped: no GPU ({})\n", cuda::unavailable_reason());
      throw CLI::RuntimeError(77);
    }
#else
    fmt::print("bench kernels: skipped: this megatrain was built without the CUDA backend\n");
    throw CLI::RuntimeError(77);
#endif
  }
  const std::string dtype_name = a.dtype.empty() ? (dev == Device::cuda ? "bf16" : "fp32") : a.dtype;
  const DType dt = parse_dtype(dtype_name);
  plan::Hardware hw = plan::builtin_hardware(dev == Device::cpu ? "cpu" : "h100-80gb");
  hw.name = dev == Device::cpu ? "cpu-measured" : "gpu-measured";
#if defined(MEGATRAIN_WITH_CUDA)
  if (dev == Device::cuda) hw.name = cuda::device_description();
#endif
  hw.gemm_points.clear();

  // GEMMs (m, n, k) = rows x output features x input features, as the layers run them (out = a @ b^T).
  double best = 0;
  for (double m : {256.0, 1024.0, 4096.0})
    for (double n : {64.0, 256.0, 1024.0, 4096.0})
      for (double k : {64.0, 256.0, 1024.0}) {
        if (dev == Device::cpu && m * n * k > 1.1e9) continue;  // keep the CPU run to seconds
        Tensor x = filled({static_cast<int64_t>(m), static_cast<int64_t>(k)}, dt, dev, 0.01f);
        Tensor w = filled({static_cast<int64_t>(n), static_cast<int64_t>(k)}, dt, dev, 0.01f);
        Tensor out = Tensor::empty({static_cast<int64_t>(m), static_cast<int64_t>(n)}, dt, dev);
        const double s = time_per_call(dev, a.min_seconds, [&] { gemm(x, w, out, {.trans_b = true}); });
        const double rate = 2 * m * n * k / s;
        hw.gemm_points.push_back({m, n, k, rate});
        best = std::max(best, rate);
        fmt::print("gemm {:5.0f} x {:5.0f} x {:5.0f}: {:8.2f} GFLOP/s\n", m, n, k, rate / 1e9);
      }
  // The points carry the efficiencies: the peak is the best measured, the curve only moves between points.
  hw.peak_flops = hw.peak_flops_fp32 = best;
  hw.gemm_efficiency = 1.0;

  // Causal attention, forward and backward, (B, T, H, D) = (1, 256, 4, 64) on the CPU, larger on a GPU.
  const int64_t B = 1, T = dev == Device::cpu ? 256 : 2048, H = dev == Device::cpu ? 4 : 16, D = 64;
  Tensor qkv = filled({B, T, H, 3, D}, dt, dev, 0.01f), att = Tensor::empty({B, T, H, D}, dt, dev);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32, dev), datt = filled({B, T, H, D}, dt, dev, 0.01f);
  Tensor dqkv = Tensor::empty({B, T, H, 3, D}, dt, dev);
  const AttentionOptions att_opt{.causal = true};
  const double s_att = time_per_call(dev, a.min_seconds, [&] {
    attention_forward(qkv, att, lse, att_opt);
    attention_backward(qkv, att, lse, datt, dqkv, att_opt);
  });
  const double att_flops = 3.5 * 2.0 * static_cast<double>(B * H * T * T * D);  // forward + 2.5x backward
  hw.attention_efficiency = att_flops / s_att / hw.peak_flops;
  fmt::print("attention (B {} T {} H {} D {}): {:.2f} GFLOP/s ({:.3f} of the best GEMM)\n", B, T, H, D,
             att_flops / s_att / 1e9, hw.attention_efficiency);

  // Elementwise: out = a + b over 4M elements (two reads, one write).
  const int64_t n = int64_t{1} << 22;
  Tensor x = filled({n}, dt, dev, 1.f), y = filled({n}, dt, dev, 2.f), z = Tensor::empty({n}, dt, dev);
  const double s_add = time_per_call(dev, a.min_seconds, [&] { add(x, y, z); });
  hw.hbm_bytes_per_s = 3.0 * static_cast<double>(n) * static_cast<double>(dtype_size(dt)) / s_add;
  hw.elementwise_efficiency = 1.0;
  fmt::print("elementwise add: {:.2f} GB/s\n", hw.hbm_bytes_per_s / 1e9);

  plan::write_rates(a.output, hw);
  fmt::print("wrote {} (use: megatrain plan --rates {})\n", a.output, a.output);
}

}  // namespace

void add_bench_commands(CLI::App& root) {
  auto* bench = root.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto* cmd = bench->add_subcommand("kernels", "Measure GEMM, attention and elementwise rates; write a rates file");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("--device", a->device, "cpu or cuda (default cpu)")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", a->dtype, "fp32 or bf16 (default: fp32 on cpu, bf16 on cuda)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("-o,--output", a->output, "rates file to write (default rates.yaml)");
  cmd->add_option("--min-seconds", a->min_seconds, "time each measurement at least this long (default 0.05)")
      ->check(CLI::PositiveNumber);
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace mt::app
