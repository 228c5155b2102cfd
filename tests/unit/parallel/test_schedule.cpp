// test_schedule.cpp: the pipeline schedules as specifications: the exact 1F1B instruction lists, the
// interleaved order of Megatron, the forward-only (evaluation) schedule, the bubble and memory of each schedule,
// and the simulator that rejects broken schedules (missing receives, deadlocks, missing backwards, sends and
// receives posted in different orders between two stages, which NCCL would pair wrongly) and invalid specs.
#include <gtest/gtest.h>

#include "tests/unit/expect_contains.h"

#include <algorithm>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/pipeline/schedule.h"

namespace mt {
void PrintTo(const PipeInstr& instr, std::ostream* os) { *os << to_string(instr); }
}  // namespace mt

using namespace mt;

namespace {

using Schedule = std::vector<std::vector<PipeInstr>>;

// Short names so that the lists below read like the schedule diagrams.
PipeInstr rf(int mb, int c = 0) { return {PipeOp::recv_forward, mb, c}; }
PipeInstr fw(int mb, int c = 0) { return {PipeOp::forward, mb, c}; }
PipeInstr sf(int mb, int c = 0) { return {PipeOp::send_forward, mb, c}; }
PipeInstr rb(int mb, int c = 0) { return {PipeOp::recv_backward, mb, c}; }
PipeInstr bw(int mb, int c = 0) { return {PipeOp::backward, mb, c}; }
PipeInstr sb(int mb, int c = 0) { return {PipeOp::send_backward, mb, c}; }

ScheduleSpec one_f_one_b(int p, int m) { return {ScheduleKind::one_f_one_b, p, m, 1}; }
ScheduleSpec interleaved(int p, int m, int v) { return {ScheduleKind::interleaved, p, m, v}; }
ScheduleSpec forward_only(int p, int m, int v) { return {ScheduleKind::forward_only, p, m, v}; }
ScheduleSpec zb_h1(int p, int m) { return {ScheduleKind::zb_h1, p, m, 1}; }
ScheduleSpec zb_v(int p, int m) { return {ScheduleKind::zb_v, p, m, 2, ChunkPlacement::v_shape}; }

// Every spec the builder accepts in the grid p in {1,2,3,4,8}, m in 1..16, v in 1..4.
std::vector<ScheduleSpec> valid_grid() {
  std::vector<ScheduleSpec> specs;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      if (p == 1) specs.push_back({ScheduleKind::no_pipelining, 1, m, 1});
      specs.push_back(one_f_one_b(p, m));
      for (int v = 1; v <= 4; ++v)
        if (p > 1 && m % p == 0) specs.push_back(interleaved(p, m, v));
    }
  }
  return specs;
}
std::string name(const ScheduleSpec& s) {
  return schedule_kind_name(s.kind) + " p=" + std::to_string(s.stages) + " m=" + std::to_string(s.microbatches) +
         " v=" + std::to_string(s.chunks);
}

// How many forwards a stage runs before its first backward.
int forwards_before_first_backward(const std::vector<PipeInstr>& list) {
  int n = 0;
  for (const PipeInstr& in : list) {
    if (in.op == PipeOp::backward) break;
    n += in.op == PipeOp::forward;
  }
  return n;
}

std::vector<PipeInstr> only(const std::vector<PipeInstr>& list, PipeOp op) {
  std::vector<PipeInstr> out;
  std::copy_if(list.begin(), list.end(), std::back_inserter(out), [&](const PipeInstr& in) { return in.op == op; });
  return out;
}

// GPipe with a flush, for comparison: all forwards, then all backwards.
Schedule gpipe(int p, int m) {
  Schedule s(p);
  for (int st = 0; st < p; ++st) {
    for (int mb = 0; mb < m; ++mb) {
      if (st > 0) s[st].push_back(rf(mb));
      s[st].push_back(fw(mb));
      if (st < p - 1) s[st].push_back(sf(mb));
    }
    for (int mb = 0; mb < m; ++mb) {
      if (st < p - 1) s[st].push_back(rb(mb));
      s[st].push_back(bw(mb));
      if (st > 0) s[st].push_back(sb(mb));
    }
  }
  return s;
}

TEST(NoPipelining, RunsForwardThenBackwardForEachMicrobatch) {
  const ScheduleSpec spec{ScheduleKind::no_pipelining, 1, 3, 1};
  const Schedule s = build_schedule(spec);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0], (std::vector<PipeInstr>{fw(0), bw(0), fw(1), bw(1), fw(2), bw(2)}));
  const ScheduleReport r = check_schedule(spec, s);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0.0);
  EXPECT_EQ(r.peak_in_flight, 1);
}

// Stage 0 of 4: three warmup forwards (p - s - 1), then one forward one backward, then the cooldown. Stage 0
// receives no inputs and sends no input gradients. Adjacent transfers form one batch: sf(3), rb(0) is Megatron's
// send_forward_recv_backward.
TEST(OneFOneB, FirstStageOfFourStagesAndEightMicrobatches) {
  const Schedule s = build_schedule(one_f_one_b(4, 8));
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0], (std::vector<PipeInstr>{
                      fw(0), sf(0), fw(1), sf(1), fw(2), sf(2),                // warmup
                      fw(3), sf(3), rb(0), bw(0), fw(4), sf(4), rb(1), bw(1),  // steady 1F1B
                      fw(5), sf(5), rb(2), bw(2), fw(6), sf(6), rb(3), bw(3),  //
                      fw(7), sf(7), rb(4), bw(4),                              //
                      rb(5), bw(5), rb(6), bw(6), rb(7), bw(7),                // cooldown
                  }));
}

// The last stage has no warmup: it runs each microbatch's backward right after its forward (the loss is there).
TEST(OneFOneB, LastStageOfFourStagesAndEightMicrobatches) {
  const Schedule s = build_schedule(one_f_one_b(4, 8));
  std::vector<PipeInstr> expected;
  for (int mb = 0; mb < 8; ++mb) {
    for (const PipeInstr& in : {rf(mb), fw(mb), bw(mb), sb(mb)}) expected.push_back(in);
  }
  EXPECT_EQ(s[3], expected);
}

TEST(OneFOneB, MiddleStageReceivesBeforeEachForwardAndSendsAfter) {
  const Schedule s = build_schedule(one_f_one_b(4, 8));
  EXPECT_EQ(std::vector<PipeInstr>(s[2].begin(), s[2].begin() + 10),
            (std::vector<PipeInstr>{rf(0), fw(0), sf(0), rf(1), fw(1), sf(1), rb(0), bw(0), sb(0), rf(2)}));
}

TEST(OneFOneB, WarmupIsStagesMinusStageMinusOneForwards) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 8, 16}) {
      const Schedule s = build_schedule(one_f_one_b(p, m));
      for (int st = 0; st < p; ++st) {
        const int warmup = std::min(p - st - 1, m);
        // The warmup forwards, then the first steady forward (if any microbatch is left) before any backward.
        EXPECT_EQ(forwards_before_first_backward(s[st]), std::min(warmup + 1, m))
            << "p=" << p << " m=" << m << " stage " << st;
      }
    }
  }
}

// The paper's rule for every stage: recv_forward right before each forward (not on stage 0), send_forward right
// after (not on the last stage), and the same for backward in the other direction.
TEST(OneFOneB, EachComputeIsWrappedByItsTransfers) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {1, 5, 16}) {
      const Schedule s = build_schedule(one_f_one_b(p, m));
      for (int st = 0; st < p; ++st) {
        const auto& l = s[st];
        for (size_t i = 0; i < l.size(); ++i) {
          const int mb = l[i].microbatch;
          SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + " stage " + std::to_string(st) + " #" +
                       std::to_string(i));
          if (l[i].op == PipeOp::forward) {
            if (st > 0) {
              EXPECT_EQ(l.at(i - 1), rf(mb));
            }
            if (st < p - 1) {
              EXPECT_EQ(l.at(i + 1), sf(mb));
            }
          } else if (l[i].op == PipeOp::backward) {
            if (st < p - 1) {
              EXPECT_EQ(l.at(i - 1), rb(mb));
            }
            if (st > 0) {
              EXPECT_EQ(l.at(i + 1), sb(mb));
            }
          }
        }
        const bool first = st == 0, last = st == p - 1;
        EXPECT_EQ(only(l, PipeOp::recv_forward).size(), first ? 0u : size_t(m));
        EXPECT_EQ(only(l, PipeOp::send_backward).size(), first ? 0u : size_t(m));
        EXPECT_EQ(only(l, PipeOp::send_forward).size(), last ? 0u : size_t(m));
        EXPECT_EQ(only(l, PipeOp::recv_backward).size(), last ? 0u : size_t(m));
      }
    }
  }
}

// With forward 1 and backward 2 per microbatch and free communication, the pipeline fills and drains once:
// makespan 3 (m + p - 1), so the bubble is (p - 1) / m exactly (the times are small integers).
TEST(OneFOneB, BubbleIsStagesMinusOneOverMicrobatchesExactly) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      const ScheduleReport r = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)));
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_EQ(r.makespan, 3.0 * (m + p - 1)) << "p=" << p << " m=" << m;
      EXPECT_EQ(r.bubble_fraction, double(p - 1) / m) << "p=" << p << " m=" << m;
    }
  }
}

// 1F1B's point: the same bubble as GPipe, but stage s holds at most p - s microbatches instead of all m.
TEST(OneFOneB, HoldsAtMostStagesMicrobatchesWhereGPipeHoldsAll) {
  for (int p : {2, 4, 8}) {
    for (int m : {1, 4, 8, 16}) {
      const ScheduleReport r = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)));
      ASSERT_TRUE(r.ok) << r.error;
      for (int st = 0; st < p; ++st) EXPECT_EQ(r.stage_peak_in_flight[st], std::min(p - st, m));
      EXPECT_LE(r.stage_peak_in_flight[0], p);
      EXPECT_EQ(r.peak_in_flight, std::min(p, m));

      const ScheduleReport g = check_schedule(one_f_one_b(p, m), gpipe(p, m));
      ASSERT_TRUE(g.ok) << g.error;
      EXPECT_EQ(g.peak_in_flight, m);
      EXPECT_EQ(g.bubble_fraction, r.bubble_fraction);
    }
  }
}

// A split backward whose W would come right after its B runs whole (schedule.h): no list keeps such a pair.
bool no_split_pair_adjacent(const std::vector<PipeInstr>& list) {
  for (size_t i = 0; i + 1 < list.size(); ++i)
    if (list[i].op == PipeOp::backward_input &&
        list[i + 1] == PipeInstr{PipeOp::backward_weight, list[i].microbatch, list[i].chunk})
      return false;
  return true;
}

// ZB-H1 (Qi et al. 2024): with F, B and W costing one unit each and free communication, the weight gradients
// fill 1F1B's drain and the bubble is p / (3 m) for every m >= p: the paper's third of 1F1B's, (p - 1) / (3 m), and
// one W more, the price of the memory bound (a split B starts with at most p - 1 microbatches held); no stage holds
// more microbatches than 1F1B's first stage; each stage runs every microbatch's F, B and W once, in microbatch
// order.
TEST(ZbH1, BubbleIsAThirdOf1F1BsAndMemoryStaysWithin1F1BsPeak) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      const Schedule s = build_schedule(zb_h1(p, m));
      const ScheduleReport r = check_schedule(zb_h1(p, m), s);
      ASSERT_TRUE(r.ok) << "p=" << p << " m=" << m << ": " << r.error;
      const ScheduleReport base = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)));
      if (m >= p) {
        EXPECT_NEAR(r.bubble_fraction, double(p) / (3 * m), 1e-12) << "p=" << p << " m=" << m;
      }
      EXPECT_LE(r.bubble_fraction, base.bubble_fraction) << "p=" << p << " m=" << m;
      EXPECT_LE(r.peak_in_flight, base.peak_in_flight) << "p=" << p << " m=" << m;
      // The memory bound: a split B starts with at most p - 1 microbatches held.
      EXPECT_LE(r.split_backward_peak_in_flight, p - 1) << "p=" << p << " m=" << m;
      for (int st = 0; st < p; ++st) {
        const auto& list = s[static_cast<size_t>(st)];
        EXPECT_TRUE(no_split_pair_adjacent(list)) << "p=" << p << " m=" << m << " stage " << st;
        std::vector<int> b, w;  // a whole backward (B and W joined) is both
        int held = 0;           // forwarded, not through W
        for (const PipeInstr& in : list) {
          if (in.op == PipeOp::forward) ++held;
          if (in.op == PipeOp::backward_input) {
            EXPECT_LT(held, p) << "p=" << p << " m=" << m << " stage " << st;
          }
          if (in.op == PipeOp::backward_input || in.op == PipeOp::backward) b.push_back(in.microbatch);
          if (in.op == PipeOp::backward_weight || in.op == PipeOp::backward) {
            w.push_back(in.microbatch);
            --held;
          }
        }
        std::vector<int> order(static_cast<size_t>(m));
        for (int i = 0; i < m; ++i) order[static_cast<size_t>(i)] = i;
        EXPECT_EQ(b, order);
        EXPECT_EQ(w, order);  // each gradient accumulates its microbatches in 1F1B's order: bit-identical training
      }
    }
  }
}

// Stage s > 0 holds its weight gradients back by s - 1 microbatches (1F1B's stage s idles at the end; one less than
// the paper's s for the memory bound): the first stage runs each W right after its B, so in its steady state B and
// W run as one whole backward (as 1F1B's, at 1F1B's memory), and so does its first cooldown B (with p microbatches
// held); the later cooldown B's split (each W while the next gradient is received). The last stage keeps p - 2 for
// its end.
TEST(ZbH1, StageSHoldsBackSWeightGradients) {
  const Schedule s = build_schedule(zb_h1(4, 8));
  for (int st = 0; st < 4; ++st) {
    int pending = 0, most = 0;
    for (const PipeInstr& in : s[static_cast<size_t>(st)]) {
      if (in.op == PipeOp::backward_input) most = std::max(most, ++pending);
      if (in.op == PipeOp::backward_weight) --pending;
    }
    EXPECT_EQ(most, std::max(st, 1)) << "stage " << st;  // s - 1 held back, and the one just through B
  }
  // Stage 0 after its 3 warmup forwards: F3, then 1F1B's batch, B0 and at once W0 (it has nothing to receive):
  // one whole backward.
  const auto& first = s[0];
  const std::vector<PipeInstr> steady(first.begin() + 6, first.begin() + 11);
  EXPECT_EQ(steady, (std::vector<PipeInstr>{{PipeOp::forward, 3, 0},
                                            {PipeOp::send_forward, 3, 0},
                                            {PipeOp::recv_backward, 0, 0},
                                            {PipeOp::backward, 0, 0},
                                            {PipeOp::forward, 4, 0}}));
  // Its cooldown: B4 whole (4 microbatches held), then B5, the receive of the next gradient with W5 while it is in
  // flight, B6 likewise; the last B and W whole.
  std::vector<PipeInstr> computes;
  for (const PipeInstr& in : first)
    if (!is_communication(in.op)) computes.push_back(in);
  const std::vector<PipeInstr> tail(computes.end() - 6, computes.end());
  EXPECT_EQ(tail, (std::vector<PipeInstr>{{PipeOp::backward, 4, 0},
                                          {PipeOp::backward_input, 5, 0},
                                          {PipeOp::backward_weight, 5, 0},
                                          {PipeOp::backward_input, 6, 0},
                                          {PipeOp::backward_weight, 6, 0},
                                          {PipeOp::backward, 7, 0}}));
  // The last stage's first W comes after its third B, placed after the receive of forward 3's input so that it
  // runs while the receive is in flight.
  const auto& last = s[3];
  size_t b2 = 0;
  while (last[b2] != PipeInstr{PipeOp::backward_input, 2, 0}) ++b2;
  EXPECT_EQ(last[b2 + 1], (PipeInstr{PipeOp::send_backward, 2, 0}));
  EXPECT_EQ(last[b2 + 2], (PipeInstr{PipeOp::recv_forward, 3, 0}));
  EXPECT_EQ(last[b2 + 3], (PipeInstr{PipeOp::backward_weight, 0, 0}));
  EXPECT_EQ(last[b2 + 4], (PipeInstr{PipeOp::forward, 3, 0}));
}

// With any costs per microbatch (free transfers) 1F1B takes (m + p - 1)(F + B + W) and ZB-H1 fills all but
// (p - 1)(F + B - W) + W of its bubble (the paper's formula, for W no longer than F + B, and one W for the memory
// bound): the planner prices the pipeline with these simulations.
TEST(ZbH1, BubblesFollowThePapersFormulasForUnequalCosts) {
  for (const ScheduleCosts c : {ScheduleCosts{1, 1.5, 0.5}, ScheduleCosts{2, 1, 1}, ScheduleCosts{0.5, 1, 0.25}}) {
    for (int p : {2, 4, 8}) {
      for (int m : {8, 16, 24}) {
        const ScheduleReport base = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)), c);
        ASSERT_TRUE(base.ok) << base.error;
        const double per_mb = c.forward + c.backward_input + c.backward_weight;
        EXPECT_NEAR(base.makespan, (m + p - 1) * per_mb, 1e-9) << "p=" << p << " m=" << m;
        const ScheduleReport zb = check_schedule(zb_h1(p, m), build_schedule(zb_h1(p, m)), c);
        ASSERT_TRUE(zb.ok) << zb.error;
        EXPECT_NEAR(zb.makespan - m * per_mb,
                    (p - 1) * (c.forward + c.backward_input - c.backward_weight) + c.backward_weight, 1e-9)
            << "p=" << p << " m=" << m << " costs " << c.forward << " " << c.backward_input << " " << c.backward_weight;
      }
    }
  }
}

TEST(ZbH1, SplitBackwardsAreCheckedToo) {
  Schedule s = build_schedule(zb_h1(2, 4));
  // Drop stage 1's last W: reported.
  auto& list = s[1];
  for (size_t i = list.size(); i-- > 0;)
    if (list[i].op == PipeOp::backward_weight) {
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  const ScheduleReport r = check_schedule(zb_h1(2, 4), s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("runs backward_input but never backward_weight"), std::string::npos) << r.error;
  // A W before its B.
  Schedule t = build_schedule(zb_h1(2, 4));
  t[0].insert(t[0].begin(), PipeInstr{PipeOp::backward_weight, 3, 0});
  const ScheduleReport q = check_schedule(zb_h1(2, 4), t);
  EXPECT_FALSE(q.ok);
  EXPECT_NE(q.error.find("weight gradients run before their backward_input"), std::string::npos) << q.error;
  EXPECT_THROW(build_schedule({ScheduleKind::zb_h1, 2, 4, 2}), std::invalid_argument);
}

// The V: chunk 0 of stage s is virtual stage s, chunk 1 is 2p - 1 - s; looped chunks are c p + s.
TEST(ZbV, PlacementPutsBothEndsOfTheModelOnStageZero) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int vs = 0; vs < 2 * p; ++vs) {
      for (ChunkPlacement placement : {ChunkPlacement::looped, ChunkPlacement::v_shape}) {
        const StageChunk at = stage_chunk(placement, p, vs);
        EXPECT_EQ(virtual_stage(placement, p, at), vs);
      }
    }
    EXPECT_EQ(stage_chunk(ChunkPlacement::v_shape, p, 0), (StageChunk{0, 0}));
    EXPECT_EQ(stage_chunk(ChunkPlacement::v_shape, p, 2 * p - 1), (StageChunk{0, 1}));
    EXPECT_EQ(stage_chunk(ChunkPlacement::v_shape, p, p - 1), (StageChunk{p - 1, 0}));
    EXPECT_EQ(stage_chunk(ChunkPlacement::v_shape, p, p), (StageChunk{p - 1, 1}));
    EXPECT_EQ(stage_chunk(ChunkPlacement::looped, p, p), (StageChunk{0, 1}));
  }
}

// ZB-V (Qi et al. 2024) with equal F, B and W costs and free transfers: every schedule passes the simulator; for
// m >= p the bubble is the (p - 1) idle half-slots of the last stage while the first microbatch reaches it,
// (p - 1) / (6 m), a sixth of 1F1B's and half of ZB-H1's; no stage holds more than 1F1B's activations (2p pairs of
// half a microbatch each = p microbatches); every chunk runs its microbatches' F, B and W in microbatch order (so
// gradients and losses accumulate in 1F1B's order: bit-identical training); the turn of the V on stage p - 1 has no
// transfer.
TEST(ZbV, BubbleIsASixthOf1F1BsWithin1F1BsMemory) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 3 * p + 2; ++m) {
      if (p == 8 && m > p + 1 && m % p != 0) continue;  // each p 8 build searches for about 0.1 s
      const Schedule s = build_schedule(zb_v(p, m));
      const ScheduleReport r = check_schedule(zb_v(p, m), s);
      ASSERT_TRUE(r.ok) << "p=" << p << " m=" << m << ": " << r.error;
      const ScheduleReport base = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)));
      if (m % p == 0) {
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (6 * m), 1e-12) << "p=" << p << " m=" << m;
      }
      const ScheduleReport h1 = check_schedule(zb_h1(p, m), build_schedule(zb_h1(p, m)));
      EXPECT_LE(r.bubble_fraction, h1.bubble_fraction + 1e-12) << "p=" << p << " m=" << m;
      for (int st = 0; st < p; ++st) {
        EXPECT_LE(r.stage_peak_in_flight[static_cast<size_t>(st)], 2 * base.peak_in_flight);
      }
      // The memory bound: a split B starts with at most 2p - 1 pairs held (1F1B's first stage holds 2p at its whole
      // backwards), so its extra peak stays under 1F1B's.
      EXPECT_LE(r.split_backward_peak_in_flight, 2 * p - 1) << "p=" << p << " m=" << m;
      for (int st = 0; st < p; ++st) {
        const auto& list = s[static_cast<size_t>(st)];
        EXPECT_TRUE(no_split_pair_adjacent(list)) << "p=" << p << " m=" << m << " stage " << st;
        for (int c = 0; c < 2; ++c) {
          std::vector<int> f, b, w;  // a whole backward (B and W joined) is both
          for (const PipeInstr& in : list) {
            if (in.chunk != c) continue;
            if (in.op == PipeOp::forward) f.push_back(in.microbatch);
            if (in.op == PipeOp::backward_input || in.op == PipeOp::backward) b.push_back(in.microbatch);
            if (in.op == PipeOp::backward_weight || in.op == PipeOp::backward) w.push_back(in.microbatch);
          }
          std::vector<int> order(static_cast<size_t>(m));
          for (int i = 0; i < m; ++i) order[static_cast<size_t>(i)] = i;
          EXPECT_EQ(f, order) << "p=" << p << " m=" << m << " stage " << st << " chunk " << c;
          EXPECT_EQ(b, order) << "p=" << p << " m=" << m << " stage " << st << " chunk " << c;
          EXPECT_EQ(w, order) << "p=" << p << " m=" << m << " stage " << st << " chunk " << c;
        }
        if (st != p - 1) continue;
        for (const PipeInstr& in : list) {
          EXPECT_FALSE(
              (in.op == PipeOp::send_forward && in.chunk == 0) || (in.op == PipeOp::recv_forward && in.chunk == 1) ||
              (in.op == PipeOp::send_backward && in.chunk == 1) || (in.op == PipeOp::recv_backward && in.chunk == 0))
              << to_string(in);
        }
      }
    }
  }
}

// Timed with the costs it runs at, ZB-V stays ahead of ZB-H1 at F : B : W = 1 : 1.5 : 0.5 (and 1 : 1 : 1): its stages
// wait only for the tensors they consume (waits on use). Not at every ratio: at 1 : 1.2 : 0.8 or 1 : 2 : 0.5 its
// greedy list schedule and the in-order completion of its transfers leave it behind ZB-H1, and a list timed for
// other costs than it runs at does worse still (docs/parallelism.md gives the figures).
TEST(ZbV, StaysAheadOfZbH1WhenTimedWithItsCosts) {
  for (const ScheduleCosts c : {ScheduleCosts{1, 1.5, 0.5}, ScheduleCosts{1, 1, 1}}) {
    for (int p : {2, 4, 8}) {
      for (int m : {p, 2 * p, 4 * p, 8 * p}) {
        if (p == 8 && m == 8 * p) continue;  // half a second a build: p 8 stops at m 32
        ScheduleSpec spec = zb_v(p, m);
        spec.costs = c;  // ZB-V times its list schedule with the costs it will run at
        const ScheduleReport v = check_schedule(spec, build_schedule(spec), c);
        const ScheduleReport h = check_schedule(zb_h1(p, m), build_schedule(zb_h1(p, m)), c);
        ASSERT_TRUE(v.ok && h.ok) << v.error << h.error;
        EXPECT_LT(v.bubble_fraction, h.bubble_fraction)
            << "p=" << p << " m=" << m << " costs " << c.forward << " " << c.backward_input << " " << c.backward_weight;
      }
    }
  }
}

// At any costs (each build searches its policy for them) ZB-V keeps its memory bound -- no stage holds more than 2p
// pairs, the p microbatches of 1F1B's first stage, and a split B starts with at most 2p - 1 -- and runs every chunk's
// backwards in microbatch order.
TEST(ZbV, KeepsItsMemoryBoundAtAnyCosts) {
  const ScheduleCosts costs[] = {{1, 1.2, 0.8}, {26, 28, 24}, {1, 2, 1}, {1, 1, 2}, {2, 1, 1}, {1, 0.7, 0.3}};
  for (const ScheduleCosts& c : costs) {
    for (int p : {2, 3, 4, 8}) {
      for (int m : {1, p - 1, p, p + 1, 2 * p + 1, 4 * p}) {
        if (m < 1 || (p == 8 && m > p + 1)) continue;  // each p 8 build searches for 0.1 s or more
        ScheduleSpec spec = zb_v(p, m);
        spec.costs = c;
        const Schedule s = build_schedule(spec);
        const ScheduleReport r = check_schedule(spec, s, c);
        ASSERT_TRUE(r.ok) << "p=" << p << " m=" << m << ": " << r.error;
        const std::string at = "p=" + std::to_string(p) + " m=" + std::to_string(m) + " costs " +
                               std::to_string(c.forward) + ":" + std::to_string(c.backward_input) + ":" +
                               std::to_string(c.backward_weight);
        EXPECT_LE(r.peak_in_flight, 2 * std::min(p, m)) << at;
        EXPECT_LE(r.split_backward_peak_in_flight, 2 * p - 1) << at;
        const ScheduleReport base = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)), c);
        // Filling the pipeline it is always ahead; with many microbatches it can trail 1F1B slightly where W is light
        // (at 1 : 1.2 : 0.8, p 8, m 32: 23.0% against 21.9%): its lock-step transfers complete in order.
        if (m > 1 && m <= 2 * p + 1) {
          EXPECT_LT(r.bubble_fraction, base.bubble_fraction) << at;
        } else if (m > 2 * p + 1) {
          EXPECT_LT(r.bubble_fraction, 1.1 * base.bubble_fraction) << at;
        }
        for (int st = 0; st < p; ++st) {
          for (int ch = 0; ch < 2; ++ch) {
            int next_b = 0;
            for (const PipeInstr& in : s[static_cast<size_t>(st)])
              if (in.chunk == ch && (in.op == PipeOp::backward_input || in.op == PipeOp::backward)) {
                EXPECT_EQ(in.microbatch, next_b++) << at << " stage " << st;
              }
          }
        }
      }
    }
  }
}

// Weighed (ScheduleMemory: a heavier head chunk, B keeping a quarter more than the forward, as fused attention does),
// no ZB-V stage holds more than 2p units, a split B leaves at most 2p - 1 held, and the lists still run and beat
// 1F1B while the pipeline fills. Weights with no room for a stage's two chunks fall back to counting pairs.
TEST(ZbV, BoundsWhatItsPairsHoldWhenWeighed) {
  for (int p : {2, 4}) {
    for (int m : {p, 2 * p, 4 * p}) {
      ScheduleSpec spec = zb_v(p, m);
      spec.costs = {26, 28, 24};
      spec.memory.forward.assign(static_cast<size_t>(2 * p), 1);
      spec.memory.backward_input.assign(static_cast<size_t>(2 * p), 0.25);
      spec.memory.forward.back() = 1.5;  // the head's chunk on stage 0
      spec.memory.backward_input.back() = -0.5;
      const Schedule s = build_schedule(spec);
      const ScheduleReport r = check_schedule(spec, s, spec.costs);
      ASSERT_TRUE(r.ok) << r.error;
      const ScheduleReport base = check_schedule(one_f_one_b(p, m), build_schedule(one_f_one_b(p, m)), spec.costs);
      if (m <= 2 * p) {
        EXPECT_LT(r.bubble_fraction, base.bubble_fraction) << "p=" << p << " m=" << m;
      }
      for (int st = 0; st < p; ++st) {
        double held = 0, peak = 0;
        for (const PipeInstr& in : s[static_cast<size_t>(st)]) {
          const auto vs = static_cast<size_t>(virtual_stage(ChunkPlacement::v_shape, p, {st, in.chunk}));
          const double f = spec.memory.forward[vs], b = spec.memory.backward_input[vs];
          if (in.op == PipeOp::forward) held += f;
          if (in.op == PipeOp::backward_input) {
            EXPECT_LE(held + std::max(0.0, b), 2 * p - 1 + 1e-9) << "p=" << p << " m=" << m << " stage " << st;
            held += b;
          }
          if (in.op == PipeOp::backward_weight) held -= f + b;
          if (in.op == PipeOp::backward) held -= f;
          peak = std::max(peak, held);
        }
        EXPECT_LE(peak, 2 * p + 1e-9) << "p=" << p << " m=" << m << " stage " << st;
        EXPECT_NEAR(held, 0, 1e-9);
      }
    }
  }
  ScheduleSpec heavy = zb_v(2, 4);
  heavy.memory.forward = {1, 1, 1, 4};  // the head alone fills stage 0: pairs are counted instead
  heavy.memory.backward_input = {0, 0, 0, 0};
  const ScheduleReport r = check_schedule(heavy, build_schedule(heavy));
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_LE(r.peak_in_flight, 4);
}

// The checker knows the V: a transfer across its turn, or a forward of chunk 1 on stage p - 1 before chunk 0's, is
// reported; so are V specs with another chunk count and looped kinds with the V placement.
TEST(ZbV, CheckerRejectsTransfersAcrossTheTurnAndBadSpecs) {
  Schedule s = build_schedule(zb_v(2, 2));
  auto& last = s[1];
  const auto f1 = std::find(last.begin(), last.end(), PipeInstr{PipeOp::forward, 0, 1});
  ASSERT_NE(f1, last.end());
  last.insert(f1, PipeInstr{PipeOp::recv_forward, 0, 1});
  ScheduleReport r = check_schedule(zb_v(2, 2), s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("the previous virtual stage is on this stage"), std::string::npos) << r.error;
  Schedule t = build_schedule(zb_v(2, 2));
  auto& l = t[1];
  const auto a = std::find(l.begin(), l.end(), PipeInstr{PipeOp::forward, 0, 0});
  const auto b = std::find(l.begin(), l.end(), PipeInstr{PipeOp::forward, 0, 1});
  std::iter_swap(a, b);
  r = check_schedule(zb_v(2, 2), t);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("runs before the forward of the previous virtual stage on this stage"), std::string::npos)
      << r.error;
  EXPECT_THROW(build_schedule({ScheduleKind::zb_v, 2, 4, 1, ChunkPlacement::v_shape}), std::invalid_argument);
  EXPECT_THROW(build_schedule({ScheduleKind::zb_v, 2, 4, 2}), std::invalid_argument);
  EXPECT_THROW(build_schedule({ScheduleKind::one_f_one_b, 2, 4, 1, ChunkPlacement::v_shape}), std::invalid_argument);
}

// Evaluating a V-placed model: forward_only with the V placement passes the simulator everywhere.
TEST(ZbV, ForwardOnlyRunsOnTheVPlacement) {
  for (int p : {1, 2, 3, 4}) {
    for (int m = 1; m <= 9; ++m) {
      const ScheduleSpec spec{ScheduleKind::forward_only, p, m, 2, ChunkPlacement::v_shape};
      const ScheduleReport r = check_schedule(spec, build_schedule(spec));
      EXPECT_TRUE(r.ok) << "p=" << p << " m=" << m << ": " << r.error;
    }
  }
}

// Megatron's get_model_chunk_id: microbatches pass chunk 0 in groups of p, then chunk 1; backward takes the
// chunks of each group in reverse.
TEST(Interleaved, MicrobatchesPassEachChunkInGroupsOfStages) {
  const Schedule s = build_schedule(interleaved(2, 4, 2));
  for (const auto& list : s) {
    EXPECT_EQ(only(list, PipeOp::forward),
              (std::vector<PipeInstr>{fw(0, 0), fw(1, 0), fw(0, 1), fw(1, 1), fw(2, 0), fw(3, 0), fw(2, 1), fw(3, 1)}));
    EXPECT_EQ(only(list, PipeOp::backward),
              (std::vector<PipeInstr>{bw(0, 1), bw(1, 1), bw(0, 0), bw(1, 0), bw(2, 1), bw(3, 1), bw(2, 0), bw(3, 0)}));
  }
}

// Stage 0 of p = 2, m = 4, v = 2: warmup 2 (p - 1) + (v - 1) p = 4 forwards, then steady steps of a forward
// and a backward followed by one batch (sends of what was made, receives of what the peers send at that step),
// then the cooldown. Chunk 0 on stage 0 is virtual stage 0: no input to receive, no input gradient to send.
TEST(Interleaved, FirstStageOfTwoStagesFourMicrobatchesTwoChunks) {
  const Schedule s = build_schedule(interleaved(2, 4, 2));
  EXPECT_EQ(s[0], (std::vector<PipeInstr>{
                      fw(0, 0), sf(0, 0),                                          // warmup
                      fw(1, 0), sf(1, 0), rf(0, 1),                                //
                      fw(0, 1), sf(0, 1), rf(1, 1),                                //
                      fw(1, 1), sf(1, 1), rb(0, 1),                                //
                      fw(2, 0), bw(0, 1), sf(2, 0), sb(0, 1), rb(1, 1),            // steady
                      fw(3, 0), bw(1, 1), sf(3, 0), sb(1, 1), rf(2, 1), rb(0, 0),  //
                      fw(2, 1), bw(0, 0), sf(2, 1), rf(3, 1), rb(1, 0),            //
                      fw(3, 1), bw(1, 0), sf(3, 1), rb(2, 1),                      //
                      bw(2, 1), sb(2, 1), rb(3, 1),                                // cooldown
                      bw(3, 1), sb(3, 1), rb(2, 0),                                //
                      bw(2, 0), rb(3, 0),                                          //
                      bw(3, 0),                                                    //
                  }));
}

// The output of chunk c on the last stage feeds chunk c + 1 on stage 0, and gradients flow back the same way:
// so stage 0 receives inputs for every chunk but 0 and the last stage sends outputs of every chunk but v - 1.
TEST(Interleaved, ChunksWrapFromTheLastStageToStageZero) {
  const int p = 4, m = 8, v = 3;
  const Schedule s = build_schedule(interleaved(p, m, v));
  for (int st = 0; st < p; ++st) {
    for (int c = 0; c < v; ++c) {
      auto count = [&](PipeOp op) {
        return std::count_if(s[st].begin(), s[st].end(),
                             [&](const PipeInstr& in) { return in.op == op && in.chunk == c; });
      };
      const bool first_virtual = st == 0 && c == 0, last_virtual = st == p - 1 && c == v - 1;
      EXPECT_EQ(count(PipeOp::recv_forward), first_virtual ? 0 : m) << "stage " << st << " chunk " << c;
      EXPECT_EQ(count(PipeOp::send_backward), first_virtual ? 0 : m) << "stage " << st << " chunk " << c;
      EXPECT_EQ(count(PipeOp::send_forward), last_virtual ? 0 : m) << "stage " << st << " chunk " << c;
      EXPECT_EQ(count(PipeOp::recv_backward), last_virtual ? 0 : m) << "stage " << st << " chunk " << c;
    }
  }
  // And the simulator, which matches stage 3 chunk 0's send_forward with stage 0 chunk 1's recv_forward, agrees.
  const ScheduleReport r = check_schedule(interleaved(p, m, v), s);
  EXPECT_TRUE(r.ok) << r.error;
}

TEST(Interleaved, WarmupIsMegatrons) {
  for (int p : {2, 3, 4, 8}) {
    for (int v : {1, 2, 3, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        const Schedule s = build_schedule(interleaved(p, m, v));
        for (int st = 0; st < p; ++st) {
          const int warmup = std::min(2 * (p - st - 1) + (v - 1) * p, m * v);
          EXPECT_EQ(forwards_before_first_backward(s[st]), std::min(warmup + 1, m * v))
              << "p=" << p << " m=" << m << " v=" << v << " stage " << st;
        }
      }
    }
  }
}

// Each chunk's forward and backward take 1/v of a stage's, so the fill and drain shrink v times:
// (p - 1) / (v m). The simulated schedule meets the paper's formula; the tolerance 1e-9 only absorbs the
// rounding of times that are sums of 1/3 and 2/3 (v = 3), not any real gap.
TEST(Interleaved, BubbleIsStagesMinusOneOverChunksTimesMicrobatches) {
  for (int p : {2, 3, 4, 8}) {
    for (int m = p; m <= 16; m += p) {
      double previous = 1e9;
      for (int v = 1; v <= 4; ++v) {
        const ScheduleReport r = check_schedule(interleaved(p, m, v), build_schedule(interleaved(p, m, v)));
        ASSERT_TRUE(r.ok) << r.error;
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (v * m), 1e-9) << "p=" << p << " m=" << m << " v=" << v;
        EXPECT_LT(r.bubble_fraction, previous);
        previous = r.bubble_fraction;
      }
    }
  }
}

// Stage s holds its warmup plus one (microbatch, chunk) activations, each 1/v of a stage: stage 0 holds
// 2 (p - 1) + (v - 1) p + 1 chunks, i.e. p + (p - 1) / v microbatches' worth, a little more than 1F1B's p.
TEST(Interleaved, PeakInFlightIsMegatrons) {
  for (int p : {2, 3, 4, 8}) {
    for (int v : {1, 2, 3, 4}) {
      for (int m : {p, 2 * p, 4 * p}) {
        const ScheduleReport r = check_schedule(interleaved(p, m, v), build_schedule(interleaved(p, m, v)));
        ASSERT_TRUE(r.ok) << r.error;
        for (int st = 0; st < p; ++st)
          EXPECT_EQ(r.stage_peak_in_flight[st], std::min(2 * (p - st - 1) + (v - 1) * p + 1, m * v))
              << "p=" << p << " m=" << m << " v=" << v << " stage " << st;
        EXPECT_EQ(r.peak_in_flight, r.stage_peak_in_flight[0]);
      }
    }
  }
  const ScheduleReport r = check_schedule(interleaved(4, 16, 2), build_schedule(interleaved(4, 16, 2)));
  EXPECT_EQ(r.peak_in_flight, 11);  // 2 * 3 + 4 + 1 chunks of 1/2: 5.5 microbatches' activations vs 4 for 1F1B
}

TEST(Grid, EveryValidSpecBuildsAndChecks) {
  int checked = 0;
  for (const ScheduleSpec& spec : valid_grid()) {
    const Schedule s = build_schedule(spec);
    ASSERT_EQ(s.size(), size_t(spec.stages)) << name(spec);
    for (const auto& list : s) {
      // m v forwards and backwards per stage, plus transfers.
      EXPECT_EQ(only(list, PipeOp::forward).size(), size_t(spec.microbatches * spec.chunks)) << name(spec);
      EXPECT_EQ(only(list, PipeOp::backward).size(), size_t(spec.microbatches * spec.chunks)) << name(spec);
    }
    const ScheduleReport r = check_schedule(spec, s);
    EXPECT_TRUE(r.ok) << name(spec) << ": " << r.error;
    EXPECT_TRUE(r.error.empty()) << name(spec);
    EXPECT_GE(r.bubble_fraction, 0.0) << name(spec);
    ++checked;
  }
  EXPECT_EQ(checked, 16 + 5 * 16 + 4 * (8 + 5 + 4 + 2));  // no pipelining, 1F1B, interleaved with m % p == 0
}

// The stage pairs of p = 2 share one channel each way for activations and gradients (stage 0's next and
// previous stage are both stage 1), the case where tag matching hides an order mismatch. Every receive
// batch of the interleaved schedule that mixes both directions keeps its order: swapping any two adjacent
// receives from the same peer there still matches by tag (the simulation passes) but is now rejected.
TEST(Grid, SwappingAdjacentSamePeerReceivesIsAlwaysRejected) {
  int swaps = 0;
  for (int m : {2, 4, 8}) {
    for (int v : {2, 3, 4}) {
      const ScheduleSpec spec = interleaved(2, m, v);
      const Schedule good = build_schedule(spec);
      for (int st = 0; st < 2; ++st) {
        for (size_t i = 0; i + 1 < good[st].size(); ++i) {
          const PipeOp a = good[st][i].op, b = good[st][i + 1].op;
          const bool recv_a = a == PipeOp::recv_forward || a == PipeOp::recv_backward;
          const bool recv_b = b == PipeOp::recv_forward || b == PipeOp::recv_backward;
          if (!recv_a || !recv_b) continue;
          Schedule bad = good;
          std::swap(bad[st][i], bad[st][i + 1]);
          const ScheduleReport r = check_schedule(spec, bad);
          EXPECT_FALSE(r.ok) << name(spec) << " stage " << st << " #" << i;
          EXPECT_CONTAINS(r.error,
                          "posting order from stage " + std::to_string(1 - st) + " to stage " + std::to_string(st));
          ++swaps;
        }
      }
    }
  }
  EXPECT_GT(swaps, 0);  // the schedules do have such batches
}

// Evaluation: every (microbatch, chunk) forward once on every stage, no backward, and the order holds for any
// m (a short last group when p does not divide it).
TEST(ForwardOnly, EverySpecOfTheGridBuildsAndChecks) {
  int checked = 0;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      for (int v = 1; v <= 4; ++v) {
        if (p == 1 && v > 1) continue;  // no interleaving without pipelining (the config rule)
        const ScheduleSpec spec = forward_only(p, m, v);
        const Schedule s = build_schedule(spec);
        ASSERT_EQ(s.size(), size_t(p)) << name(spec);
        for (int st = 0; st < p; ++st) {
          EXPECT_EQ(only(s[st], PipeOp::forward).size(), size_t(m * v)) << name(spec);
          EXPECT_TRUE(only(s[st], PipeOp::backward).empty()) << name(spec);
          EXPECT_EQ(only(s[st], PipeOp::recv_forward).size(), size_t(st == 0 ? m * (v - 1) : m * v)) << name(spec);
          EXPECT_EQ(only(s[st], PipeOp::send_forward).size(), size_t(st == p - 1 ? m * (v - 1) : m * v)) << name(spec);
        }
        const ScheduleReport r = check_schedule(spec, s);
        EXPECT_TRUE(r.ok) << name(spec) << ": " << r.error;
        EXPECT_EQ(r.peak_in_flight, 0) << name(spec);  // nothing kept for a backward
        EXPECT_GE(r.bubble_fraction, 0.0) << name(spec);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 16 + 4 * 16 * 4);
}

// Stage 1 of p = 2, m = 3, v = 2: microbatches 0, 1 pass chunk 0 then chunk 1, then the short group {2}.
// Chunk 0's outputs go to stage 0's chunk 1; chunk 1 is the last virtual stage (the loss, nothing to send).
// A send_forward and the next recv_forward form one batch, as in Megatron's send_forward_recv_forward.
TEST(ForwardOnly, LastStageOfTwoStagesThreeMicrobatchesTwoChunks) {
  const Schedule s = build_schedule(forward_only(2, 3, 2));
  EXPECT_EQ(s[1], (std::vector<PipeInstr>{
                      rf(0, 0), fw(0, 0), sf(0, 0), rf(1, 0), fw(1, 0), sf(1, 0),  // chunk 0, group {0, 1}
                      rf(0, 1), fw(0, 1), rf(1, 1), fw(1, 1),                      // chunk 1
                      rf(2, 0), fw(2, 0), sf(2, 0), rf(2, 1), fw(2, 1),            // group {2}
                  }));
  // Without interleaving each stage runs the microbatches in order: recv, forward, send. The makespan is the
  // fill (p - 1) plus m forwards.
  const ScheduleReport r = check_schedule(forward_only(4, 8, 1), build_schedule(forward_only(4, 8, 1)));
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.makespan, 8.0 + 3.0);
  EXPECT_EQ(r.bubble_fraction, 3.0 / 8.0);
}

TEST(ForwardOnly, BackwardsAndGradientsAreRejected) {
  const ScheduleSpec spec = forward_only(2, 1, 1);
  const Schedule with_backward = {{fw(0), sf(0)}, {rf(0), fw(0), bw(0)}};
  EXPECT_CONTAINS(check_schedule(spec, with_backward).error,
                  "stage 1 instruction #2 backward(mb 0, chunk 0): a forward_only schedule runs no backward");
  const Schedule with_gradient = {{fw(0), sf(0), rb(0)}, {rf(0), fw(0), sb(0)}};
  EXPECT_CONTAINS(check_schedule(spec, with_gradient).error, "a forward_only schedule moves no gradients");
  const Schedule missing_send = {{fw(0)}, {rf(0), fw(0)}};
  EXPECT_CONTAINS(check_schedule(spec, missing_send).error, "finished without sending it");
}

// The executor, not only the lists: run every stage's program of the grid through execute_pipeline against a
// communicator that records what it is asked to post. Between every pair of ranks the k-th send must be the
// k-th receive (NCCL's pairing, which ignores tags), i.e. the executor posts in the checked instruction order.
class RecordingComm final : public Communicator {
 public:
  struct Posted {
    bool send;
    int peer, tag;
  };
  RecordingComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::unique_ptr<Work> all_reduce(Tensor&, ReduceOp) override { throw std::logic_error("not here"); }
  std::unique_ptr<Work> reduce_scatter(const Tensor&, Tensor&) override { throw std::logic_error("not here"); }
  std::unique_ptr<Work> all_gather(const Tensor&, Tensor&) override { throw std::logic_error("not here"); }
  std::unique_ptr<Work> broadcast(Tensor&, int) override { throw std::logic_error("not here"); }
  std::unique_ptr<Work> send(const Tensor&, int peer, int tag) override { return log(true, peer, tag); }
  std::unique_ptr<Work> recv(Tensor&, int peer, int tag) override { return log(false, peer, tag); }
  std::unique_ptr<Work> all_to_all(const Tensor&, const std::vector<int64_t>&, Tensor&,
                                   const std::vector<int64_t>&) override {
    throw std::logic_error("not here");
  }
  void barrier() override {}
  bool collectives_block_caller() const override { return false; }  // posts like NCCL: order is what pairs
  std::vector<Posted> posted;

 private:
  struct Done final : Work {
    void wait() override {}
  };
  std::unique_ptr<Work> log(bool send, int peer, int tag) {
    posted.push_back({send, peer, tag});
    return std::make_unique<Done>();
  }
  int rank_, size_;
  std::string name_ = "recording";
};

class NullStage final : public PipelineStage {
 public:
  Tensor forward(int, int, const Tensor&) override { return Tensor::zeros({1}, DType::f32); }
  Tensor backward(int, int, const Tensor&) override { return Tensor::zeros({1}, DType::f32); }
  Shape activation_shape() const override { return {1}; }
  DType activation_dtype() const override { return DType::f32; }
};

TEST(Executor, PostsBetweenEveryPairOfRanksInOneOrder) {
  std::vector<ScheduleSpec> specs = valid_grid();
  for (int p : {2, 3, 4})
    for (int m : {1, 3, 4, 8})
      for (int v : {1, 2, 3}) specs.push_back(forward_only(p, m, v));
  for (const ScheduleSpec& spec : specs) {
    const Schedule s = build_schedule(spec);
    std::vector<RecordingComm> comms;
    for (int st = 0; st < spec.stages; ++st) comms.emplace_back(st, spec.stages);
    for (int st = 0; st < spec.stages; ++st) {
      NullStage stage;
      execute_pipeline(s[st], stage, {.comm = &comms[st], .stage = st, .stages = spec.stages, .chunks = spec.chunks});
    }
    for (int from = 0; from < spec.stages; ++from) {
      for (int to = 0; to < spec.stages; ++to) {
        std::vector<int> sent, received;
        for (const auto& x : comms[from].posted)
          if (x.send && x.peer == to) sent.push_back(x.tag);
        for (const auto& x : comms[to].posted)
          if (!x.send && x.peer == from) received.push_back(x.tag);
        EXPECT_EQ(sent, received) << name(spec) << ": stage " << from << " to stage " << to;
      }
    }
  }
}

TEST(Check, MissingReceiveIsReported) {
  const ScheduleSpec spec = one_f_one_b(2, 2);
  Schedule s = build_schedule(spec);
  ASSERT_EQ(s[1].front(), rf(0));
  s[1].erase(s[1].begin());  // stage 1 runs forward(mb 0) without receiving its input
  const ScheduleReport r = check_schedule(spec, s);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error, "stage 1 instruction #0 forward(mb 0, chunk 0)");
  EXPECT_CONTAINS(r.error, "no recv_forward");
}

// Stage 1 receives microbatch 1 before microbatch 0, while stage 0 sends 0 first. Sends are rendezvous (NCCL),
// so stage 0 waits for stage 1 to take mb 0 while stage 1 waits for mb 1: a deadlock, with both named.
TEST(Check, SwappedReceivesDeadlock) {
  const ScheduleSpec spec = one_f_one_b(2, 2);
  const Schedule s = {
      {fw(0), sf(0), fw(1), sf(1), rb(0), bw(0), rb(1), bw(1)},
      {rf(1), fw(1), rf(0), fw(0), bw(0), sb(0), bw(1), sb(1)},
  };
  const ScheduleReport r = check_schedule(spec, s);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error, "deadlock");
  EXPECT_CONTAINS(r.error, "stage 0 waits at #1 send_forward(mb 0, chunk 0) to stage 1");
  EXPECT_CONTAINS(r.error, "stage 1 waits at #0 recv_forward(mb 1, chunk 0) from stage 0");
}

// NCCL has no tags: between two ranks the k-th send meets the k-th receive. Here (p = 2, interleaved, v = 2:
// stage 0 holds virtual stages 0 and 2, stage 1 holds 1 and 3) stage 0 sends the activation sf(1, 1) and the
// gradient sb(0, 1) in one batch, and stage 1 receives them in one batch: as rf(1, 1), rb(0, 0) that is fine,
// swapped it still matches by tag and nothing deadlocks, so the old check passed; under NCCL the gradient
// would land in the activation's buffer (same shape, no error). The order check rejects it and names both ends.
TEST(Check, SwappedSamePairReceivesInOneBatchAreRejected) {
  const ScheduleSpec spec = interleaved(2, 2, 2);
  const Schedule in_order = {
      {fw(0, 0), sf(0, 0), fw(1, 0), sf(1, 0), rf(0, 1), fw(0, 1), sf(0, 1), rf(1, 1), fw(1, 1), rb(0, 1),
       bw(0, 1), sf(1, 1), sb(0, 1), rb(1, 1), bw(1, 1), sb(1, 1), rb(0, 0), bw(0, 0), rb(1, 0), bw(1, 0)},
      {rf(0, 0), fw(0, 0), sf(0, 0), rf(1, 0), fw(1, 0), sf(1, 0), rf(0, 1), fw(0, 1), bw(0, 1), sb(0, 1),
       rf(1, 1), rb(0, 0), fw(1, 1), bw(1, 1), sb(1, 1), bw(0, 0), sb(0, 0), rb(1, 0), bw(1, 0), sb(1, 0)},
  };
  const ScheduleReport ok = check_schedule(spec, in_order);
  ASSERT_TRUE(ok.ok) << ok.error;

  Schedule swapped = in_order;
  ASSERT_EQ(swapped[1][10], rf(1, 1));
  std::swap(swapped[1][10], swapped[1][11]);  // rb(0, 0), rf(1, 1): the same batch, the other order
  const ScheduleReport r = check_schedule(spec, swapped);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error,
                  "posting order from stage 0 to stage 1: stage 0's send #3 to stage 1 is instruction "
                  "#11 send_forward(mb 1, chunk 1), but stage 1's receive #3 from stage 0 is instruction "
                  "#10 recv_backward(mb 0, chunk 0)");
  EXPECT_CONTAINS(r.error, "by order, not by tag");
  EXPECT_EQ(r.error.find("deadlock"), std::string::npos) << r.error;  // tag matching alone accepts it
}

// Stage 0 waits for a gradient before sending the activation it depends on.
TEST(Check, ReceivingBeforeSendingDeadlocks) {
  const ScheduleSpec spec = one_f_one_b(2, 1);
  const Schedule s = {{fw(0), rb(0), bw(0), sf(0)}, {rf(0), fw(0), bw(0), sb(0)}};
  const ScheduleReport r = check_schedule(spec, s);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error,
                  "deadlock: stage 0 waits at #1 recv_backward(mb 0, chunk 0) from stage 1; "
                  "stage 1 waits at #0 recv_forward(mb 0, chunk 0) from stage 0");
}

TEST(Check, MissingBackwardIsReported) {
  const ScheduleSpec spec = one_f_one_b(2, 2);
  Schedule s = build_schedule(spec);
  ASSERT_EQ(s[0].back(), bw(1));
  s[0].pop_back();
  const ScheduleReport r = check_schedule(spec, s);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error, "stage 0 (mb 1, chunk 0) runs forward but never backward");
}

TEST(Check, ComputeWithoutInputAndDuplicatesAreReported) {
  const ScheduleSpec spec = one_f_one_b(2, 1);
  const Schedule s = {{fw(0), sf(0), rb(0), bw(0)}, {fw(0), bw(0), sb(0)}};  // stage 1 has no recv_forward
  const ScheduleReport r = check_schedule(spec, s);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error, "stage 1 instruction #0 forward(mb 0, chunk 0): runs before its input");

  const Schedule t = {{fw(0), sf(0), sf(0), rb(0), bw(0)}, {rf(0), fw(0), bw(0), sb(0)}};  // sent twice
  EXPECT_CONTAINS(check_schedule(spec, t).error, "stage 0 instruction #2 send_forward(mb 0, chunk 0): posted twice");

  const Schedule u = {{fw(0), sf(0), rb(0), bw(0)}, {rf(0), fw(0), bw(0), sb(0), bw(0)}};
  EXPECT_CONTAINS(check_schedule(spec, u).error, "backward runs twice");
}

// Stage 0 stops after sending its activation; stage 1's gradient then has no receiver.
TEST(Check, UnmatchedSendNamesThePeerThatFinished) {
  const ScheduleSpec spec = one_f_one_b(2, 1);
  const Schedule s = {{fw(0), sf(0)}, {rf(0), fw(0), bw(0), sb(0)}};
  const ScheduleReport r = check_schedule(spec, s);
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error,
                  "stage 1 waits at #3 send_backward(mb 0, chunk 0) to stage 0, "
                  "which finished without receiving it");
}

TEST(Check, TransfersThatCannotExistAreReported) {
  const ScheduleSpec spec = one_f_one_b(2, 1);
  const Schedule s = {{rf(0), fw(0), sf(0), rb(0), bw(0)}, {rf(0), fw(0), bw(0), sb(0)}};
  EXPECT_CONTAINS(check_schedule(spec, s).error,
                  "stage 0 instruction #0 recv_forward(mb 0, chunk 0): the first virtual stage has no previous stage");
  const Schedule t = {{fw(0), sf(0), rb(0), bw(0)}, {rf(0), fw(0), sf(0), bw(0), sb(0)}};
  EXPECT_CONTAINS(check_schedule(spec, t).error, "the last virtual stage has no next stage to send to");
  const Schedule u = {{fw(3), sf(0), rb(0), bw(0)}, {rf(0), fw(0), bw(0), sb(0)}};
  EXPECT_CONTAINS(check_schedule(spec, u).error, "microbatch out of range [0, 1)");
  const Schedule w = {{bw(0)}, {}};
  EXPECT_CONTAINS(check_schedule(spec, w).error, "backward runs before its forward");
  EXPECT_CONTAINS(check_schedule(spec, Schedule(3)).error, "the schedule has 3 stage lists for stages = 2");
}

TEST(Spec, InvalidSpecsThrowNamingTheField) {
  auto message = [](const ScheduleSpec& spec) -> std::string {
    try {
      build_schedule(spec);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no exception)";
  };
  EXPECT_CONTAINS(message({ScheduleKind::one_f_one_b, 0, 4, 1}), "stages = 0 must be >= 1");
  EXPECT_CONTAINS(message({ScheduleKind::one_f_one_b, 2, 0, 1}), "microbatches = 0 must be >= 1");
  EXPECT_CONTAINS(message({ScheduleKind::interleaved, 2, 4, 0}), "chunks = 0 must be >= 1");
  EXPECT_CONTAINS(message({ScheduleKind::one_f_one_b, 2, 4, 2}), "chunks = 2 must be 1");
  EXPECT_CONTAINS(message({ScheduleKind::no_pipelining, 2, 4, 1}), "stages = 2 must be 1");
  EXPECT_CONTAINS(message({ScheduleKind::no_pipelining, 1, 4, 2}), "chunks = 2 must be 1");
  EXPECT_CONTAINS(message({ScheduleKind::interleaved, 1, 4, 2}), "stages = 1 must be > 1");
  EXPECT_CONTAINS(message({ScheduleKind::interleaved, 4, 6, 2}), "microbatches = 6 must be a multiple of stages = 4");
  EXPECT_CONTAINS(message({ScheduleKind::interleaved, 4, 6, 2}), "interleaved");

  const ScheduleReport r = check_schedule({ScheduleKind::one_f_one_b, 2, 0, 1}, Schedule(2));
  EXPECT_FALSE(r.ok);
  EXPECT_CONTAINS(r.error, "microbatches = 0");
}

}  // namespace
