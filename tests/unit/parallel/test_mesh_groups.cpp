// test_mesh_groups.cpp: groups asked for by the mesh dimensions they span are made once, in the order asked, found in
// any name order, handed over once; a group never made, or made after start-up, is named at once.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/comm/mesh_groups.h"
#include "tests/unit/expect_contains.h"

namespace mt {
namespace {

template <class E, class F>
void expect_throws_containing(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "nothing thrown; expected: " << part;
  } catch (const E& e) {
    EXPECT_CONTAINS(e.what(), part);
  }
}

struct Made {
  std::string kind;
  std::vector<int> members;
};

// Rank 5 of tensor 2 x context 2 x data 2 x pipeline 2, its experts folded as EP 4 (ETP 1, EDP 2).
struct MeshGroupsTest : testing::Test {
  Topology topology{16, 2, 2, 2, 4, 1, 2};
  std::vector<Made> made;
  MeshGroups groups{topology, 5, [this](const std::string& kind, std::vector<int> members) {
                      made.push_back({kind, members});
                      return make_self_communicator(kind + std::to_string(made.size()));
                    }};
};

TEST_F(MeshGroupsTest, MakesEachGroupOnceWithItsMembersAndFindsItByAnyOrderOfNames) {
  Communicator& dpcp = groups.make({"dp", "cp"});
  EXPECT_EQ(&groups.make({"cp", "dp"}), &dpcp);  // the same group: not made again
  Communicator& mp = groups.make({"pp", "tp"});
  Communicator& ep = groups.make({"ep"});
  Communicator& grads = groups.make({"dp", "cp"}, GroupUse::grads);  // a reducer's own: a second communicator
  ASSERT_EQ(made.size(), 4u);
  EXPECT_EQ(made[0].kind, "dpcp");
  EXPECT_EQ(made[0].members, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(made[1].kind, "mp");
  EXPECT_EQ(made[1].members, (std::vector<int>{4, 5, 12, 13}));
  EXPECT_EQ(made[2].kind, "ep");
  EXPECT_EQ(made[2].members, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(made[3].kind, "dpcpgrads");
  EXPECT_EQ(made[3].members, made[0].members);
  EXPECT_NE(&grads, &dpcp);
  groups.close();
  EXPECT_EQ(&groups({"cp", "dp"}), &dpcp);
  EXPECT_EQ(&groups({"tp", "pp"}), &mp);
  EXPECT_EQ(groups.find({"ep"}), &ep);
  EXPECT_EQ(groups.find({"edp"}), nullptr);
  EXPECT_EQ(groups.take({"cp", "dp"}).get(), &grads);  // handed over once
  EXPECT_EQ(groups.find({"dp", "cp"}, GroupUse::grads), nullptr);
}

TEST_F(MeshGroupsTest, AGroupNeverMadeOrMadeAfterStartUpIsNamed) {
  groups.make({"tp"});
  groups.close();
  expect_throws_containing<std::logic_error>([&] { groups({"cp"}); }, "mesh group cp was not made at start-up");
  expect_throws_containing<std::logic_error>([&] { groups.take({"edp"}); },
                                             "mesh group edpgrads was not made at start-up");
  expect_throws_containing<std::logic_error>([&] { groups.make({"dp"}); }, "groups are made at start-up only");
  expect_throws_containing<std::invalid_argument>([&] { groups({"tp", "ep"}); }, "mixes the dense grid's");
  EXPECT_EQ(made.size(), 1u);
}

}  // namespace
}  // namespace mt
