// pipeline_executor.h: runs one stage's instruction list (parallel/pipeline/schedule.h) against the model chunks this
// rank holds, moving activations and their gradients between stages with asynchronous send/recv.
#pragma once
#include <vector>

#include "core/tensor/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/schedule.h"

namespace mt {

// What the executor needs from the model: forward and backward of one (microbatch, chunk).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // `input` is the received activation (undefined for the first virtual stage, which embeds tokens). Returns
  // the output activation (undefined for the last virtual stage, which computes the loss itself).
  virtual Tensor forward(int microbatch, int chunk, const Tensor& input) = 0;
  // `grad` is the received gradient of the output (undefined for the last virtual stage). Returns the
  // gradient of the input (undefined for the first virtual stage).
  virtual Tensor backward(int microbatch, int chunk, const Tensor& grad) = 0;
  // A split backward (zero-bubble schedules): the input gradient now, the weight gradients when
  // backward_weight(microbatch, chunk) comes. Stages that cannot split refuse.
  virtual Tensor backward_input(int microbatch, int chunk, const Tensor& grad);
  virtual void backward_weight(int microbatch, int chunk);
  // Shape, dtype and device of the activations that cross between stages.
  virtual Shape activation_shape() const = 0;
  virtual DType activation_dtype() const = 0;
  virtual Device activation_device() const { return Device::cpu; }
};

struct PipelinePlacement {
  Communicator* comm = nullptr;  // the pipeline group; its rank r is stage r
  int stage = 0;
  int stages = 1;
  int chunks = 1;  // model chunks (virtual stages) per rank
  ChunkPlacement placement =
      ChunkPlacement::looped;  // which virtual stage each chunk is (parallel/pipeline/schedule.h)
  bool waits_on_use = false;   // wait for a batch only when a compute consumes what it received (schedule.h)
};

// Runs `program` (this stage's list from build_schedule, training or forward_only). Consecutive send/recv
// instructions are posted together and waited for together, as the schedule checker assumes, in the
// program's order (NCCL matches transfers between two ranks by that order). forward_only programs need no
// backward(): it is never called for them. Throws CommError on transfer failures.
void execute_pipeline(const std::vector<PipeInstr>& program, PipelineStage& stage, const PipelinePlacement& at);

}  // namespace mt
