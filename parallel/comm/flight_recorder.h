// flight_recorder.h: each process's last collectives (after PyTorch's NCCL flight recorder), kept in a ring in the
// communicator layer: for every op of every counted group (comm_counted.h) its sequence number in that group, the
// op, the bytes, when it was queued and when its wait returned. Dumped as JSON when a rank fails (a collective that
// timed out, a peer gone: app/train/train.cpp), so that `megatrain debug hang RUN_DIR` can compare the ranks' dumps
// and name the ones that never reached a collective the others waited in (a stopped, killed or slow rank).
//
// The k-th op a rank issues on a group is op k of that group on every rank of it (every rank issues a group's ops in
// the same order: the rule that keeps NCCL from deadlocking), so dumps line up by (group, sequence number).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct CollectiveRecord {
  std::string group;      // the communicator's name, e.g. "dp[0,2]"
  int64_t seq = 0;        // 1, 2, ...: this op's number in its group on this rank
  std::string op;         // all_reduce, reduce_scatter, all_gather, broadcast, send, recv, all_to_all, barrier
  int64_t bytes = 0;      // the buffer's
  double queued_s = 0;    // Unix time the op was issued
  double finished_s = 0;  // Unix time its wait returned; 0: not (yet)
};

class FlightRecorder {
 public:
  static constexpr size_t kCapacity = 4096;  // the last ops kept

  // Records an op issued now; returns its slot for finished().
  uint64_t queued(const std::string& group, int64_t seq, const std::string& op, int64_t bytes);
  // The op of `slot` completed (a no-op when the ring has overwritten it since).
  void finished(uint64_t slot);
  // The kept records, oldest first.
  std::vector<CollectiveRecord> records() const;
  // Writes {"rank", "world", "reason", "dumped_s", "collectives": [...]} to `path` (atomically); false when it
  // cannot (a dump is evidence, never a reason to fail further).
  bool dump(const std::string& path, int rank, int world, const std::string& reason) const;
};

// This process's recorder (every counted communicator records into it).
FlightRecorder& flight_recorder();

// Nanoseconds the calling thread has spent inside counted communicators' ops and their waits (blocked in
// collectives, as the host sees it) since it started: app/train/straggler.h's busy time is the wall time less this.
int64_t this_thread_comm_wait_ns();
// Adds the time from its construction to its destruction to this_thread_comm_wait_ns().
class CommWaitTimer {
 public:
  CommWaitTimer();
  ~CommWaitTimer();
  CommWaitTimer(const CommWaitTimer&) = delete;
  CommWaitTimer& operator=(const CommWaitTimer&) = delete;

 private:
  int64_t start_ns_;
};

// A dump read back (FlightRecorder::dump's JSON); std::runtime_error naming the file when it is not one.
struct FlightDump {
  int rank = 0, world = 0;
  std::string reason;
  double dumped_s = 0;
  std::vector<CollectiveRecord> collectives;
};
FlightDump read_flight_dump(const std::string& path);

// What the dumps of one job say about a hang or a failure: for each group where some rank waited in collective k
// (issued, never finished), the members that never issued k (a dump shows fewer ops on that group) or left no
// dump at all (stopped, killed, or hung outside a collective) are the suspects; `lines` says it for a person.
struct HangReport {
  std::vector<int> suspects;  // ascending global ranks
  std::vector<std::string> lines;
};
HangReport analyse_flight_dumps(const std::vector<FlightDump>& dumps);

}  // namespace mt
