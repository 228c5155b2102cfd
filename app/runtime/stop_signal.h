// stop_signal.h: SIGTERM, SIGUSR1, SIGINT and SIGHUP during training ask for a checkpoint and a stop at the end
// of the iteration (Slurm sends SIGTERM, or SIGUSR1 with --signal, before the time limit).
#pragma once

namespace mt::app {

// From now on the first of those signals is recorded (stop_signal() returns it); another one more than two
// seconds later ends the process at once. One ignored at the call (SIGHUP under nohup or the --nproc launcher)
// stays ignored. (A Ctrl-C under --nproc reaches a rank twice, from the terminal and
// forwarded by the launcher, and must not skip the checkpoint.)
void install_stop_signals();
// The first signal received since install_stop_signals(), or 0.
int stop_signal();

}  // namespace mt::app
