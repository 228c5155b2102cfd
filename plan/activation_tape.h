// activation_tape.h: the activation and workspace bytes one model chunk allocates and frees for one
// microbatch, replayed in the order of models/transformer_layer.cpp, models/moe_mlp.cpp (a MoE layer's MLP, on
// balanced routing) and models/gpt.cpp (and the trainer's and pipeline executor's buffers around them), so the
// planner's peaks are the allocator's peaks.
//
// Keep it in step with the code: each function below names the code it mirrors, and each alloc/free line the
// tensor it stands for. A change in what a layer keeps for backward is a change of a line or two here.
#pragma once
#include <cstdint>

#include "models/transformer_layer.h"
#include "plan/model_shapes.h"

namespace mt::plan {

// Sizes of one microbatch on one rank (elements, except bytes_per_value).
struct TapeShapes {
  double B = 1, T = 1;           // micro batch, sequence (this rank's T / cp tokens with context parallelism)
  ModelShapes m;                 // the architecture's widths on this rank (hidden C, heads, QKV, fc1, ffn, vocabulary)
  double tp = 1;                 // tensor-parallel size
  bool sp = false;               // sequence parallelism (over tp > 1)
  double d = 4;                  // bytes of the compute dtype
  bool cpu = true;               // CPU backend: fp32 GEMM widening and Gloo's fp32 reduction copies
  bool recompute = false;        // full activation recomputation
  int64_t recompute_layers = 0;  // of each chunk's layers, the first this many recomputed (0: all)
  SelectiveRecompute selective;  // else these tensors (training.recompute: selective, models/transformer_layer.h)
  bool split_backward = false;   // a zero-bubble schedule: backward's weight-gradient GEMMs deferred to W
  double cp = 1;                 // context-parallel size (parallel.context): each rank holds T = seq_length / cp
  bool cp_allgather = false;     // parallel.context_comm: allgather (else p2p, the ring)
  bool recomputes(int64_t layer_in_chunk) const {
    return recompute && (recompute_layers == 0 || layer_in_chunk < recompute_layers);
  }
  double N() const { return B * T; }
  double Ns() const { return sp ? B * T / tp : B * T; }  // rows outside the tensor-parallel regions
};

// What one operation (a chunk's forward or backward of one microbatch) does to memory, relative to its start.
struct OpProfile {
  double peak_act = 0;  // highest activation bytes above the start
  double peak_ws = 0;   // highest transient workspace bytes
  double peak_sum = 0;  // highest activation + workspace above the start
  double delta = 0;     // activation bytes left afterwards minus at the start
};

struct ChunkSpec {
  bool has_embedding = false;
  bool has_head = false;
  int64_t layer_begin = 0;  // the global index of its first transformer layer
  int64_t layers = 0;
  bool pipelined = false;  // run through the pipeline executor (else the trainer's plain microbatch loop)
};

struct ChunkProfile {
  OpProfile forward, backward;  // with split_backward, backward is B: the input gradient, W's operands kept
  OpProfile weight;             // W (split_backward): the weight-gradient GEMMs, which free the operands B kept
  double output = 0;            // bytes of the output activation sent on after forward (freed at the next flush)
  double input_grad = 0;        // bytes of the input gradient sent back after backward (likewise)
  double message = 0;           // bytes of one received activation or gradient
  // The backward unsplit: what a zero-bubble schedule's B and W run as where they run as one (parallel/pipeline/schedule.h).
  OpProfile whole;
};

ChunkProfile profile_chunk(const TapeShapes& s, const ChunkSpec& chunk);

}  // namespace mt::plan
