// parameter.h: a model parameter as the optimizer, gradient buffers and checkpoints see it.
#pragma once
#include <string>
#include <vector>

#include "core/tensor/tensor.h"

namespace mt {

// The groups besides data parallelism whose ranks each hold a part of a parameter's gradient, summed once
// backward is done (parallel/sharding/grad_buffer.h, GradBuffer::finalize), set where the model creates the parameter.
struct GradSums {
  bool tensor = false;     // a replica used on sequence shards (sequence parallelism): each TP rank's gradient
                           // covers its positions only
  bool embedding = false;  // the tied word embeddings: the first stage's table and the last stage's copy
};

// How a parameter is initialised; every value is a pure function of (seed, name, global index).
// uniform: U(-init_std, init_std) (init_std the bound: LoRA's A, kaiming-uniform as PEFT draws it).
enum class Init { normal, zeros, ones, uniform };

struct Parameter {
  std::string name;            // "layers.3.mlp.fc1.weight": stable across layouts, used in checkpoints
  Tensor value;                // this rank's slice, compute dtype
  Tensor grad;                 // same shape, f32, accumulated over microbatches
  Shape global_shape;          // shape of the whole tensor
  std::vector<int64_t> start;  // where this rank's slice starts in the global tensor (all zeros: whole)
  Init init = Init::normal;
  float init_std = 0.f;
  bool weight_decay = true;      // false for biases and norm parameters (Megatron's rule)
  bool tensor_parallel = false;  // this rank holds a slice (split across the tensor-parallel group);
                                 // false: every TP rank holds the whole tensor (a replica)
  GradSums grad_sums;            // groups that sum its gradient (besides data parallelism)
  bool tied_copy = false;        // the last pipeline stage's copy of the tied word embeddings: its gradient
                                 // is summed with the first stage's; it is not counted in the grad norm
                                 // nor written to checkpoints (the first stage's is)
  bool expert = false;           // one of a MoE layer's experts: held by one expert-parallel rank, its gradient
                                 // summed over the expert-data-parallel group (the data-parallel ranks holding the
                                 // same experts) instead of the data-parallel group
  bool frozen = false;           // not trained (LoRA's base weights): no gradient (grad is empty), no optimizer
                                 // state, no weight-gradient GEMM; backward still passes gradients through it
  bool vocabulary_rows = false;  // dim 0 is the padded vocabulary (word embeddings, LM head): its length depends
                                 // on the layout (a multiple of 128 x TP), so a checkpoint of another layout
                                 // matches it on the other dims and gives the rows both hold
};

// Creates a parameter holding the whole global tensor, initialised with `init`; value in `dtype`.
Parameter make_parameter(std::string name, Shape shape, DType dtype, Init init, float init_std, uint64_t seed);

// A block of a global tensor: shape `local`, starting at index `start` of a tensor of shape `global`.
struct TensorBlock {
  Shape global;
  std::vector<int64_t> start;
  Shape local;
};

// The block of a global tensor, initialised with exactly the values the whole tensor holds there
// (tensor_parallel set when it is not the whole).
Parameter make_parameter_slice(std::string name, TensorBlock block, DType dtype, Init init, float init_std,
                               uint64_t seed);

// Where make_parameter and make_parameter_slice put what they make on this thread while one is alive: on the meta
// device (core/meta/meta.h), with no values drawn and nothing on the host, for a model that is only measured (the
// planner's). Without one they make parameters on the host, initialised.
class ParametersOnMeta {
 public:
  ParametersOnMeta();
  ~ParametersOnMeta();
  ParametersOnMeta(const ParametersOnMeta&) = delete;
  ParametersOnMeta& operator=(const ParametersOnMeta&) = delete;

 private:
  bool outer_;
};

// Moves a parameter made on the host (its value and gradient) to `device`; nothing for the CPU.
void move_to_device(Parameter& p, Device device);

// Fills `out` (f32, host) with the initial values of the region of `p` starting at p.start.
void initial_values(const Parameter& p, uint64_t seed, Tensor& out);

}  // namespace mt
