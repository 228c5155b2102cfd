// fp8_state.h: training.fp8 in the training loop (docs/fp8.md): the transformer layers' GEMMs wired to one fp8
// context per rank, and its delayed-scaling state in checkpoints, layout-free (per logical linear, not per shard).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/config/config.h"
#include "models/gpt.h"
#include "parallel/layers/fp8_linear.h"

namespace mt::app {

// The fp8 context of this rank's chunks, their layers' linears registered (all but the model's first and last
// layer with first_last_bf16), or null when training.fp8 is off. `context_group`: the context-parallel group (null
// without), over which the inputs' and output gradients' amaxes are reduced too.
std::shared_ptr<Fp8Context> enable_fp8(const Config& cfg, const std::vector<std::unique_ptr<GptModel>>& chunks,
                                       Device device, Communicator* context_group);

// The checkpoint tensors of the delayed recipe (none for current scaling, which keeps no state):
// state.fp8.<linear>.scale (3) and state.fp8.<linear>.amax_history (3, H) per linear (input, weight, output
// gradient), and state.fp8.history_filled (1) when `with_count` (one writer of the job).
void append_fp8_tensors(const Fp8Context& ctx, bool with_count, std::vector<TensorSlice>& out);
// Restores them from `reader` (checkpoint `dir`). A checkpoint without them (saved without the delayed recipe)
// starts the histories empty, with a warning; another history length is refused, naming the key.
void load_fp8_tensors(Fp8Context& ctx, const CheckpointReader& reader, const std::string& dir);

}  // namespace mt::app
