// test_pipeline_executor.cpp: execute_pipeline running real transfers, threads as pipeline stages over Gloo,
// over a grid of schedules (no pipelining, 1F1B, interleaved, forward only). A recording fake stage checks
// that every activation and gradient it receives is the one its neighbour computed for that (microbatch,
// virtual stage), and records its computes, which must be the program's forward and backward instructions in
// order. (test_schedule checks the lists and the order in which the executor posts; this runs them.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/comm/thread_ranks.h"

namespace mt {
namespace {

// What virtual stage vs sends for microbatch mb: its activation, or (backward) its input gradient.
float activation(int mb, int vs) { return static_cast<float>(mb * 100 + vs); }
float gradient(int mb, int vs) { return -static_cast<float>(mb * 100 + vs) - 0.5f; }

class RecordingStage final : public PipelineStage {
 public:
  RecordingStage(int stage, int stages, int chunks) : stage_(stage), p_(stages), vstages_(stages * chunks) {}
  Tensor forward(int mb, int chunk, const Tensor& input) override {
    const int vs = chunk * p_ + stage_;
    if (vs > 0) expect_all(input, activation(mb, vs - 1), "activation", mb, chunk);
    computes.push_back({PipeOp::forward, mb, chunk});
    return filled(activation(mb, vs));
  }
  Tensor backward(int mb, int chunk, const Tensor& grad) override {
    const int vs = chunk * p_ + stage_;
    if (vs + 1 < vstages_) expect_all(grad, gradient(mb, vs + 1), "gradient", mb, chunk);
    computes.push_back({PipeOp::backward, mb, chunk});
    return filled(gradient(mb, vs));
  }
  Shape activation_shape() const override { return {3}; }
  DType activation_dtype() const override { return DType::f32; }
  std::vector<PipeInstr> computes;
  std::vector<std::string> errors;

 private:
  static Tensor filled(float v) { return Tensor::from_floats(std::vector<float>(3, v), {3}); }
  void expect_all(const Tensor& t, float want, const char* what, int mb, int chunk) {
    for (float x : t.to_floats())
      if (x != want) {
        errors.push_back(std::string(what) + " of microbatch " + std::to_string(mb) + " chunk " +
                         std::to_string(chunk) + ": got " + std::to_string(x) + ", want " + std::to_string(want));
        return;
      }
  }
  int stage_, p_, vstages_;
};

std::vector<ScheduleSpec> grid(int p) {
  std::vector<ScheduleSpec> specs;
  for (int m : {1, 2, 3, 4, 6, 8}) {
    specs.push_back({p == 1 ? ScheduleKind::no_pipelining : ScheduleKind::one_f_one_b, p, m, 1});
    for (int v : {2, 3})
      if (p > 1 && m % p == 0) specs.push_back({ScheduleKind::interleaved, p, m, v});
    for (int v : {1, 2})  // one stage with several chunks would send to itself (the config refuses it)
      if (p > 1 || v == 1) specs.push_back({ScheduleKind::forward_only, p, m, v});
  }
  return specs;
}

TEST(PipelineExecutor, RunsEveryScheduleOfTheGridDeliveringEachTensorToItsConsumer) {
  for (int p : {1, 2, 3, 4}) {
    const std::vector<ScheduleSpec> specs = grid(p);
    auto store = make_hash_store();
    run_ranks(p, [&](int st) {
      auto comm = join_gloo(store, "pp", first_ranks(p), st);
      for (const ScheduleSpec& spec : specs) {
        const std::string what = schedule_kind_name(spec.kind) + " p=" + std::to_string(p) +
                                 " m=" + std::to_string(spec.microbatches) + " v=" + std::to_string(spec.chunks) +
                                 ", stage " + std::to_string(st);
        const std::vector<PipeInstr> program = build_schedule(spec)[static_cast<size_t>(st)];
        RecordingStage stage(st, p, spec.chunks);
        execute_pipeline(program, stage, {.comm = comm.get(), .stage = st, .stages = p, .chunks = spec.chunks});
        EXPECT_TRUE(stage.errors.empty()) << what << ": " << stage.errors.front();
        std::vector<PipeInstr> want;
        for (const PipeInstr& in : program)
          if (in.op == PipeOp::forward || in.op == PipeOp::backward) want.push_back(in);
        EXPECT_EQ(stage.computes, want) << what;
      }
    });
  }
}

}  // namespace
}  // namespace mt
