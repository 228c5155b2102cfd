// Tests of activation recomputation: full recomputation of every layer, and Megatron's uniform method (groups of
// layers checkpointed as one, models/gpt.h), give the gradients of the plain run bit for bit, and uniform's
// regathered units are announced as ZeRO-3 needs them.
#include <map>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "models/gpt.h"
#include "tests/unit/tiny_models.h"

namespace mt {
namespace {

using testing_util::fill_batch;
ModelConfig tiny_model() { return testing_util::tiny_gpt(true); }
ModelConfig tiny_llama() { return testing_util::tiny_llama(2, false, 100); }

// Full recomputation reruns each layer's forward in backward with the same dropout keys: the gradients are
// those of the plain run, bit for bit. `uniform` > 0: Megatron's uniform method, groups of that many layers.
void check_recompute_identical(ModelConfig cfg, int64_t uniform = 0) {
  cfg.dropout = 0.2f;
  cfg.attention_dropout = 0.2f;
  GptModel plain(cfg, {.dtype = DType::bf16, .seed = 3});
  GptModel recompute(cfg, {.dtype = DType::bf16,
                           .seed = 3,
                           .recompute = true,
                           .recompute_layers = uniform,
                           .recompute_uniform = uniform > 0});
  Tensor tokens = Tensor::empty({2, 8}, DType::i32), targets = Tensor::empty({2, 8}, DType::i32);
  fill_batch(tokens, targets, cfg.vocab_size);
  StepContext ctx{.sample_offset = 40, .training = true, .seed = 3};
  EXPECT_EQ(plain.forward(tokens, targets, 0, ctx), recompute.forward(tokens, targets, 0, ctx));
  plain.backward(0, 1.f);
  recompute.backward(0, 1.f);
  for (size_t i = 0; i < plain.parameters().size(); ++i)
    EXPECT_EQ(plain.parameters()[i]->grad.to_floats(), recompute.parameters()[i]->grad.to_floats())
        << plain.parameters()[i]->name;
}

TEST(GptModel, FullRecomputationGivesIdenticalGradients) { check_recompute_identical(tiny_model()); }
TEST(LlamaModel, FullRecomputationGivesIdenticalGradients) { check_recompute_identical(tiny_llama()); }

// Uniform recomputation over 5 layers: groups of 1 (per-layer), 2 (2 + 2 + 1, the last smaller), 3 and all 5; on
// a Llama and on a MoE Llama (its routing, dropless dispatch and auxiliary losses recomputed with the group).
TEST(LlamaModel, UniformRecomputationGivesIdenticalGradients) {
  ModelConfig cfg = tiny_llama();
  cfg.num_layers = 5;
  for (int64_t group : {1, 2, 3, 5}) {
    SCOPED_TRACE(fmt::format("groups of {}", group));
    check_recompute_identical(cfg, group);
  }
  cfg.moe = MoeConfig{.num_experts = 4, .top_k = 2, .layer_freq = 2, .ffn_hidden_size = 12, .aux_loss_coeff = 0.01};
  for (int64_t group : {2, 3}) {
    SCOPED_TRACE(fmt::format("MoE, groups of {}", group));
    check_recompute_identical(cfg, group);
  }
}

// ZeRO-3 gathers a unit between its begin and end events and prefetches the `next` a begin names: under uniform
// recomputation a group's layers are begun again for their forward in backward, every begin is ended before its
// unit begins again, and every named next is the unit that begins next.
TEST(GptModel, UniformRecomputationAnnouncesEachUnitItComputes) {
  ModelConfig cfg = tiny_llama();
  cfg.num_layers = 5;
  GptModel model(cfg, {.seed = 3, .recompute = true, .recompute_layers = 2, .recompute_uniform = true});
  struct Event {
    GptModel::UnitEvent e;
    int unit, next;
  };
  std::vector<Event> events;
  model.set_unit_hook([&](GptModel::UnitEvent e, int unit, int next) { events.push_back({e, unit, next}); });
  Tensor tokens = Tensor::empty({2, 8}, DType::i32), targets = Tensor::empty({2, 8}, DType::i32);
  fill_batch(tokens, targets, cfg.vocab_size);
  model.forward(tokens, targets, 0, StepContext{.seed = 3});
  model.backward(0, 1.f);
  using E = GptModel::UnitEvent;
  auto begins = [](const Event& ev) { return ev.e == E::forward_begin || ev.e == E::backward_begin; };
  std::vector<int> begun;  // the units begun, in order
  std::map<int, bool> open;
  for (const Event& ev : events) {
    if (begins(ev)) {
      EXPECT_FALSE(open[ev.unit]) << "unit " << ev.unit << " begun twice";
      open[ev.unit] = true;
      begun.push_back(ev.unit);
    } else {
      EXPECT_TRUE(open[ev.unit]) << "unit " << ev.unit << " ended unbegun";
      open[ev.unit] = false;
    }
  }
  // Units: 0 the embedding, 1..5 the layers, 6 the head. Backward: the head, then group [5] (layer unit 5 alone),
  // then group [3, 4] (3 again in forward, 4 with its backward, then 3's backward), then [1, 2].
  EXPECT_EQ(begun, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 6, 5, 3, 4, 3, 1, 2, 1}));
  size_t b = 0;
  for (const Event& ev : events) {
    if (!begins(ev)) continue;
    ++b;
    if (ev.next >= 0 && b < begun.size()) {
      EXPECT_EQ(ev.next, begun[b]) << "after unit " << ev.unit;
    }
  }
}

TEST(GptModel, UniformRecomputationNeedsAGroupSize) {
  EXPECT_THROW(GptModel(tiny_model(), {.recompute = true, .recompute_uniform = true}), std::invalid_argument);
}

}  // namespace
}  // namespace mt
