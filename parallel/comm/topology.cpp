// topology.cpp: the rank grid rank = tp + T * (cp + C * (dp + D * pp)) and every group as one expression over it.
#include "parallel/comm/topology.h"

#include <cstdint>
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

int Topology::expert_rank(int pp, ExpertCoord e) const {
  const int i = e.etp + etp_ * (e.ep + ep_ * e.edp);
  return rank({.tp = i % tp_, .dp = i / (tp_ * cp_), .pp = pp, .cp = i / tp_ % cp_});
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

// Each group fixes some coordinates of `rank` and varies the others; ranks ascend because the varied
// coordinates are walked slowest-first (pp, then dp, then tp).
std::vector<int> Topology::tp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int t = 0; t < tp_; ++t) g.push_back(rank({t, c.dp, c.pp, c.cp}));
  return g;
}

std::vector<int> Topology::dp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int d = 0; d < dp_; ++d) g.push_back(rank({c.tp, d, c.pp, c.cp}));
  return g;
}

std::vector<int> Topology::pp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int p = 0; p < pp_; ++p) g.push_back(rank({c.tp, c.dp, p, c.cp}));
  return g;
}

std::vector<int> Topology::model_parallel_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int p = 0; p < pp_; ++p)
    for (int t = 0; t < tp_; ++t) g.push_back(rank({t, c.dp, p, c.cp}));
  return g;
}

std::vector<int> Topology::embedding_group(int r) const {
  Coord c = coord(r);
  if (pp_ == 1) return {r};
  return {rank({c.tp, c.dp, 0, c.cp}), rank({c.tp, c.dp, pp_ - 1, c.cp})};
}

std::vector<int> Topology::cp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int k = 0; k < cp_; ++k) g.push_back(rank({c.tp, c.dp, c.pp, k}));
  return g;
}

// dp outer, cp inner: ranks ascend (cp varies faster than dp in the grid).
std::vector<int> Topology::dpcp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int d = 0; d < dp_; ++d)
    for (int k = 0; k < cp_; ++k) g.push_back(rank({c.tp, d, c.pp, k}));
  return g;
}

// The varied expert coordinate walks the stage's ranks in ascending order (i grows with it, and rank with i).
std::vector<int> Topology::ep_group(int r) const {
  const int pp = coord(r).pp;
  ExpertCoord e = expert_coord(r);
  std::vector<int> g;
  for (e.ep = 0; e.ep < ep_; ++e.ep) g.push_back(expert_rank(pp, e));
  return g;
}

std::vector<int> Topology::edp_group(int r) const {
  const int pp = coord(r).pp;
  ExpertCoord e = expert_coord(r);
  std::vector<int> g;
  for (e.edp = 0; e.edp < edp(); ++e.edp) g.push_back(expert_rank(pp, e));
  return g;
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
