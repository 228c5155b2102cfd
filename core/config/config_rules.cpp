// config_rules.cpp: every rule a Config must satisfy, checked in section order, and its derived values.
#include "core/config/config_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <string>

namespace mt {
namespace {

// Small checks that name the key and the value.
class Rules {
 public:
  explicit Rules(const ConfigSource& src) : src_(src) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const { src_.fail(path, what); }
  void positive(const std::string& path, int64_t v) const {
    if (v < 1) fail(path, fmt::format("must be positive, got {}", v));
  }
  void positive(const std::string& path, double v) const {
    if (!(v > 0)) fail(path, fmt::format("must be positive, got {}", v));
  }
  void non_negative(const std::string& path, int64_t v) const {
    if (v < 0) fail(path, fmt::format("must be >= 0, got {}", v));
  }
  void non_negative(const std::string& path, double v) const {
    if (!(v >= 0)) fail(path, fmt::format("must be >= 0, got {}", v));
  }
  void probability(const std::string& path, double v) const {  // [0, 1)
    if (!(v >= 0 && v < 1)) fail(path, fmt::format("must be in [0, 1), got {}", v));
  }
  void one_of(const std::string& path, const std::string& v, std::initializer_list<const char*> allowed) const {
    for (const char* a : allowed)
      if (v == a) return;
    fail(path, fmt::format("expected one of {}, got '{}'", fmt::join(allowed, ", "), v));
  }

 private:
  const ConfigSource& src_;
};

void resolve_model(ModelConfig& m, const Rules& r) {
  if (m.arch == "llama") r.fail("model.arch", "llama is not implemented yet (use gpt)");
  r.one_of("model.arch", m.arch, {"gpt"});
  r.positive("model.num_layers", m.num_layers);
  r.positive("model.hidden_size", m.hidden_size);
  r.positive("model.num_heads", m.num_heads);
  r.positive("model.seq_length", m.seq_length);
  r.positive("model.vocab_size", m.vocab_size);
  r.positive("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  if (m.hidden_size % m.num_heads != 0)
    r.fail("model.num_heads", fmt::format("{} does not divide model.hidden_size={}", m.num_heads, m.hidden_size));
  if (m.ffn_hidden_size == 0) m.ffn_hidden_size = 4 * m.hidden_size;
  r.positive("model.ffn_hidden_size", m.ffn_hidden_size);
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  r.positive("model.max_position_embeddings", m.max_position_embeddings);
  if (m.max_position_embeddings < m.seq_length)
    r.fail("model.max_position_embeddings",
           fmt::format("{} is less than model.seq_length={}", m.max_position_embeddings, m.seq_length));
  r.probability("model.dropout", m.dropout);
  r.probability("model.attention_dropout", m.attention_dropout);
  r.positive("model.layernorm_eps", double{m.layernorm_eps});
  r.positive("model.init_std", double{m.init_std});
  m.head_dim = m.hidden_size / m.num_heads;
}

void resolve_parallel(Config& c, int64_t world_size, const Rules& r) {
  ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  r.positive("parallel.tensor", p.tensor);
  r.positive("parallel.pipeline", p.pipeline);
  r.positive("parallel.virtual_pipeline", p.virtual_pipeline);
  r.non_negative("parallel.data", p.data);
  if (world_size < 1) r.fail("parallel", fmt::format("the world size must be positive, got {}", world_size));

  if (m.num_heads % p.tensor != 0)
    r.fail("parallel.tensor", fmt::format("{} does not divide model.num_heads={}", p.tensor, m.num_heads));
  if (m.ffn_hidden_size % p.tensor != 0)
    r.fail("parallel.tensor", fmt::format("{} does not divide model.ffn_hidden_size={}", p.tensor, m.ffn_hidden_size));
  if (p.sequence_parallel && p.tensor == 1)
    r.fail("parallel.sequence_parallel",
           "needs parallel.tensor > 1 (sequence parallelism splits the tensor-parallel "
           "group's activations), got parallel.tensor=1");
  if (p.sequence_parallel && m.seq_length % p.tensor != 0)
    r.fail("parallel.sequence_parallel",
           fmt::format("needs model.seq_length={} divisible by parallel.tensor={}", m.seq_length, p.tensor));

  const int64_t model_parallel = p.tensor * p.pipeline;
  if (p.data == 0) {  // auto
    if (world_size % model_parallel != 0)
      r.fail("parallel.data", fmt::format("auto needs the world size {} divisible by parallel.tensor*pipeline = "
                                          "{}*{} = {}",
                                          world_size, p.tensor, p.pipeline, model_parallel));
    p.data = world_size / model_parallel;
  } else if (model_parallel * p.data != world_size) {
    r.fail("parallel.data", fmt::format("parallel.tensor*pipeline*data = {}*{}*{} = {} does not match the world "
                                        "size {}",
                                        p.tensor, p.pipeline, p.data, model_parallel * p.data, world_size));
  }
  p.world_size = world_size;
  r.positive("parallel.timeout_s", p.timeout_s);
  r.positive("parallel.grad_bucket_size", p.grad_bucket_size);
  r.one_of("parallel.backend", p.backend, {"auto", "nccl", "gloo"});

  if (p.pipeline > m.num_layers)
    r.fail("parallel.pipeline", fmt::format("{} is more than model.num_layers={}", p.pipeline, m.num_layers));
  if (p.virtual_pipeline > 1 && p.pipeline == 1)
    r.fail("parallel.virtual_pipeline",
           fmt::format("{} needs parallel.pipeline > 1 (interleaving splits pipeline stages)", p.virtual_pipeline));
  const int64_t chunks = p.pipeline * p.virtual_pipeline;
  if (!p.layers_per_stage.empty()) {
    if (static_cast<int64_t>(p.layers_per_stage.size()) != chunks)
      r.fail("parallel.layers_per_stage",
             fmt::format("has {} entries, expected parallel.pipeline*virtual_pipeline = {}*{} = {}",
                         p.layers_per_stage.size(), p.pipeline, p.virtual_pipeline, chunks));
    for (size_t i = 0; i < p.layers_per_stage.size(); ++i)
      r.non_negative(fmt::format("parallel.layers_per_stage[{}]", i), p.layers_per_stage[i]);
    const int64_t sum = std::accumulate(p.layers_per_stage.begin(), p.layers_per_stage.end(), int64_t{0});
    if (sum != m.num_layers)
      r.fail("parallel.layers_per_stage", fmt::format("[{}] sums to {}, expected model.num_layers={}",
                                                      fmt::join(p.layers_per_stage, ", "), sum, m.num_layers));
  } else if (m.num_layers % chunks != 0) {
    r.fail("model.num_layers", fmt::format("{} is not divisible by parallel.pipeline*virtual_pipeline = {}*{} = {} "
                                           "(give parallel.layers_per_stage for an uneven split)",
                                           m.num_layers, p.pipeline, p.virtual_pipeline, chunks));
  }
}

void resolve_training(Config& c, const Rules& r) {
  TrainingConfig& t = c.training;
  const int64_t dp = c.parallel.data;
  r.positive("training.micro_batch_size", t.micro_batch_size);
  r.non_negative("training.global_batch_size", t.global_batch_size);
  if (t.global_batch_size == 0) t.global_batch_size = t.micro_batch_size * dp;
  if (t.global_batch_size % (t.micro_batch_size * dp) != 0)
    r.fail("training.global_batch_size",
           fmt::format("{} is not divisible by training.micro_batch_size*data-parallel size = {}*{} = {}",
                       t.global_batch_size, t.micro_batch_size, dp, t.micro_batch_size * dp));
  t.num_microbatches = t.global_batch_size / (t.micro_batch_size * dp);
  r.positive("training.train_iters", t.train_iters);
  r.one_of("training.precision", t.precision, {"fp32", "bf16", "fp16"});
  if (t.recompute == "selective") r.fail("training.recompute", "selective is not implemented yet (use none or full)");
  r.one_of("training.recompute", t.recompute, {"none", "full"});
  r.one_of("training.device", t.device, {"auto", "cuda", "cpu"});
#if !defined(MEGATRAIN_WITH_CUDA)
  if (t.device == "cuda")
    r.fail("training.device", "cuda: this megatrain was built without the CUDA backend (no CUDA toolkit at build "
                              "time); use cpu or auto");
#endif
  if (c.parallel.backend == "nccl" && t.device == "cpu")
    r.fail("parallel.backend", "nccl needs training.device: cuda (NCCL moves GPU memory); use gloo or auto on cpu");
  r.non_negative("training.seed", t.seed);

  const LossScaleConfig& s = t.loss_scale;
  r.positive("training.loss_scale.min", s.min);
  if (!(s.initial >= s.min))
    r.fail("training.loss_scale.initial", fmt::format("{} is less than training.loss_scale.min={}", s.initial, s.min));
  r.positive("training.loss_scale.window", s.window);
  r.positive("training.loss_scale.hysteresis", s.hysteresis);
}

void resolve_optimizer(Config& c, const Rules& r) {
  OptimizerConfig& o = c.optimizer;
  r.one_of("optimizer.type", o.type, {"adamw"});
  r.positive("optimizer.lr", o.lr);
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr))
    r.fail("optimizer.min_lr", fmt::format("must be in [0, optimizer.lr={}], got {}", o.lr, o.min_lr));
  r.non_negative("optimizer.warmup_iters", o.warmup_iters);
  r.non_negative("optimizer.decay_iters", o.decay_iters);
  if (o.decay_iters == 0) o.decay_iters = c.training.train_iters;
  if (o.warmup_iters > o.decay_iters)
    r.fail("optimizer.warmup_iters",
           fmt::format("{} is more than optimizer.decay_iters={}", o.warmup_iters, o.decay_iters));
  r.one_of("optimizer.decay", o.decay, {"cosine", "linear", "constant"});
  r.non_negative("optimizer.weight_decay", o.weight_decay);
  for (size_t i = 0; i < o.betas.size(); ++i) r.probability(fmt::format("optimizer.betas[{}]", i), o.betas[i]);
  r.positive("optimizer.eps", o.eps);
  r.non_negative("optimizer.grad_clip", o.grad_clip);
}

void resolve_data(Config& c, const Rules& r) {
  const DataConfig& d = c.data;
  if (d.train.empty() && !d.synthetic)
    r.fail("data.train", "needs at least one dataset prefix (or set data.synthetic: true)");
  for (size_t i = 0; i < d.train.size(); ++i)
    if (d.train[i].empty()) r.fail(fmt::format("data.train[{}]", i), "is an empty path");
  for (size_t i = 0; i < d.valid.size(); ++i)
    if (d.valid[i].empty()) r.fail(fmt::format("data.valid[{}]", i), "is an empty path");
  for (size_t i = 0; i < d.split.size(); ++i) r.non_negative(fmt::format("data.split[{}]", i), d.split[i]);
  if (!(std::accumulate(d.split.begin(), d.split.end(), 0.0) > 0))
    r.fail("data.split", fmt::format("[{}] must have a positive sum", fmt::join(d.split, ", ")));
}

void resolve_checkpoint_and_logging(Config& c, const Rules& r) {
  const CheckpointConfig& k = c.checkpoint;
  r.non_negative("checkpoint.save_interval", k.save_interval);
  r.non_negative("checkpoint.keep_last", k.keep_last);
  if (k.load.empty()) r.fail("checkpoint.load", "expected auto, none or a checkpoint path, got ''");
  const LoggingConfig& l = c.logging;
  if (l.dir.empty()) r.fail("logging.dir", "needs a run directory, got ''");
  r.positive("logging.interval", l.interval);
  r.non_negative("logging.eval_interval", l.eval_interval);
  r.non_negative("logging.eval_iters", l.eval_iters);
  if (l.eval_interval > 0 && l.eval_iters == 0)
    r.fail("logging.eval_iters", fmt::format("must be positive when logging.eval_interval={}", l.eval_interval));
  r.one_of("logging.level", l.level, {"trace", "debug", "info", "warn", "error", "critical", "off"});
}

}  // namespace

void resolve_config(Config& c, int64_t world_size, const ConfigSource& src) {
  const Rules r(src);
  resolve_model(c.model, r);
  resolve_parallel(c, world_size, r);
  // Padded so that every tensor-parallel rank holds an equal, aligned slice of the vocabulary.
  const int64_t multiple = c.model.make_vocab_size_divisible_by * c.parallel.tensor;
  c.model.padded_vocab_size = (c.model.vocab_size + multiple - 1) / multiple * multiple;
  resolve_training(c, r);
  resolve_optimizer(c, r);
  resolve_data(c, r);
  resolve_checkpoint_and_logging(c, r);
}

}  // namespace mt
