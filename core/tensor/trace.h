// trace.h: a timeline of chosen iterations (logging.trace): spans that any thread of this process opens while
// recording is on (the pipeline's forwards, backwards, sends, receives and waits, the gradient reductions on the
// reducer threads, the optimizer, checkpoints), written as Chrome trace JSON (Perfetto, chrome://tracing).
//
// Times are host times in microseconds since the Unix epoch (the system clock read once when recording first
// starts, then the steady clock), so the ranks of one machine line up. On the GPU a span ends with a device
// synchronization while recording (the traced iterations run slower): a span is then its work's time, not the
// host's time to enqueue it. With recording off a Span costs one atomic load and a branch.
#pragma once
#include <atomic>
#include <string>
#include <vector>

#include "core/tensor/allocator.h"

namespace mt::trace {

struct Event {
  std::string name;      // e.g. "F mb 3 chunk 0"
  std::string category;  // "compute", "p2p", "wait", "data-parallel", "optimizer", "checkpoint", "iteration", ...
  double start_us = 0;   // since the Unix epoch
  double dur_us = 0;
  int thread = 0;    // this process's track: 0 for the thread that first started recording, then in order of use
  std::string args;  // members of a JSON object (`"microbatch": 3, "chunk": 0`), or empty
};

namespace detail {
extern std::atomic<bool> recording;
}
inline bool recording() noexcept { return detail::recording.load(std::memory_order_relaxed); }

// Starts (or resumes) recording; events accumulate until take(). `device`: where the work runs (the GPU's spans
// end with a synchronization).
void resume(Device device);
// Stops recording; the events so far are kept.
void pause();
// The events recorded since the last take(), in the order they ended; clears them.
std::vector<Event> take();
// Names the calling thread's track (the name shows in the trace); may be called before any recording.
void name_thread(const std::string& name);
// The tracks' names so far, by track number (unnamed tracks: "thread N").
std::vector<std::string> thread_names();

// A span from construction to destruction on the calling thread (nothing while not recording).
class Span {
 public:
  Span(const char* category, std::string name, std::string args = {});
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_ = false;
  const char* category_ = nullptr;
  std::string name_, args_;
  double start_us_ = 0;
};

// One process's events as Chrome trace events (a JSON array's members, no brackets): the metadata that names the
// process `pid` (`process_name`, sorted by pid) and its tracks, then one complete ("X") event per span.
std::string chrome_events(const std::vector<Event>& events, int pid, const std::string& process_name,
                          const std::vector<std::string>& thread_names);
// A trace file's text from processes' chrome_events.
std::string chrome_trace(const std::vector<std::string>& processes);

}  // namespace mt::trace
