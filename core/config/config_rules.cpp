// config_rules.cpp: the rules of model.* and the sizes a model may have, and resolve_config, which runs every
// section's rules (config_rules_*.cpp) in order and fills the derived values.
#include "core/config/config_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "core/config/config_rules_detail.h"

namespace mt {
namespace config_rules {

void resolve_model(ModelConfig& m, const Rules& r) {
  r.positive("model.num_layers", m.num_layers);
  r.positive("model.hidden_size", m.hidden_size);
  r.positive("model.num_heads", m.num_heads);
  r.positive("model.seq_length", m.seq_length);
  r.positive("model.vocab_size", m.vocab_size);
  r.positive("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  // Generous bounds (far beyond any trained model) so that sizes multiply without overflow; the tensor
  // and parameter byte counts are checked below once the padded vocabulary is known.
  r.at_most("model.num_layers", m.num_layers, kMaxLayers, "number of layers");
  r.at_most("model.hidden_size", m.hidden_size, kMaxWidth, "width");
  r.at_most("model.num_heads", m.num_heads, kMaxWidth, "number of heads");
  r.at_most("model.seq_length", m.seq_length, kMaxSequence, "sequence length");
  r.at_most("model.vocab_size", m.vocab_size, kMaxVocab, "vocabulary: token ids are int32");
  r.at_most("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, kMaxVocabMultiple,
            "vocabulary padding multiple");
  const bool llama = m.arch == Arch::llama;
  // A head's width: hidden_size / num_heads, or (llama: Qwen3's) model.head_dim, with H * D apart from C.
  r.non_negative("model.head_dim", m.head_dim);
  if (m.head_dim == 0 && m.hidden_size % m.num_heads != 0)
    r.fail("model.num_heads", fmt::format("{} does not divide model.hidden_size={}", m.num_heads, m.hidden_size));
  if (!llama && m.head_dim != 0 && m.head_dim * m.num_heads != m.hidden_size)
    r.fail("model.head_dim", fmt::format("{} with model.arch: gpt, whose heads split model.hidden_size={} ({} each): "
                                         "another head width is llama's",
                                         m.head_dim, m.hidden_size, m.hidden_size / std::max<int64_t>(1, m.num_heads)));
  r.at_most("model.head_dim", m.head_dim, kMaxWidth, "width");
  // Megatron's SwiGLU default keeps the MLP's parameters near 8h^2: 2/3 of 4h, rounded down to 64.
  if (m.ffn_hidden_size == 0)
    m.ffn_hidden_size = llama ? std::max<int64_t>(64, (8 * m.hidden_size / 3) / 64 * 64) : 4 * m.hidden_size;
  r.positive("model.ffn_hidden_size", m.ffn_hidden_size);
  r.at_most("model.ffn_hidden_size", m.ffn_hidden_size, 4 * kMaxWidth, "feed-forward width");
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  r.positive("model.max_position_embeddings", m.max_position_embeddings);
  r.at_most("model.max_position_embeddings", m.max_position_embeddings, kMaxSequence, "number of positions");
  if (m.max_position_embeddings < m.seq_length)
    r.fail("model.max_position_embeddings",
           fmt::format("{} is less than model.seq_length={}", m.max_position_embeddings, m.seq_length));
  r.probability("model.dropout", m.dropout);
  r.probability("model.attention_dropout", m.attention_dropout);
  r.positive("model.layernorm_eps", double{m.layernorm_eps});
  r.positive("model.init_std", double{m.init_std});
  if (m.head_dim == 0) m.head_dim = m.hidden_size / m.num_heads;

  // Grouped-query attention: num_query_groups key/value heads, each shared by num_heads / num_query_groups
  // query heads. auto stays 0 (ModelConfig::kv_heads() reads it as num_heads; to_yaml writes it as auto), so a
  // config written back follows a later change of num_heads.
  r.non_negative("model.num_query_groups", m.num_query_groups);
  const int64_t groups = m.kv_heads();
  if (m.num_heads % groups != 0)
    r.fail("model.num_query_groups", fmt::format("{} does not divide model.num_heads={}", groups, m.num_heads));
  if (!llama && groups != m.num_heads)
    r.fail(
        "model.num_query_groups",
        fmt::format("grouped-query attention ({} groups for {} heads) needs model.arch: llama", groups, m.num_heads));
  if (!llama && m.qkv_bias)
    r.fail("model.qkv_bias", "true with model.arch: gpt, whose linears all have biases: the key is for llama");
  if (!llama && m.qk_norm) r.fail("model.qk_norm", "true with model.arch: gpt: QK-norm is llama's (Qwen3's)");
  r.non_negative("model.sliding_window", m.sliding_window);
  r.non_negative("model.full_attention_layers", m.full_attention_layers);
  if (m.full_attention_layers > m.num_layers)
    r.fail("model.full_attention_layers",
           fmt::format("{} is more than model.num_layers={}", m.full_attention_layers, m.num_layers));
  r.positive("model.rotary_base", m.rotary_base);
  r.at_most("model.rotary_base", m.rotary_base, std::numeric_limits<float>::max(),
            "float: the rotary embeddings compute in it");
  if (llama) {
    if (m.head_dim % 2 != 0)
      r.fail(r.given("model.head_dim") ? "model.head_dim" : "model.num_heads",
             fmt::format("rotary embeddings rotate pairs: the head dimension {} must be even",
                         r.given("model.head_dim") ? std::to_string(m.head_dim)
                                                   : fmt::format("hidden_size / num_heads = {}", m.head_dim)));
    // Llama unties the LM head from the embedding unless the file says otherwise.
    if (!r.given("model.tie_embeddings")) m.tie_embeddings = false;
  }
  if (m.rope_scaling.enabled()) {
    if (!llama)
      r.fail("model.rope_scaling.type", fmt::format("{} with model.arch: gpt, whose positions are learned: scaled "
                                                    "rotary embeddings are llama's",
                                                    name_of(m.rope_scaling.type)));
    try {  // the one computation checks what its type needs
      rope_frequencies(m.rotary_base, m.head_dim, m.rope_scaling);
    } catch (const std::invalid_argument& e) {
      r.fail("model.rope_scaling", e.what());
    }
  }
}

// Refuses, before anything is allocated, models whose tensors or parameters cannot fit: the largest weight
// and activation tensors of one rank, and the fp32 state (value, master, two moments, gradient) of all
// parameters. Products are taken in double: the bounds above keep them exact enough to compare.
void check_sizes(const Config& c, const Rules& r) {
  const ModelConfig& m = c.model;
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size),
               v = static_cast<double>(m.padded_vocab_size), p = static_cast<double>(m.max_position_embeddings),
               s = static_cast<double>(m.seq_length), b = static_cast<double>(c.training.micro_batch_size),
               heads = static_cast<double>(m.num_heads);
  auto tensor = [&](const char* key, const char* what, double numel) {
    if (numel * 4 > kMaxBytes)
      r.fail(key, fmt::format("{} would need {:.3g} bytes, more than the {} bytes one tensor may hold", what, numel * 4,
                              kMaxTensorBytes));
  };
  const bool llama = m.arch == Arch::llama;
  const double kv = static_cast<double>(2 * m.kv_heads() * m.head_dim),
               q = static_cast<double>(m.num_heads * m.head_dim);
  tensor("model.hidden_size", "the attention weight ((num_heads + 2*num_query_groups)*head_dim, hidden_size)",
         (q + kv) * h);
  tensor("model.ffn_hidden_size", "the feed-forward weight ((2*)ffn_hidden_size, hidden_size)",
         (llama ? 2 : 1) * f * h);
  tensor("model.vocab_size", "the embedding table (padded vocabulary, hidden_size)", v * h);
  tensor("model.max_position_embeddings", "the position table (max_position_embeddings, hidden_size)", p * h);
  tensor("training.micro_batch_size", "the hidden states (micro_batch_size, seq_length, hidden_size)", b * s * h);
  tensor("training.micro_batch_size", "the logits (micro_batch_size, seq_length, padded vocabulary)", b * s * v);
  tensor("model.seq_length", "the attention scores (micro_batch_size, num_heads, seq_length, seq_length)",
         b * heads * s * s);
  const double params = estimated_parameters(m);
  if (params * 20 > kMaxBytes) {
    // Blame the larger part: the layers, or the vocabulary (and position) tables.
    ModelConfig tables_only = m;
    tables_only.num_layers = 0;
    const double tables = estimated_parameters(tables_only), layers = params - tables;
    r.fail(layers >= tables ? "model.num_layers" : "model.vocab_size",
           fmt::format("the model's {:.3g} parameters ({} layers of hidden_size {}: {:.3g}; the embedding tables of "
                       "the padded vocabulary {}: {:.3g}) need {:.3g} bytes of state (20 bytes a parameter), more "
                       "than {} bytes",
                       params, m.num_layers, m.hidden_size, layers, m.padded_vocab_size, tables, params * 20,
                       kMaxTensorBytes));
  }
}

}  // namespace config_rules

using namespace config_rules;  // NOLINT(google-build-using-namespace): the sections' resolvers

double estimated_parameters(const ModelConfig& m) {
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size),
               v = static_cast<double>(m.padded_vocab_size), p = static_cast<double>(m.max_position_embeddings);
  if (m.arch == Arch::llama) {
    // Per layer: Q, K, V and proj (2h^2 + 2h * kv), gate, up and down (3hf), two RMSNorms (2h); then the word
    // embeddings, the final norm and an untied head. No biases, no position table.
    // With QK-norm two (head_dim) weights more.
    const double kv = static_cast<double>(m.kv_heads() * m.head_dim), q = static_cast<double>(m.num_heads * m.head_dim);
    return static_cast<double>(m.num_layers) *
               (2 * h * q + 2 * h * kv + 3 * h * f + 2 * h + (m.qk_norm ? 2 * static_cast<double>(m.head_dim) : 0)) +
           h + v * h * (m.tie_embeddings ? 1 : 2);
  }
  // Per layer: QKV and proj (4h^2 + 4h), fc1 and fc2 (2hf + f + h), two norms (4h); then the embeddings,
  // the final norm and an untied head.
  return static_cast<double>(m.num_layers) * (4 * h * h + 2 * h * f + 9 * h + f) + p * h + 2 * h +
         v * h * (m.tie_embeddings ? 1 : 2);
}

void resolve_config(Config& c, int64_t world_size, const ConfigSource& src) {
  const Rules r(src);
  resolve_model(c.model, r);
  resolve_parallel(c, world_size, r);
  resolve_moe(c, r);
  // Padded so that every tensor-parallel rank holds an equal, aligned slice of the vocabulary.
  const int64_t multiple = c.model.make_vocab_size_divisible_by * c.parallel.tensor;  // both bounded: no overflow
  c.model.padded_vocab_size = (c.model.vocab_size + multiple - 1) / multiple * multiple;
  if (c.model.padded_vocab_size > kMaxVocab)
    r.fail("model.make_vocab_size_divisible_by",
           fmt::format("{} (times parallel.tensor={}) pads model.vocab_size={} to {}, more than the largest "
                       "supported vocabulary {} (token ids are int32)",
                       c.model.make_vocab_size_divisible_by, c.parallel.tensor, c.model.vocab_size,
                       c.model.padded_vocab_size, kMaxVocab));
  resolve_training(c, r);
  check_sizes(c, r);
  resolve_optimizer(c, r);
  resolve_data(c, r);
  resolve_checkpoint_and_logging(c, r);
  resolve_finetune(c, r);
}

}  // namespace mt
