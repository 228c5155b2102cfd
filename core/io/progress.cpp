#include "core/io/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace mt {

namespace {

constexpr double kMB = 1048576.0;  // as preprocess_data.py's "MB/s"

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "12/291 tensors"
std::string pieces(const ProgressCount& c, std::string_view noun) {
  return fmt::format("{}/{} {}", c.done, c.total, noun);
}

void print_to_stderr(const std::string& line) {
  std::fputs((line + '\n').c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace

PieceCounter::PieceCounter(ProgressHook hook, std::vector<int64_t> piece_bytes)
    : hook_(std::move(hook)), piece_bytes_(std::move(piece_bytes)) {
  count_.total = static_cast<int64_t>(piece_bytes_.size());
  for (const int64_t b : piece_bytes_) count_.total_bytes += b;
}

void PieceCounter::piece_done() {
  if (count_.done >= count_.total) return;
  count_.bytes += piece_bytes_[static_cast<size_t>(count_.done++)];
  if (hook_) hook_(count_);
}

bool progress_wanted(ProgressMode mode, bool stderr_is_terminal) {
  return mode == ProgressMode::always || (mode == ProgressMode::automatic && stderr_is_terminal);
}

bool progress_wanted(ProgressMode mode) { return progress_wanted(mode, ::isatty(STDERR_FILENO) == 1); }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  return fmt::format("{}d{:02}h", s / 86400, s % 86400 / 3600);
}

std::string progress_line(std::string_view what, std::string_view items, int64_t done_bytes, int64_t total_bytes,
                          double elapsed_s) {
  const double rate = elapsed_s > 0 ? static_cast<double>(done_bytes) / elapsed_s : 0;  // bytes per second
  std::string line = fmt::format("{}: {}, ", what, items);
  if (total_bytes <= 0) return line + fmt::format("{:.1f} MB, {:.1f} MB/s", done_bytes / kMB, rate / kMB);
  const double eta = rate > 0 ? static_cast<double>(total_bytes - done_bytes) / rate : NAN;
  return line + fmt::format("{:.1f}/{:.1f} MB, {:.1f} MB/s, ETA {}", done_bytes / kMB, total_bytes / kMB, rate / kMB,
                            format_duration(eta));
}

Progress::Progress(ProgressOptions options) : o_(std::move(options)) {
  if (!o_.clock) o_.clock = steady_seconds;
  if (!o_.print) o_.print = print_to_stderr;
  start_ = last_ = now();
}

double Progress::now() const { return o_.clock(); }

void Progress::update(int64_t done_bytes, int64_t total_bytes, const std::function<std::string()>& items) {
  if (!o_.enabled) return;
  const double t = now();
  if (t - last_ < o_.interval_s) return;
  last_ = t;
  printed_ = true;
  o_.print(progress_line(o_.what, items(), done_bytes, total_bytes, t - start_));
}

void Progress::finish(int64_t done_bytes, std::string_view items) {
  if (!o_.enabled || (!printed_ && !o_.last_line_when_quick)) return;
  const double elapsed = now() - start_;
  const double rate = elapsed > 0 ? static_cast<double>(done_bytes) / elapsed : 0;
  o_.print(fmt::format("{}: done: {}, {:.1f} MB in {}, {:.1f} MB/s", o_.what, items, done_bytes / kMB,
                       format_duration(elapsed), rate / kMB));
}

ProgressHook Progress::hook(std::string noun) {
  noun_ = std::move(noun);
  return [this](const ProgressCount& c) {
    pieces_ = c;
    update(c.bytes, c.total_bytes, [this] { return pieces(pieces_, noun_); });
  };
}

void Progress::finish() { finish(pieces_.bytes, pieces(pieces_, noun_)); }

}  // namespace mt
