// hardware.cpp: the built-in device tables and the rates file.
//
// Sources of the built-in figures (public datasheets; no measurement on these devices was made here):
//   A100 80GB SXM: 312 TFLOP/s dense bf16, 19.5 TFLOP/s fp32, 2.0 TB/s HBM2e (NVIDIA A100 datasheet);
//     NVLink 3: 600 GB/s total = 300 GB/s per direction; DGX A100: 8 HDR InfiniBand NICs, 200 Gb/s = 25 GB/s
//     per GPU.
//   H100 80GB SXM: 989.4 TFLOP/s dense bf16, 66.9 TFLOP/s fp32, 3.35 TB/s HBM3 (H100 datasheet); NVLink 4:
//     900 GB/s total = 450 GB/s per direction; DGX H100: 8 NDR NICs, 400 Gb/s = 50 GB/s per GPU.
//   H200 141GB SXM: the H100's compute and links, 4.8 TB/s HBM3e (H200 datasheet).
// Efficiencies (assumptions, one set for all rows of any validation, never tuned per model): large bf16 GEMMs
// through cuBLASLt reach about 80% of peak on A100 and 75% on H100/H200 (their published GEMM benchmarks); a
// dimension of 64 halves the rate (tile quantisation and too few thread blocks); fused causal flash attention
// about 50% of peak; elementwise kernels 70% of HBM bandwidth; NCCL rings 80% of the link bandwidth; 5 us
// latency per NVLink step and 10 us per InfiniBand step.
#include "plan/hardware.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/io/file_io.h"

namespace mt::plan {

namespace {

Hardware gpu(std::string name, double mem_gb, double bf16_tflops, double fp32_tflops, double hbm_tb_s, double gemm_eff,
             double nvlink_gb_s, double ib_gb_s) {
  Hardware h;
  h.name = std::move(name);
  h.is_gpu = true;
  h.memory_bytes = mem_gb * 1e9;
  h.peak_flops = bf16_tflops * 1e12;
  h.peak_flops_fp32 = fp32_tflops * 1e12;
  h.hbm_bytes_per_s = hbm_tb_s * 1e12;
  h.gemm_efficiency = gemm_eff;
  h.gemm_half_dim = 64;
  h.attention_efficiency = 0.5;
  h.elementwise_efficiency = 0.7;
  h.kernel_overhead_s = 4e-6;
  h.gpus_per_node = 8;
  h.intra_node_bytes_per_s = nvlink_gb_s * 1e9;
  h.intra_node_latency_s = 5e-6;
  h.inter_node_bytes_per_s = ib_gb_s * 1e9;
  h.inter_node_latency_s = 10e-6;
  h.collective_efficiency = 0.8;
  return h;
}

// The CPU before `bench kernels` has measured it: a guess of a few cores with OpenBLAS, a placeholder that
// only orders layouts; measure for real figures.
Hardware cpu_defaults() {
  Hardware h;
  h.name = "cpu";
  h.is_gpu = false;
  h.memory_bytes = 16e9;
  h.peak_flops = h.peak_flops_fp32 = 50e9;
  h.hbm_bytes_per_s = 10e9;
  h.gemm_efficiency = 1.0;
  h.gemm_half_dim = 32;
  h.attention_efficiency = 0.05;
  h.elementwise_efficiency = 1.0;
  h.kernel_overhead_s = 1e-6;
  h.gpus_per_node = 1 << 20;  // every rank on this machine: Gloo over loopback
  h.intra_node_bytes_per_s = h.inter_node_bytes_per_s = 2e9;
  h.intra_node_latency_s = h.inter_node_latency_s = 50e-6;
  h.collective_efficiency = 1.0;
  return h;
}

}  // namespace

std::vector<std::string> builtin_hardware_names() { return {"a100-80gb", "h100-80gb", "h200-141gb", "cpu"}; }

Hardware builtin_hardware(const std::string& name) {
  if (name == "a100-80gb") return gpu(name, 80, 312, 19.5, 2.0, 0.80, 300, 25);
  if (name == "h100-80gb") return gpu(name, 80, 989.4, 66.9, 3.35, 0.75, 450, 50);
  if (name == "h200-141gb") return gpu(name, 141, 989.4, 66.9, 4.8, 0.75, 450, 50);
  if (name == "cpu") return cpu_defaults();
  throw std::invalid_argument(
      fmt::format("--gpu {}: unknown device; known: {} (or --rates FILE from `megatrain "
                  "bench kernels`)",
                  name, fmt::join(builtin_hardware_names(), ", ")));
}

namespace {

// Every scalar field, by name, for reading and writing alike.
template <class F>
void for_each_field(Hardware& h, F&& f) {
  f("memory_bytes", h.memory_bytes);
  f("peak_flops", h.peak_flops);
  f("peak_flops_fp32", h.peak_flops_fp32);
  f("hbm_bytes_per_s", h.hbm_bytes_per_s);
  f("gemm_efficiency", h.gemm_efficiency);
  f("gemm_half_dim", h.gemm_half_dim);
  f("attention_efficiency", h.attention_efficiency);
  f("elementwise_efficiency", h.elementwise_efficiency);
  f("kernel_overhead_s", h.kernel_overhead_s);
  f("norm_forward_s_per_element", h.elementwise_costs.norm_forward);
  f("norm_backward_s_per_element", h.elementwise_costs.norm_backward);
  f("act_forward_s_per_element", h.elementwise_costs.act_forward);
  f("act_backward_s_per_element", h.elementwise_costs.act_backward);
  f("dropout_forward_s_per_element", h.elementwise_costs.dropout_forward);
  f("dropout_backward_s_per_element", h.elementwise_costs.dropout_backward);
  f("cross_entropy_forward_s_per_logit", h.elementwise_costs.cross_entropy_forward);
  f("cross_entropy_backward_s_per_logit", h.elementwise_costs.cross_entropy_backward);
  f("intra_node_bytes_per_s", h.intra_node_bytes_per_s);
  f("intra_node_latency_s", h.intra_node_latency_s);
  f("inter_node_bytes_per_s", h.inter_node_bytes_per_s);
  f("inter_node_latency_s", h.inter_node_latency_s);
  f("collective_efficiency", h.collective_efficiency);
}

}  // namespace

Hardware read_rates(const std::string& path, Hardware h) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("--rates {}: cannot read: {}", path, e.what()));
  }
  if (!root.IsMap()) throw std::runtime_error(fmt::format("--rates {}: expected a mapping of rates", path));
  auto number = [&](const YAML::Node& n, const std::string& key) {
    try {
      const double v = n.as<double>();
      if (!std::isfinite(v) || v < 0) throw std::runtime_error("negative or not finite");
      return v;
    } catch (const std::exception&) {
      throw std::runtime_error(fmt::format("--rates {}: {}: expected a number >= 0", path, key));
    }
  };
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    bool known = false;
    if (key == "name") {
      h.name = kv.second.as<std::string>();
      known = true;
    } else if (key == "is_gpu") {
      h.is_gpu = kv.second.as<bool>();
      known = true;
    } else if (key == "gpus_per_node" || key == "cores") {
      (key == "cores" ? h.cores : h.gpus_per_node) = static_cast<int>(number(kv.second, key));
      known = true;
    } else if (key == "gemm_points" || key == "attention_points") {
      // [m, n, k, flops_per_s] or [T, D, dropout (0 or 1), flops_per_s]
      const bool gemm = key == "gemm_points";
      if (gemm)
        h.gemm_points.clear();
      else
        h.attention_points.clear();
      for (size_t i = 0; i < kv.second.size(); ++i) {
        const YAML::Node& pt = kv.second[i];
        const std::string where = fmt::format("{}[{}]", key, i);
        if (!pt.IsSequence() || pt.size() != 4)
          throw std::runtime_error(fmt::format("--rates {}: {}: expected [{}]", path, where,
                                               gemm ? "m, n, k, flops_per_s" : "T, D, dropout, flops_per_s"));
        const double a = number(pt[0], where), b = number(pt[1], where), c = number(pt[2], where),
                     rate = number(pt[3], where);
        if (gemm)
          h.gemm_points.push_back({a, b, c, rate});
        else
          h.attention_points.push_back({a, b, c != 0, rate});
      }
      known = true;
    } else {
      for_each_field(h, [&](const char* name, double& field) {
        if (key == name) {
          field = number(kv.second, key);
          known = true;
        }
      });
    }
    if (!known) throw std::runtime_error(fmt::format("--rates {}: unknown key '{}'", path, key));
  }
  if (!(h.peak_flops > 0) || !(h.hbm_bytes_per_s > 0))
    throw std::runtime_error(fmt::format("--rates {}: peak_flops and hbm_bytes_per_s must be positive", path));
  return h;
}

void write_rates(const std::string& path, const Hardware& hw) {
  Hardware h = hw;
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << h.name;
  out << YAML::Key << "is_gpu" << YAML::Value << h.is_gpu;
  out << YAML::Key << "gpus_per_node" << YAML::Value << h.gpus_per_node;
  out << YAML::Key << "cores" << YAML::Value << h.cores;
  for_each_field(h, [&](const char* name, double& field) { out << YAML::Key << name << YAML::Value << field; });
  out << YAML::Key << "gemm_points" << YAML::Value << YAML::BeginSeq;
  for (const GemmPoint& p : h.gemm_points)
    out << YAML::Flow << YAML::BeginSeq << p.m << p.n << p.k << p.flops_per_s << YAML::EndSeq;
  out << YAML::EndSeq;
  out << YAML::Key << "attention_points" << YAML::Value << YAML::BeginSeq;
  for (const AttentionPoint& p : h.attention_points)
    out << YAML::Flow << YAML::BeginSeq << p.T << p.D << (p.dropout ? 1 : 0) << p.flops_per_s << YAML::EndSeq;
  out << YAML::EndSeq << YAML::EndMap;
  io::write_file_atomically(path, std::string(out.c_str()) + "\n");  // a FileError naming the path
}

namespace {

double curve(const Hardware& hw, double m, double n, double k) {
  const double h = hw.gemm_half_dim;
  return hw.gemm_efficiency * (m / (m + h)) * (n / (n + h)) * (k / (k + h));
}

}  // namespace

double gemm_rate(const Hardware& hw, double m, double n, double k, bool fp32) {
  const double peak = fp32 ? hw.peak_flops_fp32 : hw.peak_flops;
  if (m <= 0 || n <= 0 || k <= 0) return peak;
  if (hw.gemm_points.empty()) return peak * curve(hw, m, n, k);
  // The nearest measured shape (in log space), moved to this shape along the curve.
  const GemmPoint* best = nullptr;
  double best_dist = std::numeric_limits<double>::infinity();
  for (const GemmPoint& p : hw.gemm_points) {
    const double dist = std::fabs(std::log(m / p.m)) + std::fabs(std::log(n / p.n)) + std::fabs(std::log(k / p.k));
    if (dist < best_dist) best_dist = dist, best = &p;
  }
  return best->flops_per_s * curve(hw, m, n, k) / curve(hw, best->m, best->n, best->k);
}

double fp8_gemm_speedup(const Hardware& hw) {
  if (!hw.is_gpu) return 1;
  for (const char* fp8_gpu : {"h100", "h200", "h800", "gh200", "b200", "b100"})
    if (hw.name.find(fp8_gpu) != std::string::npos) return 2;
  return 1;
}

namespace {

// Piecewise linear in log(x) through (x_i, y_i) sorted by x, constant beyond the ends.
double interpolate_log(const std::vector<std::pair<double, double>>& xy, double x) {
  if (x <= xy.front().first) return xy.front().second;
  if (x >= xy.back().first) return xy.back().second;
  size_t i = 1;
  while (xy[i].first < x) ++i;
  const double f = std::log(x / xy[i - 1].first) / std::log(xy[i].first / xy[i - 1].first);
  return xy[i - 1].second + f * (xy[i].second - xy[i - 1].second);
}

}  // namespace

double attention_rate(const Hardware& hw, double T, double D, bool dropout, bool fp32) {
  // Along T for each measured D, then along D between those (the points bench kernels writes form a grid).
  std::map<double, std::vector<std::pair<double, double>>> by_d;  // D -> (T, rate), sorted by T
  for (const AttentionPoint& p : hw.attention_points)
    if (p.dropout == dropout && p.T > 0 && p.D > 0) by_d[p.D].emplace_back(p.T, p.flops_per_s);
  if (by_d.empty()) return (fp32 ? hw.peak_flops_fp32 : hw.peak_flops) * hw.attention_efficiency;
  std::vector<std::pair<double, double>> along_d;
  for (auto& [d, points] : by_d) {
    std::sort(points.begin(), points.end());
    along_d.emplace_back(d, interpolate_log(points, T));
  }
  return interpolate_log(along_d, D);
}

}  // namespace mt::plan
