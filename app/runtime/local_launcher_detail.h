// local_launcher_detail.h: the local launcher's process, pipe, signal and output-relay parts. Not an interface:
// app/runtime/local_launcher.h is.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "app/runtime/local_launcher.h"
#include "core/io/file_io.h"

namespace mt::app::launcher_detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxRanks = 4096;
constexpr milliseconds kPollInterval{100};  // a backstop only: SIGCHLD and signals wake the loop at once
constexpr size_t kMaxLine = 64 * 1024;      // a longer line without '\n' is relayed in pieces
constexpr size_t kMaxDrain = 16 << 20;      // bytes read from a dead rank's pipe (an orphan may still write)

std::system_error os_error(const std::string& what);

void launcher_log(const std::string& msg);

std::string describe_signal(int sig);

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// A pipe with both ends close-on-exec (so no rank holds another's) and the read end non-blocking.
std::pair<UniqueFd, UniqueFd> make_pipe();

// ---- Signals: the handlers only write one byte to a self-pipe; the supervising loop does the rest. ----

extern std::atomic<int> g_wake_fd;  // the self-pipe's write end
constexpr unsigned char kFromKernel = 0x80;

// The high bit marks a signal that the kernel sent to the whole foreground process group (a terminal's Ctrl-C):
// the ranks, in the launcher's group, got it too, and forwarding it would deliver it twice.
extern "C" void on_launcher_signal(int sig, siginfo_t* info, void*);

struct ReceivedSignal {
  int sig;
  bool from_terminal;
};

// Owns SIGINT, SIGTERM, SIGHUP and SIGCHLD while the launcher runs (leaving ignored ones ignored, as nohup asks), and
// gives back the caller's handlers after.
class SignalWatch {
 public:
  static constexpr std::array<int, 4> kSignals = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

  SignalWatch() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw os_error("cannot create the launcher's signal pipe");
    read_.reset(fds[0]);
    write_.reset(fds[1]);
    g_wake_fd.store(write_.get());
    for (size_t i = 0; i < kSignals.size(); ++i) {
      ::sigaction(kSignals[i], nullptr, &saved_[i]);
      if (kSignals[i] != SIGCHLD && ignored(i)) continue;
      struct sigaction sa {};
      sa.sa_sigaction = on_launcher_signal;
      sa.sa_flags = SA_SIGINFO | SA_RESTART | (kSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
      sigemptyset(&sa.sa_mask);
      ::sigaction(kSignals[i], &sa, nullptr);
    }
  }
  ~SignalWatch() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
    g_wake_fd.store(-1);
  }
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  int fd() const { return read_.get(); }

  // In a child before exec (async-signal-safe): what exec does to the caller's dispositions, ignored stays
  // ignored and handlers become the default, so that no signal runs our handler there.
  void reset_in_child() const {
    for (size_t i = 0; i < kSignals.size(); ++i) {
      struct sigaction sa {};
      sa.sa_handler = ignored(i) ? SIG_IGN : SIG_DFL;
      ::sigaction(kSignals[i], &sa, nullptr);
    }
  }

  // SIGINT / SIGTERM / SIGHUP received since the last call (SIGCHLD only wakes the loop).
  std::vector<ReceivedSignal> take() {
    std::vector<ReceivedSignal> out;
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(read_.get(), buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int sig = buf[i] & ~kFromKernel;
        if (sig != SIGCHLD) out.push_back({sig, (buf[i] & kFromKernel) != 0});
      }
    }
    return out;
  }

 private:
  bool ignored(size_t i) const { return !(saved_[i].sa_flags & SA_SIGINFO) && saved_[i].sa_handler == SIG_IGN; }

  UniqueFd read_, write_;
  std::array<struct sigaction, kSignals.size()> saved_{};
};

// ---- Output: one rank's stdout or stderr, relayed line by line with "[rank N] " in front. ----

class LineRelay {
 public:
  LineRelay(UniqueFd fd, int out_fd, int rank)
      : fd_(std::move(fd)), out_fd_(out_fd), prefix_(fmt::format("[rank {}] ", rank)) {}

  bool open() const { return fd_.get() >= 0; }
  int fd() const { return fd_.get(); }

  // Reads what the pipe holds now; closes the relay (flushing a partial last line) at EOF.
  void read_available(size_t limit = kMaxLine) {
    char chunk[16384];
    size_t total = 0;
    while (open() && total < limit) {
      ssize_t n = ::read(fd_.get(), chunk, sizeof chunk);
      if (n > 0) {
        buf_.append(chunk, size_t(n));
        total += size_t(n);
        emit(false);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {  // EOF or a broken pipe
        close();
      }
    }
  }

  // For a rank that has exited: read what it left (an orphan of it may hold the pipe open), then close.
  void drain_and_close() {
    read_available(kMaxDrain);
    close();
  }

 private:
  void close() {
    emit(true);
    fd_.reset();
  }

  // Writes every complete line (and with `all`, the partial last one, ended by '\n') in one write.
  void emit(bool all) {
    std::string out;
    size_t start = 0;
    for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1)
      out.append(prefix_).append(buf_, start, nl + 1 - start);
    buf_.erase(0, start);
    if (!buf_.empty() && (all || buf_.size() >= kMaxLine)) {
      out.append(prefix_).append(buf_).push_back('\n');
      buf_.clear();
    }
    if (!out.empty()) (void)io::write_all(out_fd_, out.data(), out.size());  // the output is gone: nowhere to say so
  }

  UniqueFd fd_;
  int out_fd_;
  std::string prefix_;
  std::string buf_;  // the partial line read so far
};

// ---- Spawning. ----

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::optional<LineRelay> out, err;  // with prefix_output only
};

// True when the process is stopped (SIGSTOP, SIGTSTP, or a debugger): state T or t in /proc/PID/stat. Such a
// rank answers nothing, so its peers time out waiting for it and exit first, looking like the culprits.
bool is_stopped(pid_t pid);

// argv[0] as execvp would find it; empty when PATH has no such executable.
std::string find_program(const std::string& prog);

// Everything a child needs, built before fork: between fork and exec the child may only call async-signal-safe
// functions (the caller may have other threads, whose locks the child inherits held).
struct ExecPlan {
  std::string path;                           // empty: not found in PATH
  std::vector<char*> argv;                    // null-terminated, pointing into LaunchOptions::argv
  std::vector<std::vector<std::string>> env;  // per rank
  std::vector<std::vector<char*>> envp;       // per rank, null-terminated
};

// For errors of the launcher itself: no rank may outlive it.
void kill_and_reap(std::vector<Rank>& ranks);

// Forks every rank. SIGINT/SIGTERM/SIGCHLD stay blocked meanwhile, so no child runs the launcher's handlers
// before it resets them; what arrives is handled once all ranks run. On failure, no rank is left behind.
std::vector<Rank> spawn_ranks(const LaunchOptions& opt, const ExecPlan& plan, const SignalWatch& signals);

}  // namespace mt::app::launcher_detail
