// checkpointing.h: what a training run puts into a checkpoint and takes back out of it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/io/progress.h"
#include "core/config/config.h"
#include "core/optim/optimizer.h"
#include "core/tensor/parameter.h"
#include "models/gpt.h"

namespace mt::app {

// Tensor names: "model.<param>" (fp32 master weights), "optimizer.exp_avg.<param>",
// "optimizer.exp_avg_sq.<param>"; only the parameters `keep` accepts (all when it is empty).
std::vector<TensorSlice> optimizer_tensors(const std::vector<OptimizerSlot>& slots,
                                           const std::function<bool(const Parameter&)>& keep = {});

// The checkpoint tensor of a MoE layer's expert bias (model.moe.bias_update_rate): "state.expert_bias.<prefix>",
// (E) f32, prefix the layer's ("layers.3.mlp"); not a parameter (no gradient, no optimizer state).
inline std::string expert_bias_tensor(const std::string& layer_prefix) { return "state.expert_bias." + layer_prefix; }

// What a partial load (checkpoint.allow_partial_load) took from the checkpoint and what it left at its
// initial value, one "tensor (reason)" each.
struct PartialLoad {
  std::vector<std::string> loaded, skipped;
};

// The model keys that fix tensor shapes or their meaning (arch, num_layers, hidden_size, num_heads,
// ffn_hidden_size, max_position_embeddings, vocab_size, tie_embeddings, num_query_groups, rotary_base, qkv_bias) whose
// value differs between the config
// a checkpoint stored (`stored_yaml`, to_yaml of the saving run) and this run's `run_yaml`: one
// "model.KEY: OLD -> NEW" each, empty when they agree. Throws CheckpointError when stored_yaml has no model section.
std::vector<std::string> model_shape_differences(const std::string& stored_yaml, const std::string& run_yaml,
                                                 const std::string& dir);

// The finetune.lora keys that fix which adapters a checkpoint holds and what they compute (rank, alpha, targets)
// whose value differs between the config a checkpoint stored (`stored_yaml`; no finetune.lora: rank 0) and this
// run's `lora`: one "finetune.lora.KEY: OLD -> NEW" each (targets saying which adapters one side lacks), empty when
// they agree. Dropout may change: it shapes training, not the adapters. Resuming past a difference would drop
// adapters and their Adam state, or fail on shapes, or rescale what the adapters learned.
std::vector<std::string> lora_differences(const std::string& stored_yaml, const LoraConfig& lora);

// finetune.lora: the frozen base a run's adapters are trained on, as its checkpoints record it (state values
// lora_base_checkpoint and lora_base_weights): training.init_from's checkpoint and the stored_checksum of its
// "model." tensors, or the seeded initialization (no training.init_from) and its seed.
struct LoraBase {
  std::string checkpoint;  // the base's checkpoint directory as resolved then; empty: the seeded initialization
  std::string weights;     // "crc32 0123abcd" of the base's stored weights, or "training.seed N"
  std::string describe() const;
};
LoraBase lora_base_of(const CheckpointReader& base);
LoraBase seeded_lora_base(int64_t seed);
void record_lora_base(CheckpointState& s, const LoraBase& base);
// Adapters fit only the base they were trained on. Refuses (CheckpointError) the checkpoint `adapters` (directory
// `dir`) when the base it records differs from `now`, the base training.init_from: `init_from` gives this run,
// naming that key, what was recorded and what is found now. Where only the path differs (a copy of the same
// weights) it is said. A checkpoint saved before the record: the saving run's training.init_from against
// `init_from`, a warning when they differ.
void check_lora_base(const CheckpointState& adapters, const std::string& dir, const LoraBase& now,
                     const std::string& init_from);

// Reads "model.<param>" for every parameter into its value (dtype converted). Shapes must match the
// checkpoint's global shapes; throws CheckpointError naming the tensor otherwise.
void load_parameters(const CheckpointReader& reader, const std::vector<Parameter*>& params);
// The saved model for eval and generate (cfg: whole_model_config's), in `dtype` on `device`, with its weights: every
// parameter from `reader`; a LoRA checkpoint's model has its adapters, read from it, and its frozen base is the
// saving run's training.init_from (unset: the seeded initialization, which the model is built with), checked
// against the base the checkpoint records (check_lora_base). Throws CheckpointError naming what is missing.
std::unique_ptr<GptModel> saved_model(const CheckpointReader& reader, const Config& cfg, DType dtype, Device device);

// Reads the master weights and both Adam moments of every slot (whole per-parameter tensors of this rank's
// model-parallel slice). The caller casts the masters into the values.
// With `partial`, a tensor the checkpoint lacks or holds in another shape is skipped (left as it is) and
// recorded there instead of being an error. `progress` hears of each tensor read.
void load_optimizer(const CheckpointReader& reader, const std::vector<OptimizerSlot>& slots,
                    PartialLoad* partial = nullptr, const ProgressHook& progress = {});

// Reads only the master weights "model.<param>" of every slot (strictly: each must be there in its shape) and
// zeroes both Adam moments: a fresh optimizer on a checkpoint's weights (training.init_from).
void load_model_weights(const CheckpointReader& reader, const std::vector<OptimizerSlot>& slots);

// The config of the run that saved the checkpoint `reader` (directory `dir`), with the whole model on this one
// rank: no tensor, pipeline or data parallelism, `micro_batch` samples per step, on `device` (auto | cuda | cpu).
// What eval and generate run.
Config whole_model_config(const CheckpointReader& reader, const std::string& dir, int64_t micro_batch,
                          const std::string& device);

// Records which tokenizer made the training data: copies the sidecar of data.train's first prefix
// (PREFIX.tokenizer.yaml, see core/tokenizer/tokenizer_sidecar.h) into the checkpoint's temporary directory
// `tmp_dir` as tokenizer.yaml, which `ckpt export --format hf` reads. Nothing when data.train is empty or that
// prefix has no sidecar. Rank 0 calls it before committing.
void write_checkpoint_tokenizer(const std::string& tmp_dir, const std::vector<std::string>& data_train);

// Resuming checkpoint `dir` on data of another tokenizer would give its learned ids other meanings: its
// tokenizer.yaml and the sidecar of data.train's first dataset must agree (check_same_tokenizer: DataError naming
// both files and what differs, a warning with data.allow_tokenizer_change). Nothing for synthetic data, or when
// either record is missing.
void check_checkpoint_tokenizer(const std::string& dir, const Config& cfg);

}  // namespace mt::app
