// The timeline recorder (core/tensor/trace.h): spans only while recording, on every thread, with their tracks'
// names, and Chrome trace JSON that a JSON reader takes.
#include "core/tensor/trace.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::trace {
namespace {

TEST(Trace, SpansRecordOnlyWhileRecordingAndTakeClears) {
  (void)take();
  { const Span off("compute", "before"); }
  resume(Device::cpu);
  {
    const Span outer("iteration", "iteration 1");
    { const Span inner("compute", "F 0.0", R"("microbatch": 0, "chunk": 0)"); }
  }
  pause();
  { const Span off("compute", "after"); }
  std::vector<Event> events = take();
  ASSERT_EQ(events.size(), 2u);
  // In the order they ended: the inner span first, inside the outer one.
  EXPECT_EQ(events[0].name, "F 0.0");
  EXPECT_EQ(events[0].category, "compute");
  EXPECT_EQ(events[1].name, "iteration 1");
  EXPECT_GE(events[0].start_us, events[1].start_us);
  EXPECT_LE(events[0].start_us + events[0].dur_us, events[1].start_us + events[1].dur_us + 1e-3);
  EXPECT_GE(events[0].dur_us, 0);
  // Times are since the Unix epoch (after 2020-01-01), so ranks of one machine line up.
  EXPECT_GT(events[1].start_us, 1.5e15);
  EXPECT_TRUE(take().empty());
}

TEST(Trace, OtherThreadsGetTracksOfTheirOwnWithTheirNames) {
  (void)take();
  resume(Device::cpu);
  { const Span here("wait", "main work"); }
  std::thread worker([] {
    name_thread("gradients reducer");
    const Span there("data-parallel", "all-reduce gradients bucket 0");
  });
  worker.join();
  pause();
  const std::vector<Event> events = take();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_NE(events[0].thread, events[1].thread);
  const std::vector<std::string> names = thread_names();
  ASSERT_LT(static_cast<size_t>(events[1].thread), names.size());
  EXPECT_EQ(names[static_cast<size_t>(events[1].thread)], "gradients reducer");
}

TEST(Trace, ChromeTraceIsJsonWithAProcessPerRankAndNamedTracks) {
  const std::vector<Event> rank0{{.name = "F 0.0",
                                  .category = "compute",
                                  .start_us = 1e15,
                                  .dur_us = 12.5,
                                  .thread = 0,
                                  .args = R"("microbatch": 0, "chunk": 0)"}};
  const std::vector<Event> rank1{
      {.name = "wait \"recv F 0.0\"", .category = "wait", .start_us = 1e15 + 3, .dur_us = 10, .thread = 1, .args = ""}};
  const std::string text =
      chrome_trace({chrome_events(rank0, 0, "rank 0 (tp 0 dp 0 pp 0)", {"main"}),
                    chrome_events(rank1, 1, "rank 1 (tp 0 dp 0 pp 1)", {"main", "gradients reducer"})});
  const nlohmann::json j = nlohmann::json::parse(text);  // throws on a malformed file
  const auto& ev = j.at("traceEvents");
  int spans = 0, process_names = 0, thread_names = 0;
  for (const auto& e : ev) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      ++spans;
      if (e.at("pid") == 0) {
        EXPECT_EQ(e.at("name"), "F 0.0");
        EXPECT_EQ(e.at("args").at("microbatch"), 0);
        EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 12.5);
      } else {
        EXPECT_EQ(e.at("name"), "wait \"recv F 0.0\"");  // escaped in the file, whole when read
        EXPECT_EQ(e.at("tid"), 1);
      }
    } else if (e.at("name") == "process_name") {
      ++process_names;
    } else if (e.at("name") == "thread_name") {
      ++thread_names;
    }
  }
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(process_names, 2);
  EXPECT_EQ(thread_names, 3);
}

}  // namespace
}  // namespace mt::trace
