// topology.cpp: the rank grid rank = tp + T * (cp + C * (dp + D * pp)) and every group as one expression over it.
#include "parallel/comm/topology.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

namespace mt {
namespace {

std::string layout(int tp, int pp, int dp, int cp = 1) {
  return "tensor " + std::to_string(tp) + (cp != 1 ? " x context " + std::to_string(cp) : std::string()) +
         " x pipeline " + std::to_string(pp) + " x data " + std::to_string(dp);
}

}  // namespace

Topology::Topology(int world_size, int tp, int pp, int dp, int ep, int etp, int cp)
    : world_(world_size), tp_(tp), pp_(pp), dp_(dp), ep_(ep), etp_(etp == 0 ? tp : etp), cp_(cp) {
  if (tp < 1 || pp < 1 || dp < 1 || cp < 1)
    throw std::invalid_argument(layout(tp, pp, dp, cp) + ": every parallel size must be at least 1");
  int64_t ranks = int64_t{tp} * cp * pp * dp;
  if (ranks != world_size)
    throw std::invalid_argument(layout(tp, pp, dp, cp) + " = " + std::to_string(ranks) + " ranks, but the world has " +
                                std::to_string(world_size));
  if (etp_ == tp && (ep < 1 || (cp * dp) % ep != 0))
    throw std::invalid_argument("expert parallel " + std::to_string(ep) +
                                " must be at least 1 and divide data parallel " + std::to_string(dp) +
                                (cp != 1 ? " x context parallel " + std::to_string(cp) : ""));
  if (etp_ < 1 || tp % etp_ != 0)
    throw std::invalid_argument("expert tensor parallel " + std::to_string(etp_) +
                                " must be at least 1 and divide tensor parallel " + std::to_string(tp));
  if (ep < 1 || (int64_t{tp} * cp * dp) % (int64_t{ep} * etp_) != 0)
    throw std::invalid_argument("expert parallel " + std::to_string(ep) + " x expert tensor parallel " +
                                std::to_string(etp_) + " must divide tensor x " + (cp != 1 ? "context x " : "") +
                                "data parallel " + std::to_string(tp) + " x " +
                                (cp != 1 ? std::to_string(cp) + " x " : "") + std::to_string(dp));
}

Topology::ExpertCoord Topology::expert_coord(int r) const {
  const Coord c = coord(r);
  const int i = c.tp + tp_ * (c.cp + cp_ * c.dp);  // the rank's place in its pipeline stage
  return {i % etp_, i / etp_ % ep_, i / (etp_ * ep_)};
}

Topology::Coord Topology::coord(int rank) const {
  if (rank < 0 || rank >= world_)
    throw std::out_of_range("rank " + std::to_string(rank) + " is outside the world of " + std::to_string(world_) +
                            " ranks");
  return {rank % tp_, rank / (tp_ * cp_) % dp_, rank / (tp_ * cp_ * dp_), rank / tp_ % cp_};
}

int Topology::rank(Coord c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.dp < 0 || c.dp >= dp_ || c.pp < 0 || c.pp >= pp_ || c.cp < 0 || c.cp >= cp_)
    throw std::out_of_range("coordinate (tp " + std::to_string(c.tp) + ", dp " + std::to_string(c.dp) + ", pp " +
                            std::to_string(c.pp) + (cp_ != 1 ? ", cp " + std::to_string(c.cp) : std::string()) +
                            ") is outside the grid " + layout(tp_, pp_, dp_, cp_));
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

int Topology::size(MeshDim dim) const {
  switch (dim) {
    case MeshDim::tp:
      return tp_;
    case MeshDim::cp:
      return cp_;
    case MeshDim::dp:
      return dp_;
    case MeshDim::pp:
      return pp_;
    case MeshDim::etp:
      return etp_;
    case MeshDim::ep:
      return ep_;
    case MeshDim::edp:
      return edp();
  }
  throw std::invalid_argument("unknown mesh dimension");
}

// Dense: rank = tp + T * (cp + C * (dp + D * pp)); experts: rank = etp + ETP * (ep + EP * edp) + T * C * D * pp.
int Topology::stride(MeshDim dim) const {
  switch (dim) {
    case MeshDim::tp:
      return 1;
    case MeshDim::cp:
      return tp_;
    case MeshDim::dp:
      return tp_ * cp_;
    case MeshDim::pp:
      return tp_ * cp_ * dp_;
    case MeshDim::etp:
      return 1;
    case MeshDim::ep:
      return etp_;
    case MeshDim::edp:
      return etp_ * ep_;
  }
  throw std::invalid_argument("unknown mesh dimension");
}

int Topology::coord(MeshDim dim, int r) const {
  if (r < 0 || r >= world_) coord(r);  // throws the out_of_range
  return r / stride(dim) % size(dim);
}

std::vector<MeshDim> Topology::parse_dims(std::span<const std::string_view> names) {
  auto listed = [&] {
    std::string s;
    for (std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
    return "{" + s + "}";
  };
  if (names.empty()) throw std::invalid_argument("a mesh group names at least one dimension (tp cp dp pp etp ep edp)");
  std::vector<MeshDim> dims;
  for (std::string_view n : names) {
    const std::optional<MeshDim> d = parse_choice<MeshDim>(n);
    if (!d)
      throw std::invalid_argument("mesh group " + listed() + ": '" + std::string(n) +
                                  "' is no dimension (tp cp dp pp etp ep edp)");
    if (std::find(dims.begin(), dims.end(), *d) != dims.end())
      throw std::invalid_argument("mesh group " + listed() + " names '" + std::string(n) + "' twice");
    dims.push_back(*d);
  }
  const auto dense = [](MeshDim d) { return d == MeshDim::tp || d == MeshDim::cp || d == MeshDim::dp; };
  const auto expert = [](MeshDim d) { return d == MeshDim::etp || d == MeshDim::ep || d == MeshDim::edp; };
  if (std::any_of(dims.begin(), dims.end(), dense) && std::any_of(dims.begin(), dims.end(), expert))
    throw std::invalid_argument("mesh group " + listed() +
                                " mixes the dense grid's dimensions (tp cp dp) with the experts' fold (etp ep edp)");
  std::sort(dims.begin(), dims.end());
  return dims;
}

// The named dimensions vary (a mixed-radix counter, fastest first, so ranks ascend), the others keep rank's
// coordinates: member = base + sum of c x stride.
std::vector<int> Topology::group(std::span<const std::string_view> names, int r) const {
  std::vector<MeshDim> dims = parse_dims(names);
  // Fastest first: by stride (in the experts' fold pp, listed first by name, is the slowest).
  std::stable_sort(dims.begin(), dims.end(), [&](MeshDim a, MeshDim b) { return stride(a) < stride(b); });
  int base = r;
  int count = 1;
  for (MeshDim d : dims) {
    base -= coord(d, r) * stride(d);
    count *= size(d);
  }
  std::vector<int> g;
  g.reserve(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    int member = base;
    int rest = k;
    for (MeshDim d : dims) {
      member += rest % size(d) * stride(d);
      rest /= size(d);
    }
    g.push_back(member);
  }
  return g;
}

std::vector<int> Topology::tp_group(int r) const { return group({"tp"}, r); }
std::vector<int> Topology::dp_group(int r) const { return group({"dp"}, r); }
std::vector<int> Topology::pp_group(int r) const { return group({"pp"}, r); }
std::vector<int> Topology::model_parallel_group(int r) const { return group({"tp", "pp"}, r); }
std::vector<int> Topology::cp_group(int r) const { return group({"cp"}, r); }
std::vector<int> Topology::dpcp_group(int r) const { return group({"dp", "cp"}, r); }
std::vector<int> Topology::ep_group(int r) const { return group({"ep"}, r); }
std::vector<int> Topology::edp_group(int r) const { return group({"edp"}, r); }

std::vector<int> Topology::embedding_group(int r) const {
  Coord c = coord(r);
  if (pp_ == 1) return {r};
  return {rank({c.tp, c.dp, 0, c.cp}), rank({c.tp, c.dp, pp_ - 1, c.cp})};
}

const char* group_kind_name(GroupKind kind) { return name_of(kind).data(); }  // the table's literals end in a NUL

std::vector<int> Topology::group(GroupKind kind, int r) const {
  switch (kind) {
    case GroupKind::tp:
      return tp_group(r);
    case GroupKind::dp:
      return dp_group(r);
    case GroupKind::pp:
      return pp_group(r);
    case GroupKind::mp:
      return model_parallel_group(r);
    case GroupKind::emb:
      return embedding_group(r);
    case GroupKind::ep:
      return ep_group(r);
    case GroupKind::edp:
      return edp_group(r);
    case GroupKind::cp:
      return cp_group(r);
    case GroupKind::dpcp:
      return dpcp_group(r);
  }
  throw std::invalid_argument("unknown group kind");
}

// A group is listed once: by the rank that is its first member.
std::vector<std::vector<int>> Topology::all_groups(GroupKind kind) const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_; ++r) {
    std::vector<int> g = group(kind, r);
    if (g.front() == r) groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace mt
