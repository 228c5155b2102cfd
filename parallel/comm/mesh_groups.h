// mesh_groups.h: the communicators of one rank's groups, each asked for by the mesh dimensions it spans
// (group({"dp", "cp"})) and made once. Making is collective (NCCL splits every rank in the same order, Gloo's members
// meet in a store), so every group is made at start-up in one order on every rank; afterwards a group is only looked
// up, and asking for one that was never made is a programming error named at once, not a hang.
#pragma once
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/topology.h"

namespace mt {

// Which communicator of a group: the shared one, or a gradient reducer's own (it runs on the reducer's thread, so it
// cannot share a communicator with the collectives the step issues meanwhile).
enum class GroupUse { shared, grads };

class MeshGroups {
 public:
  using Dims = std::initializer_list<std::string_view>;
  // Makes the communicator of a group: its kind (the name it logs and counts under) and its members (ascending); no
  // members when this rank is in no group of the split yet must take part in it (NCCL). May return null then.
  using Maker = std::function<std::unique_ptr<Communicator>(const std::string& kind, std::vector<int> members)>;

  MeshGroups() = default;
  MeshGroups(const Topology& topology, int rank, Maker make);

  // Makes rank's group over `dims` (Topology::group) and keeps it; twice the same group: the first. Collective.
  Communicator& make(Dims dims, GroupUse use = GroupUse::shared);
  // Keeps a communicator of rank's group over `dims` made otherwise (a one-rank group that needs no rendezvous).
  Communicator& add(Dims dims, std::unique_ptr<Communicator> comm, GroupUse use = GroupUse::shared);
  // Start-up is over: make and add throw std::logic_error from now on (the maker, whose captures may end, is dropped).
  void close() { make_ = nullptr; }

  // The group made by make (dims in any order); throws std::logic_error naming it when none was made.
  Communicator& operator()(Dims dims, GroupUse use = GroupUse::shared) const;
  Communicator* find(Dims dims, GroupUse use = GroupUse::shared) const;
  // Hands a made group over (a gradient reducer owns its own); throws as operator() does.
  std::unique_ptr<Communicator> take(Dims dims, GroupUse use = GroupUse::grads);

  // The kind a group logs and counts under: its dimensions' names in mesh order ("dp", "tpcp"), Megatron's "mp"
  // for tp x pp and "dpcp" for dp x cp, with "grads" after a reducer's own ("dpgrads").
  static std::string kind_of(std::span<const MeshDim> dims, GroupUse use);

 private:
  std::string key(Dims dims, GroupUse use) const;
  void check_open(const std::string& key) const;
  const Topology* topology_ = nullptr;
  int rank_ = 0;
  Maker make_;                                                   // null once closed
  std::map<std::string, std::unique_ptr<Communicator>> groups_;  // by key(): kind, canonical dims
};

}  // namespace mt
