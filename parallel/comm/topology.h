// topology.h: the rank grid. rank = tp + T * (cp + C * (dp + D * pp)): tensor-parallel ranks vary fastest (a TP
// group sits inside one node), then context-parallel, then data-parallel, then pipeline (Megatron's tp-cp-dp-pp
// order; with C = 1, the context parallelism of none, rank = tp + T * (dp + D * pp) as before). The MoE layers'
// experts refold each pipeline stage's T * C * D ranks, i = tp + T * (cp + C * dp), as i = etp + ETP * (ep + EP * edp)
// (Megatron's "parallel folding": expert tensor-parallel ranks fastest, then expert-parallel, then
// expert-data-parallel). With ETP = T (the default) that splits the context x data dimension, cp + C * dp = ep + EP *
// edp: an expert-parallel group is EP consecutive ranks of it (context ranks first) and the expert-data-parallel
// group the ranks at the same place in each. With ETP < T the expert-parallel groups draw from the tensor-parallel
// ranks too.
#pragma once
#include <array>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/enum_names.h"

namespace mt {

// The kinds of process group: tensor, data, pipeline, model (tensor x pipeline) parallel, the embedding
// group (first and last pipeline stage), expert parallel (the ranks that split the experts of an MoE layer)
// and expert-data parallel (the ranks holding the same experts, which sum their gradients).
// cp: the context-parallel ranks (the chunks of one sequence); dpcp: data x context parallel, the ranks holding the
// same weights, which sum their gradients (the data-parallel group when C = 1).
enum class GroupKind { tp, dp, pp, mp, emb, ep, edp, cp, dpcp };
template <>
struct EnumNames<GroupKind> {
  static constexpr std::array names{"tp", "dp", "pp", "mp", "emb", "ep", "edp", "cp", "dpcp"};
};
const char* group_kind_name(GroupKind kind);  // name_of(kind), NUL-terminated

// The mesh's named dimensions: the dense grid's tp, cp, dp, pp (tp fastest) and the experts' fold of each pipeline
// stage, etp, ep, edp (etp fastest), which shares pp. In either fold rank = sum of coordinate x stride.
enum class MeshDim { tp, cp, dp, pp, etp, ep, edp };
template <>
struct EnumNames<MeshDim> {
  static constexpr std::array names{"tp", "cp", "dp", "pp", "etp", "ep", "edp"};
};

class Topology {
 public:
  struct Coord {
    int tp = 0, dp = 0, pp = 0, cp = 0;
    bool operator==(const Coord&) const = default;
  };
  // Throws std::invalid_argument naming the sizes when tp * pp * dp != world_size or any is < 1, and naming
  // them when etp (0: tp) does not divide tp or ep * etp does not divide tp * dp.
  // cp: the context-parallel size (throws when < 1, or when above 1 with ep > 1 or etp < tp).
  Topology(int world_size, int tp, int pp, int dp, int ep = 1, int etp = 0, int cp = 1);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int ep() const { return ep_; }
  int etp() const { return etp_; }
  int cp() const { return cp_; }
  // The expert-data-parallel size: each stage's T * C * D ranks refold as ETP * EP * EDP.
  int edp() const { return tp_ * cp_ * dp_ / (etp_ * ep_); }
  // Whether the experts' grid differs from the dense one (EP > 1 or ETP < TP): their gradients then have a
  // reduction group of their own.
  bool experts_apart() const { return ep_ > 1 || etp_ != tp_; }
  // rank's place in the experts' grid.
  struct ExpertCoord {
    int etp = 0, ep = 0, edp = 0;
  };
  ExpertCoord expert_coord(int rank) const;

  // Both throw std::out_of_range for a rank outside the world or a coordinate outside the grid.
  Coord coord(int rank) const;
  int rank(Coord c) const;

  // Members (global ranks, ascending) of each group that `rank` belongs to.
  std::vector<int> tp_group(int rank) const;              // same cp, dp, pp
  std::vector<int> dp_group(int rank) const;              // same tp, cp, pp
  std::vector<int> pp_group(int rank) const;              // same tp, cp, dp; ordered by stage
  std::vector<int> model_parallel_group(int rank) const;  // same cp, dp: every tp and pp
  std::vector<int> cp_group(int rank) const;              // same tp, dp, pp; ordered by context rank
  std::vector<int> dpcp_group(int rank) const;            // same tp, pp: every cp and dp
  // The first and last pipeline stage of rank's pipeline (tied embeddings); just the rank when pp == 1.
  std::vector<int> embedding_group(int rank) const;
  // Same pp, etp and edp: the EP ranks that split the experts (with ETP = T, EP consecutive ranks of the stage's
  // context x data ranks); just the rank when ep == 1.
  std::vector<int> ep_group(int rank) const;
  // Same pp, etp and ep: the T * C * D / (ETP * EP) ranks holding the same experts' same slices; the dp x cp group
  // when ep == 1 and etp == tp.
  std::vector<int> edp_group(int rank) const;

  // The named mesh. A dimension's size, and rank's coordinate along it.
  int size(MeshDim dim) const;
  int coord(MeshDim dim, int rank) const;
  // The members (ascending) of rank's group over the named dimensions: the ranks whose other coordinates are rank's,
  // so {"dp", "cp"} are the ranks holding the same dense weights and {"tp", "pp"} the model-parallel ones. The
  // names are of one fold, the dense (tp cp dp pp) or the experts' (etp ep edp pp). Throws std::invalid_argument
  // naming an unknown dimension, one named twice, none named, or a mix of the two folds.
  std::vector<int> group(std::span<const std::string_view> dims, int rank) const;
  std::vector<int> group(std::initializer_list<std::string_view> dims, int rank) const {
    return group(std::span<const std::string_view>(dims.begin(), dims.size()), rank);
  }
  // The dimensions those names spell, checked as group() checks them, in mesh order (tp cp dp pp etp ep edp).
  static std::vector<MeshDim> parse_dims(std::span<const std::string_view> dims);

  // The group of a kind.
  std::vector<int> group(GroupKind kind, int rank) const;
  // All groups of a kind, each once, for creating communicators collectively. Ordered by first member. Middle
  // pipeline stages are in no embedding group.
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

 private:
  int world_, tp_, pp_, dp_, ep_, etp_, cp_;
  int stride(MeshDim dim) const;
};

}  // namespace mt
