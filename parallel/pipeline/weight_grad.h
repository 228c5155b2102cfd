// weight_grad.h: deferred weight gradients, the W of zero-bubble pipeline schedules (Qi et al., "Zero Bubble
// Pipeline Parallelism", 2024). A layer's backward splits in two: B, the input gradient (which the previous stage
// waits for), and W, the weight gradients (which nothing waits for until the step's reductions). The layers hand
// their weight-gradient GEMMs (and what must follow them, such as a gradient buffer's ready hook) to
// weight_grad_work: without an open WeightGradDeferral on this thread it runs at once (the backward is whole);
// inside one it is queued, with the tensors it reads kept alive by its captures, and runs when the schedule's W
// instruction runs the queue. Each parameter's gradient still accumulates its microbatches in the same order, so a
// split schedule trains bit-identically to a whole one.
#pragma once
#include <functional>
#include <vector>

namespace mt {

using WeightGradQueue = std::vector<std::function<void()>>;

// Queues this thread's weight_grad_work from construction until take() or destruction (one at a time per thread).
class WeightGradDeferral {
 public:
  WeightGradDeferral();
  ~WeightGradDeferral();
  WeightGradDeferral(const WeightGradDeferral&) = delete;
  WeightGradDeferral& operator=(const WeightGradDeferral&) = delete;
  // The queued work, in the order it was handed over; stops deferring.
  WeightGradQueue take();

 private:
  WeightGradQueue queue_;
  bool open_ = true;
};

// Runs `work` now, or queues it in this thread's open deferral.
void weight_grad_work(std::function<void()> work);

// While one lives, weight_grad_work runs at once on this thread even inside an open deferral: for work whose
// captures cost more to keep than its time is worth deferring (the output head's vocabulary-wide dlogits).
class WeightGradsNow {
 public:
  WeightGradsNow();
  ~WeightGradsNow();
  WeightGradsNow(const WeightGradsNow&) = delete;
  WeightGradsNow& operator=(const WeightGradsNow&) = delete;

 private:
  WeightGradQueue* paused_;
};
// Runs a taken queue in order.
void run_weight_grads(WeightGradQueue& queue);

}  // namespace mt
