// shared_rounds.h: the shared-memory fast path of a Gloo group whose ranks all run on one host (comm_gloo.cpp).
// Over Gloo's TCP transport a 4 KiB all-reduce of 4 tensor-parallel ranks costs ~1.7 ms on 2 cores (three
// messages per transfer, each a wake-up of Gloo's loop thread and then of the caller); through one shared segment
// it is a copy in, an arrival counter and a futex wake. Collectives of at most kSlotBytes per rank use it; larger
// ones, send/recv and groups across hosts stay on Gloo.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/store/store.h"

namespace mt {

// A round that failed: it timed out (the message says "timed out" and names the ranks that never arrived), a peer
// process exited, or a peer gave up first. Group ranks are named with their global ranks.
class SharedRoundError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One segment per group: for each rank an arrival counter and two slots of kSlotBytes, used by alternate rounds.
// A round: every rank copies its part (at most kSlotBytes) into its slot, counts its arrival and waits for every
// other rank's; then each may read every slot of that round until it starts the round after next. That is safe
// without a second wait: a rank starts round k + 2 only after all ranks arrived at round k + 1, which each did
// after it had read round k.
class SharedRounds {
 public:
  static constexpr size_t kSlotBytes = 64 << 10;

  // Collective over the group (every member calls it, right after the group's Gloo rendezvous): returns the
  // rounds on every member, or nullptr on every member, with the reason in *why_not: the group has one rank, a
  // member did not want them (`wanted` false: parallel.gloo_shared_memory), the members are not all on this host
  // (hostname, boot id and pid namespace differ), or a member could not create or map the segment (e.g. /dev/shm
  // full). The segment is unlinked once every member has mapped it, so nothing outlives the group. Store waits
  // are bounded by `timeout` (StoreError); so is every round.
  static std::unique_ptr<SharedRounds> join(Store& store, const std::string& prefix, int rank,
                                            const std::vector<int>& members, bool wanted,
                                            std::chrono::milliseconds timeout, std::string* why_not);
  ~SharedRounds();
  SharedRounds(const SharedRounds&) = delete;
  SharedRounds& operator=(const SharedRounds&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }

  // Publishes `bytes` (<= kSlotBytes) at `mine` as this rank's part of the next round and waits for every rank's
  // part. Throws SharedRoundError (timeout, a peer process that exited, a peer that gave up, or with `same_size`
  // a part of another size: the ranks disagree on the collective); this rank then gives up too (abandon), so the
  // others stop waiting at once.
  void round(const void* mine, size_t bytes, bool same_size = true);
  // Rank j's part of the last round (valid until this rank starts the round after next).
  const std::byte* part(int j) const;
  size_t part_bytes(int j) const;

  // Marks the group broken (this rank failed, here or on Gloo's side): every rank waiting in a round, and every
  // later round, fails at once naming this rank.
  void abandon() noexcept;

  struct Segment;  // the shared layout (shared_rounds.cpp)

 private:
  SharedRounds(int rank, std::vector<int> members, std::chrono::milliseconds timeout);
  void wait_for_all(uint64_t target);
  [[noreturn]] void give_up(const std::string& why);
  std::string exited_peers() const;
  std::string who(int r) const;

  int rank_;
  std::vector<int> members_;  // global ranks
  std::chrono::milliseconds timeout_;
  Segment* seg_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<int> peer_fds_;  // pidfds of the other ranks' processes (-1: same process, or none to be had)
  std::vector<int> peer_pids_;
  uint64_t rounds_ = 0;  // rounds this rank has started
};

}  // namespace mt
