// comm_counted.h: the bytes each rank's collectives move, counted in the communicator layer per group kind and op
// (the data-parallel gradient reductions and parameter gathers: the ZeRO stages' communication volume).
//
// A collective of n ranks on a buffer of B bytes counts what a bandwidth-optimal algorithm sends from each rank
// (NCCL's "bus bandwidth" convention, and the ZeRO paper's volumes): all-reduce 2 (n - 1) / n B, reduce-scatter
// and all-gather (n - 1) / n B of the full (n-block) buffer, broadcast (n - 1) / n B; send counts its bytes, recv
// nothing, all_to_all the elements sent to other ranks. A group of one moves nothing. f64 all-reduces (the loss,
// counter and grad-norm sums of a few doubles, sum_doubles) are counted apart as `scalars`.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/base/enum_names.h"
#include "parallel/comm/communicator.h"

namespace mt {

enum class CommOp { all_reduce, reduce_scatter, all_gather, other, scalars };
template <>
struct EnumNames<CommOp> {  // metrics.jsonl's comm_bytes_by_group keys
  static constexpr std::array names{"all_reduce", "reduce_scatter", "all_gather", "other", "scalars"};
  static constexpr std::array<const char*, 0> planned{};
};
inline constexpr int kCommOps = static_cast<int>(EnumNames<CommOp>::names.size());

// Bytes moved by this process's counted communicators since it started, per group kind (the name given to
// make_counted_communicator) and op. Thread-safe (the gradient reducer's thread counts too).
using CommBytes = std::map<std::string, std::array<int64_t, kCommOps>>;
CommBytes comm_bytes_moved();

// Wraps `inner` so that its ops add their bytes to group kind `kind`'s counters (count_bytes) and go into the flight
// recorder (parallel/comm/flight_recorder.h); otherwise it is `inner`. The world's communicator is recorded, not
// counted: its few scalar sums (the logs' gathers) are no part of training's traffic.
std::unique_ptr<Communicator> make_counted_communicator(std::unique_ptr<Communicator> inner, std::string kind,
                                                        bool count_bytes = true);

}  // namespace mt
