// local_launcher_spawn.cpp: the local launcher's system side: logs, pipes, the signal handler, fork and kill.
#include "app/runtime/local_launcher_detail.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

namespace mt::app::launcher_detail {

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

std::pair<UniqueFd, UniqueFd> make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw os_error("cannot create a pipe for a rank's output");
  UniqueFd r(fds[0]), w(fds[1]);
  ::fcntl(r.get(), F_SETFL, ::fcntl(r.get(), F_GETFL) | O_NONBLOCK);
  return {std::move(r), std::move(w)};
}

std::atomic<int> g_wake_fd{-1};  // the self-pipe's write end

extern "C" void on_launcher_signal(int sig, siginfo_t* info, void*) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(sig) | (info && info->si_code == SI_KERNEL ? kFromKernel : 0);
  int fd = g_wake_fd.load(std::memory_order_relaxed);
  if (fd >= 0) (void)!::write(fd, &byte, 1);
  errno = saved_errno;
}

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

namespace {

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
  (void)io::write_all(STDERR_FILENO, msg, len);  // nowhere left to say it failed
  ::_exit(127);
}

}  // namespace

void kill_and_reap(std::vector<Rank>& ranks) {
  for (auto& r : ranks)
    if (r.running) ::kill(r.pid, SIGKILL);
  for (auto& r : ranks)
    if (r.running)
      while (::waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
}

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

}  // namespace mt::app::launcher_detail
