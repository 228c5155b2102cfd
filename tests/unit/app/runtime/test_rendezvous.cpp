// test_rendezvous.cpp: ranks that do not belong together (another config, another job, another binary, a rank
// registered twice) are refused at rendezvous on every rank, naming what differs; ranks that belong together
// pass. Threads as ranks over the in-process store.
#include <gtest/gtest.h>

#include "tests/unit/expect_contains.h"

#include <string>
#include <thread>
#include <vector>

#include "app/runtime/rendezvous.h"
#include "parallel/store/store.h"

using namespace mt;
using namespace mt::app;

namespace {

constexpr Millis kTimeout{5000};

const char* kConfig = R"(
model: {num_layers: 2, hidden_size: 32, num_heads: 4, seq_length: 32, vocab_size: 257}
training: {train_iters: 10}
optimizer: {lr: 1.0e-3}
data: {synthetic: true}
)";

Config config(const std::vector<std::string>& overrides = {}) { return parse_config(kConfig, "t.yaml", overrides, 2); }

// Runs check_job_identity on one thread per identity (rank r gets ids[r]); the error of each rank, "" if none.
std::vector<std::string> rendezvous(const std::vector<JobIdentity>& ids) {
  auto store = make_hash_store();
  const int world = static_cast<int>(ids.size());
  std::vector<std::string> errors(ids.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        check_job_identity(*store, ids[size_t(r)], r, world, kTimeout, "test-store");
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST(Rendezvous, FirstYamlDifferenceNamesTheKeyPathAndBothValues) {
  EXPECT_EQ(first_yaml_difference("a: {b: 1, c: 2}", "a: {b: 1, c: 2}"), "");
  EXPECT_EQ(first_yaml_difference("a: {b: 1, c: 2}\nd: 4", "a: {b: 1, c: 3}\nd: 5"), "a.c (2 vs 3)");
  EXPECT_EQ(first_yaml_difference("a: [1, 2]", "a: [1, 5]"), "a[1] (2 vs 5)");
  EXPECT_EQ(first_yaml_difference("a: 1", "a: 1\nb: 2"), "b (absent vs 2)");
  EXPECT_EQ(first_yaml_difference("a: 1\nb: 2", "a: 1"), "b (2 vs absent)");
}

TEST(Rendezvous, RanksOfOneJobPass) {
  const JobIdentity id = job_identity(config(), LaunchEnv{.job_id = "megatrain:1"});
  for (const auto& e : rendezvous({id, id, id})) EXPECT_EQ(e, "");
}

TEST(Rendezvous, LoggingDirMayDifferPerRank) {
  const JobIdentity a = job_identity(config({"logging.dir=a"}), LaunchEnv{});
  const JobIdentity b = job_identity(config({"logging.dir=b"}), LaunchEnv{});
  for (const auto& e : rendezvous({a, b})) EXPECT_EQ(e, "");
}

TEST(Rendezvous, ADifferentConfigIsRefusedOnEveryRankNamingTheRankAndKey) {
  const JobIdentity a = job_identity(config(), LaunchEnv{});
  const JobIdentity b = job_identity(config({"optimizer.lr=2e-3"}), LaunchEnv{});
  for (const auto& e : rendezvous({a, a, b})) {
    EXPECT_CONTAINS(e, "rank 2 runs a different config than rank 0");
    EXPECT_CONTAINS(e, "optimizer.lr (0.001 vs 0.002)");
  }
}

TEST(Rendezvous, AnotherJobIsRefusedOnEveryRank) {
  const Config c = config();
  const JobIdentity a = job_identity(c, LaunchEnv{.job_id = "megatrain:aaaa"});
  const JobIdentity b = job_identity(c, LaunchEnv{.job_id = "megatrain:bbbb"});
  for (const auto& e : rendezvous({a, b})) {
    EXPECT_CONTAINS(e, "rank 1 belongs to job 'megatrain:bbbb'");
    EXPECT_CONTAINS(e, "serves job 'megatrain:aaaa'");
  }
}

TEST(Rendezvous, AnotherVersionIsRefusedOnEveryRank) {
  JobIdentity a = job_identity(config(), LaunchEnv{});
  JobIdentity b = a;
  b.version = "0.0.0-other";
  for (const auto& e : rendezvous({a, b})) EXPECT_CONTAINS(e, "rank 1 runs megatrain 0.0.0-other");
}

TEST(Rendezvous, ASecondProcessRegisteringTheSameRankIsRefused) {
  auto store = make_hash_store();
  const JobIdentity id = job_identity(config(), LaunchEnv{});
  std::thread rank0([&] { check_job_identity(*store, id, 0, 2, kTimeout, "test-store"); });
  check_job_identity(*store, id, 1, 2, kTimeout, "test-store");
  rank0.join();
  try {
    check_job_identity(*store, id, 1, 2, kTimeout, "test-store");
    ADD_FAILURE() << "a second rank 1 was accepted";
  } catch (const RendezvousError& e) {
    EXPECT_CONTAINS(e.what(), "rank 1 is already registered at the rendezvous store at test-store");
  }
}

// Ranks launched with different world sizes are told so, with the values, on both sides: rank 0 (waiting for a
// rank that never comes) and the rank that disagrees; no bare "get(...) timed out".
TEST(Rendezvous, RanksThatDisagreeOnTheWorldSizeAreToldSoWithTheValues) {
  auto store = make_hash_store();
  const JobIdentity id = job_identity(config(), LaunchEnv{});
  constexpr Millis kShort{300};
  std::string error0, error1;
  std::thread rank0([&] {
    try {
      check_job_identity(*store, id, 0, 3, kShort, "test-store");
    } catch (const RendezvousError& e) {
      error0 = e.what();
    }
  });
  try {
    check_job_identity(*store, id, 1, 2, kShort, "test-store");
  } catch (const RendezvousError& e) {
    error1 = e.what();
  }
  rank0.join();
  EXPECT_CONTAINS(error1,
                  "the ranks disagree on the world size: rank 1 was started with a world of 2 ranks, rank 0 "
                  "with 3");
  EXPECT_CONTAINS(error0, "rank 2 never arrived at the rendezvous store at test-store within 0.3 s");
  EXPECT_CONTAINS(error0,
                  "the ranks disagree on the world size: rank 0 was started with a world of 3 ranks, rank 1 "
                  "with 2");
  EXPECT_EQ(error0.find("timed out"), std::string::npos) << error0;
}

// A rank that never comes, all others agreeing, is named with the world size rank 0 waits for.
TEST(Rendezvous, ARankThatNeverComesIsNamed) {
  auto store = make_hash_store();
  const JobIdentity id = job_identity(config(), LaunchEnv{});
  try {
    check_job_identity(*store, id, 0, 2, Millis(200), "test-store");
    ADD_FAILURE() << "rank 0 passed without rank 1";
  } catch (const RendezvousError& e) {
    EXPECT_CONTAINS(e.what(),
                    "rank 1 never arrived at the rendezvous store at test-store within 0.2 s: rank 0 waits "
                    "for a world of 2 ranks");
  }
}
