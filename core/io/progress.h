// progress.h: the progress line of a long job (data prepare, ckpt import / export, a checkpoint save or load),
// printed every few seconds on standard error as Megatron's preprocess_data.py does:
//   data prepare: 120000 documents, 130123456 tokens, 512.0/2048.0 MB, 85.3 MB/s, ETA 18s
// then one last line when the job is done. Rate-limited by a clock that tests can inject.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// --progress / --quiet: automatic prints when standard error is a terminal (not under a pipe or into a file).
enum class ProgressMode { automatic, always, never };

// Whether a job in `mode` prints progress, given whether standard error is a terminal.
bool progress_wanted(ProgressMode mode, bool stderr_is_terminal);
// The same for this process's standard error.
bool progress_wanted(ProgressMode mode);

// "45s", "12m05s", "3h02m", "2d03h": a duration to the precision a progress line needs ("?" when unknown).
std::string format_duration(double seconds);

// "WHAT: ITEMS, 512.0/2048.0 MB, 85.3 MB/s, ETA 18s" after `elapsed_s` seconds; without a total (0), no ETA.
std::string progress_line(std::string_view what, std::string_view items, int64_t done_bytes, int64_t total_bytes,
                          double elapsed_s);

// Where a job of many pieces (tensors) stands after each: `done` of `total` pieces, `bytes` of `total_bytes`.
struct ProgressCount {
  int64_t done = 0, total = 0;
  int64_t bytes = 0, total_bytes = 0;
};
// What such a job calls after each piece; empty: nobody watches.
using ProgressHook = std::function<void(const ProgressCount&)>;

// Steps a hook through a job of known pieces: piece_done() after each, in order.
class PieceCounter {
 public:
  PieceCounter(ProgressHook hook, std::vector<int64_t> piece_bytes);
  void piece_done();

 private:
  ProgressHook hook_;
  std::vector<int64_t> piece_bytes_;
  ProgressCount count_;
};

struct ProgressOptions {
  std::string what;                               // the job, first on every line: "data prepare"
  bool enabled = true;                            // false: prints nothing (progress_wanted decides)
  double interval_s = 5;                          // seconds between two lines
  bool last_line_when_quick = true;               // false: finish() is silent when no line came before
  std::function<double()> clock;                  // monotonic seconds; default std::chrono::steady_clock
  std::function<void(const std::string&)> print;  // default: the line and a newline to standard error
};

class Progress {
 public:
  explicit Progress(ProgressOptions options);
  Progress(const Progress&) = delete;  // a hook() points at this reporter
  Progress& operator=(const Progress&) = delete;

  // The work done so far, `done_bytes` of `total_bytes` (0: unknown): prints a line when interval_s has passed
  // since the start or the last line. `items` ("12/291 tensors") is only called when a line is due.
  void update(int64_t done_bytes, int64_t total_bytes, const std::function<std::string()>& items);
  // The last line: "WHAT: done: ITEMS, 2048.0 MB in 24s, 85.3 MB/s".
  void finish(int64_t done_bytes, std::string_view items);

  // For a job of pieces: a hook that reports its counts as "12/291 tensors" with `noun` "tensors" (the reporter
  // must outlive it), and the last line of the count it heard last.
  ProgressHook hook(std::string noun);
  void finish();

 private:
  double now() const;

  ProgressOptions o_;
  double start_ = 0, last_ = 0;  // clock seconds at the start and at the last line
  bool printed_ = false;         // a progress line came
  ProgressCount pieces_;         // what hook() heard last
  std::string noun_;
};

}  // namespace mt
