// local_launcher.cpp: spawn the ranks, relay their output, forward signals, stop everything on the first failure.
// The supervising loop is here; the process, pipe and signal plumbing it uses is in local_launcher_detail.h and
// local_launcher_spawn.cpp.
#include "app/runtime/local_launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
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
#include <utility>

#include <fmt/format.h>

#include "app/runtime/exit_codes.h"
#include "app/runtime/local_launcher_detail.h"
#include "parallel/store/store.h"

extern char** environ;

namespace mt::app {

using namespace launcher_detail;  // NOLINT(google-build-using-namespace): the launcher's own parts

namespace {

// What any launcher that parallel/launch understands leaves in the environment to say who a process is.
// clang-format off
constexpr std::string_view kRankVariables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
    "MEGATRAIN_JOB_ID", "MEGATRAIN_STORE_HOSTED"};
// clang-format on

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
  // Whether a signal reached the launcher (forwarded, or from the terminal): the job was stopped, not failed.
  bool signaled() const { return signaled_; }

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
    signaled_ = true;
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
  bool signaled_ = false;
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
  if (opt.max_restarts < 0)
    throw std::invalid_argument(fmt::format("--max-restarts must be >= 0, got {}", opt.max_restarts));
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
                                          const std::string& master_addr, int master_port, const std::string& job_id,
                                          bool store_hosted) {
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
  if (store_hosted) env.push_back("MEGATRAIN_STORE_HOSTED=1");
  return env;
}

namespace {

// One start of every rank, until they all exit; *signaled: a signal reached the launcher meanwhile.
int launch_once(const LaunchOptions& opt, bool* signaled) {
  // Without a port given, the launcher serves the rendezvous store itself on a port the system picks and it keeps
  // bound from then on (as torchrun's agent does): a port picked, closed and bound again by rank 0 could be taken in
  // between by any other process's ephemeral socket, and the ranks would rendezvous with a stranger.
  std::unique_ptr<TcpStoreServer> store;
  if (opt.master_port == 0) store = std::make_unique<TcpStoreServer>("", 0);
  const int port = store ? store->port() : opt.master_port;

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
    auto& env = plan.env.emplace_back(
        rank_environment(parent, rank, opt.nproc, opt.master_addr, port, job_id, store != nullptr));
    auto& envp = plan.envp.emplace_back();
    for (auto& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
  }

  std::fflush(stdout);  // what the launcher printed comes before what the ranks print
  std::fflush(stderr);
  SignalWatch signals;  // before the first fork: a signal that arrives while spawning is forwarded after
  std::vector<Rank> ranks = spawn_ranks(opt, plan, signals);
  try {
    Supervisor supervisor(ranks, signals, opt.grace);
    const int rc = supervisor.run();
    *signaled = supervisor.signaled();
    return rc;
  } catch (...) {
    kill_and_reap(ranks);
    throw;
  }
}

}  // namespace

int launch_local(const LaunchOptions& opt) {
  validate(opt);
  for (int restarts = 0;; ++restarts) {
    bool signaled = false;
    const int rc = launch_once(opt, &signaled);
    if (rc == 0 || opt.max_restarts == 0) return rc;
    if (signaled) {
      launcher_log(fmt::format("not restarting: the launcher was signaled (exit code {})", rc));
      return rc;
    }
    if (!restartable_exit(rc)) {
      launcher_log(
          fmt::format("not restarting: exit code {} is a refused input or command, which a restart would "
                      "repeat",
                      rc));
      return rc;
    }
    if (restarts == opt.max_restarts) {
      launcher_log(fmt::format("giving up: the ranks failed again after {} restart(s) (--max-restarts {})", restarts,
                               opt.max_restarts));
      return rc;
    }
    launcher_log(
        fmt::format("restart {} of {} (exit code {}): every rank starts again and resumes from the latest "
                    "checkpoint",
                    restarts + 1, opt.max_restarts, rc));
  }
}

}  // namespace mt::app
