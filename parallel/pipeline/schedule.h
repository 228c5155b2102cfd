// schedule.h: pipeline schedules as data. A schedule is one instruction list per stage; an executor (with
// the model's stage behind a small interface) runs them. Building and checking them needs no model.
//
// How an executor runs a list (the communication model that check_schedule enforces):
//   * forward / backward (and a split backward's backward_input / backward_weight) are local compute.
//   * A backward_weight does not wait for the batch posted before it: the batch's transfers stay in flight while
//     the weight gradients are computed (that is how a zero-bubble schedule fills its waits), and are waited for
//     before the next forward or backward.
//   * Every maximal run of consecutive recv_* / send_* instructions is ONE batch: the executor posts all of
//     its operations together (isend / irecv, as Megatron's batch_isend_irecv or an NCCL group) and waits
//     for all of them before the next compute. The run in 1F1B's steady state, send_forward(k) then
//     recv_backward(i), is Megatron's send_forward_recv_backward.
//   * Sends are rendezvous: a send completes only once its receiver has posted the matching receive (the
//     NCCL behaviour for activation-sized messages). A schedule that runs under this strict model also runs
//     where sends are buffered (Gloo, or an executor that waits on send handles only at the flush).
//   * Messages carry a tag (from stage, to stage, direction, microbatch, chunk), and the tags must match. But
//     NCCL send/recv has no tags: between two ranks it pairs the k-th send with the k-th receive. So the
//     schedules must also agree on ORDER: for every (sender stage, receiver stage) pair, the order in which the
//     sender posts its sends to that receiver equals the order in which the receiver posts its receives from
//     it. Forward activations and backward gradients share that one ordered channel (with p = 2 a stage's
//     next and previous stage are the same rank), and transfers inside one batch are ordered by their
//     position in the batch. Activations and gradients have the same shape, so a swap would not fail: it
//     would silently deliver the wrong tensor.
// So an executor that issued each instruction as its own blocking call would deadlock on 1F1B; one that
// batches adjacent communication instructions runs every schedule build_schedule makes.
//
// ZB-V runs under a second model, waits on use (waits_on_use): a batch does not hold up the next compute. A
// compute waits only when it consumes a received tensor, and then for the batch that brought it and every batch
// posted before it (NCCL runs a rank's groups in order on one stream, so a later group completes after the earlier
// ones, sends included); the rest are waited for at the end. Its transfers run in lock step (each message posted at
// both ends after the slot that made it), so every rank posts the same messages in the same order of slots and the
// waits follow the data only.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "core/base/enum_names.h"

namespace mt {

enum class PipeOp {
  recv_forward,   // receive the input activation of (microbatch, chunk) from the previous stage
  forward,        // run forward of (microbatch, chunk)
  send_forward,   // send its output activation to the next stage
  recv_backward,  // receive the gradient of its output from the next stage
  backward,       // run backward of (microbatch, chunk): the input gradient and the weight gradients
  send_backward,  // send the gradient of its input to the previous stage
  // A backward split in two (zero-bubble schedules): B, the input gradient (which send_backward then sends), and
  // W, the weight gradients, any time later.
  backward_input,
  backward_weight,
};
template <>
struct EnumNames<PipeOp> {
  static constexpr std::array names{"recv_forward", "forward",       "send_forward",   "recv_backward",
                                    "backward",     "send_backward", "backward_input", "backward_weight"};
};
std::string pipe_op_name(PipeOp op);
bool is_communication(PipeOp op);   // recv_* and send_*: these batch with their neighbours (see above)
bool is_backward_input(PipeOp op);  // backward or backward_input: what send_backward sends comes from it

struct PipeInstr {
  PipeOp op;
  int microbatch = 0;
  int chunk = 0;  // model chunk (virtual stage) on this rank, 0 .. v-1
  bool operator==(const PipeInstr&) const = default;
};
std::string to_string(const PipeInstr& instr);  // "send_forward(mb 3, chunk 1)"

// forward_only: evaluation, a forward of every (microbatch, chunk) on every stage and no backward.
enum class ScheduleKind { no_pipelining, one_f_one_b, interleaved, forward_only, zb_h1, zb_v };
template <>
struct EnumNames<ScheduleKind> {
  static constexpr std::array names{"no_pipelining", "one_f_one_b", "interleaved", "forward_only", "zb_h1", "zb_v"};
};
std::string schedule_kind_name(ScheduleKind kind);
// Whether the kind's lists split backwards into B and W (the zero-bubble schedules).
inline bool splits_backward(ScheduleKind kind) { return kind == ScheduleKind::zb_h1 || kind == ScheduleKind::zb_v; }

// Where a rank's model chunks sit in the model. looped (Megatron's interleaving): chunk c of stage s is virtual
// stage c * p + s. v_shape (ZB-V, v = 2): chunk 0 of stage s is virtual stage s and chunk 1 is 2p - 1 - s, so stage
// 0 holds the first and the last virtual stage and the turn at the bottom of the V (virtual stages p - 1 and p)
// stays on stage p - 1: no transfer crosses it.
enum class ChunkPlacement { looped, v_shape };
ChunkPlacement chunk_placement(ScheduleKind kind);
// Whether the executor waits for a batch of transfers only when a compute consumes what it received (above).
bool waits_on_use(ScheduleKind kind);
struct StageChunk {
  int stage = 0;
  int chunk = 0;
  bool operator==(const StageChunk&) const = default;
};
int virtual_stage(ChunkPlacement placement, int stages, StageChunk at);
StageChunk stage_chunk(ChunkPlacement placement, int stages, int virtual_stage);
// The chunk of `at.stage` that holds virtual stage virtual_stage(at) + step, when that neighbour sits on the same stage
// (the turn of a V: the output or input gradient is handed over there, with no transfer); nothing when it is on
// another stage or past either end of the stages * chunks virtual stages.
std::optional<int> local_neighbour(ChunkPlacement placement, int stages, int chunks, StageChunk at, int step);

// What one microbatch's compute costs on a stage, for the simulator (a chunk's share is 1/v of it): a whole
// backward costs backward_input + backward_weight. The defaults are the paper's equal F, B and W costs.
struct ScheduleCosts {
  double forward = 1;
  double backward_input = 1;   // B: the input gradient
  double backward_weight = 1;  // W: the weight gradients
};

// What a (microbatch, chunk) pair holds on its stage, per virtual stage, in units of what a chunk of layers' forward
// keeps: forwarded, forward[vs]; through its B and waiting for its W, forward[vs] + backward_input[vs] (B frees what
// W does not read and keeps the linears' inputs and output gradients: about nothing more on the CPU, a quarter more
// with fused attention, whose forward keeps little; the head's chunk keeps its logits). zb_v bounds its pairs' sum by
// 2p, 1F1B's first stage's p microbatches of two chunks. Empty: every pair 1 and 0 (pairs counted).
struct ScheduleMemory {
  std::vector<double> forward, backward_input;
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1;        // p
  int microbatches = 1;  // m
  int chunks = 1;        // v (virtual stages per rank); > 1 only for interleaved, forward_only and zb_v (2)
  // Where the chunks sit: looped, or v_shape for zb_v (and for forward_only when evaluating a zb_v model).
  ChunkPlacement placement = ChunkPlacement::looped;
  // The costs zb_v times its list schedule with (the others do not depend on costs).
  ScheduleCosts costs;
  ScheduleMemory memory;  // what zb_v bounds (the others do not depend on it)
};

// The instruction list of every stage. Layer chunk c of stage s is global virtual stage c * p + s (Megatron's
// interleaving): the output of chunk c on the last stage feeds chunk c + 1 on stage 0.
//   no_pipelining (p = 1): forward, backward per microbatch.
//   one_f_one_b: min(p - s - 1, m) warmup forwards, steady 1F1B, cooldown backwards (Megatron, PipeDream-Flush).
//   interleaved: Megatron's interleaved 1F1B; microbatches pass chunk 0 in groups of p, then chunk 1, ...;
//     warmup min(2 (p - s - 1) + (v - 1) p, m v) forwards (Megatron's count; we skip Megatron's special case
//     that runs all m v forwards first when m == p: it is not needed here and holds more activations).
//     Inside each batch: the sends, then the receives, the forward direction first in each. With p = 2 the two
//     ranks share one channel each way for activations and gradients, and this order posts them the same way
//     at both ends (check_schedule's per-pair order check passes over the tests' whole grid).
//   zb_h1 (v = 1): Qi et al.'s ZB-H1. 1F1B's forwards and backwards with each backward split into B and W;
//     stage s > 0 holds back its weight gradients by s - 1 microbatches (W of microbatch j after the B of microbatch
//     j + s - 1), each released W placed after the next compute's receives so it runs while they are in flight, and
//     the last after the stage's last B, where 1F1B's stage s idles waiting on the stages before it. The memory
//     bound: a B keeps W's operands (each linear's input and output gradient, about as many bytes as the
//     activations it frees) and peaks above a whole backward while it gathers them, so a split B starts with at most
//     p - 1 microbatches forwarded and not through W (itself included); 1F1B's first stage holds p at its whole
//     backwards. The paper's hold of s would start every steady B with p held and peak a B's extra above 1F1B's
//     first stage. A B that would start with p held runs the oldest waiting W first, or with none waiting runs whole
//     (the first stage's first cooldown B). With equal F, B and W costs the bubble is p / (3 m): the paper's
//     (p - 1) / (3 m), a third of 1F1B's, and one W more ((p - 1) (F + B - W) + W for m >= p).
//   zb_v (v = 2, v_shape placement): Qi et al.'s ZB-V. A list schedule timed with the spec's costs (each chunk's F, B
//     or W takes its cost / 2), decided at each op's end: every free stage runs, in order of preference, a B whose
//     output gradient has arrived (oldest microbatch first), an F (chunk 1's first: it leads to the loss), a W (oldest
//     first). Its memory bound is 1F1B's first stage's p microbatches, 2p (microbatch, chunk) pairs of half a stage
//     each, weighed by the spec's ScheduleMemory (a pair forwarded holds forward[vs], through its B forward[vs] +
//     backward_input[vs]; unweighed, 1 both): a stage holds at most 2p; a B splits only if what is held with it after
//     it is at most 2p - 1 (a B keeps W's operands and peaks above a whole backward), else it runs the oldest waiting W
//     first, else whole; and a whole backward that starts with more than 2p - 1 held has no other tensor of the
//     pipeline beside it (no receive posted for a later compute, no send not yet waited for, no output the turn hands
//     on), since there it peaks at 1F1B's first stage. A deterministic search picks the list's knobs per stage (pairs
//     kept free for chunk 1's forwards, a cap of 2p or 2p - 1, when a waiting W runs before a forward, how many W's
//     wait, whether the 2p-th pair needs a W waiting) for the shortest makespan check_schedule gives; with equal costs
//     it reaches the bound of a stage's (p - 1) idle slots while the first microbatch reaches it, a bubble of (p - 1) /
//     (6 m), a sixth of 1F1B's. The transfers run in lock step: after each op a stage posts the sends of what it just
//     computed and the receives of what its neighbours computed meanwhile, so both ends post every message in the same
//     order; it runs under waits on use (above), so a stage waits only for what it consumes.
//   In both zero-bubble lists a B whose W comes right after it (no transfer or other compute between them) runs with
//     it as one whole backward: the split would gain no overlap, and B keeps W's operands (each linear's input and
//     output gradient) until W where a whole backward frees each layer's as it goes. ZB-H1's first stage thus runs
//     1F1B's steady state exactly (at 1F1B's memory) and splits only in its cooldown, after its first cooldown B.
//   forward_only (any p, m, v): recv_forward, forward, send_forward of each (microbatch, chunk), microbatches
//     passing chunk 0 in groups of p (the last group may be smaller), then chunk 1, ... (interleaved's forward
//     order; with v = 1 simply microbatch order). A send_forward and the next recv_forward form one batch
//     (Megatron's send_forward_recv_forward).
// Throws std::invalid_argument naming the field for impossible specs (stages < 1, interleaved with
// m % p != 0, ...).
std::vector<std::vector<PipeInstr>> build_schedule(const ScheduleSpec& spec);

struct ScheduleReport {
  bool ok = false;
  std::string error;  // why not ok: unmatched send, deadlock (which stages wait on what), ...
  // (makespan - ideal) / ideal with ideal = m * (forward + backward) per stage, simulated with a chunk's
  // forward taking 1/v and its backward 2/v (a split one's B and W 1/v each; other ScheduleCosts scale these) and
  // free communication: (p-1)/m for 1F1B, ~(p-1)/(v*m) interleaved, (p-1)/(3m) ZB-H1.
  double bubble_fraction = 0;
  double makespan = 0;  // when the last stage finishes, in the costs' units (default: one microbatch's forward)
  // Most (microbatch, chunk) pairs whose activations one stage holds at once (forwarded, not yet through their
  // whole backward: a split backward's W frees them); for v = 1 that is microbatches, for v > 1 each pair is 1/v
  // of a stage's activations for one microbatch.
  int peak_in_flight = 0;                 // max over stages
  std::vector<int> stage_peak_in_flight;  // per stage
  // Most pairs one stage holds when a split backward (backward_input) starts, itself included (max over stages; 0
  // without one). A B keeps W's operands and peaks above a whole backward while it gathers them, so the zero-bubble
  // lists start one only below 1F1B's count: ZB-H1 with at most p - 1 microbatches, ZB-V with at most 2p - 1 pairs.
  int split_backward_peak_in_flight = 0;
};

// Simulates the schedules under the communication model above and checks: every send has its receive, each
// forward precedes its backward, inputs and output gradients are received before they are used, every
// (microbatch, chunk) runs forward and backward exactly once per stage (forward only, and no backward, for
// forward_only), nothing deadlocks, and, per (sender, receiver) pair of stages, sends and receives are posted
// in the same order (NCCL's pairing). For forward_only the ideal is m forwards per stage and peak_in_flight is
// 0 (no activations are kept for a backward).
// `costs` times the compute (free communication); bubble_fraction and makespan are in its units (the ideal is
// m (forward + backward_input + backward_weight) per stage). megatrain plan prices the pipeline with it.
ScheduleReport check_schedule(const ScheduleSpec& spec, const std::vector<std::vector<PipeInstr>>& schedule,
                              const ScheduleCosts& costs = {});

}  // namespace mt
