// hardware.h: the device and network rates the time model reads: built-in tables for the GPUs from their
// public figures, or a rates file written by `megatrain bench kernels` (measured on this machine).
#pragma once
#include <string>
#include <vector>

namespace mt::plan {

// One measured GEMM: (m, n, k) in the compute dtype and its rate.
struct GemmPoint {
  double m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

// One measured causal attention (forward + backward) at sequence T and head dimension D, with dropout on the
// probabilities or without, and its rate (FLOP/s, counting the backward as 2.5 forwards).
struct AttentionPoint {
  double T = 0, D = 0;
  bool dropout = false;
  double flops_per_s = 0;
};

// Seconds per element of the elementwise ops that are not simply bandwidth-bound on every device (the CPU's tanh
// in GELU, dropout's counter-based random numbers, the norms' row reductions, the softmax's exp), measured by
// `bench kernels` at a typical activation size. 0 (the built-in GPU tables): bandwidth-bound, bytes alone count.
struct ElementwiseCosts {
  double norm_forward = 0, norm_backward = 0;                    // LayerNorm / RMSNorm, per element of (N, C)
  double act_forward = 0, act_backward = 0;                      // GELU (or SwiGLU), per output element
  double dropout_forward = 0, dropout_backward = 0;              // residual dropout-add (p > 0) and its backward
  double cross_entropy_forward = 0, cross_entropy_backward = 0;  // per logit
};

struct Hardware {
  std::string name;            // "a100-80gb", "cpu", ...
  bool is_gpu = true;          // false: the CPU backend (and its memory model)
  double memory_bytes = 0;     // per device
  double peak_flops = 0;       // dense FLOP/s in the compute dtype (bf16 on GPUs); MFU is against this
  double peak_flops_fp32 = 0;  // for fp32 runs (GPUs: TF32 off, the FP32 pipe)
  double hbm_bytes_per_s = 0;  // memory bandwidth
  // GEMM rate = peak * gemm_efficiency * prod over (m, n, k) of d / (d + gemm_half_dim): big GEMMs run at
  // gemm_efficiency of peak, a dimension of gemm_half_dim halves it. Measured points (bench kernels), when
  // present, replace the curve's efficiency near their shapes.
  double gemm_efficiency = 0.8;
  double gemm_half_dim = 64;
  std::vector<GemmPoint> gemm_points;
  double attention_efficiency = 0.5;             // causal flash attention, fraction of peak (forward; backward alike)
  std::vector<AttentionPoint> attention_points;  // measured; replace the efficiency near their shapes
  double elementwise_efficiency = 0.7;           // fraction of hbm_bytes_per_s that norms, dropout and adds reach
  ElementwiseCosts elementwise_costs;
  double kernel_overhead_s = 4e-6;  // per kernel launch (not hidden when kernels are short)
  // CPU only: the cores the ranks of one machine share (bench kernels counts them); more ranks than cores
  // slow every rank's compute by ranks / cores. 0: a device per rank (GPUs).
  int cores = 0;
  int gpus_per_node = 8;
  double intra_node_bytes_per_s = 0;  // per GPU per direction (NVLink)
  double intra_node_latency_s = 0;
  double inter_node_bytes_per_s = 0;  // per GPU (its InfiniBand NIC)
  double inter_node_latency_s = 0;
  double collective_efficiency = 0.8;  // what NCCL's rings reach of the link bandwidth
};

// The built-in tables: a100-80gb, h100-80gb, h200-141gb, cpu. Throws naming the known ones.
Hardware builtin_hardware(const std::string& name);
std::vector<std::string> builtin_hardware_names();

// A rates file (YAML, as bench kernels writes it): every Hardware field by name, gemm_points as a list of
// [m, n, k, flops_per_s]. Keys not given keep `base`'s values. Throws with the file and key on bad input.
Hardware read_rates(const std::string& path, Hardware base);
void write_rates(const std::string& path, const Hardware& hw);

// The GEMM rate for one shape (FLOP/s) under `hw`'s curve and measured points.
double gemm_rate(const Hardware& hw, double m, double n, double k, bool fp32);
// training.fp8's GEMM rate over bf16's on `hw`: 2 on fp8 tensor cores (Hopper: the h100 and h200 tables, and a
// GPU table naming "h100", "h200", "h800", "gh200", "b200" or "b100"), 1 elsewhere (an A100 has none; the CPU emulates).
double fp8_gemm_speedup(const Hardware& hw);
// The causal attention rate (FLOP/s) at sequence T and head dimension D: interpolated in log T and log D between
// the measured points of the same dropout kind (the nearest end's rate beyond them), else attention_efficiency
// of the peak.
double attention_rate(const Hardware& hw, double T, double D, bool dropout, bool fp32);

}  // namespace mt::plan
