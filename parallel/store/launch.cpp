// launch.cpp: rank, world size and rendezvous address from the torchrun, Slurm or Open MPI environment.
#include "parallel/store/launch.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mt {
namespace {

constexpr const char* kDefaultAddr = "127.0.0.1";
constexpr int kDefaultPort = 29500;

std::invalid_argument error(const std::string& message) { return std::invalid_argument(message); }

// The whole value must be a decimal integer: no sign other than '-', no spaces, no trailing junk.
int parse_int(const std::string& name, const std::string& text) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) throw error(name + "=" + text + " is out of range for an integer");
  if (ec != std::errc() || ptr != end) throw error(name + "='" + text + "' is not an integer");
  return value;
}

// Slurm's tasks-per-node lists look like "4", "4(x2)" or "2(x3),1": the leading count is this node's layout
// when every node runs the same number of tasks.
int parse_tasks_per_node(const std::string& name, const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  bool tail_ok = digits == text.size() || text[digits] == '(' || text[digits] == ',';
  if (digits == 0 || !tail_ok)
    throw error(name + "='" + text + "' does not start with a task count (expected a form like 4 or 4(x2))");
  return parse_int(name, text.substr(0, digits));
}

bool host_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_'; }

// The first host of a Slurm node list, expanding only the first entry of each bracket:
// "node07" -> "node07", "node[03-05,7],gpu1" -> "node03", "rack[1-2]-n[01-04]" -> "rack1-n01".
std::string first_host(const std::string& name, const std::string& list) {
  auto bad = [&] {
    return error(name + "='" + list + "' is not a Slurm node list this launcher can read; set MASTER_ADDR");
  };
  std::string host;
  bool in_bracket = false, first_done = false;
  size_t digits = 0;  // since the last '[', '-' or ','; every number in a bracket needs at least one
  for (char c : list) {
    if (in_bracket) {
      if (std::isdigit(static_cast<unsigned char>(c))) {
        if (!first_done) host += c;
        ++digits;
      } else if ((c == '-' || c == ',') && digits > 0) {
        first_done = true, digits = 0;
      } else if (c == ']' && digits > 0) {
        in_bracket = false;
      } else {
        throw bad();
      }
    } else if (c == '[') {
      in_bracket = true, first_done = false, digits = 0;
    } else if (c == ',') {
      break;  // the first host ends at the first comma outside brackets
    } else if (host_char(c)) {
      host += c;
    } else {
      throw bad();
    }
  }
  if (in_bracket || host.empty()) throw bad();
  return host;
}

// Reads go through here so that every message can name the variable it came from.
class Env {
 public:
  explicit Env(const GetEnv& getenv) : getenv_(getenv) {}

  bool has(const char* name) const { return getenv_(name) != nullptr; }
  std::optional<std::string> get(const char* name) const {
    const char* value = getenv_(name);
    if (!value) return std::nullopt;
    return std::string(value);
  }
  // A variable the launcher always sets alongside `trigger`; its absence means a half-set environment.
  std::string require(const char* name, const char* trigger, const char* launcher) const {
    auto value = get(name);
    if (!value)
      throw error(std::string(launcher) + " environment is incomplete: " + trigger + " is set but " + name + " is not");
    return *value;
  }
  int require_int(const char* name, const char* trigger, const char* launcher) const {
    return parse_int(name, require(name, trigger, launcher));
  }
  std::optional<std::string> addr(const char* name) const {
    auto value = get(name);
    if (value && value->empty()) throw error(std::string(name) + " is set but empty");
    return value;
  }
  std::optional<int> port(const char* name) const {
    auto value = get(name);
    if (!value) return std::nullopt;
    return parse_int(name, *value);
  }

 private:
  const GetEnv& getenv_;
};

// Variable names of one launcher, for the consistency messages.
struct Names {
  std::string rank, world, local_rank, local_world, port;
};

std::string is(const std::string& name, int value) { return name + "=" + std::to_string(value); }

void check(const LaunchEnv& e, const Names& n) {
  if (e.world_size < 1) throw error(is(n.world, e.world_size) + " must be at least 1");
  if (e.rank < 0) throw error(is(n.rank, e.rank) + " is negative");
  if (e.rank >= e.world_size) throw error(is(n.rank, e.rank) + " is not below " + is(n.world, e.world_size));
  if (e.local_world_size < 1) throw error(is(n.local_world, e.local_world_size) + " must be at least 1");
  if (e.local_world_size > e.world_size)
    throw error(is(n.local_world, e.local_world_size) + " is more than " + is(n.world, e.world_size));
  if (e.local_rank < 0) throw error(is(n.local_rank, e.local_rank) + " is negative");
  if (e.local_rank >= e.local_world_size)
    throw error(is(n.local_rank, e.local_rank) + " is not below " + is(n.local_world, e.local_world_size));
  if (e.master_port < 1 || e.master_port > 65535) throw error(is(n.port, e.master_port) + " is outside 1..65535");
}

// Without MASTER_ADDR the rendezvous can only be local; a job spanning nodes must name its rank-0 host.
std::string local_addr_or_throw(const LaunchEnv& e, const Names& n) {
  if (e.world_size > e.local_world_size)
    throw error("MASTER_ADDR is not set, and " + is(n.world, e.world_size) + " spans more than one node (" +
                is(n.local_world, e.local_world_size) + ")");
  return kDefaultAddr;
}

// Rank, world size and local rank of `launcher` under its names n (local_world too when `with_local_world`),
// each required once `trigger` is set ("torchrun environment is incomplete: ..." names `who`).
LaunchEnv read_ranks(const Env& env, const char* launcher, const char* who, const char* trigger, const Names& n,
                     bool with_local_world) {
  LaunchEnv e;
  e.launcher = launcher;
  e.rank = env.require_int(n.rank.c_str(), trigger, who);
  e.world_size = env.require_int(n.world.c_str(), trigger, who);
  e.local_rank = env.require_int(n.local_rank.c_str(), trigger, who);
  if (with_local_world) e.local_world_size = env.require_int(n.local_world.c_str(), trigger, who);
  return e;
}

LaunchEnv from_torchrun(const Env& env) {
  const char* trigger = env.has("RANK") ? "RANK" : "WORLD_SIZE";
  const char* who = "torchrun";
  const Names names{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"};
  LaunchEnv e = read_ranks(env, "torchrun", who, trigger, names, true);
  e.master_addr = env.require("MASTER_ADDR", trigger, who);
  if (e.master_addr.empty()) throw error("MASTER_ADDR is set but empty");
  e.master_port = env.require_int("MASTER_PORT", trigger, who);
  check(e, names);
  return e;
}

LaunchEnv from_slurm(const Env& env) {
  const char* trigger = "SLURM_PROCID";
  const char* local_world_name = env.has("SLURM_NTASKS_PER_NODE") ? "SLURM_NTASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  const Names names{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_world_name, "MASTER_PORT"};
  LaunchEnv e = read_ranks(env, "slurm", "Slurm", trigger, names, false);
  if (!env.has(local_world_name))
    throw error(
        "Slurm environment is incomplete: SLURM_PROCID is set but neither SLURM_NTASKS_PER_NODE nor "
        "SLURM_TASKS_PER_NODE is");
  e.local_world_size = parse_tasks_per_node(local_world_name, *env.get(local_world_name));
  e.master_port = env.port("MASTER_PORT").value_or(kDefaultPort);
  check(e, names);
  if (auto addr = env.addr("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else if (auto list = env.get("SLURM_JOB_NODELIST")) {
    e.master_addr = first_host("SLURM_JOB_NODELIST", *list);
  } else if (auto list = env.get("SLURM_NODELIST")) {
    e.master_addr = first_host("SLURM_NODELIST", *list);
  } else {
    e.master_addr = local_addr_or_throw(e, names);
  }
  return e;
}

LaunchEnv from_openmpi(const Env& env) {
  const Names names{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", "MASTER_PORT"};
  LaunchEnv e = read_ranks(env, "openmpi", "Open MPI", "OMPI_COMM_WORLD_RANK", names, true);
  e.master_port = env.port("MASTER_PORT").value_or(kDefaultPort);
  check(e, names);
  auto addr = env.addr("MASTER_ADDR");
  e.master_addr = addr ? *addr : local_addr_or_throw(e, names);
  return e;
}

}  // namespace

// The launcher's id of this job (LaunchEnv::job_id); "" when it gives none.
std::string job_id_of(const GetEnv& getenv) {
  auto value = [&](const char* name) -> std::string {
    const char* v = getenv(name);
    return v ? v : "";
  };
  if (std::string id = value("MEGATRAIN_JOB_ID"); !id.empty()) return "megatrain:" + id;
  if (std::string id = value("TORCHELASTIC_RUN_ID"); !id.empty()) return "torchrun:" + id;
  if (std::string id = value("SLURM_JOB_ID"); !id.empty()) return "slurm:" + id + "." + value("SLURM_STEP_ID");
  return "";
}

LaunchEnv detect_launch_env(const GetEnv& getenv) {
  Env env(getenv);
  LaunchEnv e;
  if (env.has("RANK") || env.has("WORLD_SIZE"))
    e = from_torchrun(env);
  else if (env.has("SLURM_PROCID"))
    e = from_slurm(env);
  else if (env.has("OMPI_COMM_WORLD_RANK"))
    e = from_openmpi(env);
  e.job_id = job_id_of(getenv);
  const char* hosted = getenv("MEGATRAIN_STORE_HOSTED");
  e.store_hosted = hosted && std::string_view(hosted) == "1";
  return e;
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace mt
