// straggler.h: straggler detection (issue 46; after Megatron's straggler detector). Each logging interval every
// rank measures its busy time per iteration: the wall time less what its training thread spent blocked in
// collectives (issued and waited for: parallel/comm/flight_recorder.h's this_thread_comm_wait_ns). In synchronous
// training every rank's step lasts as long as the slowest's, so the wall time alone says nothing; the busy time is
// the rank's own work, and a slow rank is the one whose peers wait for it. The ranks' figures are compared within
// each pipeline stage (its ranks do the same work; stages differ by design): the slowest rank and its excess over
// the stage's median go to the log and metrics.jsonl, and a rank that stays above the median by more than
// logging.straggler_margin for three intervals in a row is warned about by name.
//
// On a GPU the host's view is what is measured (a collective the host does not wait for is not counted): a slow
// GPU shows where the host synchronises with it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mt::app {

struct StragglerVerdict {
  int slowest_rank = 0;    // global rank with the largest busy time over its stage's median
  double busy_ms = 0;      // its busy time per iteration
  double median_ms = 0;    // its stage's median
  double excess = 0;       // busy / median - 1
  bool warn = false;       // the same rank above the margin for `reports` intervals in a row (this one included)
  int intervals_slow = 0;  // how many in a row it has been
};

class StragglerWatch {
 public:
  // margin: the excess that counts as slow (0: never warn); ranks_per_stage: the ranks of one pipeline stage,
  // consecutive in global rank order (tp x cp x dp); reports: intervals in a row before a warning.
  StragglerWatch(double margin, int ranks_per_stage, int reports = 3);
  // One interval's busy time per iteration of every rank (by global rank).
  StragglerVerdict observe(const std::vector<double>& busy_ms);

 private:
  double margin_;
  int per_stage_, reports_;
  std::optional<int> slow_rank_;
  int slow_for_ = 0;
};

// "busy ms/iter: median 12.3, slowest rank 2 18.1 (+47%)": the log's line.
std::string straggler_line(const StragglerVerdict& v);

}  // namespace mt::app
