// test_launch.cpp: who this process is, read from torchrun, Slurm or Open MPI variables (a fake environment
// from a map), their precedence, and every error naming its variable.
#include <gtest/gtest.h>

#include "tests/unit/expect_contains.h"

#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "parallel/store/launch.h"

using namespace mt;

namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv detect(const Vars& vars) {
  return detect_launch_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The message of the std::invalid_argument that detect throws (the test fails when it does not throw).
std::string error_of(const Vars& vars) {
  try {
    detect(vars);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument was thrown";
  return "";
}

const Vars kTorchrun = {{"RANK", "5"},
                        {"WORLD_SIZE", "8"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "node01"},
                        {"MASTER_PORT", "29400"}};
const Vars kSlurm = {{"SLURM_PROCID", "6"},
                     {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "2"},
                     {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                     {"SLURM_JOB_NODELIST", "gpu[03-04]"}};
const Vars kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};

Vars with(Vars vars, const Vars& changes) {
  for (const auto& [k, v] : changes) vars[k] = v;
  return vars;
}
Vars without(Vars vars, const std::string& name) {
  vars.erase(name);
  return vars;
}
Vars merged(const Vars& a, const Vars& b) { return with(a, b); }

}  // namespace

// --- no launcher ---

TEST(Launch, NoLauncherMeansOneRank) {
  LaunchEnv e = detect({});
  EXPECT_EQ(e.launcher, "single");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(Launch, UnrelatedVariablesMeanOneRank) {
  // LOCAL_RANK alone, or Open MPI's size without its rank, is not a launcher.
  EXPECT_EQ(detect({{"LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"MASTER_PORT", "x"}}).launcher, "single");
}

// --- torchrun ---

TEST(Launch, TorchrunReadsAllSixVariables) {
  LaunchEnv e = detect(kTorchrun);
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node01");
  EXPECT_EQ(e.master_port, 29400);
}

TEST(Launch, TorchrunRankWithoutWorldSizeNamesWorldSize) {
  std::string msg = error_of(without(kTorchrun, "WORLD_SIZE"));
  EXPECT_CONTAINS(msg, "torchrun environment is incomplete: RANK is set but WORLD_SIZE is not");
}

TEST(Launch, TorchrunWorldSizeWithoutRankNamesRank) {
  EXPECT_CONTAINS(error_of(without(kTorchrun, "RANK")), "WORLD_SIZE is set but RANK is not");
}

TEST(Launch, TorchrunEveryVariableIsRequired) {
  for (const char* name : {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    SCOPED_TRACE(name);
    EXPECT_CONTAINS(error_of(without(kTorchrun, name)), std::string("RANK is set but ") + name + " is not");
  }
}

TEST(Launch, TorchrunRankMustBeBelowWorldSize) {
  EXPECT_EQ(error_of(with(kTorchrun, {{"RANK", "8"}})), "RANK=8 is not below WORLD_SIZE=8");
  EXPECT_EQ(detect(with(kTorchrun, {{"RANK", "7"}})).rank, 7);
}

TEST(Launch, TorchrunNegativeAndZeroValues) {
  EXPECT_EQ(error_of(with(kTorchrun, {{"RANK", "-1"}})), "RANK=-1 is negative");
  EXPECT_EQ(error_of(with(kTorchrun, {{"WORLD_SIZE", "0"}, {"RANK", "0"}})), "WORLD_SIZE=0 must be at least 1");
  EXPECT_EQ(error_of(with(kTorchrun, {{"LOCAL_RANK", "-2"}})), "LOCAL_RANK=-2 is negative");
  EXPECT_EQ(error_of(with(kTorchrun, {{"LOCAL_WORLD_SIZE", "0"}})), "LOCAL_WORLD_SIZE=0 must be at least 1");
}

TEST(Launch, TorchrunLocalRankMustBeBelowLocalWorldSize) {
  EXPECT_EQ(error_of(with(kTorchrun, {{"LOCAL_RANK", "4"}})), "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4");
}

TEST(Launch, TorchrunLocalWorldCannotExceedWorld) {
  EXPECT_EQ(error_of(with(kTorchrun, {{"LOCAL_WORLD_SIZE", "16"}})), "LOCAL_WORLD_SIZE=16 is more than WORLD_SIZE=8");
}

TEST(Launch, IntegersAreParsedStrictly) {
  for (const char* bad : {"", "5x", "x5", " 5", "5 ", "+5", "0x5", "5.0", "--5"}) {
    SCOPED_TRACE(std::string("RANK='") + bad + "'");
    EXPECT_EQ(error_of(with(kTorchrun, {{"RANK", bad}})), std::string("RANK='") + bad + "' is not an integer");
  }
  EXPECT_EQ(error_of(with(kTorchrun, {{"WORLD_SIZE", "99999999999"}})),
            "WORLD_SIZE=99999999999 is out of range for an integer");
  EXPECT_EQ(detect(with(kTorchrun, {{"RANK", "007"}})).rank, 7);  // leading zeros are still decimal
}

TEST(Launch, PortMustBeInRange) {
  EXPECT_EQ(error_of(with(kTorchrun, {{"MASTER_PORT", "0"}})), "MASTER_PORT=0 is outside 1..65535");
  EXPECT_EQ(error_of(with(kTorchrun, {{"MASTER_PORT", "65536"}})), "MASTER_PORT=65536 is outside 1..65535");
  EXPECT_EQ(error_of(with(kTorchrun, {{"MASTER_PORT", "29500abc"}})), "MASTER_PORT='29500abc' is not an integer");
  EXPECT_EQ(detect(with(kTorchrun, {{"MASTER_PORT", "1"}})).master_port, 1);
  EXPECT_EQ(detect(with(kTorchrun, {{"MASTER_PORT", "65535"}})).master_port, 65535);
}

TEST(Launch, EmptyMasterAddrIsAnError) {
  EXPECT_EQ(error_of(with(kTorchrun, {{"MASTER_ADDR", ""}})), "MASTER_ADDR is set but empty");
  EXPECT_EQ(error_of(with(kSlurm, {{"MASTER_ADDR", ""}})), "MASTER_ADDR is set but empty");
}

// --- Slurm ---

TEST(Launch, SlurmReadsTasksAndTheFirstNode) {
  LaunchEnv e = detect(kSlurm);
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu03");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(Launch, SlurmMasterAddrAndPortFromTheEnvironmentWin) {
  LaunchEnv e = detect(with(kSlurm, {{"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "12345"}}));
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 12345);
  EXPECT_EQ(error_of(with(kSlurm, {{"MASTER_PORT", "70000"}})), "MASTER_PORT=70000 is outside 1..65535");
}

TEST(Launch, SlurmTasksPerNodeForms) {
  auto local_world = [](const Vars& changes) {
    return detect(with(without(kSlurm, "SLURM_NTASKS_PER_NODE"), changes)).local_world_size;
  };
  EXPECT_EQ(local_world({{"SLURM_NTASKS_PER_NODE", "8"}}), 8);
  EXPECT_EQ(local_world({{"SLURM_NTASKS_PER_NODE", "4(x2)"}}), 4);
  EXPECT_EQ(local_world({{"SLURM_TASKS_PER_NODE", "4(x2)"}}), 4);
  EXPECT_EQ(local_world({{"SLURM_TASKS_PER_NODE", "3(x2),2"}}), 3);
  EXPECT_EQ(local_world({{"SLURM_TASKS_PER_NODE", "4,4"}}), 4);
  // SLURM_NTASKS_PER_NODE is preferred when both are set.
  EXPECT_EQ(local_world({{"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "8"}}), 4);
}

TEST(Launch, SlurmBadTasksPerNodeNamesTheVariable) {
  Vars base = without(kSlurm, "SLURM_NTASKS_PER_NODE");
  for (const char* bad : {"", "x4", "4x", "(x2)", "-4"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(error_of(with(base, {{"SLURM_TASKS_PER_NODE", bad}})),
              std::string("SLURM_TASKS_PER_NODE='") + bad +
                  "' does not start with a task count (expected a form like 4 or 4(x2))");
  }
  EXPECT_EQ(error_of(with(base, {{"SLURM_TASKS_PER_NODE", "0(x2)"}})), "SLURM_TASKS_PER_NODE=0 must be at least 1");
  EXPECT_EQ(error_of(with(kSlurm, {{"SLURM_NTASKS_PER_NODE", "16"}})),
            "SLURM_NTASKS_PER_NODE=16 is more than SLURM_NTASKS=8");
}

TEST(Launch, SlurmFirstHostOfTheNodeList) {
  auto master = [](const std::string& list) {
    return detect(with(kSlurm, {{"SLURM_JOB_NODELIST", list}})).master_addr;
  };
  EXPECT_EQ(master("node07"), "node07");
  EXPECT_EQ(master("node[03-05,7]"), "node03");
  EXPECT_EQ(master("node[7,03-05]"), "node7");
  EXPECT_EQ(master("node[12]"), "node12");
  EXPECT_EQ(master("a,b"), "a");
  EXPECT_EQ(master("gpu-a[1-2],gpu-b[3]"), "gpu-a1");
  EXPECT_EQ(master("rack[1-2]-n[01-04]"), "rack1-n01");
  EXPECT_EQ(master("host.example.org"), "host.example.org");
}

TEST(Launch, SlurmJobNodeListBeforeNodeList) {
  EXPECT_EQ(detect(with(kSlurm, {{"SLURM_NODELIST", "other1"}})).master_addr, "gpu03");
  EXPECT_EQ(detect(with(without(kSlurm, "SLURM_JOB_NODELIST"), {{"SLURM_NODELIST", "other[1-2]"}})).master_addr,
            "other1");
}

TEST(Launch, SlurmUnreadableNodeListNamesTheVariable) {
  for (const char* bad : {"", "node[03-05", "node]", "node[]", "node[a-b]", "node[-3]", "node[1,,2]", "[1-2]x y"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(error_of(with(kSlurm, {{"SLURM_JOB_NODELIST", bad}})),
              std::string("SLURM_JOB_NODELIST='") + bad +
                  "' is not a Slurm node list this launcher can read; set "
                  "MASTER_ADDR");
  }
  EXPECT_CONTAINS(error_of(with(without(kSlurm, "SLURM_JOB_NODELIST"), {{"SLURM_NODELIST", "n[1"}})),
                  "SLURM_NODELIST='n[1'");
  // MASTER_ADDR makes the node list irrelevant.
  EXPECT_EQ(detect(with(kSlurm, {{"SLURM_JOB_NODELIST", "n[1"}, {"MASTER_ADDR", "n1"}})).master_addr, "n1");
}

TEST(Launch, SlurmWithoutNodeList) {
  Vars one_node = with(without(kSlurm, "SLURM_JOB_NODELIST"), {{"SLURM_NTASKS_PER_NODE", "8"}});
  EXPECT_EQ(detect(one_node).master_addr, "127.0.0.1");
  EXPECT_EQ(error_of(without(kSlurm, "SLURM_JOB_NODELIST")),
            "MASTER_ADDR is not set, and SLURM_NTASKS=8 spans more than one node (SLURM_NTASKS_PER_NODE=4)");
}

TEST(Launch, SlurmMissingVariables) {
  EXPECT_EQ(error_of(without(kSlurm, "SLURM_NTASKS")),
            "Slurm environment is incomplete: SLURM_PROCID is set but SLURM_NTASKS is not");
  EXPECT_EQ(error_of(without(kSlurm, "SLURM_LOCALID")),
            "Slurm environment is incomplete: SLURM_PROCID is set but SLURM_LOCALID is not");
  EXPECT_EQ(error_of(without(kSlurm, "SLURM_NTASKS_PER_NODE")),
            "Slurm environment is incomplete: SLURM_PROCID is set but neither SLURM_NTASKS_PER_NODE nor "
            "SLURM_TASKS_PER_NODE is");
}

TEST(Launch, SlurmConsistencyNamesSlurmVariables) {
  EXPECT_EQ(error_of(with(kSlurm, {{"SLURM_PROCID", "8"}})), "SLURM_PROCID=8 is not below SLURM_NTASKS=8");
  EXPECT_EQ(error_of(with(kSlurm, {{"SLURM_LOCALID", "4"}})), "SLURM_LOCALID=4 is not below SLURM_NTASKS_PER_NODE=4");
  EXPECT_EQ(error_of(with(kSlurm, {{"SLURM_PROCID", "six"}})), "SLURM_PROCID='six' is not an integer");
}

// --- Open MPI ---

TEST(Launch, OpenMpiReadsCommWorld) {
  LaunchEnv e = detect(with(kOpenMpi, {{"MASTER_PORT", "4000"}}));
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // one node: the rendezvous is local
  EXPECT_EQ(e.master_port, 4000);
}

TEST(Launch, OpenMpiAcrossNodesNeedsMasterAddr) {
  Vars two_nodes = with(kOpenMpi, {{"OMPI_COMM_WORLD_SIZE", "8"}});
  EXPECT_EQ(error_of(two_nodes),
            "MASTER_ADDR is not set, and OMPI_COMM_WORLD_SIZE=8 spans more than one node "
            "(OMPI_COMM_WORLD_LOCAL_SIZE=4)");
  EXPECT_EQ(detect(with(two_nodes, {{"MASTER_ADDR", "head"}})).master_addr, "head");
}

TEST(Launch, OpenMpiMissingAndBadVariables) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(error_of(without(kOpenMpi, name)),
              std::string("Open MPI environment is incomplete: OMPI_COMM_WORLD_RANK is set but ") + name + " is not");
  }
  EXPECT_EQ(error_of(with(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "4"}})),
            "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4");
  EXPECT_EQ(error_of(with(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "4"}})),
            "OMPI_COMM_WORLD_LOCAL_RANK=4 is not below OMPI_COMM_WORLD_LOCAL_SIZE=4");
  EXPECT_EQ(error_of(with(kOpenMpi, {{"MASTER_PORT", "0"}})), "MASTER_PORT=0 is outside 1..65535");
}

// --- precedence ---

TEST(Launch, TorchrunBeatsSlurmBeatsOpenMpi) {
  EXPECT_EQ(detect(merged(merged(kOpenMpi, kSlurm), kTorchrun)).launcher, "torchrun");
  EXPECT_EQ(detect(merged(kSlurm, kTorchrun)).launcher, "torchrun");
  EXPECT_EQ(detect(merged(kOpenMpi, kTorchrun)).launcher, "torchrun");
  EXPECT_EQ(detect(merged(kOpenMpi, kSlurm)).launcher, "slurm");
  EXPECT_EQ(detect(merged(kOpenMpi, kSlurm)).rank, 6);
}

TEST(Launch, AHalfSetTorchrunIsAnErrorEvenUnderSlurm) {
  // torchrun inside an srun allocation: its variables win, so a broken set is not silently replaced by Slurm's.
  EXPECT_CONTAINS(error_of(merged(kSlurm, {{"RANK", "0"}})), "RANK is set but WORLD_SIZE is not");
}

// --- the process environment ---

TEST(Launch, ReadsTheProcessEnvironment) {
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* name : names) {
    const char* v = std::getenv(name);
    saved[name] = v ? std::optional<std::string>(v) : std::nullopt;
  }
  for (const auto& [k, v] : kTorchrun) setenv(k.c_str(), v.c_str(), 1);
  LaunchEnv e = detect_launch_env();
  for (const auto& [k, v] : saved) v ? setenv(k.c_str(), v->c_str(), 1) : unsetenv(k.c_str());
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.master_addr, "node01");
}

// --- the job id (rendezvous refuses ranks of another job) ---

TEST(Launch, JobIdComesFromTheLauncherInOrderOfPrecedence) {
  EXPECT_EQ(detect({}).job_id, "");
  EXPECT_EQ(detect(with(kTorchrun, {{"TORCHELASTIC_RUN_ID", "r1"}})).job_id, "torchrun:r1");
  EXPECT_EQ(detect({{"SLURM_JOB_ID", "12"}, {"SLURM_STEP_ID", "3"}}).job_id, "slurm:12.3");
  EXPECT_EQ(detect(with(kTorchrun, {{"TORCHELASTIC_RUN_ID", "r1"}, {"MEGATRAIN_JOB_ID", "ab"}})).job_id,
            "megatrain:ab");
}
