// test_flight_recorder.cpp: the ring of the last collectives, its dump, and the analysis that names the rank a hang
// waits for (parallel/comm/flight_recorder.h).
#include "parallel/comm/flight_recorder.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor/tensor.h"
#include "parallel/comm/comm_counted.h"
#include "parallel/comm/communicator.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

std::vector<CollectiveRecord> of_group(const std::string& group) {
  std::vector<CollectiveRecord> out;
  for (const CollectiveRecord& c : flight_recorder().records())
    if (c.group == group) out.push_back(c);
  return out;
}

TEST(FlightRecorder, CountedCommunicatorsNumberTheirCollectivesAndMarkTheFinished) {
  auto comm = make_counted_communicator(make_self_communicator("fr_test[0]"), "fr_test");
  const std::vector<float> v = {1, 2, 3, 4};
  Tensor t = Tensor::from_floats(v, {4});
  comm->all_reduce(t, ReduceOp::sum)->wait();
  auto pending = comm->all_reduce(t, ReduceOp::sum);  // issued, not waited for yet
  const std::vector<CollectiveRecord> ops = of_group("fr_test[0]");
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].seq, 1);
  EXPECT_EQ(ops[1].seq, 2);
  EXPECT_EQ(ops[0].op, "all_reduce");
  EXPECT_EQ(ops[0].bytes, 16);
  EXPECT_GT(ops[0].finished_s, 0);
  EXPECT_EQ(ops[1].finished_s, 0);
  pending->wait();
  EXPECT_GT(of_group("fr_test[0]").back().finished_s, 0);
}

TEST(FlightRecorder, TheRingKeepsTheLastOpsAndADumpReadsBack) {
  FlightRecorder& fr = flight_recorder();
  for (size_t i = 0; i < FlightRecorder::kCapacity + 10; ++i)
    fr.finished(fr.queued("ring[0,1]", int64_t(i) + 1, "x", 1));
  const std::vector<CollectiveRecord> all = fr.records();
  ASSERT_EQ(all.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(all.back().seq, int64_t(FlightRecorder::kCapacity) + 10);
  testing_util::TempDir dir("mt_flight");
  const std::string path = dir / "rank_00001.json";
  ASSERT_TRUE(fr.dump(path, 1, 2, "a reason"));
  const FlightDump d = read_flight_dump(path);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.world, 2);
  EXPECT_EQ(d.reason, "a reason");
  ASSERT_EQ(d.collectives.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(d.collectives.back().group, "ring[0,1]");
  EXPECT_THROW(read_flight_dump(dir / "absent.json"), std::runtime_error);
}

CollectiveRecord op(const std::string& group, int64_t seq, bool finished) {
  return {.group = group, .seq = seq, .op = "all_reduce", .bytes = 8, .queued_s = 1, .finished_s = finished ? 2.0 : 0};
}

TEST(FlightDumps, TheRankThatLeftNoRecordIsTheSuspectOfAGroupsWait) {
  // Ranks 0, 1, 3 wait in dp's all-reduce #3; rank 2 (stopped) left nothing.
  std::vector<FlightDump> dumps;
  for (int r : {0, 1, 3})
    dumps.push_back(
        {.rank = r,
         .world = 4,
         .reason = "timed out",
         .collectives = {op("dp[0,1,2,3]", 1, true), op("dp[0,1,2,3]", 2, true), op("dp[0,1,2,3]", 3, false)}});
  const HangReport r = analyse_flight_dumps(dumps);
  EXPECT_EQ(r.suspects, std::vector<int>{2});
  const bool named = std::any_of(r.lines.begin(), r.lines.end(), [](const std::string& l) {
    return l.find("dp[0,1,2,3]: rank(s) 0, 1, 3 waited in all_reduce #3") != std::string::npos &&
           l.find("rank(s) 2 left no record") != std::string::npos;
  });
  EXPECT_TRUE(named) << r.lines[1];
}

TEST(FlightDumps, ARankThatNeverIssuedTheCollectiveIsNamedWithItsLastOne) {
  // tp[0,1]: rank 0 waits in #5; rank 1 dumped too (it failed elsewhere) but issued only up to #4.
  std::vector<FlightDump> dumps = {
      {.rank = 0, .world = 2, .reason = "timed out", .collectives = {op("tp[0,1]", 4, true), op("tp[0,1]", 5, false)}},
      {.rank = 1, .world = 2, .reason = "bad data", .collectives = {op("tp[0,1]", 4, true)}}};
  const HangReport r = analyse_flight_dumps(dumps);
  EXPECT_EQ(r.suspects, std::vector<int>{1});
  EXPECT_NE(r.lines[1].find("rank(s) 1 never issued it (rank 1: its last was #4)"), std::string::npos) << r.lines[1];
}

TEST(FlightDumps, ARankBlockedInAnotherCollectiveIsNotTheSuspect) {
  // Rank 1 never issued dp #3: its gradient reducer waits in dpgrads #2 for rank 2, which left nothing.
  std::vector<FlightDump> dumps = {{.rank = 0, .world = 3, .reason = "x", .collectives = {op("dp[0,1,2]", 3, false)}},
                                   {.rank = 1,
                                    .world = 3,
                                    .reason = "x",
                                    .collectives = {op("dp[0,1,2]", 2, true), op("dpgrads[0,1,2]", 2, false)}}};
  const HangReport r = analyse_flight_dumps(dumps);
  EXPECT_EQ(r.suspects, std::vector<int>{2});
  EXPECT_NE(r.lines[1].find("rank 1: its last was #2, blocked in all_reduce #2 on dpgrads[0,1,2]"), std::string::npos)
      << r.lines[1];
}

TEST(FlightDumps, NoWaitMeansNoSuspect) {
  std::vector<FlightDump> dumps = {{.rank = 0, .world = 1, .reason = "x", .collectives = {op("w[0]", 1, true)}}};
  EXPECT_TRUE(analyse_flight_dumps(dumps).suspects.empty());
}

}  // namespace
}  // namespace mt
