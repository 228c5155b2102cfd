// config.h: the typed run configuration, read from YAML with every key checked, and its derived values.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/rope_scaling.h"
#include "core/config/config_enums.h"
#include "core/optim/lr_schedule.h"

namespace mt {

// Every config problem: the message names the source, the key path and the rule, e.g.
// "gpt.yaml: parallel.tensor: 3 does not divide model.num_heads=16".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// model.moe: mixture-of-experts MLPs (absent, or num_experts 0: every layer is dense). The router's logits, scores
// and top-k are fp32, ties broken by the lower expert index, so routing never depends on the layout.
struct MoeConfig {
  int64_t num_experts = 0;  // 0: dense
  int64_t top_k = 2;        // experts per token
  // Which layers are MoE: every layer_freq-th (layers 0, k, 2k, ...), or layer_pattern (one 0/1 per layer).
  int64_t layer_freq = 1;
  std::vector<int64_t> layer_pattern;  // empty: layer_freq decides
  int64_t ffn_hidden_size = 0;         // each expert's MLP width; 0: model.ffn_hidden_size (fine-grained: smaller)
  int64_t shared_expert_ffn_hidden_size = 0;    // a shared expert every token passes (DeepSeek, Qwen); 0: none
  MoeScore score_function = MoeScore::softmax;  // softmax then top-k (Mixtral) | sigmoid (DeepSeek-V3)
  bool norm_topk_prob = true;                   // the top-k weights divided by their sum
  double aux_loss_coeff = 0;                    // Switch/GShard load-balancing loss; 0: off
  double z_loss_coeff = 0;                      // router z-loss; 0: off
  double bias_update_rate = 0;                  // DeepSeek-V3's aux-loss-free expert bias update per step; 0: off
  double capacity_factor = 0;  // tokens per expert capped at factor * N * top_k / num_experts; 0 (none): dropless
  // Not a YAML key: `megatrain plan --moe-imbalance F` (a run's moe_peak_received); 0: not given. Training ignores it.
  double plan_imbalance = 0;

  bool enabled() const { return num_experts > 0; }
  // Whether layer `layer` (0-based, of the whole model) has a MoE MLP: layer_pattern's entry, else every
  // layer_freq-th layer from layer 0.
  bool is_moe_layer(int64_t layer) const {
    if (!enabled()) return false;
    if (!layer_pattern.empty()) return layer_pattern.at(static_cast<size_t>(layer)) != 0;
    return layer % layer_freq == 0;
  }
  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::gpt;         // gpt | llama
  int64_t num_layers = 0;        // required
  int64_t hidden_size = 0;       // required
  int64_t num_heads = 0;         // required; divides hidden_size
  int64_t num_query_groups = 0;  // key/value heads (grouped-query attention, llama only); 0: num_heads
  int64_t head_dim = 0;          // a head's width; auto (0) resolves to hidden_size / num_heads; llama may set another
  int64_t ffn_hidden_size = 0;   // 0: 4 * hidden_size (gpt), Megatron's SwiGLU default (llama)
  int64_t seq_length = 0;        // required
  int64_t max_position_embeddings = 0;  // 0: seq_length; >= seq_length
  int64_t vocab_size = 0;               // required (257 for the byte tokenizer); auto: data.train[0]'s tokenizer
  int64_t make_vocab_size_divisible_by = 128;
  bool tie_embeddings = true;         // default false for llama
  float dropout = 0.1f;               // hidden dropout (after attention proj and fc2, and on the embeddings)
  float attention_dropout = 0.1f;     // on the attention probabilities
  float layernorm_eps = 1e-5f;        // the epsilon of LayerNorm (gpt) or RMSNorm (llama)
  double rotary_base = 10000;         // llama: the rotary embeddings' theta (HF's rope_theta)
  bool qkv_bias = false;              // llama: biases on the query, key and value projections (Qwen2's; Megatron's
                                      // add_qkv_bias); gpt has biases on every linear
  RopeScaling rope_scaling;           // llama: the rotary embeddings scaled for a longer context (Llama 3.1's llama3)
  bool qk_norm = false;               // llama: each query and key head RMS-normalized before the rotary embeddings
                                      // (Qwen3's q_norm / k_norm, a weight (head_dim) each)
  int64_t sliding_window = 0;         // > 0: each query sees only its last this many tokens, itself included
                                      // (Mistral's, Qwen2's sliding layers); 0: every earlier token
  int64_t full_attention_layers = 0;  // with sliding_window: the first this many layers see every earlier token
                                      // (Qwen2's max_window_layers); the window is the later layers'
  float init_std = 0.02f;
  MoeConfig moe;
  // derived
  int64_t padded_vocab_size = 0;  // vocab_size rounded up to divisible_by * parallel.tensor

  // Key/value heads: num_query_groups, or num_heads when it is 0.
  int64_t kv_heads() const { return num_query_groups > 0 ? num_query_groups : num_heads; }
  // The sliding window of layer `layer` (global index): sliding_window past the full-attention layers, else 0.
  int64_t window_of(int64_t layer) const { return layer >= full_attention_layers ? sliding_window : 0; }
  // The attention's work over the layers against causal attention's (1 without a window): a query sees about
  // seq_length / 2 keys causally, W - W^2 / (2 seq_length) in a window W < seq_length (the first W rows see fewer).
  double attention_work_fraction() const {
    if (sliding_window == 0 || sliding_window >= seq_length || num_layers == 0) return 1.0;
    const double S = static_cast<double>(seq_length), W = static_cast<double>(sliding_window);
    const double windowed = static_cast<double>(num_layers - full_attention_layers);
    const double band = (W - W * W / (2 * S)) / (S / 2);
    return (static_cast<double>(full_attention_layers) + windowed * band) / static_cast<double>(num_layers);
  }

  bool operator==(const ModelConfig&) const = default;
};

struct ParallelConfig {
  int64_t tensor = 1;
  int64_t pipeline = 1;
  int64_t virtual_pipeline = 1;  // > 1: interleaved 1F1B
  int64_t data = 0;              // 0 means "auto": world_size / (tensor * pipeline)
  bool sequence_parallel = false;
  bool distributed_optimizer = false;  // the alias of shard: optimizer (read it through `shard`)
  // none | optimizer (ZeRO-1) | gradients (ZeRO-2; parameters: ZeRO-3, planned). distributed_optimizer: true with
  // shard none becomes optimizer; with gradients it is refused as a conflict.
  ShardStage shard = ShardStage::none;
  // Hybrid sharding (HSDP, parallel/sharding/hybrid_shard.h): the stage shards inside groups of this many consecutive
  // data-parallel ranks and replicates across the groups; 0 (auto): the whole data-parallel group.
  int64_t shard_group = 0;
  std::vector<int64_t> layers_per_stage;  // empty: num_layers split evenly
  double timeout_s = 300;                 // bound on every rendezvous and collective wait (a dead rank ends the job)
  // Gloo groups whose ranks share a host run collectives of at most 64 KiB per rank through shared memory
  // (parallel/comm/shared_rounds.h); false keeps every byte on Gloo's TCP transport.
  bool gloo_shared_memory = true;
  int64_t grad_bucket_size = 40000000;  // elements per data-parallel gradient bucket, reduced during backward
  BackendChoice backend = BackendChoice::automatic;  // auto (nccl on cuda, gloo on cpu) | nccl | gloo (host-staged)
  // auto | 1f1b | interleaved (needs virtual_pipeline > 1) | zb-h1 (zero-bubble: split backwards, needs
  // pipeline > 1 and virtual_pipeline 1); parallel/pipeline/schedule.h builds each.
  PipelineSchedule pipeline_schedule = PipelineSchedule::automatic;
  // Expert parallelism (model.moe): experts split over this many ranks, drawn from the data-parallel ranks (and,
  // with expert_tensor < tensor, from the tensor ranks: Megatron's parallel folding); expert_tensor is the expert
  // layers' own tensor-parallel degree (0: parallel.tensor).
  int64_t expert = 1;
  int64_t expert_tensor = 0;
  // Context parallelism: each sample's sequence is cut into 2 * context chunks and context rank r holds chunks r
  // and 2 * context - 1 - r (the same causal work on every rank); attention meets the other chunks' keys and
  // values through context_comm. Ranks order tensor, context, data, pipeline (Megatron's tp-cp-dp-pp).
  int64_t context = 1;
  ContextComm context_comm = ContextComm::p2p;
  // derived
  int64_t world_size = 1;

  // The experts' tensor-parallel size (expert_tensor, or tensor when 0) and the ranks of each stage holding the
  // same experts' same slices (the expert-data-parallel group: tensor x data / (expert x that)).
  int64_t experts_tensor() const { return expert_tensor > 0 ? expert_tensor : tensor; }
  // The expert-data-parallel size: each stage's tensor x context x data ranks refold as expert_tensor x expert x
  // expert_data (parallel/comm/topology.h).
  int64_t expert_data() const { return tensor * context * data / (expert * experts_tensor()); }
  // The ranks that hold the same weights and sum their gradients: data x context.
  int64_t data_context() const { return data * context; }
  // Hybrid sharding (shard_group below data): the experts' shard group is the expert-data-parallel ranks inside one
  // dense shard group (tensor x shard_group x context ranks of the stage's fold), at least one: with expert x
  // experts_tensor() above that, an expert's replicas all lie in different shard groups. The whole expert-data
  // group without hybrid sharding. The config refuses a fold that does not divide (config_rules_parallel.cpp).
  int64_t expert_shard_size() const {
    if (shard_group <= 0 || shard_group >= data) return expert_data();
    return std::max<int64_t>(1, tensor * shard_group * context / (expert * experts_tensor()));
  }

  bool operator==(const ParallelConfig&) const = default;
};

struct LossScaleConfig {
  double initial = 4294967296.0;  // 2^32
  double min = 1.0;
  int64_t window = 1000;
  int64_t hysteresis = 2;

  bool operator==(const LossScaleConfig&) const = default;
};

// training.loss_spike: a loss spike detector over running statistics of the per-iteration loss. It keeps an
// exponential moving mean and variance of the loss (smoothing 2 / (window + 1), about the last `window`
// iterations); after `warmup_iters` iterations have fed it, an iteration whose loss is above mean + sigmas * stddev
// AND above mean * ratio is a spike (both: sigma alone flags tiny wiggles on a flat, quiet curve; the ratio
// alone flags the noise of a small batch). A spike enters the statistics clipped to that threshold, so one
// spike does not blind the detector and a lasting level shift is followed within a few windows. Each spike is
// logged as a warning and a metrics.jsonl record {"event": "loss_spike", ...}. action: log (nothing else;
// read with the interval's losses, no extra device read), skip (the step's update is not applied: counted as
// a skipped iteration, its data consumed), stop (as skip, then save a checkpoint and exit with status 1: a
// run stopped for a human to look at must not read as finished to a scheduler or a job chain; resuming
// continues after the spike's batch). skip and stop read the step's loss with the optimizer's grad-norm read
// and agree on it over the pipeline and data-parallel ranks (one small host exchange a step). The statistics
// are saved in checkpoints.
struct LossSpikeConfig {
  SpikeAction action = SpikeAction::log;  // log | skip | stop
  int64_t window = 100;                   // iterations the running mean and variance cover (exponential smoothing)
  int64_t warmup_iters = 100;             // iterations fed before any spike is flagged
  double sigmas = 6.0;                    // a spike is above mean + sigmas * stddev ...
  double ratio = 1.2;                     // ... and above mean * ratio

  bool operator==(const LossSpikeConfig&) const = default;
};

// training.fp8 (docs/fp8.md): the GEMMs of the transformer layers (QKV, attention projection, fc1, fc2) take fp8
// inputs scaled per tensor, with training.precision bf16 (everything else stays bf16, masters fp32). format none: off;
// e4m3: every GEMM input e4m3; hybrid: e4m3 forward, the output gradients e5m2. recipe current: each GEMM's inputs
// scaled by their own amax (the default: needs no history, so nothing lags a changing tensor); delayed: scales
// from an amax history of the previous iterations (Transformer Engine's DelayedScaling), updated once per iteration.
struct Fp8Config {
  Fp8Format format = Fp8Format::none;
  Fp8Recipe recipe = Fp8Recipe::current;
  int64_t amax_history_len = 1024;                   // delayed: iterations the history keeps
  Fp8AmaxAlgo amax_compute_algo = Fp8AmaxAlgo::max;  // delayed: the history's max, or its newest entry
  int64_t margin = 0;                                // scale = fp8_max / amax / 2^margin
  bool first_last_bf16 = false;                      // the model's first and last layers stay bf16

  bool enabled() const { return format != Fp8Format::none; }
  bool operator==(const Fp8Config&) const = default;
};

struct TrainingConfig {
  // Fine-tuning: start from the model weights of this checkpoint (a megatrain checkpoint directory, its save_dir
  // (its latest) or a `ckpt import` output) with a fresh optimizer, iteration 0 and the data from its start; any
  // layout from any layout. Empty: the model's initialization. Not with an explicit checkpoint.load path; a run
  // that finds checkpoints in checkpoint.save_dir (load: auto) resumes them instead (a restarted fine-tuning run).
  std::string init_from;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;  // 0: micro_batch_size * data-parallel size
  int64_t train_iters = 0;        // required
  Precision precision = Precision::fp32;
  LossScaleConfig loss_scale;
  LossSpikeConfig loss_spike;
  Fp8Config fp8;
  // none | full (every layer's forward again in backward) | selective (recompute_modules' tensors only)
  Recompute recompute = Recompute::none;
  // With selective: which tensors each layer drops after its forward and recomputes in backward (Megatron-Core's
  // names): core_attn (the attention output and its softmax statistics), layernorm (both norms' outputs), mlp_act
  // (the MLP activation: GELU or SwiGLU of fc1), moe_act (a MoE layer's experts' and shared expert's activations).
  // Empty with selective: [core_attn], Megatron's default.
  std::vector<std::string> recompute_modules;
  // With full and recompute_method block: recompute only the first this many layers of every model chunk, each on
  // its own (0: every layer). With uniform (>= 1): every chunk's layers in consecutive groups of this many (the
  // last group of a chunk may be smaller), each group checkpointed as one: its input kept, its forward run again
  // in backward. Megatron's two methods.
  int64_t recompute_num_layers = 0;
  std::string recompute_method = "block";  // block | uniform
  int64_t seed = 1234;
  DeviceChoice device = DeviceChoice::automatic;  // auto (cuda when built with it and a GPU is visible) | cuda | cpu
  // Stop with an error after this many non-finite iterations in a row (inf/NaN loss or gradients; fp16 steps
  // skipped by the loss scaler count only once the scale is at its minimum).
  int64_t max_nonfinite_iters = 10;
  // Save a checkpoint and exit (status 0) after every this many iterations (Megatron's --exit-interval); 0: never.
  int64_t exit_interval = 0;
  // Save and exit once this many minutes have passed since training started, agreed by all ranks at the end of
  // an iteration (Megatron's --exit-duration-in-mins: set it below the job's time limit); 0: never.
  double exit_duration_mins = 0;
  // derived
  int64_t num_microbatches = 0;  // global_batch_size / (micro_batch_size * data-parallel size)

  bool operator==(const TrainingConfig&) const = default;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  double lr = 0.0;  // required, > 0
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;          // 0: train_iters
  LrDecay decay = LrDecay::cosine;  // cosine | linear | constant | wsd | inverse_square_root
  // wsd only: the anneal takes the last wsd_decay_fraction * decay_iters steps (Megatron gives the same as a
  // step count, --lr-wsd-decay-iters), in wsd_decay_style's shape (Megatron's default, exponential).
  double wsd_decay_fraction = 0.2;
  WsdShape wsd_decay_style = WsdShape::exponential;
  double weight_decay = 0.01;  // not applied to biases and norm parameters
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  // ZeRO-Offload (core/optim/host_offload.h): this rank's fp32 masters and Adam moments (of its shard under
  // parallel.shard) in host memory, the AdamW step on the host, gradients down and values up per chunk.
  bool offload = false;
  // The host memory one rank's offloaded state may take, in GiB; 0: no budget (not checked). With offload a state
  // larger than the budget is refused at start-up and does not fit in `megatrain plan`; `plan --search` tries
  // offload (where nothing else fits the device) only with a budget, set with offload false or true.
  double offload_host_memory_gib = 0;

  bool operator==(const OptimizerConfig&) const = default;
};

struct DataConfig {
  // Each of train / valid is a list of indexed-dataset prefixes (.bin/.idx), concatenated in order, or a
  // weighted blend in Megatron's --data-path syntax, [w0, prefix0, w1, prefix1, ...] (see parse_data_blend).
  std::vector<std::string> train;
  std::vector<std::string> valid;            // optional; when empty validation comes from `split`
  std::vector<double> split = {969, 30, 1};  // train / valid / test weights over documents
  bool synthetic = false;                    // random tokens, no files (benchmarks)
  // Train on datasets whose tokenizer records (PREFIX.tokenizer.yaml) differ from each other or from the resumed
  // checkpoint's tokenizer.yaml; refused by default, as the ids would change meaning.
  bool allow_tokenizer_change = false;
  // Check every dataset against its PREFIX.crc32c (when it has one) at training start; rank 0 reads each .bin
  // whole once (docs/data.md gives the speed). false skips the check.
  bool verify_checksums = true;
  // Supervised fine-tuning data (`data prepare --format chat`): the loss counts only where PREFIX_mask holds 1,
  // averaged over those tokens of the whole global batch. auto: when every dataset of a list has its _mask (some
  // but not all is an error); true: every dataset must have one; false: ignore masks (every token counts).
  LossMaskChoice loss_mask = LossMaskChoice::automatic;
  // How samples are cut from the documents: concat (pre-training's: the documents as one stream, cut every
  // seq_length tokens, a sample may span documents) | pad (one document (conversation) per sample, cut at
  // seq_length + 1 tokens, the rest padding whose loss mask is 0; needs loss masks) | pack (concat's samples with
  // position ids and causal attention reset at every document boundary inside a sample, Megatron's
  // reset_position_ids + reset_attention_mask; any data, masked or not).
  SftPacking sft_packing = SftPacking::concat;

  bool operator==(const DataConfig&) const = default;
};

// A data.train / data.valid list read as Megatron's get_blend_from_list does: an even number of items whose
// every other item (from the first) is a number is a weighted blend; anything else is a plain list of prefixes
// (weights empty).
struct DataBlend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // empty: unweighted
};
DataBlend parse_data_blend(const std::vector<std::string>& items);

struct CheckpointConfig {
  std::string save_dir;             // empty: never save
  int64_t save_interval = 0;        // 0: only at the end
  int64_t keep_last = 0;            // 0: keep all
  std::string load = "auto";        // auto (save_dir's latest when present) | none | a checkpoint path
  bool allow_partial_load = false;  // resume from a checkpoint of another model shape: load the tensors
                                    // that match, log the rest (otherwise a shape difference is an error)

  bool operator==(const CheckpointConfig&) const = default;
};

struct LoggingConfig {
  std::string dir = "runs/default";  // run directory: megatrain.log and metrics.jsonl
  int64_t interval = 10;
  int64_t eval_interval = 0;  // 0: no validation during training
  int64_t eval_iters = 10;
  std::string level = "info";
  bool tensorboard = false;  // TensorBoard event files under RUN_DIR/tensorboard (the logging rank)
  // The console line of a logging interval: false, a short line (iteration, elapsed, ETA, loss, lr, grad norm,
  // tokens/s, TFLOP/s/GPU, MFU where the GPU's peak is known; skipped/NaN counts when not zero, loss scale with
  // fp16); true, Megatron's long line with every figure. metrics.jsonl holds every figure either way.
  bool verbose_line = false;
  // A sink (metrics.jsonl, the TensorBoard file) whose write fails during the run (a full disk) is closed with
  // a warning naming its file and the OS error; warn: training goes on without it; save_and_stop: the run saves
  // a checkpoint and stops cleanly (exit 0), as on a stop signal.
  SinkErrorAction on_sink_error = SinkErrorAction::warn;
  // Time this iteration op by op (core/tensor/op_profile.h: CUDA events on the GPU, the wall clock on the CPU) and
  // write RUN_DIR/op_profile.md (the logging rank; the top ops also go to the log); 0: never. The profiled
  // iteration runs slower (one host call and two events per op): leave it out of timing comparisons.
  int64_t profile_iteration = 0;
  // A timeline of chosen iterations (core/tensor/trace.h): every rank's forwards, backwards, pipeline sends,
  // receives and waits, gradient reductions, optimizer and checkpoint as Chrome trace events, merged into
  // RUN_DIR/trace.json (a track per rank; Perfetto or chrome://tracing open it). trace_iterations: which (global
  // iteration numbers, ascending); empty: the second and third iterations this run trains.
  bool trace = false;
  std::vector<int64_t> trace_iterations;
  // Straggler detection (app/train/straggler.h): a rank whose busy time per iteration (the wall time less its waits
  // in collectives) stays this fraction above its pipeline stage's median for three intervals in a row is warned
  // about by name; 0: no warning (the figures are still logged).
  double straggler_margin = 0.2;

  bool operator==(const LoggingConfig&) const = default;
};

// finetune.lora: low-rank adapters (Hu et al., "LoRA", 2021) on the transformer layers' linears, y = W x +
// (alpha / rank) * B A dropout(x); with rank > 0 every base parameter is frozen (no gradient, no optimizer state)
// and only the adapters train (models/lora.h).
struct LoraConfig {
  int64_t rank = 0;      // 0: off
  double alpha = 16.0;   // the adapters' output is scaled by alpha / rank
  double dropout = 0.0;  // on the adapter's input, in [0, 1)
  // Which linears get adapters: qkv (the fused query/key/value projection: HF q_proj, k_proj, v_proj), proj
  // (attention output: o_proj / c_proj), fc1 (MLP up: Llama's fused gate_proj + up_proj, GPT's c_fc), fc2 (MLP
  // down: down_proj / mlp.c_proj).
  std::vector<std::string> targets = {"qkv", "proj", "fc1", "fc2"};
  // Adapters need a trained base (training.init_from); true lets them train on this model's seeded, random
  // initialization instead: for tests and experiments, never for a real fine-tune.
  bool random_base = false;

  bool enabled() const { return rank > 0; }
  bool targets_any(const std::string& t) const {
    for (const auto& x : targets)
      if (x == t) return true;
    return false;
  }
  bool operator==(const LoraConfig&) const = default;
};

struct FinetuneConfig {
  LoraConfig lora;
  bool operator==(const FinetuneConfig&) const = default;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  FinetuneConfig finetune;
  std::string source = "<config>";  // where it was read from, for messages

  bool operator==(const Config&) const = default;
};

// Reads `path`, applies `overrides` ("model.num_layers=4", values parsed as YAML), checks every key
// (unknown keys are errors with a nearest-key hint), validates the rules against `world_size` and fills
// the derived values. Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides, int64_t world_size = 1);
// The same from YAML text; `source` names it in messages.
Config parse_config(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides,
                    int64_t world_size = 1);
// A config's YAML text parsed once, to derive many configs from (the planner's search applies a layout to one base
// config thousands of times): parse() is parse_config less the parsing of the text, each call on its own copy.
class ConfigDocument {
 public:
  // Throws ConfigError on malformed YAML, naming `source` and the line.
  ConfigDocument(const std::string& yaml_text, std::string source);
  ~ConfigDocument();
  ConfigDocument(const ConfigDocument&) = delete;
  ConfigDocument& operator=(const ConfigDocument&) = delete;
  Config parse(const std::vector<std::string>& overrides, int64_t world_size = 1) const;

 private:
  struct Root;
  std::unique_ptr<Root> root_;
  std::string source_;
};
// The world size the layout of the config at `path` (with `overrides`) names: parallel.tensor * context * pipeline
// * data, with data: auto counted as 1; 0 when the file or those keys cannot be read (load_config says why). For hints
// such as "add --nproc 2", before the config can be resolved against a world size. `data_auto`, when given, is set
// to whether parallel.data is auto (absent included).
int64_t layout_world_size(const std::string& path, const std::vector<std::string>& overrides,
                          bool* data_auto = nullptr);
// The number of parameters of the whole model (all ranks; padded vocabulary included), as a double so that
// it cannot overflow; an estimate within a few per cent, for size checks before anything is allocated.
double estimated_parameters(const ModelConfig& m);

// The resolved configuration as YAML (every key, derived values included under a `derived:` section),
// printed at start and stored in every checkpoint; parse_config(to_yaml(c)) gives c back.
std::string to_yaml(const Config& c);

}  // namespace mt
