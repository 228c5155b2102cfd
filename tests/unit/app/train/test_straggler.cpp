// test_straggler.cpp: the ranks' busy times compared within their pipeline stages (app/train/straggler.h).
#include "app/train/straggler.h"

#include <gtest/gtest.h>

namespace mt::app {
namespace {

TEST(StragglerWatch, TheSlowestRankIsMeasuredAgainstItsOwnStagesMedian) {
  // Two stages of 4 ranks: stage 1 is slower by design (the head), rank 6 is slow within it.
  StragglerWatch w(0.2, 4);
  const StragglerVerdict v = w.observe({10, 10, 11, 10, 20, 20, 30, 20});
  EXPECT_EQ(v.slowest_rank, 6);
  EXPECT_DOUBLE_EQ(v.median_ms, 20);
  EXPECT_DOUBLE_EQ(v.excess, 0.5);
  EXPECT_FALSE(v.warn);  // one interval is not yet a straggler
  EXPECT_EQ(v.intervals_slow, 1);
}

TEST(StragglerWatch, ARankSlowThreeIntervalsInARowIsWarnedAbout) {
  StragglerWatch w(0.2, 4);
  EXPECT_FALSE(w.observe({10, 10, 15, 10}).warn);
  EXPECT_FALSE(w.observe({10, 10, 15, 10}).warn);
  const StragglerVerdict v = w.observe({10, 10, 15, 10});
  EXPECT_TRUE(v.warn);
  EXPECT_EQ(v.slowest_rank, 2);
  EXPECT_EQ(v.intervals_slow, 3);
  // Another rank slow, or none: the count starts again.
  EXPECT_FALSE(w.observe({10, 15, 10, 10}).warn);
  EXPECT_EQ(w.observe({10, 10, 10, 10}).intervals_slow, 0);
}

TEST(StragglerWatch, WithinTheMarginOrWithMarginZeroNobodyIsWarnedAbout) {
  StragglerWatch within(0.2, 2), off(0, 2);
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(within.observe({10, 11.5}).warn);
    EXPECT_FALSE(off.observe({10, 30}).warn);
  }
}

TEST(StragglerWatch, TimesThatDoNotFillTheStagesAreALogicError) {
  StragglerWatch w(0.2, 4);
  EXPECT_THROW(w.observe({1, 2, 3}), std::logic_error);
  EXPECT_THROW(w.observe({}), std::logic_error);
}

TEST(StragglerLine, SaysTheMedianAndTheSlowestRank) {
  const std::string line = straggler_line({.slowest_rank = 2, .busy_ms = 18.1, .median_ms = 12.3, .excess = 0.4716});
  EXPECT_NE(line.find("stage median 12.30, slowest rank 2 18.10 (+47%)"), std::string::npos) << line;
}

}  // namespace
}  // namespace mt::app
