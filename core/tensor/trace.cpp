// trace.cpp: the process's span recorder and its Chrome trace JSON (core/tensor/trace.h).
#include "core/tensor/trace.h"

#include <chrono>
#include <mutex>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/tensor/backend.h"

namespace mt::trace {

namespace detail {
std::atomic<bool> recording{false};
}

namespace {

struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
  std::vector<std::string> names;  // by track
  Device device = Device::cpu;
  bool clock_set = false;
  std::chrono::steady_clock::time_point steady0;
  double epoch_us0 = 0;  // the system clock at steady0
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

std::atomic<int> next_track{0};
thread_local int track = -1;

int this_track() {
  if (track < 0) {
    track = next_track.fetch_add(1);
    Recorder& r = recorder();
    std::lock_guard lock(r.mu);
    if (static_cast<int>(r.names.size()) <= track) r.names.resize(static_cast<size_t>(track) + 1);
    if (r.names[static_cast<size_t>(track)].empty())
      r.names[static_cast<size_t>(track)] = track == 0 ? "main" : fmt::format("thread {}", track);
  }
  return track;
}

double now_us() {
  Recorder& r = recorder();
  return r.epoch_us0 + std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - r.steady0).count();
}

}  // namespace

void resume(Device device) {
  Recorder& r = recorder();
  (void)this_track();  // the thread that starts recording is track 0 when it is the first to ask
  {
    std::lock_guard lock(r.mu);
    r.device = device;
    if (!r.clock_set) {
      // The system clock read between two steady reads, the closest of a few tries: a preemption between the reads
      // would shift this rank's whole timeline against the other ranks'.
      auto gap = std::chrono::steady_clock::duration::max();
      for (int i = 0; i < 8; ++i) {
        const auto before = std::chrono::steady_clock::now();
        const auto system = std::chrono::system_clock::now();
        const auto after = std::chrono::steady_clock::now();
        if (after - before >= gap) continue;
        gap = after - before;
        r.steady0 = before + gap / 2;
        r.epoch_us0 = std::chrono::duration<double, std::micro>(system.time_since_epoch()).count();
      }
      r.clock_set = true;
    }
  }
  detail::recording.store(true);
}

void pause() { detail::recording.store(false); }

std::vector<Event> take() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  return std::exchange(r.events, {});
}

void name_thread(const std::string& name) {
  const int t = this_track();
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  r.names[static_cast<size_t>(t)] = name;
}

std::vector<std::string> thread_names() {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  return r.names;
}

Span::Span(const char* category, std::string name, std::string args) {
  if (!recording()) return;
  on_ = true;
  category_ = category;
  name_ = std::move(name);
  args_ = std::move(args);
  start_us_ = now_us();
}

Span::~Span() {
  if (!on_) return;
  Recorder& r = recorder();
  if (DeviceRuntime* rt = find_runtime(r.device)) {
    try {
      rt->synchronize();  // the span is its work's time
    } catch (...) {
      // a failing device surfaces at the next op; a trace must not throw from a destructor
    }
  }
  Event e{.name = std::move(name_),
          .category = category_,
          .start_us = start_us_,
          .dur_us = now_us() - start_us_,
          .thread = this_track(),
          .args = std::move(args_)};
  std::lock_guard lock(r.mu);
  r.events.push_back(std::move(e));
}

std::string chrome_events(const std::vector<Event>& events, int pid, const std::string& process_name,
                          const std::vector<std::string>& thread_names) {
  std::vector<std::string> out;
  out.push_back(fmt::format(R"({{"ph": "M", "pid": {}, "name": "process_name", "args": {{"name": {}}}}})", pid,
                            nlohmann::json(process_name).dump()));
  out.push_back(
      fmt::format(R"({{"ph": "M", "pid": {}, "name": "process_sort_index", "args": {{"sort_index": {}}}}})", pid, pid));
  for (size_t t = 0; t < thread_names.size(); ++t)
    out.push_back(fmt::format(R"({{"ph": "M", "pid": {}, "tid": {}, "name": "thread_name", "args": {{"name": {}}}}})",
                              pid, t, nlohmann::json(thread_names[t]).dump()));
  for (const Event& e : events)
    out.push_back(fmt::format(R"({{"ph": "X", "pid": {}, "tid": {}, "ts": {:.3f}, "dur": {:.3f}, "name": {}, )"
                              R"("cat": {}, "args": {{{}}}}})",
                              pid, e.thread, e.start_us, e.dur_us, nlohmann::json(e.name).dump(),
                              nlohmann::json(e.category).dump(), e.args));
  return fmt::format("{}", fmt::join(out, ",\n"));
}

std::string chrome_trace(const std::vector<std::string>& processes) {
  std::vector<std::string> parts;
  for (const std::string& p : processes)
    if (!p.empty()) parts.push_back(p);
  return fmt::format("{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{}\n]}}\n", fmt::join(parts, ",\n"));
}

}  // namespace mt::trace
