// op_profile.cpp: the op profiler's records (one Recorder per open Session, on its thread) and its tables.
#include "core/tensor/op_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/tensor/backend.h"

namespace mt::op_profile {

using Clock = std::chrono::steady_clock;

namespace detail {
thread_local Recorder* current = nullptr;
}

class Recorder {
 public:
  explicit Recorder(Device device) : device_(device), runtime_(find_runtime(device)), begin_(Clock::now()) {}
  ~Recorder() { release_events(); }

  size_t open(const char* op, std::string detail) {
    std::string key = detail.empty() ? std::string(op) : fmt::format("{}\t{}", op, detail);
    auto [it, inserted] = keys_.try_emplace(std::move(key), rows_.size());
    if (inserted) rows_.push_back(Row{.op = op, .detail = std::move(detail)});
    Entry e{.row = it->second, .t0 = Clock::now()};
    if (runtime_) {  // a device's ops are timed by its events, the host's by the wall clock
      e.ev0 = event();
      e.ev1 = event();
      record(e.ev0);
    }
    entries_.push_back(e);
    return entries_.size() - 1;
  }

  void close(size_t i) noexcept {
    Entry& e = entries_[i];
    e.t1 = Clock::now();
    e.closed = true;
    if (runtime_) {
      try {
        record(e.ev1);
      } catch (const std::exception& ex) {  // a failing op already threw; its figure is left out
        e.closed = false;
        spdlog::debug("op profile: recording the end of {} failed: {}", rows_[e.row].op, ex.what());
      }
    }
  }

  Report finish() {
    Report r;
    r.device = device_;
    if (runtime_) runtime_->synchronize();
    r.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - begin_).count();
    for (const Entry& e : entries_) {
      if (!e.closed) continue;
      double ms = std::chrono::duration<double, std::milli>(e.t1 - e.t0).count();
      if (runtime_) ms = runtime_->elapsed_ms(e.ev0, e.ev1);
      Row& row = rows_[e.row];
      ++row.calls;
      row.ms += ms;
    }
    r.rows = rows_;
    std::erase_if(r.rows, [](const Row& x) { return x.calls == 0; });
    std::stable_sort(r.rows.begin(), r.rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
    return r;
  }

  int depth = 0;

 private:
  struct Entry {
    size_t row = 0;
    Clock::time_point t0, t1;
    void* ev0 = nullptr;
    void* ev1 = nullptr;
    bool closed = false;
  };

  void* event() {
    events_.push_back(runtime_->create_timing_event());
    return events_.back();
  }
  void record(void* ev) { runtime_->record_timing_event(ev); }
  void release_events() noexcept {
    for (void* e : events_) runtime_->destroy_timing_event(e);
    events_.clear();
  }

  Device device_;
  DeviceRuntime* runtime_;  // null on the host
  Clock::time_point begin_;
  std::map<std::string, size_t> keys_;
  std::vector<Row> rows_;
  std::vector<Entry> entries_;
  std::vector<void*> events_;
};

double Report::op_ms() const {
  double s = 0;
  for (const Row& r : rows) s += r.ms;
  return s;
}

std::vector<Row> Report::by_op() const {
  std::vector<Row> out;
  std::map<std::string, size_t> at;
  for (const Row& r : rows) {
    auto [it, inserted] = at.try_emplace(r.op, out.size());
    if (inserted) out.push_back(Row{.op = r.op});
    out[it->second].calls += r.calls;
    out[it->second].ms += r.ms;
  }
  std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return out;
}

Session::Session(Device device) {
  if (detail::current) throw std::logic_error("op profile: a session is already open on this thread");
  recorder_ = new Recorder(device);
  detail::current = recorder_;
}

Session::~Session() {
  if (detail::current == recorder_) detail::current = nullptr;
  delete recorder_;
}

Report Session::finish() {
  if (detail::current != recorder_) throw std::logic_error("op profile: this session is not the open one");
  detail::current = nullptr;  // the waits and reads below are not ops of the step
  return recorder_->finish();
}

void Scope::start(const char* op, std::string detail) {
  Recorder& r = *detail::current;
  entry_ = r.depth > 0 ? SIZE_MAX : r.open(op, std::move(detail));
  ++r.depth;  // after open: an open that throws leaves no scope behind
  open_ = true;
}

void Scope::stop() noexcept {
  Recorder* r = detail::current;
  if (!r) return;  // the session ended inside this op
  --r->depth;
  if (entry_ != SIZE_MAX) r->close(entry_);
}

std::string format_report(const Report& r, int64_t iteration, size_t max_rows) {
  const double step = r.step_ms > 0 ? r.step_ms : 1;
  const double ops = r.op_ms();
  std::string out = fmt::format(
      "op profile of iteration {} on the {}: step {:.2f} ms (wall), ops {:.2f} ms ({:.1f}%), outside the ops {:.2f} ms "
      "({:.1f}%: communication waits, host work, gaps between kernels)\n",
      iteration, r.device == Device::cuda ? "GPU (CUDA events on the compute stream)" : "CPU (wall clock per op)",
      r.step_ms, ops, 100 * ops / step, r.step_ms - ops, 100 * (r.step_ms - ops) / step);
  auto table = [&](const std::vector<Row>& rows, bool details, size_t limit) {
    out += details ? "\n| op | detail | calls | ms | % of step | ms/call "
                     "|\n|----|--------|------:|---:|----------:|--------:|\n"
                   : "\n| op | calls | ms | % of step | ms/call |\n|----|------:|---:|----------:|--------:|\n";
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
      const Row& x = rows[i];
      const double per = x.calls > 0 ? x.ms / static_cast<double>(x.calls) : 0;
      if (details)
        out += fmt::format("| {} | {} | {} | {:.3f} | {:.1f} | {:.4f} |\n", x.op, x.detail, x.calls, x.ms,
                           100 * x.ms / step, per);
      else
        out += fmt::format("| {} | {} | {:.3f} | {:.1f} | {:.4f} |\n", x.op, x.calls, x.ms, 100 * x.ms / step, per);
    }
    if (rows.size() > limit)
      out += fmt::format("| ({} more) |{}\n", rows.size() - limit, details ? " | | | | |" : " | | | |");
  };
  table(r.by_op(), false, SIZE_MAX);
  if (max_rows > 0) table(r.rows, true, max_rows);
  return out;
}

}  // namespace mt::op_profile
