// topology.h: the rank grid. rank = tp + T * (dp + D * pp): tensor-parallel ranks vary fastest (a TP group
// sits inside one node), then data-parallel, then pipeline (Megatron's default order).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace mt {

// The kinds of process group: tensor, data, pipeline, model (tensor x pipeline) parallel, and the embedding
// group (first and last pipeline stage).
enum class GroupKind { tp, dp, pp, mp, emb };
const char* group_kind_name(GroupKind kind);  // "tp", "dp", "pp", "mp", "emb"

class Topology {
 public:
  struct Coord {
    int tp = 0, dp = 0, pp = 0;
    bool operator==(const Coord&) const = default;
  };
  // Throws std::invalid_argument naming the sizes when tp * pp * dp != world_size or any is < 1.
  Topology(int world_size, int tp, int pp, int dp);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }

  // Both throw std::out_of_range for a rank outside the world or a coordinate outside the grid.
  Coord coord(int rank) const;
  int rank(Coord c) const;

  // Members (global ranks, ascending) of each group that `rank` belongs to.
  std::vector<int> tp_group(int rank) const;              // same dp, pp
  std::vector<int> dp_group(int rank) const;              // same tp, pp
  std::vector<int> pp_group(int rank) const;              // same tp, dp; ordered by stage
  std::vector<int> model_parallel_group(int rank) const;  // same dp: every tp and pp
  // The first and last pipeline stage of rank's pipeline (tied embeddings); just the rank when pp == 1.
  std::vector<int> embedding_group(int rank) const;

  // The group of a kind.
  std::vector<int> group(GroupKind kind, int rank) const;
  // All groups of a kind, each once, for creating communicators collectively. Ordered by first member. Middle
  // pipeline stages are in no embedding group.
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

 private:
  int world_, tp_, pp_, dp_;
};

}  // namespace mt
