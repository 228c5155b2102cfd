// launch.h: who this process is in the job, read from the launcher's environment.
#pragma once
#include <functional>
#include <string>

namespace mt {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "single";  // torchrun | slurm | openmpi | single
  // Who launched this job, the same on every rank of it and (as far as the launcher makes it so) different
  // between jobs: MEGATRAIN_JOB_ID (megatrain --nproc), else TORCHELASTIC_RUN_ID (torchrun --rdzv-id), else
  // SLURM_JOB_ID.SLURM_STEP_ID; empty when none is set. Rendezvous refuses ranks whose job ids differ.
  std::string job_id;
  // MEGATRAIN_STORE_HOSTED=1 (megatrain --nproc picking the port): the launcher serves the rendezvous store at
  // master_addr:master_port itself, on the socket it bound, so rank 0 serves nothing. Otherwise rank 0 serves it.
  bool store_hosted = false;
};

using GetEnv = std::function<const char*(const char*)>;

// torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; all six
// required once RANK or WORLD_SIZE is set), then Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and
// SLURM_NTASKS_PER_NODE or else SLURM_TASKS_PER_NODE, whose leading count of "4(x2)" is taken; MASTER_ADDR from
// the environment or else the first host of SLURM_JOB_NODELIST / SLURM_NODELIST; MASTER_PORT from the
// environment or else 29500), then Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MASTER_ADDR
// and MASTER_PORT from the environment), in that order; none means one rank. Throws std::invalid_argument
// naming the variable and its value for values that do not parse or are inconsistent ("RANK=8 is not below
// WORLD_SIZE=8", negative, port outside 1..65535, a half-set launcher environment, a multi-node job with no
// way to find MASTER_ADDR). job_id is read the same way whatever the launcher (see LaunchEnv::job_id).
LaunchEnv detect_launch_env(const GetEnv& getenv);
LaunchEnv detect_launch_env();  // from the process environment

}  // namespace mt
