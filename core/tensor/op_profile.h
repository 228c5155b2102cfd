// op_profile.h: where one training step's time goes, op by op (logging.profile_iteration). Every entry point of
// core/tensor/ops.h opens a Scope; while a Session is open on this thread, the outermost Scope of each call is
// timed: on the CPU by the wall clock around the call, on the GPU by two CUDA events on the compute stream (so the
// figure is the device's time for the op's kernels, not the host's time to enqueue them). Nested entry points
// (an op that calls another) count once, in the outer one. With no Session open a Scope costs one thread-local
// load and a branch.
//
// Session::finish waits for the device and gives the rows, keyed by op and a detail (the GEMM's shape), with
// the step's wall time: what the ops do not cover (communication waits, host work, gaps between kernels) is
// the difference.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor/allocator.h"

namespace mt::op_profile {

struct Row {
  std::string op;      // the entry point's name, e.g. "gemm"
  std::string detail;  // e.g. "16384x6144x2048 nt" for a GEMM (M x N x K, transposes of a and b); may be empty
  int64_t calls = 0;
  double ms = 0;  // summed over the calls
};

struct Report {
  Device device = Device::cpu;
  double step_ms = 0;     // wall time from the Session's start to finish (after waiting for the device)
  std::vector<Row> rows;  // largest ms first
  double op_ms() const;   // the rows' sum
  // The rows summed per op (details merged), largest first.
  std::vector<Row> by_op() const;
};

class Recorder;
namespace detail {
extern thread_local Recorder* current;
}
inline bool active() noexcept { return detail::current != nullptr; }

// Records the ops this thread calls until finish() (or destruction, which discards the records). One at a time
// per thread.
class Session {
 public:
  explicit Session(Device device);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Report finish();

 private:
  Recorder* recorder_;
};

class Scope {
 public:
  explicit Scope(const char* op) {
    if (active()) start(op, std::string());
  }
  // `detail()` (returning a string) is called only while a Session records.
  template <class F>
  Scope(const char* op, F&& detail) {
    if (active()) start(op, detail());
  }
  ~Scope() {
    if (open_) stop();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void start(const char* op, std::string detail);
  void stop() noexcept;
  bool open_ = false;
  size_t entry_ = 0;  // SIZE_MAX: a nested call, not timed
};

// Markdown tables: the per-op totals, then the `max_rows` largest rows by op and detail (none when 0), each with
// calls, ms, share of the step and ms per call; a first line says what was timed and how.
std::string format_report(const Report& r, int64_t iteration, size_t max_rows);

}  // namespace mt::op_profile
