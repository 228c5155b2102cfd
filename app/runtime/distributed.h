// distributed.h: this process's place in the job (launch environment, rank grid) and the communicators
// of its groups, set up once at start.
#pragma once
#include <algorithm>
#include <memory>

#include "app/runtime/device.h"
#include "app/runtime/heartbeat.h"
#include "core/config/config.h"
#include "parallel/comm/communicator.h"
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
  std::unique_ptr<Communicator> world;     // every rank (barriers around checkpoints)
  std::unique_ptr<Communicator> tp;        // this rank's tensor-parallel group
  std::unique_ptr<Communicator> dp;        // this rank's data-parallel group (size 1 when not distributed)
  std::unique_ptr<Communicator> pp;        // this rank's pipeline (its rank r is stage r)
  std::unique_ptr<Communicator> mp;        // model-parallel group (every tp and pp rank of this dp rank)
  std::unique_ptr<Communicator> emb;       // first and last stage (tied embeddings); null on middle stages and untied
  std::unique_ptr<Communicator> dp_grads;  // the gradient reducer's own: data-parallel (x context-parallel) group
  // Context parallelism (parallel.context > 1; null otherwise): the ranks holding the chunks of the same samples, and
  // the data x context group, whose ranks hold the same weights (the distributed optimizer's shards).
  std::unique_ptr<Communicator> cp;
  std::unique_ptr<Communicator> dpcp;
  // Hybrid sharding (parallel.shard_group N below the data-parallel size; null otherwise, parallel/sharding/hybrid_shard.h):
  // this rank's shard group (N consecutive data-parallel ranks: the distributed optimizer's and the sharded
  // parameters' gathers) and its replica group (the ranks at its place in the other shard groups), the latter for
  // the gradient reducer's thread.
  std::unique_ptr<Communicator> shard_group;
  std::unique_ptr<Communicator> replicas_grads;
  // Expert parallelism (parallel.expert = EP, parallel.expert_tensor = ETP; parallel/comm/topology.h): the MoE token
  // exchange runs over `ep`, expert gradients are summed over `edp` (the ranks holding the same experts' same
  // slices). When the experts' grid is the dense one (EP == 1 and ETP == TP), `ep` is a one-rank communicator that
  // costs nothing to create and `edp` is null: the expert data-parallel group is then the data-parallel group
  // (expert_data_parallel() hands out dp).
  std::unique_ptr<Communicator> ep;
  std::unique_ptr<Communicator> edp;
  std::unique_ptr<Communicator> edp_grads;  // edp again, for the expert gradient buffer's thread (when apart)
  std::unique_ptr<Heartbeat> heartbeat;     // multi-rank jobs: names the ranks that stop answering (last member:
                                            // it stops before the store server goes)

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
  Communicator& weight_replicas() const { return dpcp ? *dpcp : *dp; }
  // The ranks the ZeRO stages shard over: the shard group with hybrid sharding, else weight_replicas().
  Communicator& shard_owners() const { return shard_group ? *shard_group : weight_replicas(); }
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
  Communicator& expert_data_parallel() const { return edp ? *edp : *dp; }
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
