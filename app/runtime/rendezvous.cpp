#include "app/runtime/rendezvous.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

namespace mt::app {

namespace {

std::string flat(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "absent";
  YAML::Emitter out;
  out << YAML::Flow << n;
  return out.c_str();
}

std::string join_path(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string difference(const YAML::Node& a, const YAML::Node& b, const std::string& path) {
  if (a.IsMap() && b.IsMap()) {
    for (const auto& kv : a) {
      const std::string key = kv.first.as<std::string>();
      if (std::string d = difference(kv.second, b[key], join_path(path, key)); !d.empty()) return d;
    }
    for (const auto& kv : b) {
      const std::string key = kv.first.as<std::string>();
      if (!a[key]) return fmt::format("{} (absent vs {})", join_path(path, key), flat(kv.second));
    }
    return "";
  }
  if (a.IsSequence() && b.IsSequence() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (std::string d = difference(a[i], b[i], fmt::format("{}[{}]", path, i)); !d.empty()) return d;
    return "";
  }
  const std::string fa = flat(a), fb = flat(b);
  return fa == fb ? "" : fmt::format("{} ({} vs {})", path.empty() ? "<document>" : path, fa, fb);
}

// Why rank `rank` (identity `me`) does not belong with rank 0 (identity `ref`); "" when it does.
std::string verdict(const JobIdentity& ref, const JobIdentity& me, int rank, const std::string& address) {
  if (me.version != ref.version)
    return fmt::format("rank {} runs megatrain {} but rank 0 runs megatrain {}", rank, me.version, ref.version);
  if (me.job_id != ref.job_id)
    return fmt::format(
        "rank {} belongs to job '{}' but the rendezvous store at {} serves job '{}' (rank 0's): "
        "two jobs on one MASTER_PORT?",
        rank, me.job_id.empty() ? "<none>" : me.job_id, address, ref.job_id.empty() ? "<none>" : ref.job_id);
  if (me.config != ref.config) {
    std::string d;
    try {
      d = first_yaml_difference(ref.config, me.config);
    } catch (const std::exception& e) {
      d = fmt::format("<unreadable: {}>", e.what());
    }
    return fmt::format(
        "rank {} runs a different config than rank 0: first difference at {} (rank 0 vs rank {}); "
        "every rank of a job needs the same config file and --set options",
        rank, d.empty() ? "<formatting only>" : d, rank);
  }
  return "";
}

// Why the ranks `missing` never gave rank 0 (which waits for `world_size` ranks) their verdicts: the world sizes
// that the ranks that did arrive were started with, when one differs; else that those ranks never came.
std::string missing_ranks(Store& store, const std::vector<int>& missing, int world_size, Millis timeout,
                          const std::string& address) {
  std::vector<std::string> others;
  for (int r = 1; r < world_size; ++r) {
    const std::string key = fmt::format("rdv/world_size/{}", r);
    if (!store.check(key)) continue;
    if (const std::string w = bytes_text(store.get(key, timeout)); w != std::to_string(world_size))
      others.push_back(fmt::format("rank {} with {}", r, w));
  }
  const std::string waited =
      fmt::format("rank{} {} never arrived at the rendezvous store at {} within {} s", missing.size() > 1 ? "s" : "",
                  fmt::join(missing, ", "), address, static_cast<double>(timeout.count()) / 1000.0);
  if (others.empty())
    return fmt::format(
        "{}: rank 0 waits for a world of {} ranks; were they started, with this MASTER_ADDR and "
        "MASTER_PORT?",
        waited, world_size);
  return fmt::format(
      "{}: the ranks disagree on the world size: rank 0 was started with a world of {} ranks, {} "
      "(WORLD_SIZE, SLURM_NTASKS or --nproc differ between the launches)",
      waited, world_size, fmt::join(others, ", "));
}

}  // namespace

JobIdentity job_identity(const Config& cfg, const LaunchEnv& env) {
  // logging.dir is read by rank 0 alone (the others log warnings to the console only), so ranks started with
  // their own run directories still belong together; every other key counts.
  Config compared = cfg;
  compared.logging.dir.clear();
  return JobIdentity{.version = MEGATRAIN_VERSION, .job_id = env.job_id, .config = to_yaml(compared)};
}

std::string first_yaml_difference(const std::string& a, const std::string& b) {
  return difference(YAML::Load(a), YAML::Load(b), "");
}

void check_job_identity(Store& store, const JobIdentity& me, int rank, int world_size, Millis timeout,
                        const std::string& address) {
  if (store.add(fmt::format("rdv/registered/{}", rank), 1) != 1)
    throw RendezvousError(fmt::format(
        "rank {} is already registered at the rendezvous store at {}: another process joined this job as rank {} "
        "first (two jobs on one MASTER_PORT, or one rank started twice?)",
        rank, address, rank));
  // Each rank's world size, so that a rank that never comes is explained (the launchers disagree: WORLD_SIZE,
  // SLURM_NTASKS, --nproc) rather than reported as a timed-out get.
  store.set(fmt::format("rdv/world_size/{}", rank), text_bytes(std::to_string(world_size)));
  if (rank == 0) {
    store.set("rdv/version", text_bytes(me.version));
    store.set("rdv/job_id", text_bytes(me.job_id));
    store.set("rdv/config", text_bytes(me.config));
    // Every verdict within one timeout from here (the others wait for the outcome as long, and a little more).
    std::vector<std::string> refused;
    std::vector<int> missing;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (int r = 1; r < world_size; ++r) {
      const std::string key = fmt::format("rdv/verdict/{}", r);
      const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
      std::optional<std::string> v;
      if (missing.empty() && left > Millis(0)) {
        try {
          v = bytes_text(store.get(key, left));
        } catch (const StoreError&) {  // timed out: named with the others below
        }
      } else if (store.check(key)) {  // once one is missing, the deadline has passed: no more waiting
        v = bytes_text(store.get(key, timeout));
      }
      if (!v)
        missing.push_back(r);
      else if (!v->empty())
        refused.push_back(std::move(*v));
    }
    if (!missing.empty()) refused.push_back(missing_ranks(store, missing, world_size, timeout, address));
    const std::string outcome = fmt::format("{}", fmt::join(refused, "; "));
    store.set("rdv/outcome", text_bytes(outcome));
    if (outcome.empty()) return;
    // Keep serving the store until the others have read the outcome (briefly): they then fail with it rather
    // than with "lost the rendezvous store".
    const auto read_by = std::chrono::steady_clock::now() + std::min<Millis>(timeout, Millis(5000));
    while (store.add("rdv/outcome_read", 0) < world_size - 1 && std::chrono::steady_clock::now() < read_by)
      std::this_thread::sleep_for(Millis(20));
    throw RendezvousError("rendezvous refused the job: " + outcome);
  }
  const std::string world0 = bytes_text(store.get("rdv/world_size/0", timeout));
  if (world0 != std::to_string(world_size)) {
    const std::string why = fmt::format(
        "the ranks disagree on the world size: rank {} was started with a world of {} ranks, rank 0 with {} "
        "(WORLD_SIZE, SLURM_NTASKS or --nproc differ between the launches)",
        rank, world_size, world0);
    store.set(fmt::format("rdv/verdict/{}", rank), text_bytes(why));
    throw RendezvousError("rendezvous refused the job: " + why);  // rank 0 may never ask for this rank's verdict
  }
  const JobIdentity ref{.version = bytes_text(store.get("rdv/version", timeout)),
                        .job_id = bytes_text(store.get("rdv/job_id", timeout)),
                        .config = bytes_text(store.get("rdv/config", timeout))};
  const std::string mine = verdict(ref, me, rank, address);
  store.set(fmt::format("rdv/verdict/{}", rank), text_bytes(mine));
  // Rank 0 publishes the outcome within one timeout of its start, which was before this rank read rdv/version.
  const std::string outcome = bytes_text(store.get("rdv/outcome", timeout + Millis(5000)));
  if (outcome.empty()) return;
  store.add("rdv/outcome_read", 1);
  throw RendezvousError("rendezvous refused the job: " + outcome);
}

}  // namespace mt::app
