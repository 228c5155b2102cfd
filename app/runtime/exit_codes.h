// exit_codes.h: what megatrain's exit status tells whoever supervises it (the local launcher's --max-restarts,
// torchrun's --max-restarts, srun --requeue, a sweep script): whether starting the same command again may succeed.
#pragma once

namespace mt::app {

// A failure a restart may cure: a rank died or was killed, a collective or the rendezvous timed out, a peer went
// away. The run resumes from its latest checkpoint when started again.
constexpr int kExitFailure = 1;
// The configuration or an input (data, checkpoint, tokenizer, command line) was refused: the same command fails
// the same way again, so no supervisor should restart it.
constexpr int kExitRefusedInput = 2;

// Whether a rank's exit status (128 + N: killed by signal N) is a failure worth a restart: not success, not a refused
// input, not a command-line error (CLI11's 100-126) and not a program that cannot run (127).
constexpr bool restartable_exit(int code) {
  return code != 0 && code != kExitRefusedInput && !(code >= 100 && code <= 127);
}

}  // namespace mt::app
