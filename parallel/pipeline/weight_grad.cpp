// weight_grad.cpp: the thread's open deferral of weight-gradient work (parallel/pipeline/weight_grad.h).
#include "parallel/pipeline/weight_grad.h"

#include <stdexcept>
#include <utility>

namespace mt {

namespace {
thread_local WeightGradQueue* open_queue = nullptr;
}

WeightGradDeferral::WeightGradDeferral() {
  if (open_queue) throw std::logic_error("weight-gradient deferral: one is already open on this thread");
  open_queue = &queue_;
}

WeightGradDeferral::~WeightGradDeferral() {
  if (open_ && open_queue == &queue_) open_queue = nullptr;
}

WeightGradQueue WeightGradDeferral::take() {
  if (open_ && open_queue == &queue_) open_queue = nullptr;
  open_ = false;
  return std::exchange(queue_, {});
}

void weight_grad_work(std::function<void()> work) {
  if (open_queue)
    open_queue->push_back(std::move(work));
  else
    work();
}

WeightGradsNow::WeightGradsNow() : paused_(std::exchange(open_queue, nullptr)) {}

WeightGradsNow::~WeightGradsNow() { open_queue = paused_; }

void run_weight_grads(WeightGradQueue& queue) {
  for (auto& work : queue) work();
  queue.clear();
}

}  // namespace mt
