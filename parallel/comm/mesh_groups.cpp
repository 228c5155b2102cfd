// mesh_groups.cpp: groups by the names of the mesh dimensions they span, made once.
#include "parallel/comm/mesh_groups.h"

#include <stdexcept>
#include <utility>

namespace mt {
namespace {

std::vector<MeshDim> dims_of(MeshGroups::Dims dims) {
  return Topology::parse_dims(std::span<const std::string_view>(dims.begin(), dims.size()));
}

}  // namespace

MeshGroups::MeshGroups(const Topology& topology, int rank, Maker make)
    : topology_(&topology), rank_(rank), make_(std::move(make)) {}

std::string MeshGroups::kind_of(std::span<const MeshDim> dims, GroupUse use) {
  std::string kind;
  const auto is = [&](MeshDim a, MeshDim b) { return dims.size() == 2 && dims[0] == a && dims[1] == b; };
  if (is(MeshDim::tp, MeshDim::pp))
    kind = "mp";  // Megatron's model-parallel group
  else if (is(MeshDim::cp, MeshDim::dp))
    kind = "dpcp";  // Megatron's data-parallel-with-context group
  else
    for (MeshDim d : dims) kind += name_of(d);
  return use == GroupUse::grads ? kind + "grads" : kind;
}

std::string MeshGroups::key(Dims dims, GroupUse use) const { return kind_of(dims_of(dims), use); }

void MeshGroups::check_open(const std::string& k) const {
  if (!make_)
    throw std::logic_error("mesh group " + k +
                           ": groups are made at start-up only (collectively, in one order on every rank)");
}

Communicator& MeshGroups::add(Dims dims, std::unique_ptr<Communicator> comm, GroupUse use) {
  const std::string k = key(dims, use);
  check_open(k);
  auto& slot = groups_[k];
  if (!slot) slot = std::move(comm);
  return *slot;
}

Communicator& MeshGroups::make(Dims dims, GroupUse use) {
  const std::string k = key(dims, use);
  check_open(k);
  auto& slot = groups_[k];
  if (!slot) {
    slot = make_(k, topology_->group(std::span<const std::string_view>(dims.begin(), dims.size()), rank_));
    if (!slot) throw std::logic_error("mesh group " + k + ": its maker made no communicator for a member");
  }
  return *slot;
}

Communicator* MeshGroups::find(Dims dims, GroupUse use) const {
  const auto it = groups_.find(key(dims, use));
  return it == groups_.end() ? nullptr : it->second.get();
}

Communicator& MeshGroups::operator()(Dims dims, GroupUse use) const {
  if (Communicator* c = find(dims, use)) return *c;
  throw std::logic_error("mesh group " + key(dims, use) +
                         " was not made at start-up (groups are made collectively, in one order on every rank: "
                         "app/runtime/distributed.cpp make_groups)");
}

std::unique_ptr<Communicator> MeshGroups::take(Dims dims, GroupUse use) {
  const auto it = groups_.find(key(dims, use));
  if (it == groups_.end()) (*this)(dims, use);  // throws, naming the group
  std::unique_ptr<Communicator> c = std::move(it->second);
  groups_.erase(it);
  return c;
}

}  // namespace mt
