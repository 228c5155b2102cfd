// checkpointing.h: what a training run puts into a checkpoint and takes back out of it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/optimizer.h"
#include "core/parameter.h"

namespace mt::app {

// Tensor names: "model.<param>" (fp32 master weights), "optimizer.exp_avg.<param>",
// "optimizer.exp_avg_sq.<param>"; only the parameters `keep` accepts (all when it is empty).
std::vector<TensorSlice> optimizer_tensors(const std::vector<AdamW::Slot>& slots,
                                          const std::function<bool(const Parameter&)>& keep = {});

// Reads "model.<param>" for every parameter into its value (dtype converted). Shapes must match the
// checkpoint's global shapes; throws CheckpointError naming the tensor otherwise.
void load_parameters(const CheckpointReader& reader, const std::vector<Parameter*>& params);
// Reads the master weights and both Adam moments of every slot (whole per-parameter tensors of this rank's
// model-parallel slice). The caller casts the masters into the values.
void load_optimizer(const CheckpointReader& reader, const std::vector<AdamW::Slot>& slots);

// A required integer / float value of the checkpoint state; throws CheckpointError naming the key.
int64_t state_int(const CheckpointState& s, const std::string& key, const std::string& dir);
double state_double(const CheckpointState& s, const std::string& key, const std::string& dir);

}  // namespace mt::app
