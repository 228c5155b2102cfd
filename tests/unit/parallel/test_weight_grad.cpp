// test_weight_grad.cpp: the thread's weight-gradient deferral (parallel/pipeline/weight_grad.h): work queued in order while a
// WeightGradDeferral is open, run at once without one, and run at once inside one while a WeightGradsNow lives.
#include <gtest/gtest.h>

#include <string>

#include "parallel/pipeline/weight_grad.h"

namespace mt {
namespace {

TEST(WeightGrad, RunsAtOnceWithoutADeferral) {
  std::string log;
  weight_grad_work([&] { log += "a"; });
  EXPECT_EQ(log, "a");
}

TEST(WeightGrad, QueuesInOrderUntilTaken) {
  std::string log;
  WeightGradDeferral deferral;
  weight_grad_work([&] { log += "a"; });
  weight_grad_work([&] { log += "b"; });
  EXPECT_EQ(log, "");
  WeightGradQueue queue = deferral.take();
  weight_grad_work([&] { log += "c"; });  // taken: no longer deferring
  EXPECT_EQ(log, "c");
  run_weight_grads(queue);
  EXPECT_EQ(log, "cab");
  EXPECT_TRUE(queue.empty());
}

TEST(WeightGrad, NowRunsInsideADeferralAndRestoresIt) {
  std::string log;
  WeightGradDeferral deferral;
  weight_grad_work([&] { log += "a"; });
  {
    WeightGradsNow now;
    weight_grad_work([&] { log += "h"; });  // the head's dW: at once
    EXPECT_EQ(log, "h");
  }
  weight_grad_work([&] { log += "b"; });  // deferred again
  EXPECT_EQ(log, "h");
  WeightGradQueue queue = deferral.take();
  run_weight_grads(queue);
  EXPECT_EQ(log, "hab");
}

TEST(WeightGrad, OneDeferralAThread) {
  WeightGradDeferral deferral;
  EXPECT_THROW(WeightGradDeferral second, std::logic_error);
}

}  // namespace
}  // namespace mt
