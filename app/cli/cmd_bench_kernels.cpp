// cmd_bench_kernels.cpp: megatrain bench kernels: measures this machine's GEMM rates by shape, causal attention by
// sequence and head dimension, elementwise bandwidth and the per-element cost of the norms, GELU, dropout and
// cross-entropy with megatrain's own ops (on the CPU also Gloo between two local ranks), and writes the rates
// file `megatrain plan --rates` reads.
// On the CPU it measures the reference backend (OpenBLAS); with --device cuda it measures the GPU, and says so
// and exits with status 77 when no GPU can be used.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "app/cli/commands.h"
#include "app/cli/option_checks.h"
#include "core/tensor/backend.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/store/store.h"
#include "parallel/comm/thread_ranks.h"
#include "plan/hardware.h"

namespace mt::app {

namespace {

struct BenchArgs {
  std::string device = "cpu";  // cpu | cuda
  std::string dtype;           // fp32 | bf16 (default: fp32 on cpu, bf16 on cuda)
  std::string output = "rates.yaml";
  double min_seconds = 0.05;  // per measurement
};

void sync(Device d) {
  if (DeviceRuntime* rt = find_runtime(d)) rt->synchronize();
}

// Seconds per call of `fn`: the fastest of three rounds, each repeated until min_seconds have passed (after one
// warm-up call). The fastest round is the machine's rate; the others were slowed by whatever else it ran.
double time_per_call(Device d, double min_seconds, const std::function<void()>& fn) {
  fn();
  sync(d);
  double best = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 3; ++round) {
    int calls = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      fn();
      ++calls;
      sync(d);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (elapsed < min_seconds);
    best = std::min(best, elapsed / calls);
  }
  return best;
}

Tensor filled(Shape shape, DType dtype, Device device, float v) {
  Tensor t = Tensor::empty(std::move(shape), dtype, device);
  fill_(t, v);
  return t;
}

// Causal attention, forward and backward, at a few sequence lengths and head dimensions, with dropout on the
// probabilities and without: its rate moves with both (short rows and narrow heads waste the vector units).
void measure_attention(Device dev, DType dt, double min_seconds, plan::Hardware& hw) {
  hw.attention_points.clear();
  const bool cpu = dev == Device::cpu;
  const int64_t B = 1, H = cpu ? 4 : 16;
  const std::vector<int64_t> Ts = cpu ? std::vector<int64_t>{64, 256, 1024} : std::vector<int64_t>{512, 2048, 8192};
  const std::vector<int64_t> Ds = cpu ? std::vector<int64_t>{16, 64, 128} : std::vector<int64_t>{64, 128};
  double sum_efficiency = 0;
  for (bool dropout : {false, true})
    for (int64_t T : Ts)
      for (int64_t D : Ds) {
        Tensor qkv = filled({B, T, H, 3, D}, dt, dev, 0.01f), att = Tensor::empty({B, T, H, D}, dt, dev);
        Tensor lse = Tensor::empty({B, H, T}, DType::f32, dev), datt = filled({B, T, H, D}, dt, dev, 0.01f);
        Tensor dqkv = Tensor::empty({B, T, H, 3, D}, dt, dev);
        const AttentionOptions opt{.causal = true, .dropout_p = dropout ? 0.1f : 0.f, .seed = 1, .site = 1};
        const double s = time_per_call(dev, min_seconds, [&] {
          attention_forward(qkv, att, lse, opt);
          attention_backward(qkv, att, lse, datt, dqkv, opt);
        });
        // Causal: half of the 4 B H T^2 D of QK^T and PV; the backward counted as 2.5 forwards.
        const double rate = 3.5 * 2.0 * static_cast<double>(B * H * T * T * D) / s;
        hw.attention_points.push_back({static_cast<double>(T), static_cast<double>(D), dropout, rate});
        if (!dropout) sum_efficiency += rate / hw.peak_flops;
        fmt::print("attention (T {:5d} D {:3d}{}): {:8.2f} GFLOP/s\n", T, D, dropout ? ", dropout 0.1" : "",
                   rate / 1e9);
      }
  hw.attention_efficiency = sum_efficiency / static_cast<double>(Ts.size() * Ds.size());
}

// Streaming bandwidth (out = a + b over 4M elements, 64M on a GPU), then the ops whose cost is more than their bytes on some
// devices, per element at a typical activation size.
void measure_elementwise(Device dev, DType dt, double min_seconds, plan::Hardware& hw) {
  const int64_t n = int64_t{1} << (dev == Device::cpu ? 22 : 26);  // past the caches; on a GPU past the launch
  {
    Tensor x = filled({n}, dt, dev, 1.f), y = filled({n}, dt, dev, 2.f), z = Tensor::empty({n}, dt, dev);
    const double s_add = time_per_call(dev, min_seconds, [&] { add(x, y, z); });
    hw.hbm_bytes_per_s = 3.0 * static_cast<double>(n) * static_cast<double>(dtype_size(dt)) / s_add;
    hw.elementwise_efficiency = 1.0;
    fmt::print("elementwise add: {:.2f} GB/s\n", hw.hbm_bytes_per_s / 1e9);
  }
  // CPU: 256 x 1024 (1 MiB in fp32, about a layer's activation of the CPU-sized models); GPU: 8192 x 4096, large
  // enough that the launch does not dominate (at 256 x 1024 a GPU op is all launch and would seem 10x slower per
  // element than it is on a real model's tensors).
  const int64_t R = dev == Device::cpu ? 256 : 8192, C = dev == Device::cpu ? 1024 : 4096;
  const double elems = static_cast<double>(R * C);
  Tensor x = filled({R, C}, dt, dev, 0.5f), dy = filled({R, C}, dt, dev, 0.01f), out = Tensor::empty({R, C}, dt, dev);
  Tensor dx = Tensor::empty({R, C}, dt, dev), w = filled({C}, dt, dev, 1.f), b = filled({C}, dt, dev, 0.f);
  Tensor mean = Tensor::empty({R}, DType::f32, dev), rstd = Tensor::empty({R}, DType::f32, dev);
  Tensor dw = filled({C}, DType::f32, dev, 0.f), db = filled({C}, DType::f32, dev, 0.f);
  plan::ElementwiseCosts& e = hw.elementwise_costs;
  auto per_element = [&](const char* what, double& field, double count, const std::function<void()>& fn) {
    field = time_per_call(dev, min_seconds, fn) / count;
    fmt::print("{}: {:.2f} ns per element\n", what, field * 1e9);
  };
  per_element("layernorm forward", e.norm_forward, elems, [&] { layernorm_forward(x, w, b, out, mean, rstd); });
  per_element("layernorm backward", e.norm_backward, elems,
              [&] { layernorm_backward(dy, x, w, mean, rstd, dx, dw, db); });
  per_element("gelu forward", e.act_forward, elems, [&] { gelu_forward(x, out); });
  per_element("gelu backward", e.act_backward, elems, [&] { gelu_backward(x, dy, dx); });
  const DropoutOptions drop{.p = 0.1f, .seed = 1, .site = 1};
  Tensor x3 = x.view({1, R, C}), dy3 = dy.view({1, R, C}), out3 = out.view({1, R, C}), dx3 = dx.view({1, R, C});
  per_element("dropout-add forward", e.dropout_forward, elems, [&] { dropout_add(x3, dy3, out3, drop); });
  per_element("dropout backward", e.dropout_backward, elems, [&] { dropout_backward(dy3, dx3, drop); });
  // Cross-entropy over (R, C) logits, every target inside.
  Tensor targets = Tensor::empty({R}, DType::i32, Device::cpu);
  for (int64_t i = 0; i < R; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % C);
  targets = targets.to(dev);
  Tensor rowmax = Tensor::empty({R}, DType::f32, dev), sumexp = Tensor::empty({R}, DType::f32, dev);
  Tensor target_logit = Tensor::empty({R}, DType::f32, dev), losses = Tensor::empty({R}, DType::f32, dev);
  Tensor dloss = filled({R}, DType::f32, dev, 1.f / static_cast<float>(R));
  per_element("cross-entropy forward", e.cross_entropy_forward, elems, [&] {
    cross_entropy_rowmax(x, rowmax);
    cross_entropy_partials(x, targets, rowmax, sumexp, target_logit);
    cross_entropy_loss(rowmax, sumexp, target_logit, losses);
  });
  per_element("cross-entropy backward", e.cross_entropy_backward, elems,
              [&] { cross_entropy_backward(x, targets, rowmax, sumexp, dloss, dx); });
}

// Gloo between two ranks of this machine (threads over loopback TCP, as the CPU ranks of one machine talk):
// the all-reduce time of a small and a large message gives latency and bandwidth (ring of two: bytes / bw +
// 2 latencies), the mean of three rounds (unlike a kernel's rate, the wake-up latency is not disturbance to
// filter out: every collective of a run pays it); and the cores the ranks share. Both messages over TCP
// (parallel.gloo_shared_memory off): the planner prices every collective so, an upper bound for the small ones
// that go through shared memory (parallel/comm/shared_rounds.h).
void measure_gloo(plan::Hardware& hw) {
  // n^3 * 2 FLOP at the best measured GEMM rate = 5 ms.
  const auto n = static_cast<int64_t>(std::clamp(std::cbrt(5e-3 * hw.peak_flops / 2), 128.0, 2048.0));
  hw.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<double> bytes = {16.0 * 1024, 4.0 * 1024 * 1024};
  std::vector<double> seconds(bytes.size());
  auto store = make_hash_store();
  run_ranks(2, [&](int rank) {
    auto comm = join_gloo(store, "bench", first_ranks(2), rank, std::chrono::seconds(60), /*shared_memory=*/false);
    // Training calls a collective between compute steps, not back to back: a waiting rank's threads go to
    // sleep, and each collective pays their wake-up, the longer the longer they slept (on the 2-core VM this
    // was written on: 0.3 ms back to back, 0.9 ms after 1 ms of compute, 1.9 ms after 5 ms). So each
    // all-reduce here follows a GEMM of about 5 ms, a CPU layer's compute between two of its collectives,
    // whose time alone is subtracted.
    Tensor a = filled({n, n}, DType::f32, Device::cpu, 0.01f);
    Tensor o = Tensor::empty({n, n}, DType::f32, Device::cpu);
    for (size_t i = 0; i < bytes.size(); ++i) {
      // A fixed number of calls on both ranks (a timed loop could end at different counts and hang).
      Tensor t = filled({static_cast<int64_t>(bytes[i] / 4)}, DType::f32, Device::cpu, 1.f);
      const int calls = i == 0 ? 100 : 10;
      double s = 0;
      for (int round = 0; round < 3; ++round) {
        comm->all_reduce(t, ReduceOp::sum)->wait();
        auto t0 = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) gemm(a, a, o, {.trans_b = true});
        const double compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        comm->barrier();
        t0 = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) {
          gemm(a, a, o, {.trans_b = true});
          comm->all_reduce(t, ReduceOp::sum)->wait();
        }
        const double both = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        s += std::max(0.0, both - compute) / calls / 3;
      }
      if (rank == 0) seconds[i] = s;
    }
  });
  const double bw = (bytes[1] - bytes[0]) / std::max(seconds[1] - seconds[0], 1e-9);
  const double latency = std::max(0.0, (seconds[0] - bytes[0] / bw) / 2);
  hw.intra_node_bytes_per_s = hw.inter_node_bytes_per_s = bw;
  hw.intra_node_latency_s = hw.inter_node_latency_s = latency;
  hw.collective_efficiency = 1.0;
  fmt::print("gloo all-reduce between 2 ranks: {:.2f} GB/s, {:.1f} us latency; {} cores\n", bw / 1e9, latency * 1e6,
             hw.cores);
}

void run_bench(const BenchArgs& a) {
  const Device dev = a.device == "cuda" ? Device::cuda : Device::cpu;
  DeviceRuntime* rt = find_runtime(dev);
  if (dev == Device::cuda) {
    if (!rt) {
      fmt::print("bench kernels: skipped: this megatrain was built without the CUDA backend\n");
      throw CLI::RuntimeError(77);
    }
    if (rt->device_count() == 0) {
      fmt::print("bench kernels: skipped: no GPU ({})\n", rt->unavailable_reason());
      throw CLI::RuntimeError(77);
    }
  }
  const std::string dtype_name = a.dtype.empty() ? (dev == Device::cuda ? "bf16" : "fp32") : a.dtype;
  const DType dt = parse_dtype(dtype_name);
  plan::Hardware hw = plan::builtin_hardware(dev == Device::cpu ? "cpu" : "h100-80gb");
  hw.name = dev == Device::cpu ? "cpu-measured" : "gpu-measured";
  if (rt) hw.name = rt->device_description();
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

  measure_attention(dev, dt, a.min_seconds, hw);
  measure_elementwise(dev, dt, a.min_seconds, hw);
  if (dev == Device::cpu) measure_gloo(hw);

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
      ->check(above(0));
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace mt::app
