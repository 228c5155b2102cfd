// schedule_check.cpp: check_schedule, a simulator that runs every stage's instruction list together under the
// communication model of schedule.h (adjacent sends/receives form one batch, sends are rendezvous, messages are
// matched by tag) with a chunk's forward taking 1/v and its backward 2/v (a split backward's B and W 1/v each; a W
// right after a batch runs while the batch is in flight), then checks that every pair of stages
// posts its sends and receives in the same order (NCCL matches by order, not tag), and reports what went wrong.
#include <algorithm>
#include <map>
#include <optional>
#include <ranges>
#include <sstream>
#include <tuple>

#include "parallel/pipeline/schedule.h"

namespace mt {

namespace {

enum class Dir { forward, backward };

// A message: its direction, microbatch and the virtual stage that sends it (which fixes both ends).
struct MessageKey {
  Dir dir;
  int microbatch;
  int from_virtual;
  auto operator<=>(const MessageKey&) const = default;
};

struct Posting {
  double send_time = -1, recv_time = -1;  // when each side was posted; -1: not yet
};

struct CheckError {
  std::string what;
};

class Simulator {
 public:
  Simulator(const ScheduleSpec& spec, const std::vector<std::vector<PipeInstr>>& schedule, const ScheduleCosts& costs)
      : p_(spec.stages), m_(spec.microbatches), v_(spec.chunks), forward_only_(spec.kind == ScheduleKind::forward_only),
        placement_(spec.placement), on_use_(waits_on_use(spec.kind)), costs_(costs), schedule_(schedule), stages_(p_) {
    for (auto& st : stages_) st.pairs.assign(static_cast<size_t>(m_) * v_, PairState{});
  }

  ScheduleReport run() {
    ScheduleReport report;
    report.stage_peak_in_flight.assign(p_, 0);
    std::string simulated, ordered;
    try {
      for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < p_; ++s) progress |= on_use_ ? advance_on_use(s) : advance(s);
      }
      std::string stuck = deadlock_description();
      if (!stuck.empty()) throw CheckError{stuck};
      check_complete();
    } catch (const CheckError& e) {
      simulated = e.what;
    }
    // The order is a static property of the lists: check it even when the simulation failed, since a posting
    // order mismatch is often why it deadlocked under tag matching.
    try {
      check_posting_order();
    } catch (const CheckError& e) {
      ordered = e.what;
    }
    if (!simulated.empty() || !ordered.empty()) {
      report.error = simulated;
      if (!ordered.empty() && ordered != simulated) report.error += (simulated.empty() ? "" : "; and ") + ordered;
      return report;
    }
    for (int s = 0; s < p_; ++s) {
      report.makespan = std::max(report.makespan, stages_[s].clock);
      report.stage_peak_in_flight[s] = stages_[s].peak_in_flight;
      report.peak_in_flight = std::max(report.peak_in_flight, stages_[s].peak_in_flight);
      report.split_backward_peak_in_flight =
          std::max(report.split_backward_peak_in_flight, stages_[s].split_peak_in_flight);
    }
    // m microbatches x (forward + backward), over v chunks of 1/v each; forward only: m forwards.
    const double ideal =
        (forward_only_ ? costs_.forward : costs_.forward + costs_.backward_input + costs_.backward_weight) * m_;
    report.bubble_fraction = (report.makespan - ideal) / ideal;
    report.ok = true;
    return report;
  }

 private:
  struct PairState {  // one (microbatch, chunk) on one stage
    bool received_input = false, forwarded = false, sent_output = false;
    bool received_grad = false, backwarded = false, sent_grad = false;
    bool weighted = false;  // the weight gradients done (with backward, or a split backward's W)
  };
  struct StageState {
    size_t pc = 0;           // next instruction
    double clock = 0;        // when the stage is free
    size_t batch_end = 0;    // > pc while the batch [pc, batch_end) is posted and not complete
    size_t after_batch = 0;  // past the backward_weight run after the batch, which ran while it was in flight
    std::vector<PairState> pairs;
    int in_flight = 0, peak_in_flight = 0, split_peak_in_flight = 0;
    // Waits on use: the posted batches (instruction numbers), how many have completed, and which batch each
    // receive is in (by its instruction's op, microbatch and chunk).
    std::vector<std::vector<size_t>> batches;
    size_t completed = 0;
    std::map<std::tuple<PipeOp, int, int>, size_t> batch_of;
  };

  int virtual_stage(int s, int chunk) const { return mt::virtual_stage(placement_, p_, {s, chunk}); }
  int stage_of(int vs) const { return stage_chunk(placement_, p_, vs).stage; }
  int last_virtual() const { return p_ * v_ - 1; }
  // Whether virtual stage vs's neighbour `other` sits on the same stage: then nothing is transferred between them
  // (the V's turn on stage p - 1): the executor hands the tensor over locally.
  bool local(int vs, int other) const { return stage_of(vs) == stage_of(other); }
  // The state of (microbatch, virtual stage vs) on the stage that holds it.
  const PairState& pair_at(int mb, int vs) const {
    const StageChunk at = stage_chunk(placement_, p_, vs);
    return stages_[at.stage].pairs[static_cast<size_t>(mb) * v_ + at.chunk];
  }

  [[noreturn]] void fail(int s, size_t i, const std::string& why) const {
    throw CheckError{"stage " + std::to_string(s) + " instruction #" + std::to_string(i) + " " +
                     to_string(schedule_[s][i]) + ": " + why};
  }

  PairState& pair(int s, size_t i) {
    const PipeInstr& in = schedule_[s][i];
    if (in.microbatch < 0 || in.microbatch >= m_) fail(s, i, "microbatch out of range [0, " + std::to_string(m_) + ")");
    if (in.chunk < 0 || in.chunk >= v_) fail(s, i, "chunk out of range [0, " + std::to_string(v_) + ")");
    return stages_[s].pairs[static_cast<size_t>(in.microbatch) * v_ + in.chunk];
  }

  // The message a communication instruction sends or receives; checks that the peer exists.
  MessageKey message(int s, size_t i) {
    const PipeInstr& in = schedule_[s][i];
    pair(s, i);  // range checks
    const int vs = virtual_stage(s, in.chunk);
    switch (in.op) {
      case PipeOp::recv_forward:
        if (vs == 0) fail(s, i, "the first virtual stage has no previous stage to receive from");
        if (local(vs, vs - 1)) fail(s, i, "the previous virtual stage is on this stage: nothing to receive");
        return {Dir::forward, in.microbatch, vs - 1};
      case PipeOp::send_forward:
        if (vs == last_virtual()) fail(s, i, "the last virtual stage has no next stage to send to");
        if (local(vs, vs + 1)) fail(s, i, "the next virtual stage is on this stage: nothing to send");
        return {Dir::forward, in.microbatch, vs};
      case PipeOp::recv_backward:
        if (vs == last_virtual()) fail(s, i, "the last virtual stage has no next stage to receive from");
        if (local(vs, vs + 1)) fail(s, i, "the next virtual stage is on this stage: nothing to receive");
        return {Dir::backward, in.microbatch, vs + 1};
      case PipeOp::send_backward:
        if (vs == 0) fail(s, i, "the first virtual stage has no previous stage to send to");
        if (local(vs, vs - 1)) fail(s, i, "the previous virtual stage is on this stage: nothing to send");
        return {Dir::backward, in.microbatch, vs};
      default:
        break;
    }
    fail(s, i, "not a communication instruction");
  }
  static bool is_send(PipeOp op) { return op == PipeOp::send_forward || op == PipeOp::send_backward; }
  int peer(const MessageKey& key, bool sender) const {  // the stage at the other end from `sender`'s view
    const int to_virtual = key.dir == Dir::forward ? key.from_virtual + 1 : key.from_virtual - 1;
    return stage_of(sender ? to_virtual : key.from_virtual);
  }

  // Runs stage s as far as it can; returns whether it moved.
  bool advance(int s) {
    StageState& st = stages_[s];
    const auto& list = schedule_[s];
    bool moved = false;
    while (st.pc < list.size()) {
      const PipeInstr& in = list[st.pc];
      if (!is_communication(in.op)) {
        compute(s, st.pc);
        ++st.pc;
        moved = true;
        continue;
      }
      if (st.batch_end <= st.pc) {  // post the batch: all adjacent communication instructions
        st.batch_end = st.pc;
        while (st.batch_end < list.size() && is_communication(list[st.batch_end].op)) post(s, st.batch_end++);
        // The weight gradients right after it run while its transfers are in flight.
        st.after_batch = st.batch_end;
        while (st.after_batch < list.size() && list[st.after_batch].op == PipeOp::backward_weight)
          compute(s, st.after_batch++);
        moved = true;
      }
      if (!complete_batch(s, std::views::iota(st.pc, st.batch_end))) return moved;  // waits for a peer
      st.pc = st.after_batch;
      moved = true;
    }
    return moved;
  }

  // Waits on use (schedule.h): posting never waits; a forward (backward) whose input (output gradient) came from
  // another stage waits for the batch that received it and every batch before it; the end waits for all.
  bool advance_on_use(int s) {
    StageState& st = stages_[s];
    const auto& list = schedule_[s];
    const size_t completed_before = st.completed;
    bool moved = false;
    while (st.pc < list.size()) {
      const PipeInstr& in = list[st.pc];
      if (is_communication(in.op)) {
        st.batches.emplace_back();
        for (; st.pc < list.size() && is_communication(list[st.pc].op); ++st.pc) {
          post(s, st.pc);
          st.batches.back().push_back(st.pc);
          const PipeOp op = list[st.pc].op;
          if (op == PipeOp::recv_forward || op == PipeOp::recv_backward)
            st.batch_of[{op, list[st.pc].microbatch, list[st.pc].chunk}] = st.batches.size() - 1;
        }
        moved = true;
        continue;
      }
      const std::optional<size_t> need = batch_needed(s, in);
      if (need && !complete_through(s, *need)) return moved || st.completed != completed_before;
      compute(s, st.pc++);
      moved = true;
    }
    if (!st.batches.empty()) complete_through(s, st.batches.size() - 1);
    return moved || st.completed != completed_before;
  }

  // The batch whose receive a compute consumes, if its input (output gradient) comes from another stage and was
  // posted; none otherwise (compute reports a missing receive).
  std::optional<size_t> batch_needed(int s, const PipeInstr& in) const {
    const int vs = virtual_stage(s, in.chunk);
    PipeOp recv;
    if (in.op == PipeOp::forward && vs != 0 && !local(vs, vs - 1))
      recv = PipeOp::recv_forward;
    else if (is_backward_input(in.op) && vs != last_virtual() && !local(vs, vs + 1))
      recv = PipeOp::recv_backward;
    else
      return std::nullopt;
    const auto& map = stages_[s].batch_of;
    const auto it = map.find({recv, in.microbatch, in.chunk});
    if (it == map.end()) return std::nullopt;
    return it->second;
  }

  // Completes stage s's batches up to k in order (complete_batch); false when one still waits for a peer.
  bool complete_through(int s, size_t k) {
    StageState& st = stages_[s];
    for (; st.completed <= k; ++st.completed)
      if (!complete_batch(s, st.batches[st.completed])) return false;
    return true;
  }

  // Completes a posted batch of stage s (its instruction numbers) once every transfer in it has its peer posted:
  // the stage's clock moves to the latest of those posts. False, with nothing changed, while one still waits.
  template <class Indices>
  bool complete_batch(int s, const Indices& batch) {
    double done = stages_[s].clock;
    for (size_t i : batch) {
      const Posting& post = postings_[message(s, i)];
      const double other = is_send(schedule_[s][i].op) ? post.recv_time : post.send_time;
      if (other < 0) return false;
      done = std::max(done, other);
    }
    for (size_t i : batch) complete(s, i);
    stages_[s].clock = done;
    return true;
  }

  void post(int s, size_t i) {
    const PipeInstr& in = schedule_[s][i];
    if (forward_only_ && (in.op == PipeOp::recv_backward || in.op == PipeOp::send_backward))
      fail(s, i, "a forward_only schedule moves no gradients");
    PairState& ps = pair(s, i);
    Posting& post = postings_[message(s, i)];
    const std::string twice = "posted twice";
    switch (in.op) {
      case PipeOp::send_forward:
        if (!ps.forwarded) fail(s, i, "sends an output that was never computed (no forward before it)");
        if (ps.sent_output || post.send_time >= 0) fail(s, i, twice);
        break;
      case PipeOp::send_backward:
        if (!ps.backwarded) fail(s, i, "sends an input gradient that was never computed (no backward before it)");
        if (ps.sent_grad || post.send_time >= 0) fail(s, i, twice);
        break;
      case PipeOp::recv_forward:
        if (ps.received_input || post.recv_time >= 0) fail(s, i, twice);
        break;
      case PipeOp::recv_backward:
        if (ps.received_grad || post.recv_time >= 0) fail(s, i, twice);
        break;
      default:
        break;
    }
    (is_send(in.op) ? post.send_time : post.recv_time) = stages_[s].clock;
  }

  void complete(int s, size_t i) {
    PairState& ps = pair(s, i);
    switch (schedule_[s][i].op) {
      case PipeOp::send_forward:
        ps.sent_output = true;
        break;
      case PipeOp::send_backward:
        ps.sent_grad = true;
        break;
      case PipeOp::recv_forward:
        ps.received_input = true;
        break;
      case PipeOp::recv_backward:
        ps.received_grad = true;
        break;
      default:
        break;
    }
  }

  void compute(int s, size_t i) {
    StageState& st = stages_[s];
    PairState& ps = pair(s, i);
    const int vs = virtual_stage(s, schedule_[s][i].chunk);
    const PipeOp op = schedule_[s][i].op;
    if (op == PipeOp::backward_weight) {
      if (forward_only_) fail(s, i, "a forward_only schedule runs no backward");
      if (ps.weighted) fail(s, i, "weight gradients run twice");
      if (!ps.backwarded) fail(s, i, "weight gradients run before their backward_input");
      ps.weighted = true;
      st.clock += costs_.backward_weight / v_;
      --st.in_flight;  // W frees what the microbatch kept
      return;
    }
    if (op == PipeOp::forward) {
      if (ps.forwarded) fail(s, i, "forward runs twice");
      if (vs != 0 && local(vs, vs - 1) && !pair_at(schedule_[s][i].microbatch, vs - 1).forwarded)
        fail(s, i, "runs before the forward of the previous virtual stage on this stage");
      if (vs != 0 && !local(vs, vs - 1) && !ps.received_input)
        fail(s, i, "runs before its input activation was received (no recv_forward)");
      ps.forwarded = true;
      st.clock += costs_.forward / v_;
      // Without a backward nothing is kept: forward_only holds no activations.
      if (!forward_only_) st.peak_in_flight = std::max(st.peak_in_flight, ++st.in_flight);
    } else {
      if (forward_only_) fail(s, i, "a forward_only schedule runs no backward");
      if (ps.backwarded) fail(s, i, "backward runs twice");
      if (!ps.forwarded) fail(s, i, "backward runs before its forward");
      if (vs != last_virtual() && local(vs, vs + 1) && !pair_at(schedule_[s][i].microbatch, vs + 1).backwarded)
        fail(s, i, "runs before the backward of the next virtual stage on this stage");
      if (vs != last_virtual() && !local(vs, vs + 1) && !ps.received_grad)
        fail(s, i, "runs before its output gradient was received (no recv_backward)");
      ps.backwarded = true;
      if (op == PipeOp::backward_input) {
        st.clock += costs_.backward_input / v_;  // what the microbatch kept stays until its W
        st.split_peak_in_flight = std::max(st.split_peak_in_flight, st.in_flight);
      } else {
        ps.weighted = true;
        st.clock += (costs_.backward_input + costs_.backward_weight) / v_;
        --st.in_flight;
      }
    }
  }

  // Empty when every stage finished; otherwise what each unfinished stage waits on.
  std::string deadlock_description() {
    std::ostringstream os;
    bool any = false;
    for (int s = 0; s < p_; ++s) {
      const StageState& st = stages_[s];
      // Waits on use: the first batch not completed holds the stage (at a compute or at the end).
      const bool waits = on_use_ && st.completed < st.batches.size();
      if (st.pc >= schedule_[s].size() && !waits) continue;
      if (on_use_ && !waits) {
        os << (any ? "; " : "") << "stage " << s << " stops at #" << st.pc << " " << to_string(schedule_[s][st.pc]);
        any = true;
        continue;
      }
      const size_t from = waits ? st.batches[st.completed].front() : st.pc;
      const size_t to = waits ? st.batches[st.completed].back() + 1 : st.batch_end;
      for (size_t i = from; i < to; ++i) {
        const MessageKey key = message(s, i);
        const bool send = is_send(schedule_[s][i].op);
        const Posting& post = postings_[key];
        if ((send ? post.recv_time : post.send_time) >= 0) continue;
        const int other = peer(key, send);
        os << (any ? "; " : "") << "stage " << s << " waits at #" << i << " " << to_string(schedule_[s][i])
           << (send ? " to" : " from") << " stage " << other;
        if (stages_[other].pc >= schedule_[other].size())
          os << ", which finished without " << (send ? "receiving" : "sending") << " it";
        any = true;
        break;
      }
    }
    return any ? "deadlock: " + os.str() : "";
  }

  void check_complete() const {
    for (int s = 0; s < p_; ++s) {
      for (int mb = 0; mb < m_; ++mb) {
        for (int c = 0; c < v_; ++c) {
          const PairState& ps = stages_[s].pairs[static_cast<size_t>(mb) * v_ + c];
          const std::string where =
              "stage " + std::to_string(s) + " (mb " + std::to_string(mb) + ", chunk " + std::to_string(c) + ")";
          if (!ps.forwarded) throw CheckError{where + " never runs forward"};
          if (!forward_only_ && !ps.backwarded) throw CheckError{where + " runs forward but never backward"};
          if (!forward_only_ && !ps.weighted)
            throw CheckError{where + " runs backward_input but never backward_weight"};
          const int vs = virtual_stage(s, c);
          if (vs != last_virtual() && !local(vs, vs + 1) && !ps.sent_output)
            throw CheckError{where + " never sends its output (send_forward)"};
          if (!forward_only_ && vs != 0 && !local(vs, vs - 1) && !ps.sent_grad)
            throw CheckError{where + " never sends its input gradient (send_backward)"};
        }
      }
    }
  }

  // NCCL send/recv has no tags: between two ranks the k-th send is received by the k-th receive. So for every
  // (sender, receiver) pair of stages, in both directions of data flow together (with p = 2 a stage's next and
  // previous stage are the same rank) and in list order (which is posting order, also inside a batch), the
  // messages the sender posts must be the messages the receiver posts, one by one.
  void check_posting_order() {
    struct Posted {
      size_t index;  // instruction number in the stage's list
      MessageKey key;
    };
    std::map<std::pair<int, int>, std::vector<Posted>> sends, recvs;  // by (sender stage, receiver stage)
    for (int s = 0; s < p_; ++s) {
      for (size_t i = 0; i < schedule_[s].size(); ++i) {
        if (!is_communication(schedule_[s][i].op)) continue;
        const MessageKey key = message(s, i);
        const bool send = is_send(schedule_[s][i].op);
        const int other = peer(key, send);
        (send ? sends[{s, other}] : recvs[{other, s}]).push_back({i, key});
      }
    }
    std::map<std::pair<int, int>, bool> channels;
    for (const auto& [ch, list] : sends) channels[ch] = true;
    for (const auto& [ch, list] : recvs) channels[ch] = true;
    for (const auto& [ch, unused] : channels) {
      const auto& out = sends[ch];
      const auto& in = recvs[ch];
      const auto [from, to] = ch;
      const std::string pair = "posting order from stage " + std::to_string(from) + " to stage " + std::to_string(to);
      for (size_t k = 0; k < std::min(out.size(), in.size()); ++k) {
        if (out[k].key == in[k].key) continue;
        throw CheckError{pair + ": stage " + std::to_string(from) + "'s send #" + std::to_string(k) + " to stage " +
                         std::to_string(to) + " is instruction #" + std::to_string(out[k].index) + " " +
                         to_string(schedule_[from][out[k].index]) + ", but stage " + std::to_string(to) +
                         "'s receive #" + std::to_string(k) + " from stage " + std::to_string(from) +
                         " is instruction #" + std::to_string(in[k].index) + " " +
                         to_string(schedule_[to][in[k].index]) +
                         " (NCCL pairs sends and receives between two ranks by order, not by tag)"};
      }
      if (out.size() != in.size())
        throw CheckError{pair + ": stage " + std::to_string(from) + " posts " + std::to_string(out.size()) +
                         " sends to stage " + std::to_string(to) + " but stage " + std::to_string(to) + " posts " +
                         std::to_string(in.size()) + " receives from stage " + std::to_string(from)};
    }
  }

  int p_, m_, v_;
  bool forward_only_;
  ChunkPlacement placement_;
  bool on_use_;  // waits on use (schedule.h), else the batch model
  ScheduleCosts costs_;
  const std::vector<std::vector<PipeInstr>>& schedule_;
  std::vector<StageState> stages_;
  std::map<MessageKey, Posting> postings_;
};

}  // namespace

ScheduleReport check_schedule(const ScheduleSpec& spec, const std::vector<std::vector<PipeInstr>>& schedule,
                              const ScheduleCosts& costs) {
  ScheduleReport report;
  if (spec.stages < 1 || spec.microbatches < 1 || spec.chunks < 1) {
    report.error = "invalid spec: stages = " + std::to_string(spec.stages) +
                   ", microbatches = " + std::to_string(spec.microbatches) +
                   ", chunks = " + std::to_string(spec.chunks) + " (each must be >= 1)";
    return report;
  }
  if (schedule.size() != static_cast<size_t>(spec.stages)) {
    report.error = "the schedule has " + std::to_string(schedule.size()) +
                   " stage lists for stages = " + std::to_string(spec.stages);
    return report;
  }
  return Simulator(spec, schedule, costs).run();
}

}  // namespace mt
