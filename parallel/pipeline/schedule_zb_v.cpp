// schedule_zb_v.cpp: the ZB-V schedule (schedule.h): a list schedule per stage, timed with the spec's costs, whose
// policy a deterministic search picks, turned into instruction lists with the transfers placed at its times.
#include <algorithm>
#include <array>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_detail.h"

namespace mt::schedule_detail {
namespace {

// ZB-V (schedule.h): one stage's ops of the list schedule, timed with the spec's costs. BW is a whole backward (B
// and W as one op).
struct ZbvOp {
  enum Kind { F, B, W, BW } kind;
  int mb, vs;
  double start, end;
};
using ZbvLists = std::vector<std::vector<ZbvOp>>;

// Weights per virtual stage (ScheduleMemory): wf what a pair's forward keeps, wb what its B adds; `held` below is
// their sum over the pairs a stage holds.
struct ZbvWeights {
  std::vector<double> wf, wb;
};

// What steers one stage's list: a forward needs held + wf <= cap (2p or 2p - 1), one of chunk 0 also keeps `reserve`
// chunk 1 forwards' room free (held + wf0 + reserve wf1 <= cap), with no B ready a waiting W runs before a forward
// once held >= w_first (above 2p: never), a stage keeps up to keep_w W's waiting while it has B's to run, and strict
// lets the 2p-th pair in only with a W waiting.
struct ZbvPolicy {
  std::vector<int> reserve, cap, w_first, keep_w;
  bool strict = false;  // the 2p-th pair only with a W waiting (no whole backward ever starts with 2p held)
};

// The list schedule under `policy`, or nothing when it stalls (a stage full of chunk 0 pairs waits for a chunk 1
// forward that has no room). Decisions are made at event times (each op's end): at every time a stage is free it
// runs, in order of preference, a B whose output gradient has arrived (oldest microbatch first, chunk 1 first) --
// split when at most 2p - 1 are held with it after it, else after the oldest waiting W, else whole --, a W (oldest
// first) when held >= w_first, a forward of chunk 1, one of chunk 0, a W.
std::optional<ZbvLists> zb_v_list(int p, int m, const double cost[3], const ZbvWeights& w, const ZbvPolicy& policy) {
  const int vstages = 2 * p, limit = 2 * p;
  constexpr double not_yet = std::numeric_limits<double>::infinity();
  // When each (microbatch, virtual stage)'s F and B end (a whole backward's B: when the whole op does).
  std::vector<std::array<double, 2>> ends(static_cast<size_t>(m) * vstages, {not_yet, not_yet});
  auto end_of = [&](int mb, int vs) -> std::array<double, 2>& { return ends[static_cast<size_t>(mb) * vstages + vs]; };
  struct Stage {
    double free_at = 0;
    double held = 0;  // pairs forwarded and not through W (or a whole backward), weighed (ScheduleMemory)
    std::deque<std::pair<int, int>> waiting_w;      // (microbatch, virtual stage) through B, oldest first
    std::array<int, 2> next_f{0, 0}, next_b{0, 0};  // per chunk: F and B run in microbatch order
  };
  std::vector<Stage> st(p);
  ZbvLists ops(p);
  long placed = 0;
  const long total = 3L * m * vstages;
  double now = 0;
  auto run = [&](int s, ZbvOp::Kind kind, int mb, int vs) {
    Stage& t = st[static_cast<size_t>(s)];
    const double d = kind == ZbvOp::F   ? cost[0]
                     : kind == ZbvOp::B ? cost[1]
                     : kind == ZbvOp::W ? cost[2]
                                        : cost[1] + cost[2];
    const int c = vs < p ? 0 : 1;
    switch (kind) {
      case ZbvOp::F:
        end_of(mb, vs)[0] = now + d;
        ++t.next_f[c];
        t.held += w.wf[static_cast<size_t>(vs)];
        break;
      case ZbvOp::B:
        end_of(mb, vs)[1] = now + d;
        ++t.next_b[c];
        t.waiting_w.emplace_back(mb, vs);
        t.held += w.wb[static_cast<size_t>(vs)];
        break;
      case ZbvOp::W:
        t.waiting_w.pop_front();
        t.held -= w.wf[static_cast<size_t>(vs)] + w.wb[static_cast<size_t>(vs)];
        break;
      case ZbvOp::BW:
        end_of(mb, vs)[1] = now + d;
        ++t.next_b[c];
        t.held -= w.wf[static_cast<size_t>(vs)];
        ++placed;  // B and W
        break;
    }
    ++placed;
    ops[static_cast<size_t>(s)].push_back({kind, mb, vs, now, now + d});
    t.free_at = now + d;
  };
  while (placed < total) {
    for (int s = 0; s < p; ++s) {
      Stage& t = st[static_cast<size_t>(s)];
      if (t.free_at > now) continue;
      const std::array<int, 2> own{s, vstages - 1 - s};  // chunk 0's and chunk 1's virtual stage
      std::optional<std::pair<int, int>> b;              // (microbatch, virtual stage)
      for (int c : {1, 0}) {
        const int mb = t.next_b[static_cast<size_t>(c)], vs = own[static_cast<size_t>(c)];
        if (mb >= m || end_of(mb, vs)[0] > now || (vs != vstages - 1 && end_of(mb, vs + 1)[1] > now)) continue;
        if (!b || mb < b->first) b = std::pair(mb, vs);
      }
      auto f_ready = [&](int c) {
        const int mb = t.next_f[static_cast<size_t>(c)], vs = own[static_cast<size_t>(c)];
        return mb < m && (vs == 0 || end_of(mb, vs - 1)[0] <= now);
      };
      // strict: the 2p-th pair only with a W waiting, which the next B then runs first (so no whole backward starts
      // with more than 2p - 1 held).
      const double room = t.waiting_w.empty() && policy.strict ? std::min(policy.cap[static_cast<size_t>(s)], limit - 1)
                                                               : policy.cap[static_cast<size_t>(s)];
      constexpr double eps = 1e-9;
      const double wf0 = w.wf[static_cast<size_t>(own[0])], wf1 = w.wf[static_cast<size_t>(own[1])];
      if (b && t.held + std::max(w.wb[static_cast<size_t>(b->second)], 0.0) <= limit - 1 + eps) {
        run(s, ZbvOp::B, b->first, b->second);
      } else if (b && !t.waiting_w.empty()) {
        run(s, ZbvOp::W, t.waiting_w.front().first, t.waiting_w.front().second);
      } else if (b) {
        run(s, ZbvOp::BW, b->first, b->second);
      } else if (!t.waiting_w.empty() && t.held >= policy.w_first[static_cast<size_t>(s)] - eps) {
        run(s, ZbvOp::W, t.waiting_w.front().first, t.waiting_w.front().second);
      } else if (f_ready(1) && t.held + wf1 <= room + eps) {
        run(s, ZbvOp::F, t.next_f[1], own[1]);
      } else if (f_ready(0) && t.held + wf0 + policy.reserve[static_cast<size_t>(s)] * wf1 <= room + eps) {
        run(s, ZbvOp::F, t.next_f[0], own[0]);
      } else if (t.waiting_w.size() > static_cast<size_t>(policy.keep_w[static_cast<size_t>(s)]) ||
                 (!t.waiting_w.empty() && t.next_b[0] == m && t.next_b[1] == m)) {
        run(s, ZbvOp::W, t.waiting_w.front().first, t.waiting_w.front().second);
      }
    }
    // Every op placed at `now` ends later (costs are positive): the next decisions are at the earliest end.
    double next = not_yet;
    for (const Stage& t : st)
      if (t.free_at > now) next = std::min(next, t.free_at);
    if (next == not_yet && placed < total) return std::nullopt;  // nothing runs and nothing will
    now = next;
  }
  return ops;
}

double makespan_of(const ZbvLists& lists) {
  double end = 0;
  for (const auto& list : lists)
    if (!list.empty()) end = std::max(end, list.back().end);
  return end;
}

// The instruction lists of a timed ZB-V list: a stage posts the send of what an op made right after it; the receiving
// stage posts its receive after every op of its own that started before the tensor was made (just before the op that
// consumes it, if it idles till then). Both ends thus post each pair's messages in the order they were made.
std::vector<std::vector<PipeInstr>> zb_v_instructions(int p, const ZbvLists& ops) {
  const int vstages = 2 * p;
  std::vector<std::vector<std::vector<PipeInstr>>> after(p);  // after[s][k]: posted after stage s's k-th op
  for (int s = 0; s < p; ++s) after[s].resize(ops[s].size() + 1);
  auto chunk_of = [&](int vs) { return stage_chunk(ChunkPlacement::v_shape, p, vs).chunk; };
  for (int s = 0; s < p; ++s) {
    for (size_t j = 0; j < ops[s].size(); ++j) {
      const ZbvOp& op = ops[s][j];
      const bool backs = op.kind == ZbvOp::B || op.kind == ZbvOp::BW;
      const bool forward = op.kind == ZbvOp::F && op.vs + 1 < vstages, backward = backs && op.vs > 0;
      if (!forward && !backward) continue;
      const int to_vs = forward ? op.vs + 1 : op.vs - 1, to = stage_chunk(ChunkPlacement::v_shape, p, to_vs).stage;
      if (to == s) continue;  // the turn of the V: handed over on this stage
      after[s][j + 1].push_back({forward ? PipeOp::send_forward : PipeOp::send_backward, op.mb, chunk_of(op.vs)});
      // The receiver's ops are in order of their start times.
      const auto k = static_cast<size_t>(
          std::partition_point(ops[to].begin(), ops[to].end(), [&](const ZbvOp& o) { return o.start < op.end; }) -
          ops[to].begin());
      after[to][k].push_back({forward ? PipeOp::recv_forward : PipeOp::recv_backward, op.mb, chunk_of(to_vs)});
    }
  }
  std::vector<std::vector<PipeInstr>> out(p);
  for (int s = 0; s < p; ++s) {
    for (size_t k = 0; k <= ops[s].size(); ++k) {
      out[s].insert(out[s].end(), after[s][k].begin(), after[s][k].end());
      if (k == ops[s].size()) break;
      const ZbvOp& op = ops[s][k];
      const PipeOp code = op.kind == ZbvOp::F    ? PipeOp::forward
                          : op.kind == ZbvOp::B  ? PipeOp::backward_input
                          : op.kind == ZbvOp::BW ? PipeOp::backward
                                                 : PipeOp::backward_weight;
      out[s].push_back({code, op.mb, chunk_of(op.vs)});
    }
  }
  return out;
}

// Whether no whole backward that starts with more than 2p - 1 pairs held (weighed as zb_v_list does: 2p is 1F1B's
// first stage's count, at its peak) has another tensor of the pipeline beside it: a receive posted for a later
// compute, a sent tensor whose batch is not yet waited for (waits on use), or an output the turn of the V hands to a
// chunk that has not yet run. Such a backward would peak that tensor above 1F1B's first stage. The lists are walked as
// the executor runs them (pipeline_executor.cpp).
bool brim_clear(int p, const ZbvWeights& w, const std::vector<std::vector<PipeInstr>>& lists) {
  const int vstages = 2 * p;
  for (int s = 0; s < p; ++s) {
    auto vs_of = [&](int chunk) { return virtual_stage(ChunkPlacement::v_shape, p, {s, chunk}); };
    std::map<std::tuple<PipeOp, int, int>, size_t> received;  // live receive buffers and their batch
    std::map<std::tuple<bool, int, int>, int> handed;         // (backward, microbatch, chunk) taken by a later compute
    std::vector<int> sent;                                    // per posted batch: its sends
    size_t waited = 0;
    bool open = false;
    double held = 0;
    auto post = [&] {
      if (!open) sent.push_back(0);
      open = true;
    };
    for (const PipeInstr& in : lists[static_cast<size_t>(s)]) {
      switch (in.op) {
        case PipeOp::recv_forward:
        case PipeOp::recv_backward:
          post();
          received[{in.op, in.microbatch, in.chunk}] = sent.size() - 1;
          break;
        case PipeOp::send_forward:
        case PipeOp::send_backward:
          post();
          ++sent.back();
          break;
        case PipeOp::backward_weight: {
          open = false;
          const auto v = static_cast<size_t>(vs_of(in.chunk));
          held -= w.wf[v] + w.wb[v];
          break;
        }
        default: {  // forward, backward, backward_input
          open = false;
          const bool forward = in.op == PipeOp::forward;
          const auto it =
              received.find({forward ? PipeOp::recv_forward : PipeOp::recv_backward, in.microbatch, in.chunk});
          if (it != received.end()) {
            for (; waited <= it->second && waited < sent.size(); ++waited) sent[waited] = 0;
            received.erase(it);
          }
          handed.erase({!forward, in.microbatch, in.chunk});
          if (in.op == PipeOp::backward && held > vstages - 1 + 1e-9) {
            int extra = static_cast<int>(received.size() + handed.size());
            for (size_t b = waited; b < sent.size(); ++b) extra += sent[b];
            if (extra > 0) return false;
          }
          if (const auto to = local_neighbour(ChunkPlacement::v_shape, p, 2, {s, in.chunk}, forward ? 1 : -1))
            handed[{!forward, in.microbatch, *to}] = 1;
          const auto v = static_cast<size_t>(vs_of(in.chunk));
          held += forward ? w.wf[v] : in.op == PipeOp::backward ? -w.wf[v] : w.wb[v];
          break;
        }
      }
    }
  }
  return true;
}

// ZB-V (schedule.h): the list schedule of the policy found by a deterministic search (every rank builds the same
// lists), with the transfers placed at its times. A policy qualifies when its lists run (check_schedule) and keep the
// brim clear (brim_clear). First the reserves, by the list's own makespan (cheap), with and without `strict`: the
// family (a, b, ..., b), then stage by stage until nothing improves (this alone meets (p - 1) / (6 m) with equal
// costs). Then a seeded local search over every knob by the makespan check_schedule gives the instruction lists
// (transfers completing in order, waits on use), which is what other costs need.
// Nothing when no list qualifies (weights that leave no room for a stage's two chunks).
std::optional<std::vector<std::vector<PipeInstr>>> zb_v(int p, int m, const ScheduleCosts& costs, const ZbvWeights& w) {
  const int vstages = 2 * p;
  const auto P = static_cast<size_t>(p);
  const double cost[3] = {costs.forward / 2, costs.backward_input / 2, costs.backward_weight / 2};  // a chunk's
  const ScheduleSpec spec{ScheduleKind::zb_v, p, m, 2, ChunkPlacement::v_shape, costs};
  using Lists = std::vector<std::vector<PipeInstr>>;
  struct Found {
    Lists lists;
    double makespan;
  };
  auto qualify = [&](const ZbvPolicy& c) -> std::optional<Found> {
    const std::optional<ZbvLists> timed = zb_v_list(p, m, cost, w, c);
    if (!timed) return std::nullopt;
    Lists lists = zb_v_instructions(p, *timed);
    for (auto& list : lists) join_adjacent_backward(list);
    if (!brim_clear(p, w, lists)) return std::nullopt;
    const ScheduleReport r = check_schedule(spec, lists, costs);
    if (!r.ok) return std::nullopt;
    return Found{std::move(lists), r.makespan};
  };
  // One pair reserved on every stage (which never stalls: a chunk 1 forward always has room, so every microbatch in
  // the pipeline reaches the loss, and a B always runs, whole at worst), the cap at 2p, no W before a forward, none
  // kept waiting.
  auto baseline = [&](bool strict) {
    return ZbvPolicy{std::vector<int>(P, 1), std::vector<int>(P, vstages), std::vector<int>(P, vstages + 1),
                     std::vector<int>(P, 0), strict};
  };
  // The reserves by the list's makespan, from the baseline.
  auto reserves = [&](bool strict) {
    ZbvPolicy policy = baseline(strict);
    const std::optional<ZbvLists> first = zb_v_list(p, m, cost, w, policy);
    double best = first ? makespan_of(*first) : std::numeric_limits<double>::infinity();
    auto by_list = [&](const ZbvPolicy& candidate) {
      const std::optional<ZbvLists> timed = zb_v_list(p, m, cost, w, candidate);
      if (!timed || makespan_of(*timed) >= best * (1 - 1e-9)) return false;
      best = makespan_of(*timed);
      policy = candidate;
      return true;
    };
    for (int a = 0; a < vstages; ++a) {
      for (int b = 0; b < std::min(4, vstages); ++b) {
        ZbvPolicy c = policy;
        c.reserve.assign(P, b);
        c.reserve[0] = a;
        by_list(c);
      }
    }
    for (int round = 0; round < 3; ++round) {
      bool improved = false;
      for (size_t s = 0; s < P; ++s) {
        for (int x = 0; x < vstages; ++x) {
          if (x == policy.reserve[s]) continue;
          ZbvPolicy c = policy;
          c.reserve[s] = x;
          improved |= by_list(c);
        }
      }
      if (!improved) break;
    }
    return policy;
  };
  std::optional<Found> best;
  ZbvPolicy policy;
  for (bool strict : {false, true}) {
    for (const ZbvPolicy& c : {reserves(strict), baseline(strict)}) {
      std::optional<Found> found = qualify(c);
      if (found && (!best || found->makespan < best->makespan * (1 - 1e-9))) {
        best = std::move(found);
        policy = c;
      }
    }
  }
  if (!best) return std::nullopt;
  // 300 steps, fewer for long lists (a check costs about 2 ms at p 8, m 64; the search then takes about 0.6 s).
  const int steps = static_cast<int>(std::clamp(2.0e6 / (6.0 * p * m), 50.0, 300.0));
  std::mt19937 rng(20240101u);  // fixed: the same lists on every rank
  for (int it = 0; it < steps; ++it) {
    ZbvPolicy c = policy;
    const size_t s = rng() % P;
    switch (rng() % 5) {
      case 0:
        c.reserve[s] = static_cast<int>(rng() % static_cast<unsigned>(vstages));
        break;
      case 1:
        c.cap[s] = vstages - static_cast<int>(rng() % 2);
        break;
      case 2:
        c.w_first[s] = rng() % 2 ? vstages + 1 : p + static_cast<int>(rng() % static_cast<unsigned>(p + 1));
        break;
      case 3:
        c.keep_w[s] = static_cast<int>(rng() % 3);
        break;
      default:
        c.strict = !c.strict;
        break;
    }
    std::optional<Found> found = qualify(c);
    // As short is taken: the search walks plateaus.
    if (!found || found->makespan > best->makespan * (1 + 1e-9)) continue;
    best = std::move(found);
    policy = c;
  }
  return std::move(best->lists);
}

}  // namespace

// zb_v, remembered per (p, m, costs, memory): the executor, the planner (once per stage) and the time model ask again.
std::vector<std::vector<PipeInstr>> zb_v_schedule(int p, int m, const ScheduleCosts& costs,
                                                  const ScheduleMemory& memory) {
  using Key = std::tuple<int, int, double, double, double, std::vector<double>, std::vector<double>>;
  static std::mutex mutex;
  static std::map<Key, std::vector<std::vector<PipeInstr>>> cache;
  const Key key{
      p, m, costs.forward, costs.backward_input, costs.backward_weight, memory.forward, memory.backward_input};
  {
    const std::lock_guard lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const auto V = static_cast<size_t>(2 * p);
  const ZbvWeights counted{std::vector<double>(V, 1), std::vector<double>(V, 0)};
  ZbvWeights weights = counted;
  if (memory.forward.size() == V && memory.backward_input.size() == V)
    weights = {memory.forward, memory.backward_input};
  // Weights that leave no list (a head chunk heavier than the room beside the other chunk): count pairs instead.
  std::optional<std::vector<std::vector<PipeInstr>>> lists = zb_v(p, m, costs, weights);
  if (!lists) lists = zb_v(p, m, costs, counted);
  if (!lists)
    throw std::logic_error("zb_v schedule: no list keeps 1F1B's memory (p " + std::to_string(p) + ", m " +
                           std::to_string(m) + ")");
  const std::lock_guard lock(mutex);
  if (cache.size() >= 256) cache.clear();  // a plan --search over many shapes: keep it bounded
  cache.emplace(key, *lists);
  return *lists;
}

}  // namespace mt::schedule_detail
