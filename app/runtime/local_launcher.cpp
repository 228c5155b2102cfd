// local_launcher.cpp: spawn the ranks, relay their output, forward signals, stop everything on the first failure.
#include "app/runtime/local_launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <fmt/format.h>

extern char** environ;

namespace mt::app {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxRanks = 4096;
constexpr milliseconds kPollInterval{100};  // a backstop only: SIGCHLD and signals wake the loop at once
constexpr size_t kMaxLine = 64 * 1024;      // a longer line without '\n' is relayed in pieces
constexpr size_t kMaxDrain = 16 << 20;      // bytes read from a dead rank's pipe (an orphan may still write)

// What any launcher that parallel/launch understands leaves in the environment to say who a process is.
// clang-format off
constexpr std::string_view kRankVariables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
    "MEGATRAIN_JOB_ID"};
// clang-format on

std::system_error os_error(const std::string& what) { return {errno, std::generic_category(), what}; }

void launcher_log(const std::string& msg) {
  std::fflush(stdout);
  fmt::print(stderr, "megatrain launch: {}\n", msg);
  std::fflush(stderr);
}

std::string describe_signal(int sig) {
  const char* name = sigdescr_np(sig);
  return name ? fmt::format("{} ({})", sig, name) : std::to_string(sig);
}

// Async-signal-safe (only write and poll): used between fork and exec too.
void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= size_t(w);
    } else if (w < 0 && errno == EAGAIN) {
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
    } else if (!(w < 0 && errno == EINTR)) {
      return;  // the output is gone; nowhere left to say so
    }
  }
}

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
std::pair<UniqueFd, UniqueFd> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw os_error("cannot create a pipe for a rank's output");
  UniqueFd r(fds[0]), w(fds[1]);
  ::fcntl(r.get(), F_SETFL, ::fcntl(r.get(), F_GETFL) | O_NONBLOCK);
  return {std::move(r), std::move(w)};
}

// ---- Signals: the handlers only write one byte to a self-pipe; the supervising loop does the rest. ----

std::atomic<int> g_wake_fd{-1};  // the self-pipe's write end
constexpr unsigned char kFromKernel = 0x80;

// The high bit marks a signal that the kernel sent to the whole foreground process group (a terminal's Ctrl-C):
// the ranks, in the launcher's group, got it too, and forwarding it would deliver it twice.
extern "C" void on_launcher_signal(int sig, siginfo_t* info, void*) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(sig) | (info && info->si_code == SI_KERNEL ? kFromKernel : 0);
  int fd = g_wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) (void)!::write(fd, &byte, 1);
  errno = saved_errno;
}

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
    if (!out.empty()) write_all(out_fd_, out.data(), out.size());
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
bool is_stopped(pid_t pid) {
  std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (!f) return false;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  // "PID (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
  const char* close = nullptr;
  for (size_t i = 0; i < n; ++i)
    if (buf[i] == ')') close = buf + i;
  return close && close + 2 < buf + n && (close[2] == 'T' || close[2] == 't');
}

// argv[0] as execvp would find it; empty when PATH has no such executable.
std::string find_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + prog;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

// Everything a child needs, built before fork: between fork and exec the child may only call async-signal-safe
// functions (the caller may have other threads, whose locks the child inherits held).
struct ExecPlan {
  std::string path;                           // empty: not found in PATH
  std::vector<char*> argv;                    // null-terminated, pointing into LaunchOptions::argv
  std::vector<std::vector<std::string>> env;  // per rank
  std::vector<std::vector<char*>> envp;       // per rank, null-terminated
};

[[noreturn]] void exec_rank(const ExecPlan& plan, int rank, const SignalWatch& signals, pid_t launcher,
                            const sigset_t& caller_mask, int out_w, int err_w) {
  signals.reset_in_child();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(1);     // the launcher died before prctl took effect
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);  // descriptors the caller left inheritable stay with the launcher
  if (out_w >= 0) ::dup2(out_w, STDOUT_FILENO);
  if (err_w >= 0) ::dup2(err_w, STDERR_FILENO);
  ::sigprocmask(SIG_SETMASK, &caller_mask, nullptr);
  if (plan.path.empty()) {
    errno = ENOENT;
  } else {
    ::execve(plan.path.c_str(), plan.argv.data(), plan.envp[size_t(rank)].data());
  }
  const char* reason = ::strerrordesc_np(errno);
  // One write, so that the messages of several ranks do not interleave.
  char msg[1024];
  size_t len = 0;
  for (const char* part :
       {"cannot run ", static_cast<const char*>(plan.argv[0]), ": ", reason ? reason : "unknown error"})
    for (; *part && len < sizeof msg - 1; ++part) msg[len++] = *part;
  msg[len++] = '\n';
  write_all(STDERR_FILENO, msg, len);
  ::_exit(127);
}

// For errors of the launcher itself: no rank may outlive it.
void kill_and_reap(std::vector<Rank>& ranks) {
  for (auto& r : ranks)
    if (r.running) ::kill(r.pid, SIGKILL);
  for (auto& r : ranks)
    if (r.running)
      while (::waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
}

// Forks every rank. SIGINT/SIGTERM/SIGCHLD stay blocked meanwhile, so no child runs the launcher's handlers
// before it resets them; what arrives is handled once all ranks run. On failure, no rank is left behind.
std::vector<Rank> spawn_ranks(const LaunchOptions& opt, const ExecPlan& plan, const SignalWatch& signals) {
  sigset_t block, caller_mask;
  sigemptyset(&block);
  for (int sig : SignalWatch::kSignals) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &caller_mask);
  const pid_t launcher = ::getpid();
  std::vector<Rank> ranks;
  try {
    for (int rank = 0; rank < opt.nproc; ++rank) {
      UniqueFd out_r, out_w, err_r, err_w;
      if (opt.prefix_output) {
        std::tie(out_r, out_w) = make_pipe();
        std::tie(err_r, err_w) = make_pipe();
      }
      pid_t pid = ::fork();
      if (pid < 0) throw os_error(fmt::format("cannot fork rank {}", rank));
      if (pid == 0) exec_rank(plan, rank, signals, launcher, caller_mask, out_w.get(), err_w.get());
      Rank& r = ranks.emplace_back(Rank{rank, pid, true, std::nullopt, std::nullopt});
      if (opt.prefix_output) {
        r.out.emplace(std::move(out_r), STDOUT_FILENO, rank);
        r.err.emplace(std::move(err_r), STDERR_FILENO, rank);
      }
    }
  } catch (...) {
    kill_and_reap(ranks);
    ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
    throw;
  }
  ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
  return ranks;
}

// ---- Supervising: wait for the ranks; the first failure stops the others. ----

class Supervisor {
 public:
  Supervisor(std::vector<Rank>& ranks, SignalWatch& signals, milliseconds grace)
      : ranks_(ranks), signals_(signals), grace_(grace), running_(int(ranks.size())) {}

  int run() {
    while (running_ > 0) {
      wait_for_events();
      for (const auto& s : signals_.take()) forward(s);
      reap();
      if (stop_deadline_ && !killed_ && Clock::now() >= *stop_deadline_ && running_ > 0) kill_stragglers();
    }
    return first_failure_.value_or(0);
  }

 private:
  // Sleeps until a signal, a child's exit (SIGCHLD), output to relay, the SIGKILL deadline or the poll interval.
  void wait_for_events() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<LineRelay*> relays;
    for (auto& r : ranks_)
      for (auto* relay : {&r.out, &r.err})
        if (*relay && (*relay)->open()) {
          fds.push_back({(*relay)->fd(), POLLIN, 0});
          relays.push_back(&**relay);
        }
    milliseconds timeout = kPollInterval;
    if (stop_deadline_ && !killed_) {
      auto left = std::chrono::ceil<milliseconds>(*stop_deadline_ - Clock::now());
      timeout = std::clamp(left, milliseconds(0), kPollInterval);
    }
    if (::poll(fds.data(), fds.size(), int(timeout.count())) <= 0) return;
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) relays[i - 1]->read_available();
  }

  void forward(const ReceivedSignal& s) {
    if (s.from_terminal) {
      launcher_log(
          fmt::format("signal {} from the terminal reached every rank; waiting for them", describe_signal(s.sig)));
      return;
    }
    launcher_log(
        fmt::format("received signal {}: forwarding it to {} running rank(s)", describe_signal(s.sig), running_));
    for (auto& r : ranks_)
      if (r.running) ::kill(r.pid, s.sig);
  }

  // Ranks that failed in one pass are judged together: one killed by a signal is named before ones that exited
  // with an error (typically a timeout waiting for it).
  void reap() {
    struct Failed {
      Rank* rank;
      int code;
      std::string how;
      bool signaled;
    };
    std::vector<Failed> failed;
    for (auto& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      pid_t p;
      while ((p = ::waitpid(r.pid, &status, WNOHANG)) < 0 && errno == EINTR) {
      }
      if (p == 0) continue;
      r.running = false;
      --running_;
      if (r.out) r.out->drain_and_close();
      if (r.err) r.err->drain_and_close();
      int code;
      std::string how;
      if (p < 0) {  // another thread of the caller reaped it (waitpid(-1)): the status is lost
        code = 1;
        how = "was reaped by someone else; its exit status is unknown";
      } else if (WIFSIGNALED(status)) {
        code = 128 + WTERMSIG(status);
        how = fmt::format("was killed by signal {}", describe_signal(WTERMSIG(status)));
      } else {
        code = WEXITSTATUS(status);
        how = fmt::format("exited with code {}", code);
      }
      if (code != 0) failed.push_back({&r, code, how, p > 0 && WIFSIGNALED(status)});
    }
    if (failed.empty() || first_failure_) return;
    auto first = std::find_if(failed.begin(), failed.end(), [](const Failed& f) { return f.signaled; });
    if (first == failed.end()) first = failed.begin();
    on_first_failure(*first->rank, first->code, first->how);
  }

  void on_first_failure(const Rank& r, int code, const std::string& how) {
    first_failure_ = code;
    // A stopped rank never answers: it is the likely cause, so it is named first, and it gets SIGKILL at once
    // (SIGTERM stays pending in a stopped process).
    for (auto& o : ranks_)
      if (o.running && is_stopped(o.pid)) {
        launcher_log(
            fmt::format("rank {} (pid {}) is stopped (SIGSTOP or a debugger) and answers nothing: the "
                        "likely cause of the failure below; sending it SIGKILL",
                        o.rank, o.pid));
        ::kill(o.pid, SIGKILL);
      }
    launcher_log(fmt::format("rank {} (pid {}) {}", r.rank, r.pid, how));
    if (running_ == 0) return;
    launcher_log(fmt::format("stopping the other {} running rank(s): SIGTERM, then SIGKILL after {} ms", running_,
                             grace_.count()));
    for (auto& o : ranks_)
      if (o.running) ::kill(o.pid, SIGTERM);
    stop_deadline_ = Clock::now() + grace_;
  }

  void kill_stragglers() {
    killed_ = true;
    std::string names;
    for (auto& r : ranks_)
      if (r.running) {
        names += fmt::format("{}{} (pid {})", names.empty() ? "" : ", ", r.rank, r.pid);
        ::kill(r.pid, SIGKILL);
      }
    launcher_log(fmt::format("rank(s) {} still running {} ms after SIGTERM: sent SIGKILL", names, grace_.count()));
  }

  std::vector<Rank>& ranks_;
  SignalWatch& signals_;
  milliseconds grace_;
  int running_;
  std::optional<int> first_failure_;  // the launcher's exit code
  std::optional<Clock::time_point> stop_deadline_;
  bool killed_ = false;
};

void validate(const LaunchOptions& opt) {
  if (opt.nproc < 1 || opt.nproc > kMaxRanks)
    throw std::invalid_argument(fmt::format("--nproc must be between 1 and {}, got {}", kMaxRanks, opt.nproc));
  if (opt.argv.empty() || opt.argv[0].empty()) throw std::invalid_argument("local launcher: no program to run");
  if (opt.master_addr.empty()) throw std::invalid_argument("local launcher: MASTER_ADDR is empty");
  if (opt.master_port < 0 || opt.master_port > 65535)
    throw std::invalid_argument(
        fmt::format("MASTER_PORT must be between 1 and 65535 (or 0: pick a free one), got {}", opt.master_port));
  if (opt.grace.count() < 0)
    throw std::invalid_argument(fmt::format("local launcher: negative grace period {} ms", opt.grace.count()));
}

// 64 random bits in hex: this launch's MEGATRAIN_JOB_ID, so that a rank of another job that reaches our
// rendezvous store (the same MASTER_PORT) is refused there.
std::string random_job_id() {
  std::random_device rd;
  const uint64_t v = (uint64_t(rd()) << 32) ^ rd();
  return fmt::format("{:016x}", v);
}

}  // namespace

std::vector<std::string> rank_environment(const std::vector<std::string>& parent, int rank, int nproc,
                                          const std::string& master_addr, int master_port, const std::string& job_id) {
  std::vector<std::string> env;
  env.reserve(parent.size() + 6);
  for (const auto& entry : parent) {
    std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    if (std::find(std::begin(kRankVariables), std::end(kRankVariables), name) == std::end(kRankVariables))
      env.push_back(entry);
  }
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("WORLD_SIZE={}", nproc));
  env.push_back(fmt::format("LOCAL_RANK={}", rank));
  env.push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc));
  env.push_back(fmt::format("MASTER_ADDR={}", master_addr));
  env.push_back(fmt::format("MASTER_PORT={}", master_port));
  if (!job_id.empty()) env.push_back(fmt::format("MEGATRAIN_JOB_ID={}", job_id));
  return env;
}

int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(addr.c_str(), "0", &hints, &found); rc != 0)
    throw std::runtime_error(fmt::format("cannot resolve MASTER_ADDR {}: {}", addr, ::gai_strerror(rc)));
  int last_errno = EADDRNOTAVAIL;
  for (addrinfo* ai = found; ai; ai = ai->ai_next) {
    UniqueFd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (s.get() < 0 || ::bind(s.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      last_errno = errno;
      continue;
    }
    ::freeaddrinfo(found);
    return bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  ::freeaddrinfo(found);
  throw std::system_error(last_errno, std::generic_category(),
                          fmt::format("cannot pick a free port on MASTER_ADDR {}", addr));
}

int launch_local(const LaunchOptions& opt) {
  validate(opt);
  const int port = opt.master_port != 0 ? opt.master_port : pick_free_port(opt.master_addr);

  ExecPlan plan;
  plan.env.reserve(size_t(opt.nproc));  // envp points into env
  plan.envp.reserve(size_t(opt.nproc));
  plan.path = find_program(opt.argv[0]);
  for (const auto& a : opt.argv) plan.argv.push_back(const_cast<char*>(a.c_str()));
  plan.argv.push_back(nullptr);
  std::vector<std::string> parent;
  for (char** e = environ; *e; ++e) parent.emplace_back(*e);
  const std::string job_id = random_job_id();
  for (int rank = 0; rank < opt.nproc; ++rank) {
    auto& env = plan.env.emplace_back(rank_environment(parent, rank, opt.nproc, opt.master_addr, port, job_id));
    auto& envp = plan.envp.emplace_back();
    for (auto& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
  }

  std::fflush(stdout);  // what the launcher printed comes before what the ranks print
  std::fflush(stderr);
  SignalWatch signals;  // before the first fork: a signal that arrives while spawning is forwarded after
  std::vector<Rank> ranks = spawn_ranks(opt, plan, signals);
  try {
    return Supervisor(ranks, signals, opt.grace).run();
  } catch (...) {
    kill_and_reap(ranks);
    throw;
  }
}

}  // namespace mt::app
