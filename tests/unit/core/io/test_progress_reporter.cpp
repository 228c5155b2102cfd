// test_progress_reporter.cpp: the progress line of long jobs (core/io/progress.h) on an injected clock: a line
// only every interval, the ETA from the rate so far, the last line, and when it prints at all.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/io/progress.h"

using namespace mt;

namespace {

constexpr int64_t MB = 1 << 20;

// A reporter whose clock the test moves and whose lines it keeps.
struct Watched {
  double t = 100;  // any start: only differences count
  std::vector<std::string> lines;
  Progress progress{ProgressOptions{.what = "job",
                                    .interval_s = 5,
                                    .clock = [this] { return t; },
                                    .print = [this](const std::string& l) { lines.push_back(l); }}};
};

}  // namespace

TEST(ProgressReporter, PrintsOnlyOnceAnIntervalHasPassed) {
  Watched w;
  int built = 0;
  const auto items = [&built] { return "n " + std::to_string(++built); };
  w.t += 4.9;
  w.progress.update(1 * MB, 0, items);
  EXPECT_TRUE(w.lines.empty());
  EXPECT_EQ(built, 0) << "the items text is only built for a line";
  w.t += 0.2;  // 5.1 s since the start
  w.progress.update(2 * MB, 0, items);
  ASSERT_EQ(w.lines.size(), 1u);
  w.t += 4;  // 4 s since that line
  w.progress.update(3 * MB, 0, items);
  EXPECT_EQ(w.lines.size(), 1u);
  w.t += 1;
  w.progress.update(4 * MB, 0, items);
  ASSERT_EQ(w.lines.size(), 2u);
  EXPECT_EQ(w.lines[1], "job: n 2, 4.0 MB, 0.4 MB/s");  // 4 MB in 10.1 s
}

TEST(ProgressReporter, EtaIsTheRemainingBytesAtTheRateSoFar) {
  Watched w;
  w.t += 10;
  w.progress.update(25 * MB, 100 * MB, [] { return std::string("12/48 tensors"); });
  ASSERT_EQ(w.lines.size(), 1u);
  // 2.5 MB/s: the 75 MB left take 30 s.
  EXPECT_EQ(w.lines[0], "job: 12/48 tensors, 25.0/100.0 MB, 2.5 MB/s, ETA 30s");
  EXPECT_EQ(progress_line("job", "x", 0, 100 * MB, 0), "job: x, 0.0/100.0 MB, 0.0 MB/s, ETA ?");
  EXPECT_EQ(progress_line("job", "x", 10 * MB, 40 * MB, 600), "job: x, 10.0/40.0 MB, 0.0 MB/s, ETA 30m00s");
}

TEST(ProgressReporter, TheLastLineSaysDoneWithTheElapsedTime) {
  Watched w;
  w.t += 90;
  w.progress.finish(180 * MB, "7 documents, 99 tokens");
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_EQ(w.lines[0], "job: done: 7 documents, 99 tokens, 180.0 MB in 1m30s, 2.0 MB/s");
}

TEST(ProgressReporter, ADisabledReporterPrintsNothing) {
  std::vector<std::string> lines;
  double t = 0;
  Progress p(ProgressOptions{.what = "job",
                             .enabled = false,
                             .clock = [&t] { return t; },
                             .print = [&lines](const std::string& l) { lines.push_back(l); }});
  t = 60;
  p.update(MB, 0, [] { return std::string("x"); });
  p.finish(MB, "x");
  EXPECT_TRUE(lines.empty());
}

TEST(ProgressReporter, AutomaticPrintsOnATerminalOnly) {
  EXPECT_TRUE(progress_wanted(ProgressMode::automatic, true));
  EXPECT_FALSE(progress_wanted(ProgressMode::automatic, false));
  EXPECT_TRUE(progress_wanted(ProgressMode::always, false));
  EXPECT_FALSE(progress_wanted(ProgressMode::never, true));
}

TEST(ProgressReporter, AJobOfPiecesCountsThem) {
  Watched w;
  const ProgressHook hook = w.progress.hook("tensors");
  w.t += 2;
  hook({.done = 1, .total = 4, .bytes = 10 * MB, .total_bytes = 40 * MB});
  EXPECT_TRUE(w.lines.empty());
  w.t += 3;
  hook({.done = 2, .total = 4, .bytes = 20 * MB, .total_bytes = 40 * MB});
  ASSERT_EQ(w.lines.size(), 1u);
  EXPECT_EQ(w.lines[0], "job: 2/4 tensors, 20.0/40.0 MB, 4.0 MB/s, ETA 5s");
  w.t += 5;
  hook({.done = 4, .total = 4, .bytes = 40 * MB, .total_bytes = 40 * MB});
  w.progress.finish();
  EXPECT_EQ(w.lines.back(), "job: done: 4/4 tensors, 40.0 MB in 10s, 4.0 MB/s");
}

TEST(ProgressReporter, APieceCounterAddsEachPieceToTheCount) {
  std::vector<ProgressCount> seen;
  PieceCounter counter([&seen](const ProgressCount& c) { seen.push_back(c); }, {10, 30, 60});
  counter.piece_done();
  counter.piece_done();
  counter.piece_done();
  counter.piece_done();  // past the last piece: nothing
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].done, 2);
  EXPECT_EQ(seen[1].total, 3);
  EXPECT_EQ(seen[1].bytes, 40);
  EXPECT_EQ(seen[2].bytes, 100);
  EXPECT_EQ(seen[2].total_bytes, 100);
}

TEST(ProgressReporter, AQuickJobCanEndWithoutALine) {
  std::vector<std::string> lines;
  double t = 0;
  const auto quick = [&](double seconds) {
    Progress p(ProgressOptions{.what = "save",
                               .interval_s = 5,
                               .last_line_when_quick = false,
                               .clock = [&t] { return t; },
                               .print = [&lines](const std::string& l) { lines.push_back(l); }});
    t += seconds;
    p.update(MB, 2 * MB, [] { return std::string("x"); });
    p.finish(2 * MB, "x");
  };
  quick(1);
  EXPECT_TRUE(lines.empty());
  quick(6);
  ASSERT_EQ(lines.size(), 2u);  // the progress line, then the last one
  EXPECT_EQ(lines[1], "save: done: x, 2.0 MB in 6s, 0.3 MB/s");
}
