// time_model.h: predicted time of one training step of a resolved config on a Hardware, split as a profile
// would split it, and the throughput figures the training log prints (tokens/s, TFLOP/s per GPU, MFU).
//
// What it assumes of the code (app/train/trainer.cpp, models/, parallel/ at this commit): tensor-parallel
// reductions are synchronous (no overlap with compute); with sequence parallelism backward gathers ln1 and ln2
// again; pipeline transfers are waited on before each compute (exposed); without ZeRO the data-parallel
// buckets reduce during the last microbatch's backward; with ZeRO the gradients are reduce-scattered and the
// values all-gathered after backward, exposed; full recomputation runs each layer's forward again in backward; a
// mixture-of-experts layer routes balanced (N top_k / E rows per expert, each expert its own GEMMs) and, with
// expert parallelism (E / EP experts a rank, each N top_k EP / E rows), waits on its dispatch and combine
// all-to-alls (exposed; inter-node where an EP group's ranks lie in more than one node), and the experts' gradients
// reduce over the expert-data-parallel ranks; with parallel folding (ETP < TP) each fold of a tensor-parallel group
// computes and sends 1 / folds of the choices; with context parallelism (parallel.context) each rank's layers run
// on its seq_length / CP tokens but its attention meets every rank's keys (1 / CP of the causal work), the ring's
// key/value blocks overlapping the previous block's attention and its key/value gradients' hops exposed (or one
// all-gather, and a reduce-scatter of the gradients, exposed), and the gradients reduce over data x context.
#pragma once
#include <string>

#include "core/config/config.h"
#include "plan/hardware.h"

namespace mt::plan {

struct StepTime {
  // Seconds per iteration, on the slowest pipeline stage.
  double compute = 0;  // GEMMs, attention, elementwise of all microbatches (recomputation included)
  double gemm = 0, attention = 0, elementwise = 0;  // the parts of compute
  double tp_comm = 0;                               // tensor/sequence-parallel collectives (exposed)
  double ep_comm = 0;    // the MoE layers' expert-parallel all-to-alls (exposed; 0 without expert parallelism)
  double cp_comm = 0;    // context parallelism's key/value (and gradient) transfers (exposed)
  double pp_comm = 0;    // pipeline sends and receives (exposed)
  double bubble = 0;     // pipeline fill and drain
  double dp_comm = 0;    // data-parallel gradient reduction (and ZeRO's all-gather), exposed part
  double optimizer = 0;  // grad norm, AdamW, zeroing the gradient buffer
  double total = 0;
  // Throughput, as the training log computes it (model FLOPs, Megatron's formula, no recomputation).
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;  // with recomputation counted (what Narayanan et al. 2021 report)
  double mfu = 0;                      // model TFLOP/s per GPU over the device's peak
  // Bytes one token sends over one MoE layer's all-to-alls in a step: 2 (dispatch and combine) x 2 (forward and
  // backward) x top_k x C x dtype bytes x (EP - 1) / EP; 0 for a dense model or at EP 1.
  double all_to_all_bytes_per_token = 0;
};

StepTime predict_time(const Config& c, const Hardware& hw);

}  // namespace mt::plan
