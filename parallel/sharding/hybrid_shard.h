// hybrid_shard.h: hybrid sharded data parallelism (HSDP, parallel.shard_group: N; after torchtitan's HSDP and
// Megatron-FSDP). The D data-parallel ranks split into D / N shard groups of N consecutive data-parallel ranks: the
// optimizer state, gradients and parameters (the ZeRO stage's) are sharded inside a group, as ZeRO shards them over
// the whole group, and replicated across the groups. Data-parallel rank d is in-group rank d % N of group d / N; the
// replica group of in-group rank i is the ranks i, N + i, 2N + i, ... (ordered by group).
//
// The gradient sum keeps the summation order of the whole group's (Gloo sums every element in data-parallel rank
// order, ((x_0 + x_1) + x_2) + ..., whatever the grouping), so every shard group size trains bit for bit as the
// others and as parallel.shard: none. Summing inside a group first and then across groups ((x_0 + x_1) + (x_2 +
// x_3)) would not. So a bucket (padded to a multiple of D) is reduce-scattered over the whole data-parallel group
// into D blocks placed so that rank d's block is the (d / N)-th of the G = D / N pieces of its group shard (d % N),
// and the G pieces of a shard are then all-gathered over its replica group. Per rank that moves as many bytes as the
// textbook form (a reduce-scatter in the group, then an all-reduce of the shard across groups): (N - 1) / N B +
// 2 (G - 1) / G B / N = (D - 1) / D B + (G - 1) / G B / N for a bucket of B bytes; only the links differ (the whole
// group's rather than mostly the shard group's).
#pragma once
#include <memory>
#include <vector>

#include "parallel/comm/communicator.h"

namespace mt {

// The members (global ranks) of the shard group and the replica group of the rank at data-parallel index `index` of
// `dp_members` (its data-parallel group in data-parallel order), for shard groups of `n` ranks (n divides the
// group's size; std::invalid_argument naming parallel.shard_group otherwise).
std::vector<int> shard_group_members(const std::vector<int>& dp_members, int n, int index);
std::vector<int> replica_group_members(const std::vector<int>& dp_members, int n, int index);

// Reduce-scatters `bucket` (f32, a multiple of dp.size() elements) over the data-parallel group `dp` into `out`
// (bucket / n elements: block dp.rank() % n of the bucket, n = dp.size() / replicas.size()), summed over every rank of
// dp in rank order; `replicas` is this rank's replica group. `out` may be a block of `bucket`. With one replica (n =
// dp.size()) it is dp's reduce-scatter. The returned Work completes the all-gather (the reduce-scatter is waited on
// inside: on NCCL that orders the compute stream, the host does not wait; so on NCCL the compute stream waits for
// each bucket's reduce-scatter before the gather over the replicas is enqueued after it, less overlap with backward
// than one collective would keep: an event between the two communicators' streams would spare that).
std::unique_ptr<Work> hybrid_reduce_scatter(Communicator& dp, Communicator& replicas, const Tensor& bucket,
                                            Tensor& out);

}  // namespace mt
