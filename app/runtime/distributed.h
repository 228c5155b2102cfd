// distributed.h: this process's place in the job (launch environment, rank grid) and the communicators
// of its groups, set up once at start.
#pragma once
#include <algorithm>
#include <memory>

#include "app/runtime/device.h"
#include "app/runtime/heartbeat.h"
#include "core/config/config.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/mesh_groups.h"
#include "parallel/store/launch.h"
#include "parallel/store/store.h"
#include "parallel/comm/topology.h"

namespace mt::app {

struct Distributed {
  LaunchEnv env;
  Placement placement;  // this rank's device and communication backend
  Topology topology{1, 1, 1, 1};
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
  std::shared_ptr<Store> store;
  std::unique_ptr<Communicator> world;  // every rank (barriers around checkpoints)
  // The named mesh's groups (parallel/comm/mesh_groups.h), made once at start-up by make_groups in one order on
  // every rank: {tp}, {dp}, {pp}, {tp, pp} (model parallel), the dense gradient reducer's own {dp} or {dp, cp}
  // (GroupUse::grads, handed to it); with context parallelism {cp} and {dp, cp} (the ranks holding the same weights,
  // the distributed optimizer's shards); {ep}, the MoE token exchange (one rank when the experts' grid is the dense
  // one); when the experts are apart (EP > 1 or ETP < TP) {edp}, the ranks holding the same experts' same slices, and
  // the expert reducer's own {edp}. Without them the expert-data-parallel group is the data-parallel group.
  MeshGroups groups;
  std::unique_ptr<Communicator> emb;  // first and last stage (tied embeddings); null on middle stages and untied
  // Hybrid sharding (parallel.shard_group N below the data-parallel size; null otherwise, parallel/sharding/hybrid_shard.h):
  // this rank's shard group (N consecutive data-parallel ranks: the distributed optimizer's and the sharded
  // parameters' gathers) and its replica group (the ranks at its place in the other shard groups), the latter for
  // the gradient reducer's thread.
  std::unique_ptr<Communicator> shard_group;
  std::unique_ptr<Communicator> replicas_grads;
  // The experts' (when apart and sharded in smaller groups than their expert-data-parallel group, ParallelConfig::
  // expert_shard_size): the expert-data-parallel ranks inside this rank's shard group, and their replicas.
  std::unique_ptr<Communicator> expert_shard_group;
  std::unique_ptr<Communicator> expert_replicas_grads;
  std::unique_ptr<Heartbeat> heartbeat;  // multi-rank jobs: names the ranks that stop answering (last member:
                                         // it stops before the store server goes)

  // A group by the dimensions it spans: group({"tp"}), group({"dp", "cp"}). Throws naming one never made.
  Communicator& group(MeshGroups::Dims dims) const { return groups(dims); }
  // The context-parallel group; null without context parallelism.
  Communicator* context_parallel() const { return groups.find({"cp"}); }
  // The dense reducer's own communicator, handed over once (parallelize).
  std::unique_ptr<Communicator> take_dense_grads() {
    return groups.take(cp_size() > 1 ? MeshGroups::Dims{"dp", "cp"} : MeshGroups::Dims{"dp"});
  }
  // The expert reducer's own, handed over once; null when the experts reduce with the dense parameters.
  std::unique_ptr<Communicator> take_expert_grads() { return experts_apart() ? groups.take({"edp"}) : nullptr; }

  int rank() const { return env.rank; }
  bool is_logging_rank() const { return env.rank == 0; }
  int dp_rank() const { return topology.coord(env.rank).dp; }
  int dp_size() const { return topology.dp(); }
  int tp_rank() const { return topology.coord(env.rank).tp; }
  int tp_size() const { return topology.tp(); }
  int pp_rank() const { return topology.coord(env.rank).pp; }
  int cp_rank() const { return topology.coord(env.rank).cp; }
  int cp_size() const { return topology.cp(); }
  // The ranks that sum gradients and shard the distributed optimizer: data x context parallel.
  Communicator& weight_replicas() const {
    Communicator* dpcp = groups.find({"dp", "cp"});
    return dpcp ? *dpcp : group({"dp"});
  }
  // The ranks the ZeRO stages shard over: the shard group with hybrid sharding, else weight_replicas().
  Communicator& shard_owners() const { return shard_group ? *shard_group : weight_replicas(); }
  // The ranks the experts' ZeRO stages shard over (experts apart): their shard group, else the expert-data group.
  Communicator* expert_shard_owners() const {
    return expert_shard_group ? expert_shard_group.get() : groups.find({"edp"});
  }
  int pp_size() const { return topology.pp(); }
  int ep_rank() const { return topology.expert_coord(env.rank).ep; }
  int ep_size() const { return topology.ep(); }
  int edp_rank() const { return topology.expert_coord(env.rank).edp; }
  int edp_size() const { return topology.edp(); }
  int etp_rank() const { return topology.expert_coord(env.rank).etp; }
  int etp_size() const { return topology.etp(); }
  bool experts_apart() const { return topology.experts_apart(); }
  // Checkpoint writers: of each pipeline stage the ranks i = tp + T * (cp + C * dp) in [0, W), W = max(T, ETP * EP) (the
  // first data-parallel rank's, i < T, write the dense parameters; the first expert-data-parallel rank's,
  // i < ETP * EP, their experts); each writes file i + W * pp of W * PP.
  int checkpoint_writers_per_stage() const { return std::max(tp_size(), etp_size() * ep_size()); }
  int checkpoint_file() const {
    return tp_rank() + tp_size() * (cp_rank() + cp_size() * dp_rank()) + checkpoint_writers_per_stage() * pp_rank();
  }
  Communicator& expert_data_parallel() const {
    Communicator* edp = groups.find({"edp"});
    return edp ? *edp : group({"dp"});
  }
};

// Serves (rank 0) or reaches the rendezvous store and creates the communicators of this rank's groups: with
// NCCL, one world communicator bootstrapped through the store and every group split off it
// (ncclCommSplit); with Gloo, one communicator per group through prefixed stores, host-staged when the
// tensors live on a GPU. Every communicator takes tensors on any device (small host exchanges are staged).
std::unique_ptr<Distributed> init_distributed(const Config& cfg, const LaunchEnv& env, const Placement& placement);

// The rank grid of a job of `world_size` ranks laid out as cfg.parallel says.
Topology topology_of(const Config& cfg, int world_size);

// Rank `rank` of a job of `world_size` ranks laid out as cfg.parallel says, on the meta device (core/meta/meta.h):
// the same groups as init_distributed makes, each a meta communicator (parallel/comm/communicator.h
// make_meta_communicator) that moves nothing. What the planner measures a rank's step in.
struct MetaGroups {
  bool gloo = true;               // mirror Gloo's workspaces (a CPU job's), else NCCL's (none)
  double moe_receive_factor = 1;  // MetaCommOptions::receive_factor
};
std::unique_ptr<Distributed> meta_distributed(const Config& cfg, int world_size, int rank, const MetaGroups& opt);

}  // namespace mt::app
