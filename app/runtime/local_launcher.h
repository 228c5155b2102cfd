// local_launcher.h: `--nproc N`, the binary as its own torchrun on one machine: spawn N ranks, forward
// signals, and stop all of them when one fails.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace mt::app {

struct LaunchOptions {
  int nproc = 1;                          // ranks to spawn, 1..4096
  std::vector<std::string> argv;          // the program (a path, or a name looked up in PATH) and its arguments
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR of every rank
  int master_port = 0;                    // MASTER_PORT of every rank; 0: a free port on master_addr
  bool prefix_output = false;             // relay each rank's stdout/stderr line by line as "[rank N] ..."
  std::chrono::milliseconds grace{std::chrono::seconds(10)};  // SIGTERM -> SIGKILL when stopping the ranks
  // --max-restarts: after a restartable failure (app/runtime/exit_codes.h: a rank died or timed out, not a refused
  // input) every rank is stopped and all start again, at most this many times; never after a signal sent to the
  // launcher (a person or the scheduler stopping the job).
  int max_restarts = 0;
};

// Runs opt.argv once per rank (fork + exec), each with torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set and any Slurm / Open MPI / PMI rank variables removed, and
// waits for them. Returns the exit code for the launcher: 0 when every rank exits 0. Otherwise the first rank
// that fails (non-zero exit, or killed by a signal) is named on stderr ("rank 2 (pid 812) exited with code 3"),
// the others get SIGTERM and, `grace` later, SIGKILL, and its code is returned (128 + signal when killed).
// SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to every rank, which are then waited for as
// usual; a Ctrl-C from the terminal (or its closing, SIGHUP) already reaches every rank (they share the
// launcher's process group), so it is not sent a second time; a signal the caller ignores stays ignored, in the launcher and the ranks. Ranks get SIGKILL
// when the launcher dies (PR_SET_PDEATHSIG: the calling thread must outlive the call, which it does), inherit
// only descriptors 0-2, and a rank whose program cannot be run prints "cannot run <prog>: <reason>" and exits 127.
// With max_restarts the ranks are started again after a restartable failure ("restart 1 of 3 after rank 2 was
// killed by signal 9"), each time on a fresh rendezvous; the last attempt's code is returned.
// Throws std::invalid_argument for bad options and std::system_error when the ranks cannot be started (then
// none is left running). Not reentrant: it owns the SIGINT, SIGTERM, SIGHUP and SIGCHLD handlers while it runs.
int launch_local(const LaunchOptions& opt);

// The environment of one rank: `parent` ("NAME=value" entries) without the variables of any launcher that
// parallel/launch reads, plus torchrun's for this rank of a one-node job of `nproc` ranks, plus
// MEGATRAIN_JOB_ID=job_id when it is not empty (the same for every rank of one launch), plus
// MEGATRAIN_STORE_HOSTED=1 when the launcher serves the rendezvous store (parallel/store/launch.h).
std::vector<std::string> rank_environment(const std::vector<std::string>& parent, int rank, int nproc,
                                          const std::string& master_addr, int master_port,
                                          const std::string& job_id = "", bool store_hosted = false);

}  // namespace mt::app
