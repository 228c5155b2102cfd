// schedule.cpp: building the instruction lists of no pipelining, 1F1B (and ZB-H1) and interleaved 1F1B (as
// Megatron-LM's pipeline_parallel/schedules.py), and of evaluation. ZB-V's are in schedule_zb_v.cpp, the simulator
// that checks them all in schedule_check.cpp.
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/pipeline/schedule_detail.h"

namespace mt {

std::string pipe_op_name(PipeOp op) { return std::string(name_of(op)); }

bool is_communication(PipeOp op) {
  return op == PipeOp::recv_forward || op == PipeOp::send_forward || op == PipeOp::recv_backward ||
         op == PipeOp::send_backward;
}

bool is_backward_input(PipeOp op) { return op == PipeOp::backward || op == PipeOp::backward_input; }

std::string to_string(const PipeInstr& instr) {
  return pipe_op_name(instr.op) + "(mb " + std::to_string(instr.microbatch) + ", chunk " + std::to_string(instr.chunk) +
         ")";
}
std::string schedule_kind_name(ScheduleKind kind) { return std::string(name_of(kind)); }

bool waits_on_use(ScheduleKind kind) { return kind == ScheduleKind::zb_v; }

ChunkPlacement chunk_placement(ScheduleKind kind) {
  return kind == ScheduleKind::zb_v ? ChunkPlacement::v_shape : ChunkPlacement::looped;
}

int virtual_stage(ChunkPlacement placement, int stages, StageChunk at) {
  if (placement == ChunkPlacement::v_shape && at.chunk == 1) return 2 * stages - 1 - at.stage;
  return at.chunk * stages + at.stage;
}

StageChunk stage_chunk(ChunkPlacement placement, int stages, int vs) {
  if (placement == ChunkPlacement::v_shape && vs >= stages) return {2 * stages - 1 - vs, 1};
  return {vs % stages, vs / stages};
}

std::optional<int> local_neighbour(ChunkPlacement placement, int stages, int chunks, StageChunk at, int step) {
  const int vs = virtual_stage(placement, stages, at) + step;
  if (vs < 0 || vs >= stages * chunks) return std::nullopt;
  const StageChunk there = stage_chunk(placement, stages, vs);
  if (there.stage != at.stage) return std::nullopt;
  return there.chunk;
}

namespace {

void fail(const ScheduleSpec& spec, const std::string& why) {
  throw std::invalid_argument("pipeline schedule " + schedule_kind_name(spec.kind) + ": " + why);
}

void validate(const ScheduleSpec& spec) {
  const std::string p = std::to_string(spec.stages), m = std::to_string(spec.microbatches),
                    v = std::to_string(spec.chunks);
  if (spec.stages < 1) fail(spec, "stages = " + p + " must be >= 1");
  if (spec.microbatches < 1) fail(spec, "microbatches = " + m + " must be >= 1");
  if (spec.chunks < 1) fail(spec, "chunks = " + v + " must be >= 1");
  switch (spec.kind) {
    case ScheduleKind::no_pipelining:
      if (spec.stages != 1) fail(spec, "stages = " + p + " must be 1 (use one_f_one_b to pipeline)");
      if (spec.chunks != 1) fail(spec, "chunks = " + v + " must be 1 (chunks > 1 is the interleaved schedule)");
      break;
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1:
      if (spec.chunks != 1) fail(spec, "chunks = " + v + " must be 1 (chunks > 1 is the interleaved schedule)");
      break;
    case ScheduleKind::interleaved:
      if (spec.stages < 2) fail(spec, "stages = " + p + " must be > 1 to interleave");
      if (spec.microbatches % spec.stages != 0)
        fail(spec, "microbatches = " + m + " must be a multiple of stages = " + p +
                       " (Megatron's rule: microbatches pass each chunk in groups of stages)");
      break;
    case ScheduleKind::zb_v:
      if (spec.chunks != 2) fail(spec, "chunks = " + v + " must be 2 (ZB-V places two chunks per stage in a V)");
      break;
    case ScheduleKind::forward_only:
      break;  // any p, m, v: the last group of microbatches may be short
  }
  if (spec.placement == ChunkPlacement::v_shape && spec.chunks != 2)
    fail(spec, "chunks = " + v + " must be 2 for the V-shaped placement");
  if (spec.kind != ScheduleKind::forward_only && spec.placement != chunk_placement(spec.kind))
    fail(spec, spec.placement == ChunkPlacement::v_shape ? "runs looped chunks, not the V-shaped placement"
                                                         : "needs the V-shaped placement");
}

// Appends instructions to one stage's list; the stage's position decides which transfers exist: a chunk receives
// its input (sends its output) unless it is the first (last) virtual stage or its neighbour is on this stage.
struct StageWriter {
  std::vector<PipeInstr>& out;
  int stage, stages, chunks;
  ChunkPlacement placement = ChunkPlacement::looped;

  int vs(int chunk) const { return virtual_stage(placement, stages, {stage, chunk}); }
  bool remote(int virtual_stage) const { return stage_chunk(placement, stages, virtual_stage).stage != stage; }
  bool has_prev(int chunk) const { return vs(chunk) > 0 && remote(vs(chunk) - 1); }
  bool has_next(int chunk) const { return vs(chunk) < stages * chunks - 1 && remote(vs(chunk) + 1); }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  void add(PipeOp op, int mb, int chunk) { out.push_back({op, mb, chunk}); }
};

std::vector<PipeInstr> no_pipelining(int m) {
  std::vector<PipeInstr> out;
  for (int mb = 0; mb < m; ++mb) {
    out.push_back({PipeOp::forward, mb, 0});
    out.push_back({PipeOp::backward, mb, 0});
  }
  return out;
}

// Megatron's forward_backward_pipelining_without_interleaving; with `zero_bubble`, ZB-H1 (schedule.h): the same
// forwards and backwards with each backward split, and stage s's W held back by s - 1 microbatches.
std::vector<PipeInstr> one_f_one_b(int p, int s, int m, bool zero_bubble) {
  std::vector<PipeInstr> out;
  StageWriter w{out, s, p, 1};
  std::vector<int> waiting;  // ZB-H1: microbatches through B, waiting for their W, oldest first
  size_t next_w = 0;
  int held = 0;  // microbatches forwarded and not yet through their W (or whole backward)
  // The W's beyond `hold`, placed before the next compute (after its receives: in flight meanwhile).
  auto release = [&](size_t hold) {
    while (waiting.size() - next_w > hold) {
      w.add(PipeOp::backward_weight, waiting[next_w++], 0);
      --held;
    }
  };
  // Stage s holds back s - 1 W's (the paper's s, less one for the memory bound below): each placed after the
  // receive of a later compute's input.
  const auto hold = static_cast<size_t>(std::max(s - 1, 0));
  auto forward = [&](int mb) {
    if (w.has_prev(0)) w.add(PipeOp::recv_forward, mb, 0);
    release(hold);
    w.add(PipeOp::forward, mb, 0);
    ++held;
    if (w.has_next(0)) w.add(PipeOp::send_forward, mb, 0);
  };
  auto backward = [&](int mb) {
    if (w.has_next(0)) w.add(PipeOp::recv_backward, mb, 0);
    release(hold);
    // The memory bound (ZB-H1): a B keeps W's operands, about a microbatch's activations, and peaks above a whole
    // backward while it gathers them, so a split B starts with at most p - 1 microbatches held (itself included),
    // where 1F1B's first stage holds p at its whole backwards: the oldest waiting W's run first, and with none
    // waiting (the first stage's first cooldown B) the B runs whole, as 1F1B's.
    while (zero_bubble && held >= p && next_w < waiting.size()) {
      w.add(PipeOp::backward_weight, waiting[next_w++], 0);
      --held;
    }
    const bool split = zero_bubble && held < p;
    w.add(split ? PipeOp::backward_input : PipeOp::backward, mb, 0);
    if (w.has_prev(0)) w.add(PipeOp::send_backward, mb, 0);
    if (split)
      waiting.push_back(mb);
    else
      --held;
  };
  const int warmup = std::min(p - s - 1, m), steady = m - warmup;
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = 0; i < steady; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int i = steady; i < m; ++i) backward(i);
  release(0);  // ZB-H1: the held-back W's, where 1F1B's stage s idles at the end
  return out;
}

// Megatron's forward_backward_pipelining_with_interleaving. Virtual microbatch k (0 .. m v - 1) is one
// (microbatch, chunk) pair: microbatches pass chunk 0 in groups of p, then chunk 1, ...; backward walks the
// chunks in reverse. After each compute step the stage posts one batch: the sends of what it just made and
// the receives its peers send at the same step (recv_prev / recv_next, Megatron's conditions). Receives
// arrive in the order the peer sends them, so the j-th receive is for the j-th (microbatch, chunk) that
// needs one.
std::vector<PipeInstr> interleaved(int p, int s, int m, int v) {
  const int total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    const int in_group = ((k % (p * v)) + p * v) % (p * v);  // Python's modulo: k may be negative
    const int c = in_group / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };

  std::vector<PipeInstr> out;
  StageWriter w{out, s, p, v};
  // The pairs whose input (output gradient) arrives from a peer, in the order they arrive.
  std::vector<PipeInstr> inputs, grads;
  for (int k = 0; k < total; ++k) {
    if (w.has_prev(chunk_of(k, true))) inputs.push_back({PipeOp::recv_forward, microbatch_of(k), chunk_of(k, true)});
    if (w.has_next(chunk_of(k, false))) grads.push_back({PipeOp::recv_backward, microbatch_of(k), chunk_of(k, false)});
  }
  size_t next_input = 0, next_grad = 0;
  auto recv_prev = [&] { out.push_back(inputs.at(next_input++)); };
  auto recv_next = [&] { out.push_back(grads.at(next_grad++)); };
  auto forward = [&](int k) { w.add(PipeOp::forward, microbatch_of(k), chunk_of(k, true)); };
  auto backward = [&](int k) { w.add(PipeOp::backward, microbatch_of(k), chunk_of(k, false)); };
  auto send_forward = [&](int k) {
    if (w.has_next(chunk_of(k, true))) w.add(PipeOp::send_forward, microbatch_of(k), chunk_of(k, true));
  };
  auto send_backward = [&](int k) {
    if (w.has_prev(chunk_of(k, false))) w.add(PipeOp::send_backward, microbatch_of(k), chunk_of(k, false));
  };

  // Megatron's warmup. (Megatron also runs all m v forwards first when m == p; matched by tag, the schedule
  // needs no such case, and without it the later stages hold fewer activations.)
  const int warmup = std::min(2 * (p - s - 1) + (v - 1) * p, total);
  const int steady = total - warmup;

  if (w.has_prev(0)) recv_prev();
  for (int k = 0; k < warmup; ++k) {
    forward(k);
    send_forward(k);
    if (k != total - 1 && !(w.first_stage() && chunk_of(k + 1, true) == 0)) recv_prev();
    if (k == warmup - 1 && !w.last_stage()) recv_next();  // the gradient for the first backward (chunk v - 1)
  }
  for (int k = 0; k < steady; ++k) {
    const int forward_k = warmup + k, backward_k = k;
    forward(forward_k);
    backward(backward_k);
    send_forward(forward_k);
    send_backward(backward_k);
    // Stage 0 is p - 1 steps ahead of the last stage, which sends to chunk c + 1 unless c is its last chunk.
    bool prev = !w.first_stage() || chunk_of(forward_k - (p - 1), true) != v - 1;
    bool next = !w.last_stage() || chunk_of(backward_k - (p - 1), false) != 0;
    if (k == steady - 1) prev = false;
    if (prev) recv_prev();
    if (next) recv_next();
  }
  for (int k = steady; k < total; ++k) {
    backward(k);
    send_backward(k);
    if (k != total - 1 && !(w.last_stage() && chunk_of(k + 1, false) == v - 1)) recv_next();
  }
  if (next_input != inputs.size() || next_grad != grads.size())
    throw std::logic_error("interleaved schedule: stage " + std::to_string(s) + " posts " + std::to_string(next_input) +
                           "/" + std::to_string(inputs.size()) + " input and " + std::to_string(next_grad) + "/" +
                           std::to_string(grads.size()) + " gradient receives");
  return out;
}

// Evaluation: each (microbatch, chunk) received, run and sent on, in interleaved's forward order (microbatches
// pass chunk 0 in groups of p, then chunk 1, ...; a short last group when p does not divide m). Every stage
// walks the same order, so each receive meets its send in order and nothing waits on a later message.
std::vector<PipeInstr> forward_only(int p, int s, int m, int v, ChunkPlacement placement) {
  std::vector<PipeInstr> out;
  StageWriter w{out, s, p, v, placement};
  for (int group = 0; group < m; group += p) {
    const int group_end = std::min(group + p, m);
    for (int c = 0; c < v; ++c) {
      for (int mb = group; mb < group_end; ++mb) {
        if (w.has_prev(c)) w.add(PipeOp::recv_forward, mb, c);
        w.add(PipeOp::forward, mb, c);
        if (w.has_next(c)) w.add(PipeOp::send_forward, mb, c);
      }
    }
  }
  return out;
}

}  // namespace

namespace schedule_detail {

// A split backward whose W comes right after its B (nothing between them: no transfer in flight for W to overlap,
// no other compute) gains nothing from the split but costs memory: B keeps W's operands (each linear's input and
// output gradient) until W, and a whole backward frees each layer's as it goes. Such a pair runs as one backward.
void join_adjacent_backward(std::vector<PipeInstr>& list) {
  std::vector<PipeInstr> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeInstr& in = list[i];
    if (in.op == PipeOp::backward_input && i + 1 < list.size() &&
        list[i + 1] == PipeInstr{PipeOp::backward_weight, in.microbatch, in.chunk}) {
      out.push_back({PipeOp::backward, in.microbatch, in.chunk});
      ++i;
      continue;
    }
    out.push_back(in);
  }
  list = std::move(out);
}

}  // namespace schedule_detail

std::vector<std::vector<PipeInstr>> build_schedule(const ScheduleSpec& spec) {
  validate(spec);
  const int p = spec.stages, m = spec.microbatches, v = spec.chunks;
  std::vector<std::vector<PipeInstr>> stages(p);
  for (int s = 0; s < p; ++s) {
    switch (spec.kind) {
      case ScheduleKind::no_pipelining:
        stages[s] = no_pipelining(m);
        break;
      case ScheduleKind::one_f_one_b:
        stages[s] = one_f_one_b(p, s, m, false);
        break;
      case ScheduleKind::interleaved:
        stages[s] = interleaved(p, s, m, v);
        break;
      case ScheduleKind::forward_only:
        stages[s] = forward_only(p, s, m, v, spec.placement);
        break;
      case ScheduleKind::zb_h1:
        stages[s] = one_f_one_b(p, s, m, true);
        break;
      case ScheduleKind::zb_v:
        break;  // all stages at once, below
    }
  }
  if (spec.kind == ScheduleKind::zb_v) stages = schedule_detail::zb_v_schedule(p, m, spec.costs, spec.memory);
  if (splits_backward(spec.kind))
    for (auto& list : stages) schedule_detail::join_adjacent_backward(list);
  return stages;
}

}  // namespace mt
