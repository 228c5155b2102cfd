// memory_model.cpp: a rank's memory measured on the meta device: the trainer's own step run there
// (app/train/meta_step.h), its allocator's peaks by kind as the training log reports them.
#include "plan/memory_model.h"

#include <algorithm>

#include "app/train/meta_step.h"
#include "models/pipeline_schedule.h"
#include "plan/model_shapes.h"

namespace mt::plan {

double zero_model_state_bytes(double psi, int64_t nd, ShardStage stage, double k) {
  const double n = static_cast<double>(nd);
  const double values = stage >= ShardStage::parameters ? 2 * psi / n : 2 * psi;
  const double grads = stage >= ShardStage::gradients ? 2 * psi / n : 2 * psi;
  const double state = stage >= ShardStage::optimizer ? k * psi / n : k * psi;
  return values + grads + state;
}

double MemoryPlan::max_total() const {
  double m = 0;
  for (const StageMemory& s : stages) m = std::max(m, s.bytes.total);
  return m;
}

namespace {

// The rank kinds a plan reports: every stage alike without pipelining, else the first, a middle one (p > 2) and
// the last (their stages hold different chunks: the embedding, layers only, the head).
std::vector<std::pair<std::string, int64_t>> rank_kinds(const Config& c) {
  const int64_t p = c.parallel.pipeline;
  if (p == 1) return {{"only", 0}};
  std::vector<std::pair<std::string, int64_t>> kinds = {{"first", 0}};
  if (p > 2) kinds.push_back({"middle", p / 2});
  kinds.push_back({"last", p - 1});
  return kinds;
}

meta::Mirror mirror_of(Backend backend) { return backend == Backend::cpu ? meta::Mirror::cpu : meta::Mirror::cuda; }

// The options of every rank kind's measurement of `c`, its ZB-V weights measured once for all of them.
app::MetaStepOptions meta_options(const Config& c, Backend backend) {
  return {.mirror = mirror_of(backend),
          .moe_receive_factor = c.model.moe.enabled()
                                    ? moe_imbalance(c.model.moe, c.parallel.expert, c.parallel.context,
                                                    c.parallel.tensor / c.parallel.experts_tensor())
                                          .factor
                                    : 1,
          .microbatches = app::peaks_microbatches(c),
          .zb_v = app::measure_schedule_memory(c, mirror_of(backend))};
}

}  // namespace

MemoryPlan predict_memory(const Config& c, Backend backend, double give_up_above) {
  const app::MetaStepOptions opt = meta_options(c, backend);
  MemoryPlan plan;
  for (const auto& [kind, stage] : rank_kinds(c)) {
    const app::MetaStep step = app::measure_step(c, static_cast<int>(stage), opt);
    StageMemory sm{.kind = kind,
                   .stage = stage,
                   .parameters = step.parameters,
                   .layers = step.layers,
                   .peak_in_flight = step.peak_in_flight,
                   .transient_grad_bytes = static_cast<double>(step.transient_grad_bytes)};
    for (size_t k = 0; k < KindBytes::kKinds; ++k) sm.bytes.peak[k] = static_cast<double>(step.memory.peak[k]);
    sm.bytes.total = static_cast<double>(step.memory.peak_total);
    plan.stages.push_back(sm);
    if (sm.bytes.total > give_up_above) break;
  }
  return plan;
}

double setup_memory(const Config& c, Backend backend, double give_up_above) {
  app::MetaStepOptions opt = meta_options(c, backend);
  opt.step = false;
  double most = 0;
  for (const auto& [kind, stage] : rank_kinds(c)) {
    most = std::max(most, static_cast<double>(app::measure_step(c, static_cast<int>(stage), opt).memory.peak_total));
    if (most > give_up_above) break;
  }
  return most;
}

ScheduleSpec planned_training_schedule(const Config& c, int64_t microbatches, Backend backend) {
  ScheduleSpec spec = training_schedule(c, microbatches);
  spec.memory = app::measure_schedule_memory(c, mirror_of(backend));
  return spec;
}

}  // namespace mt::plan
