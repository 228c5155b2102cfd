#include "app/runtime/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "app/runtime/rendezvous.h"
#include "parallel/comm/comm_counted.h"
#include "parallel/sharding/hybrid_shard.h"

namespace mt::app {

namespace {

using GroupMaker = MeshGroups::Maker;

// The address other ranks reach this one's Gloo device at: loopback for single-node jobs started with a
// loopback master, else this host's name.
std::string gloo_hostname(const LaunchEnv& env) {
  if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") return "127.0.0.1";
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}

// The groups of this rank after the world's, made by `group` (kind, ascending members; no members: this rank is in no
// group of that split, and takes part in it only when `all_take_part`, as NCCL's splits need; null then), in the
// same order on every rank: the mesh's {tp}, {dp}, {pp}, {tp, pp}, emb, the dense reducer's own, and as the config
// says {cp}, {dp, cp}, the hybrid sharding groups, {ep}, {edp} and the expert reducer's own.
void make_groups(Distributed& d, const Config& cfg, const GroupMaker& group, bool all_take_part) {
  d.groups = MeshGroups(d.topology, d.rank(), group);
  MeshGroups& mesh = d.groups;
  mesh.make({"tp"});
  mesh.make({"dp"});
  mesh.make({"pp"});
  mesh.make({"tp", "pp"});
  // The embedding group sums the gradient of the word embeddings that the first and last stage share: only
  // tied embeddings have one (untied, the first stage owns the embedding and the last its own lm_head, and
  // the last stage has nothing to add to the first's sum). Every rank decides this from the same config.
  // zb-v holds both ends of the model on the first stage: its copies are summed there (GradBuffer), no group.
  const bool tied = cfg.model.tie_embeddings && cfg.parallel.pipeline_schedule != PipelineSchedule::zb_v;
  std::vector<int> emb = d.topology.embedding_group(d.rank());
  const bool in_emb = tied && std::find(emb.begin(), emb.end(), d.rank()) != emb.end() &&
                      (d.pp_rank() == 0 || d.pp_rank() == d.pp_size() - 1);
  if (in_emb || (all_take_part && tied)) d.emb = group("emb", in_emb ? emb : std::vector<int>{});
  // With context parallelism the context ranks hold the same weights as the data-parallel ones: gradients are
  // summed (and the distributed optimizer sharded) over data x context, and the context group passes keys and
  // values. Without it nothing more is created (the groups and their order are as before).
  const bool context = d.topology.cp() > 1;
  mesh.make(context ? MeshGroups::Dims{"dp", "cp"} : MeshGroups::Dims{"dp"}, GroupUse::grads);
  if (context) {
    mesh.make({"cp"});
    mesh.make({"dp", "cp"});
  }
  // Hybrid sharding (every rank knows parallel.shard_group from the same config): the shard group and the replica
  // group of this rank, within the ranks holding its weights. With context parallelism a shard group is N data
  // ranks with all their context ranks (N x C consecutive ranks of the data x context group: the context rank
  // varies fastest), as torchtitan shards over dp_shard x cp.
  const int shard_group = static_cast<int>(cfg.parallel.shard_group);
  const Topology& t = d.topology;
  const bool hybrid = shard_group > 0 && shard_group < t.dp();
  if (hybrid) {
    const std::vector<int> members = context ? t.dpcp_group(d.rank()) : t.dp_group(d.rank());
    const int index = d.cp_rank() + t.cp() * d.dp_rank();
    d.shard_group = group("shard", shard_group_members(members, shard_group * t.cp(), index));
    d.replicas_grads = group("replicas", replica_group_members(members, shard_group * t.cp(), index));
  }
  // Every rank knows EP and ETP from the same config, so all take part in both splits or in none.
  if (t.experts_apart()) {
    mesh.make({"ep"});
    mesh.make({"edp"});
    mesh.make({"edp"}, GroupUse::grads);  // the expert gradient buffer's own
    // Hybrid sharding of the experts: their shard group is the expert-data-parallel ranks inside this rank's dense
    // shard group (expert_shard_size), their replicas the ranks at its place in the others.
    if (const int n = static_cast<int>(cfg.parallel.expert_shard_size()); hybrid && n < t.edp()) {
      const std::vector<int> members = t.edp_group(d.rank());
      d.expert_shard_group = group("expert_shard", shard_group_members(members, n, d.edp_rank()));
      d.expert_replicas_grads = group("expert_replicas", replica_group_members(members, n, d.edp_rank()));
    }
    // LoRA adapters on experts split over ETP > 1 ranks sum their partial gradients there (models/moe_expert_lora.h).
    const LoraConfig& lora = cfg.finetune.lora;
    if (d.topology.etp() > 1 && lora.enabled() && (lora.targets_any("fc1") || lora.targets_any("fc2")))
      mesh.make({"etp"});
  } else {
    mesh.add({"ep"}, make_self_communicator(fmt::format("ep[{}]", d.rank())));  // one rank: no rendezvous
  }
  mesh.close();  // `group`'s captures end with the caller: every later request only looks up
}

}  // namespace

Topology topology_of(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  return Topology(world_size, static_cast<int>(p.tensor), static_cast<int>(p.pipeline), static_cast<int>(p.data),
                  static_cast<int>(p.expert), static_cast<int>(p.expert_tensor), static_cast<int>(p.context));
}

std::unique_ptr<Distributed> init_distributed(const Config& cfg, const LaunchEnv& env, const Placement& placement) {
  const auto& p = cfg.parallel;
  auto d = std::make_unique<Distributed>();
  d->env = env;
  d->placement = placement;
  d->topology = topology_of(cfg, env.world_size);
  const Millis timeout{static_cast<int64_t>(cfg.parallel.timeout_s * 1000)};
  if (env.world_size == 1) {
    d->store = make_hash_store();
  } else {
    if (env.rank == 0 && !env.store_hosted) d->server = std::make_unique<TcpStoreServer>("", env.master_port);
    // Store requests wait as long as collectives do (parallel.timeout_s), not a fixed time of their own.
    d->store = connect_tcp_store(env.master_addr, env.master_port, timeout, timeout);
    check_job_identity(*d->store, job_identity(cfg, env), env.rank, env.world_size, timeout,
                       fmt::format("{}:{}", env.master_addr, env.master_port));
    d->heartbeat = std::make_unique<Heartbeat>(env, Millis(1000), timeout);
  }
  // Every rank creates every group it belongs to, in the same order: world, tp, dp, pp, mp, emb, dp_grads, and
  // with expert parallelism ep, edp.
  // (With NCCL every rank takes part in every split, passing no members for a group it is not in.)
  const bool nccl = placement.backend == Backend::nccl;
  auto group_name = [](const std::string& kind, const std::vector<int>& members) {
    return fmt::format("{}[{}]", kind, fmt::join(members, ","));
  };
  auto gloo_group = [&](const std::string& kind, std::vector<int> members) {
    return make_staged_communicator(
        make_gloo_communicator(d->store, GlooOptions{.name = group_name(kind, members),
                                                     .members = members,
                                                     .global_rank = env.rank,
                                                     .hostname = gloo_hostname(env),
                                                     .timeout = timeout,
                                                     .shared_memory = p.gloo_shared_memory}),
        Device::cpu);
  };
#if defined(MEGATRAIN_WITH_NCCL)
  auto nccl_options = [&](const std::string& kind, std::vector<int> members) {
    return NcclOptions{.name = members.empty() ? std::string() : group_name(kind, members),
                       .members = members,
                       .global_rank = env.rank,
                       .device = placement.ordinal,
                       .timeout = timeout};
  };
  auto backend_group = [&](const std::string& kind, std::vector<int> members) -> std::unique_ptr<Communicator> {
    if (!nccl) return gloo_group(kind, std::move(members));
    auto split = split_nccl_communicator(*d->world, nccl_options(kind, std::move(members)));
    return split ? make_staged_communicator(std::move(split), Device::cuda) : nullptr;
  };
#else
  auto backend_group = gloo_group;
#endif
  // Every group counts the bytes it moves (parallel/comm/comm_counted.h) under its kind; the gradient reducers' own
  // communicators and hybrid sharding's groups count as the data-parallel traffic they are.
  GroupMaker group = [&](const std::string& kind, std::vector<int> members) -> std::unique_ptr<Communicator> {
    std::unique_ptr<Communicator> c = backend_group(kind, std::move(members));
    std::string counted = kind;
    if (counted.ends_with("grads")) counted.resize(counted.size() - 5);
    if (counted == "dpcp" || counted == "shard" || counted == "replicas") counted = "dp";
    if (counted == "expert_shard" || counted == "expert_replicas") counted = "edp";
    return c ? make_counted_communicator(std::move(c), counted) : nullptr;
  };
  std::vector<int> everyone(env.world_size);
  for (int r = 0; r < env.world_size; ++r) everyone[r] = r;
#if defined(MEGATRAIN_WITH_NCCL)
  if (nccl) spdlog::info("nccl: {}", nccl_version());
  if (nccl)
    d->world =
        make_staged_communicator(make_nccl_communicator(d->store, nccl_options("world", everyone)), Device::cuda);
  else
#endif
    d->world = gloo_group("world", everyone);
  d->world = make_counted_communicator(std::move(d->world), "world", false);  // in the flight recorder, not counted
  make_groups(*d, cfg, group, nccl);
  if (env.world_size == 1) return d;
  spdlog::info("rank {} of {} ({}): tp {} dp {} pp {}{}{}, {}, {}, rendezvous at {}:{}", env.rank, env.world_size,
               env.launcher, d->topology.coord(env.rank).tp, d->topology.coord(env.rank).dp,
               d->topology.coord(env.rank).pp,
               d->context_parallel() ? fmt::format(" cp {}", d->cp_rank()) : std::string(),
               d->experts_apart() ? fmt::format(" etp {} ep {} edp {}", d->etp_rank(), d->ep_rank(), d->edp_rank())
                                  : std::string(),
               placement.description, nccl ? "nccl" : "gloo", env.master_addr, env.master_port);
  return d;
}

std::unique_ptr<Distributed> meta_distributed(const Config& cfg, int world_size, int rank, const MetaGroups& opt) {
  auto d = std::make_unique<Distributed>();
  d->env.world_size = world_size;
  d->env.rank = rank;
  d->env.launcher = "meta";
  d->placement.device = Device::meta;
  d->placement.description = "meta";
  d->topology = topology_of(cfg, world_size);
  d->store = make_hash_store();
  const GroupMaker group = [&](const std::string& kind, std::vector<int> members) -> std::unique_ptr<Communicator> {
    const auto at = std::find(members.begin(), members.end(), rank);
    if (at == members.end()) return nullptr;
    return make_meta_communicator(MetaCommOptions{.name = fmt::format("{}[{}]", kind, fmt::join(members, ",")),
                                                  .rank = static_cast<int>(at - members.begin()),
                                                  .size = static_cast<int>(members.size()),
                                                  .gloo = opt.gloo,
                                                  .receive_factor = kind == "ep" ? opt.moe_receive_factor : 1});
  };
  std::vector<int> everyone(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) everyone[static_cast<size_t>(r)] = r;
  d->world = group("world", everyone);
  make_groups(*d, cfg, group, false);
  return d;
}

}  // namespace mt::app
