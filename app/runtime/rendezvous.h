// rendezvous.h: before any communicator exists, every rank of a job checks through the store that it joined
// the job it meant to: one process per rank, the same binary version, the same launcher job id and the same
// resolved config. Ranks that disagree train together silently (or abort inside Gloo) otherwise.
#pragma once
#include <stdexcept>
#include <string>

#include "core/config/config.h"
#include "parallel/store/launch.h"
#include "parallel/store/store.h"

namespace mt::app {

// A rank that does not belong with the others; the message names the ranks and what differs.
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What must be equal on every rank of one job.
struct JobIdentity {
  std::string version;  // MEGATRAIN_VERSION
  std::string job_id;   // LaunchEnv::job_id ("" when the launcher gives none)
  std::string config;   // to_yaml of the resolved config less logging.dir (only rank 0 reads it)
};

JobIdentity job_identity(const Config& cfg, const LaunchEnv& env);

// Registers `rank` in the store (a second process registering the same rank is refused at once), then rank 0
// publishes its identity, every other rank compares its own with it, and rank 0 gathers the verdicts and
// publishes one outcome that every rank reads: any disagreement makes every rank throw RendezvousError naming
// the ranks and the first difference (the version, the job id, or the first differing config key path with
// both values). Waits at most `timeout` for each step. `address` only names the store in messages.
void check_job_identity(Store& store, const JobIdentity& me, int rank, int world_size, Millis timeout,
                        const std::string& address);

// The first difference between two YAML documents, as "key.path (A vs B)" in document order; "" if equal.
std::string first_yaml_difference(const std::string& a, const std::string& b);

}  // namespace mt::app
