// test_topology.cpp: the rank grid rank = tp + T * (dp + D * pp): Megatron's 16-rank example written out,
// the rank <-> coordinate round trip and the group partitions for every layout up to 16 ranks, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/comm/topology.h"

using namespace mt;

namespace {

using Groups = std::vector<std::vector<int>>;

struct Layout {
  int world, tp, pp, dp;
};

// Every (tp, pp, dp) whose product is a world of 1..16 ranks.
std::vector<Layout> all_layouts() {
  std::vector<Layout> layouts;
  for (int world = 1; world <= 16; ++world)
    for (int tp = 1; tp <= world; ++tp)
      for (int pp = 1; pp <= world; ++pp)
        if (world % (tp * pp) == 0) layouts.push_back({world, tp, pp, world / (tp * pp)});
  return layouts;
}

std::string name(const Layout& l) {
  return "world " + std::to_string(l.world) + " tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) + " dp " +
         std::to_string(l.dp);
}

std::string error_of(int world, int tp, int pp, int dp) {
  try {
    Topology(world, tp, pp, dp);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument was thrown";
  return "";
}

std::string fmt_layout(int tp, int cp, int dp, int pp, int etp, int ep) {
  return "tp " + std::to_string(tp) + " cp " + std::to_string(cp) + " dp " + std::to_string(dp) + " pp " +
         std::to_string(pp) + " etp " + std::to_string(etp) + " ep " + std::to_string(ep);
}

}  // namespace

// Megatron-LM's example (parallel_state.initialize_model_parallel): 16 GPUs, tensor 2, pipeline 4, data 2.
TEST(Topology, MegatronSixteenRankExample) {
  Topology t(16, /*tp=*/2, /*pp=*/4, /*dp=*/2);
  EXPECT_EQ(t.all_groups(GroupKind::tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::dp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::pp), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::mp), (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::emb), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));

  EXPECT_EQ(t.coord(13), (Topology::Coord{1, 0, 3}));
  EXPECT_EQ(t.rank({1, 0, 3}), 13);
  EXPECT_EQ(t.tp_group(13), (std::vector<int>{12, 13}));
  EXPECT_EQ(t.dp_group(13), (std::vector<int>{13, 15}));
  EXPECT_EQ(t.pp_group(13), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(t.model_parallel_group(13), (std::vector<int>{0, 1, 4, 5, 8, 9, 12, 13}));
  EXPECT_EQ(t.embedding_group(13), (std::vector<int>{1, 13}));
  EXPECT_EQ(t.embedding_group(5), (std::vector<int>{1, 13}));  // a middle stage is not in its own group
}

TEST(Topology, SizesAreKept) {
  Topology t(24, 2, 3, 4);
  EXPECT_EQ(t.world_size(), 24);
  EXPECT_EQ(t.tp(), 2);
  EXPECT_EQ(t.pp(), 3);
  EXPECT_EQ(t.dp(), 4);
}

TEST(Topology, TensorVariesFastestThenDataThenPipeline) {
  Topology t(24, 2, 3, 4);
  EXPECT_EQ(t.coord(0), (Topology::Coord{0, 0, 0}));
  EXPECT_EQ(t.coord(1), (Topology::Coord{1, 0, 0}));
  EXPECT_EQ(t.coord(2), (Topology::Coord{0, 1, 0}));
  EXPECT_EQ(t.coord(7), (Topology::Coord{1, 3, 0}));
  EXPECT_EQ(t.coord(8), (Topology::Coord{0, 0, 1}));
  EXPECT_EQ(t.coord(23), (Topology::Coord{1, 3, 2}));
}

TEST(Topology, RankCoordRoundTripForEveryLayoutUpTo16) {
  for (const Layout& l : all_layouts()) {
    SCOPED_TRACE(name(l));
    Topology t(l.world, l.tp, l.pp, l.dp);
    for (int r = 0; r < l.world; ++r) {
      Topology::Coord c = t.coord(r);
      EXPECT_TRUE(c.tp >= 0 && c.tp < l.tp && c.dp >= 0 && c.dp < l.dp && c.pp >= 0 && c.pp < l.pp);
      EXPECT_EQ(t.rank(c), r);
      EXPECT_EQ(r, c.tp + l.tp * (c.dp + l.dp * c.pp));
    }
    for (int p = 0; p < l.pp; ++p)
      for (int d = 0; d < l.dp; ++d)
        for (int k = 0; k < l.tp; ++k) EXPECT_EQ(t.coord(t.rank({k, d, p})), (Topology::Coord{k, d, p}));
  }
}

// For tp, dp, pp and mp: every rank is in exactly one group, the one its own *_group call returns, of the
// expected size, ascending, whose members share exactly the coordinates the kind fixes.
TEST(Topology, GroupsPartitionTheWorldForEveryLayoutUpTo16) {
  for (const Layout& l : all_layouts()) {
    Topology t(l.world, l.tp, l.pp, l.dp);
    struct Kind {
      GroupKind kind;
      size_t size;
      bool same_tp, same_dp, same_pp;
    };
    for (const Kind& k :
         {Kind{GroupKind::tp, size_t(l.tp), false, true, true}, Kind{GroupKind::dp, size_t(l.dp), true, false, true},
          Kind{GroupKind::pp, size_t(l.pp), true, true, false},
          Kind{GroupKind::mp, size_t(l.tp * l.pp), false, true, false}}) {
      SCOPED_TRACE(name(l) + " kind " + group_kind_name(k.kind));
      Groups groups = t.all_groups(k.kind);
      EXPECT_EQ(groups.size(), l.world / k.size);
      std::vector<int> seen(l.world, 0);
      for (const auto& g : groups) {
        EXPECT_EQ(g.size(), k.size);
        EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
        for (int r : g) {
          ++seen[r];
          EXPECT_EQ(t.group(k.kind, r), g);
          Topology::Coord a = t.coord(g.front()), b = t.coord(r);
          if (k.same_tp) {
            EXPECT_EQ(a.tp, b.tp);
          }
          if (k.same_dp) {
            EXPECT_EQ(a.dp, b.dp);
          }
          if (k.same_pp) {
            EXPECT_EQ(a.pp, b.pp);
          }
        }
      }
      EXPECT_EQ(seen, std::vector<int>(l.world, 1));
    }
  }
}

TEST(Topology, NamedGroupsMatchTheirFunctions) {
  Topology t(16, 2, 4, 2);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(t.group(GroupKind::tp, r), t.tp_group(r));
    EXPECT_EQ(t.group(GroupKind::dp, r), t.dp_group(r));
    EXPECT_EQ(t.group(GroupKind::pp, r), t.pp_group(r));
    EXPECT_EQ(t.group(GroupKind::mp, r), t.model_parallel_group(r));
    EXPECT_EQ(t.group(GroupKind::emb, r), t.embedding_group(r));
  }
}

TEST(Topology, PipelineGroupIsOrderedByStage) {
  for (const Layout& l : all_layouts()) {
    SCOPED_TRACE(name(l));
    Topology t(l.world, l.tp, l.pp, l.dp);
    for (int r = 0; r < l.world; ++r) {
      std::vector<int> g = t.pp_group(r);
      for (int stage = 0; stage < l.pp; ++stage) EXPECT_EQ(t.coord(g[stage]).pp, stage);
    }
  }
}

TEST(Topology, TensorGroupsAreConsecutiveRanks) {
  // So that with tp <= GPUs per node a TP group never crosses a node boundary.
  Topology t(16, 4, 2, 2);
  for (int r = 0; r < 16; ++r) {
    std::vector<int> g = t.tp_group(r);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(g[i], r / 4 * 4 + i);
  }
}

TEST(Topology, EmbeddingGroupIsFirstAndLastStage) {
  for (const Layout& l : all_layouts()) {
    SCOPED_TRACE(name(l));
    Topology t(l.world, l.tp, l.pp, l.dp);
    Groups groups = t.all_groups(GroupKind::emb);
    if (l.pp == 1) {
      // One stage is both first and last: each rank is its own group.
      EXPECT_EQ(groups.size(), size_t(l.world));
      for (int r = 0; r < l.world; ++r) EXPECT_EQ(t.embedding_group(r), std::vector<int>{r});
      continue;
    }
    EXPECT_EQ(groups.size(), size_t(l.tp * l.dp));  // one per pipeline
    std::set<int> members;
    for (const auto& g : groups) {
      ASSERT_EQ(g.size(), 2u);
      Topology::Coord first = t.coord(g[0]), last = t.coord(g[1]);
      EXPECT_EQ(first.pp, 0);
      EXPECT_EQ(last.pp, l.pp - 1);
      EXPECT_EQ(first.tp, last.tp);
      EXPECT_EQ(first.dp, last.dp);
      EXPECT_TRUE(members.insert(g[0]).second);
      EXPECT_TRUE(members.insert(g[1]).second);
    }
    for (int r = 0; r < l.world; ++r) {
      std::vector<int> pipeline = t.pp_group(r);
      EXPECT_EQ(t.embedding_group(r), (std::vector<int>{pipeline.front(), pipeline.back()}));
      int stage = t.coord(r).pp;
      EXPECT_EQ(members.count(r), (stage == 0 || stage == l.pp - 1) ? 1u : 0u);
    }
  }
}

TEST(Topology, SizesThatDoNotMultiplyToTheWorldAreRejected) {
  EXPECT_EQ(error_of(8, 2, 2, 3), "tensor 2 x pipeline 2 x data 3 = 12 ranks, but the world has 8");
  EXPECT_EQ(error_of(16, 2, 4, 1), "tensor 2 x pipeline 4 x data 1 = 8 ranks, but the world has 16");
  EXPECT_EQ(error_of(0, 1, 1, 1), "tensor 1 x pipeline 1 x data 1 = 1 ranks, but the world has 0");
  // A product that overflows int is still reported, not wrapped around.
  EXPECT_EQ(error_of(8, 65536, 65536, 2),
            "tensor 65536 x pipeline 65536 x data 2 = 8589934592 ranks, but the world has 8");
}

TEST(Topology, SizesBelowOneAreRejected) {
  EXPECT_EQ(error_of(8, 0, 2, 4), "tensor 0 x pipeline 2 x data 4: every parallel size must be at least 1");
  EXPECT_EQ(error_of(8, 2, -1, -4), "tensor 2 x pipeline -1 x data -4: every parallel size must be at least 1");
  EXPECT_EQ(error_of(8, 8, 1, 0), "tensor 8 x pipeline 1 x data 0: every parallel size must be at least 1");
}

TEST(Topology, RanksAndCoordinatesOutsideTheGridAreRejected) {
  Topology t(8, 2, 2, 2);
  EXPECT_THROW(t.coord(8), std::out_of_range);
  EXPECT_THROW(t.coord(-1), std::out_of_range);
  EXPECT_THROW(t.tp_group(8), std::out_of_range);
  EXPECT_THROW(t.embedding_group(-1), std::out_of_range);
  EXPECT_THROW(t.rank({2, 0, 0}), std::out_of_range);
  EXPECT_THROW(t.rank({0, -1, 0}), std::out_of_range);
  EXPECT_THROW(t.rank({0, 0, 2}), std::out_of_range);
  try {
    t.coord(8);
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "rank 8 is outside the world of 8 ranks");
  }
  try {
    t.rank({0, 0, 2});
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "coordinate (tp 0, dp 0, pp 2) is outside the grid tensor 2 x pipeline 2 x data 2");
  }
}

TEST(Topology, GroupKindsHaveTheirNames) {
  EXPECT_STREQ(group_kind_name(GroupKind::tp), "tp");
  EXPECT_STREQ(group_kind_name(GroupKind::dp), "dp");
  EXPECT_STREQ(group_kind_name(GroupKind::pp), "pp");
  EXPECT_STREQ(group_kind_name(GroupKind::mp), "mp");
  EXPECT_STREQ(group_kind_name(GroupKind::emb), "emb");
  EXPECT_STREQ(group_kind_name(GroupKind::ep), "ep");
  EXPECT_STREQ(group_kind_name(GroupKind::edp), "edp");
}

// Expert parallelism splits the data-parallel dimension: dp = ep_index + EP * edp_index.
TEST(Topology, ExpertGroupsOfTwoOfFourDataParallelRanksWithTensorAndPipeline) {
  Topology t(16, /*tp=*/2, /*pp=*/2, /*dp=*/4, /*ep=*/2);
  EXPECT_EQ(t.ep(), 2);
  // dp indices {0, 1} and {2, 3} of each (tp, pp): rank = tp + 2 * (dp + 4 * pp).
  EXPECT_EQ(t.all_groups(GroupKind::ep),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  // dp indices {0, 2} and {1, 3}: one rank of each expert-parallel group.
  EXPECT_EQ(t.all_groups(GroupKind::edp),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(t.ep_group(7), (std::vector<int>{5, 7}));
  EXPECT_EQ(t.edp_group(7), (std::vector<int>{3, 7}));
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(t.group(GroupKind::ep, r), t.ep_group(r));
    EXPECT_EQ(t.group(GroupKind::edp, r), t.edp_group(r));
  }
}

TEST(Topology, ExpertParallelOneIsTheRankAloneAndItsDataParallelGroup) {
  for (const Layout& l : all_layouts()) {
    SCOPED_TRACE(name(l));
    Topology t(l.world, l.tp, l.pp, l.dp);
    EXPECT_EQ(t.ep(), 1);
    for (int r = 0; r < l.world; ++r) {
      EXPECT_EQ(t.ep_group(r), std::vector<int>{r});
      EXPECT_EQ(t.edp_group(r), t.dp_group(r));
    }
  }
}

TEST(Topology, ExpertParallelOverAllDataParallelRanksLeavesEachExpertOnOneRank) {
  for (const Layout& l : all_layouts()) {
    SCOPED_TRACE(name(l));
    Topology t(l.world, l.tp, l.pp, l.dp, l.dp);
    for (int r = 0; r < l.world; ++r) {
      EXPECT_EQ(t.ep_group(r), t.dp_group(r));
      EXPECT_EQ(t.edp_group(r), std::vector<int>{r});
    }
  }
}

// The ep groups and the edp groups each partition the world into sorted groups of their size, and a rank's ep
// group and edp group meet in the rank alone.
void expect_expert_groups_partition(const Topology& t, int ep, int edp) {
  for (GroupKind kind : {GroupKind::ep, GroupKind::edp}) {
    std::vector<int> seen(t.world_size(), 0);
    for (const std::vector<int>& g : t.all_groups(kind)) {
      EXPECT_EQ(g.size(), size_t(kind == GroupKind::ep ? ep : edp));
      EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
      for (int r : g) ++seen[r];
    }
    EXPECT_EQ(seen, std::vector<int>(t.world_size(), 1));
  }
  for (int r = 0; r < t.world_size(); ++r) {
    std::vector<int> e = t.ep_group(r), d = t.edp_group(r), both;
    std::set_intersection(e.begin(), e.end(), d.begin(), d.end(), std::back_inserter(both));
    EXPECT_EQ(both, std::vector<int>{r});
  }
}

// For every layout up to 16 ranks and every ep dividing dp: the ep groups (and the edp groups) partition the
// world, and an ep group and an edp group meet in one rank and together span the rank's dp group.
TEST(Topology, ExpertGroupsTileTheDataParallelGroupForEveryLayoutUpTo16) {
  for (const Layout& l : all_layouts())
    for (int ep = 1; ep <= l.dp; ++ep) {
      if (l.dp % ep != 0) continue;
      SCOPED_TRACE(name(l) + " ep " + std::to_string(ep));
      Topology t(l.world, l.tp, l.pp, l.dp, ep);
      expect_expert_groups_partition(t, ep, l.dp / ep);
      for (int r = 0; r < l.world; ++r) {
        std::vector<int> e = t.ep_group(r), d = t.edp_group(r);
        std::set<int> span;  // the ep groups of the edp members
        for (int m : d)
          for (int q : t.ep_group(m)) span.insert(q);
        std::vector<int> dp = t.dp_group(r);
        EXPECT_EQ(std::vector<int>(span.begin(), span.end()), dp);
        // Megatron's order: the ep group is ep consecutive dp indices.
        EXPECT_EQ(t.coord(e.back()).dp - t.coord(e.front()).dp, ep - 1);
      }
    }
}

// Parallel folding (ETP < TP): the stage's ranks i = tp + T * dp refold as i = etp + ETP * (ep + EP * edp).
TEST(Topology, ParallelFoldingDrawsExpertRanksFromTheTensorGroup) {
  // TP 2, ETP 1, EP 2, DP 2, PP 2: i = tp + 2 dp = ep + 2 edp, so the EP groups are the TP groups.
  Topology t(8, /*tp=*/2, /*pp=*/2, /*dp=*/2, /*ep=*/2, /*etp=*/1);
  EXPECT_TRUE(t.experts_apart());
  EXPECT_EQ(t.all_groups(GroupKind::ep), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(t.all_groups(GroupKind::edp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(t.expert_coord(3).ep, 1);
  EXPECT_EQ(t.expert_coord(3).edp, 1);
  // TP 4, ETP 2, EP 4, DP 2 (one stage): i = tp + 4 dp = etp + 2 (ep + 4 edp): every EP group spans both DP ranks.
  Topology u(8, 4, 1, 2, 4, 2);
  EXPECT_EQ(u.all_groups(GroupKind::ep), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(u.all_groups(GroupKind::edp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // TP 2, ETP 1, EP 1: the experts' data-parallel group is the tensor x data ranks.
  Topology v(4, 2, 1, 2, 1, 1);
  EXPECT_TRUE(v.experts_apart());
  EXPECT_EQ(v.edp_group(2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_FALSE(Topology(4, 2, 1, 2, 1).experts_apart());
}

// For every layout up to 16 ranks, every ETP dividing TP and EP with EP x ETP dividing TP x DP: the EP and the EDP
// groups each partition the world, meet in one rank, and together span the stage's ranks of one etp.
TEST(Topology, FoldedExpertGroupsTileEachStageForEveryLayoutUpTo16) {
  for (const Layout& l : all_layouts())
    for (int etp = 1; etp <= l.tp; ++etp) {
      if (l.tp % etp != 0) continue;
      for (int ep = 1; ep <= l.tp * l.dp; ++ep) {
        if ((l.tp * l.dp) % (ep * etp) != 0) continue;
        SCOPED_TRACE(name(l) + " etp " + std::to_string(etp) + " ep " + std::to_string(ep));
        Topology t(l.world, l.tp, l.pp, l.dp, ep, etp);
        expect_expert_groups_partition(t, ep, l.tp * l.dp / (ep * etp));
        for (int r = 0; r < l.world; ++r)
          for (int q : t.ep_group(r)) {
            EXPECT_EQ(t.coord(q).pp, t.coord(r).pp);
            EXPECT_EQ(t.expert_coord(q).etp, t.expert_coord(r).etp);
          }
      }
    }
}

TEST(Topology, ExpertTensorParallelMustDivideTensorParallel) {
  auto error = [](int tp, int dp, int ep, int etp) -> std::string {
    try {
      Topology(tp * dp, tp, 1, dp, ep, etp);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "no std::invalid_argument was thrown for etp " << etp;
    return "";
  };
  EXPECT_EQ(error(2, 1, 1, 4), "expert tensor parallel 4 must be at least 1 and divide tensor parallel 2");
  EXPECT_EQ(error(4, 1, 8, 1), "expert parallel 8 x expert tensor parallel 1 must divide tensor x data parallel 4 x 1");
}

TEST(Topology, ExpertParallelMustDivideDataParallel) {
  auto error = [](int ep) -> std::string {
    try {
      Topology(16, 2, 2, 4, ep);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "no std::invalid_argument was thrown for ep " << ep;
    return "";
  };
  EXPECT_EQ(error(3), "expert parallel 3 must be at least 1 and divide data parallel 4");
  EXPECT_EQ(error(8), "expert parallel 8 must be at least 1 and divide data parallel 4");
  EXPECT_EQ(error(0), "expert parallel 0 must be at least 1 and divide data parallel 4");
  EXPECT_EQ(error(-2), "expert parallel -2 must be at least 1 and divide data parallel 4");
}

// Context parallelism orders tp-cp-dp-pp (Megatron's): 16 ranks, tensor 2, context 2, data 2, pipeline 2.
TEST(Topology, ContextParallelOrdersTensorContextDataPipeline) {
  Topology t(16, /*tp=*/2, /*pp=*/2, /*dp=*/2, /*ep=*/1, /*etp=*/0, /*cp=*/2);
  EXPECT_EQ(t.cp(), 2);
  EXPECT_EQ(t.all_groups(GroupKind::tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::cp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::dp),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::dpcp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::pp),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(t.all_groups(GroupKind::mp), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(t.coord(6), (Topology::Coord{.tp = 0, .dp = 1, .pp = 0, .cp = 1}));
  // Every rank round-trips, in every layout with context parallelism up to 16 ranks.
  for (int cp = 1; cp <= 4; ++cp)
    for (const Layout& l : all_layouts()) {
      if (l.world * cp > 16) continue;
      const Topology g(l.world * cp, l.tp, l.pp, l.dp, 1, 0, cp);
      for (int r = 0; r < l.world * cp; ++r) {
        ASSERT_EQ(g.rank(g.coord(r)), r) << name(l) << " cp " << cp;
        // The data x context group is the union of the data groups of the rank's context group.
        std::vector<int> dpcp;
        for (int m : g.cp_group(r))
          for (int d : g.dp_group(m)) dpcp.push_back(d);
        std::sort(dpcp.begin(), dpcp.end());
        ASSERT_EQ(g.dpcp_group(r), dpcp) << name(l) << " cp " << cp;
      }
    }
  // With one context rank the data x context group is the data group, and no rank moves.
  const Topology one(8, 2, 2, 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(one.dpcp_group(r), one.dp_group(r));
}

TEST(Topology, ContextParallelErrorsNameTheSizes) {
  EXPECT_THROW(Topology(4, 1, 1, 2, 1, 0, 0), std::invalid_argument);
  try {
    Topology(6, 1, 1, 2, 1, 0, 2);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 1 x context 2 x pipeline 1 x data 2 = 4 ranks, but the world has 6"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Topology(4, 1, 1, 2, 3, 0, 2), std::invalid_argument);  // EP 3 does not divide context x data 4
}

// With context parallelism the experts' grid folds the context ranks in (i = tp + T * (cp + C * dp)): for every
// layout up to 16 ranks with CP 2 or 4, every ETP dividing TP and EP with EP x ETP dividing T x C x D, the EP and
// EDP groups partition the world, meet in one rank, keep to one stage and one etp; with ETP = T an EP group is EP
// consecutive context x data places (context ranks first).
TEST(Topology, ExpertGroupsFoldTheContextRanksIn) {
  for (int cp : {2, 4})
    for (int tp : {1, 2})
      for (int dp : {1, 2})
        for (int pp : {1, 2}) {
          const int world = tp * cp * dp * pp;
          if (world > 16) continue;
          for (int etp = 1; etp <= tp; ++etp) {
            if (tp % etp != 0) continue;
            for (int ep = 1; ep <= tp * cp * dp; ++ep) {
              if ((tp * cp * dp) % (ep * etp) != 0 || (etp == tp && (cp * dp) % ep != 0)) continue;
              SCOPED_TRACE("tp " + std::to_string(tp) + " cp " + std::to_string(cp) + " dp " + std::to_string(dp) +
                           " pp " + std::to_string(pp) + " etp " + std::to_string(etp) + " ep " + std::to_string(ep));
              Topology t(world, tp, pp, dp, ep, etp, cp);
              expect_expert_groups_partition(t, ep, tp * cp * dp / (ep * etp));
              for (int r = 0; r < world; ++r) {
                for (int q : t.ep_group(r)) {
                  EXPECT_EQ(t.coord(q).pp, t.coord(r).pp);
                  EXPECT_EQ(t.expert_coord(q).etp, t.expert_coord(r).etp);
                  if (etp == tp) {
                    EXPECT_EQ(t.coord(q).tp, t.coord(r).tp);
                    const int place_q = t.coord(q).cp + cp * t.coord(q).dp,
                              place_r = t.coord(r).cp + cp * t.coord(r).dp;
                    EXPECT_EQ(place_q / ep, place_r / ep);  // consecutive context x data places
                  }
                }
              }
            }
          }
        }
  // CP 2 x DP 2 with EP 2: the expert-parallel groups are the context pairs, the expert-data groups across data.
  const Topology t(4, 1, 1, 2, 2, 0, 2);
  EXPECT_EQ(t.ep_group(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.edp_group(0), (std::vector<int>{0, 2}));
}

// The named mesh: for every layout up to 16 ranks (TP, CP, DP, PP and each expert fold), every set of dimensions of
// one fold gives each rank the group of the ranks that agree with it on every other dimension of that fold and on
// pp: of the product of the named sizes, ascending, holding the rank, in whatever order the names come.
TEST(Topology, NamedGroupsVaryTheNamedDimensionsAndKeepTheOthers) {
  const std::vector<std::vector<MeshDim>> folds{{MeshDim::tp, MeshDim::cp, MeshDim::dp, MeshDim::pp},
                                                {MeshDim::etp, MeshDim::ep, MeshDim::edp, MeshDim::pp}};
  for (int cp : {1, 2})
    for (int tp : {1, 2, 4})
      for (int dp : {1, 2, 4})
        for (int pp : {1, 2}) {
          const int world = tp * cp * dp * pp;
          if (world > 16) continue;
          for (int etp = 1; etp <= tp; ++etp)
            for (int ep = 1; ep <= tp * cp * dp; ++ep) {
              if (tp % etp != 0 || (tp * cp * dp) % (ep * etp) != 0 || (etp == tp && (cp * dp) % ep != 0)) continue;
              const Topology t(world, tp, pp, dp, ep, etp, cp);
              for (const std::vector<MeshDim>& fold : folds)
                for (unsigned subset = 1; subset < 16; ++subset) {
                  std::vector<std::string_view> names;
                  int size = 1;
                  for (size_t k = 0; k < 4; ++k)
                    if (subset & (1u << k)) {
                      names.insert(names.begin(), name_of(fold[k]));  // reversed: the order does not matter
                      size *= t.size(fold[k]);
                    }
                  SCOPED_TRACE(fmt_layout(tp, cp, dp, pp, etp, ep) + " dims " + std::to_string(subset));
                  for (int r = 0; r < world; ++r) {
                    const std::vector<int> g = t.group(names, r);
                    ASSERT_EQ(g.size(), static_cast<size_t>(size));
                    EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
                    EXPECT_NE(std::find(g.begin(), g.end(), r), g.end());
                    for (int q : g)
                      for (size_t k = 0; k < 4; ++k)
                        if (!(subset & (1u << k))) EXPECT_EQ(t.coord(fold[k], q), t.coord(fold[k], r));
                  }
                }
            }
        }
  // The kinds are the named groups they always were.
  const Topology t(16, 2, 2, 2, 2, 1, 2);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(t.group({"tp"}, r), t.group(GroupKind::tp, r));
    EXPECT_EQ(t.group({"cp", "dp"}, r), t.group(GroupKind::dpcp, r));
    EXPECT_EQ(t.group({"pp", "tp"}, r), t.group(GroupKind::mp, r));
    EXPECT_EQ(t.group({"edp"}, r), t.group(GroupKind::edp, r));
    EXPECT_EQ(t.coord(MeshDim::ep, r), t.expert_coord(r).ep);
    EXPECT_EQ(t.coord(MeshDim::cp, r), t.coord(r).cp);
  }
  EXPECT_EQ(t.group({"tp", "cp", "dp", "pp"}, 5).size(), 16u);  // the world
}

TEST(Topology, NamedGroupsRefuseUnknownRepeatedMixedAndNoNames) {
  const Topology t(8, 2, 1, 4, 2);
  auto error = [&](std::initializer_list<std::string_view> names) -> std::string {
    try {
      t.group(names, 0);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error({"dp", "xp"}), "mesh group {dp, xp}: 'xp' is no dimension (tp cp dp pp etp ep edp)");
  EXPECT_EQ(error({"dp", "dp"}), "mesh group {dp, dp} names 'dp' twice");
  EXPECT_EQ(error({"dp", "ep"}),
            "mesh group {dp, ep} mixes the dense grid's dimensions (tp cp dp) with the experts' fold (etp ep edp)");
  EXPECT_EQ(error({}), "a mesh group names at least one dimension (tp cp dp pp etp ep edp)");
  EXPECT_EQ(t.group({"ep", "pp"}, 3), t.ep_group(3));  // pp belongs to both folds
}
