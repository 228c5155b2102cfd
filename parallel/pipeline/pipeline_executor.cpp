// pipeline_executor.cpp: execute_pipeline, one stage's instruction list run in order against its chunks.
#include "parallel/pipeline/pipeline_executor.h"

#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/tensor/trace.h"

namespace mt {

namespace {

// A message is named by its direction, microbatch and the virtual stage that receives it, so sender and
// receiver compute the same tag. Gloo matches by it; NCCL ignores it (see execute_pipeline on order).
int message_tag(bool backward, int microbatch, int receiving_virtual_stage, int virtual_stages) {
  return ((microbatch * virtual_stages + receiving_virtual_stage) << 1) | (backward ? 1 : 0);
}

}  // namespace

Tensor PipelineStage::backward_input(int microbatch, int chunk, const Tensor&) {
  throw std::logic_error(
      fmt::format("pipeline: this stage cannot split the backward of microbatch {} chunk {}", microbatch, chunk));
}

void PipelineStage::backward_weight(int microbatch, int chunk) {
  throw std::logic_error(
      fmt::format("pipeline: this stage cannot split the backward of microbatch {} chunk {}", microbatch, chunk));
}

void execute_pipeline(const std::vector<PipeInstr>& program, PipelineStage& stage, const PipelinePlacement& at) {
  const int p = at.stages, vstages = at.stages * at.chunks;
  auto holder = [&](int vs) { return stage_chunk(at.placement, p, vs); };  // the stage and chunk of a virtual stage
  using Key = std::pair<int, int>;                                         // (microbatch, chunk)
  std::map<Key, Tensor> received_act, outputs, received_grad, input_grads;

  struct Pending {
    std::unique_ptr<Work> work;
    Tensor keep_alive;
    std::string what;  // for the timeline: "recv F 3.0", ...
  };
  std::vector<Pending> batch;  // the batch being posted
  auto wait_for = [](std::vector<Pending>& works) {
    if (works.empty()) return;
    std::string what;  // the timeline's name of the wait, only while recording
    if (trace::recording()) {
      std::vector<std::string> names;
      for (const Pending& pending : works) names.push_back(pending.what);
      what = fmt::format("wait {}", fmt::join(names, ", "));
    }
    const trace::Span span("wait", std::move(what));
    for (Pending& pending : works) pending.work->wait();
    works.clear();
  };
  // Waits on use: the batches posted and not yet waited for, oldest first (batch number waited + i), and the batch
  // number that brings each received tensor.
  std::deque<std::vector<Pending>> posted;
  size_t waited = 0;
  std::map<Key, size_t> act_batch, grad_batch;
  auto seal = [&] {
    if (!batch.empty()) posted.push_back(std::move(batch));
    batch.clear();
  };
  auto wait_through = [&](size_t k) {  // batch k and every batch before it
    for (; waited <= k && !posted.empty(); ++waited) {
      wait_for(posted.front());
      posted.pop_front();
    }
  };
  // Before a compute: the batch model waits for the batch just posted; waits on use waits for the batch that brought
  // the tensor the compute consumes (when it came from another stage).
  auto before_compute = [&](const std::map<Key, size_t>& consumed, Key key) {
    if (!at.waits_on_use) return wait_for(batch);
    seal();
    const auto it = consumed.find(key);
    if (it != consumed.end()) wait_through(it->second);
  };
  auto flush = [&] {
    seal();
    if (!posted.empty()) wait_through(waited + posted.size() - 1);
  };
  // The timeline's name of an instruction: "F 3.0" is microbatch 3's forward of chunk 0.
  auto label = [](const char* op, const PipeInstr& in) {
    return trace::recording() ? fmt::format("{} {}.{}", op, in.microbatch, in.chunk) : std::string();
  };
  auto args = [](const PipeInstr& in) {
    return trace::recording() ? fmt::format(R"("microbatch": {}, "chunk": {})", in.microbatch, in.chunk)
                              : std::string();
  };
  auto take = [](std::map<Key, Tensor>& m, Key k, const char* what) {
    auto it = m.find(k);
    if (it == m.end())
      throw std::logic_error(fmt::format("pipeline: no {} for microbatch {} chunk {}", what, k.first, k.second));
    Tensor t = std::move(it->second);
    m.erase(it);
    return t;
  };

  // Correctness under NCCL rests on ORDER, not tags: NCCL pairs the k-th send from one rank to another with
  // the k-th receive posted there. This loop posts every send/recv exactly in the program's instruction order
  // (one call per instruction, no reordering, no skipping, batches issued in order), and check_schedule
  // verifies that the schedules' instruction orders agree between every pair of stages. Keep it so: posting
  // a batch's transfers in another order (say all receives first) would swap same-shape activations and
  // gradients between two ranks (p = 2 shares one channel for both) without any error.
  for (const PipeInstr& in : program) {
    const Key key{in.microbatch, in.chunk};
    const int vs = virtual_stage(at.placement, p, {at.stage, in.chunk});  // this chunk's virtual stage
    switch (in.op) {
      case PipeOp::recv_forward: {
        const trace::Span span("p2p", label("post recv F", in), args(in));
        Tensor buf = Tensor::empty(stage.activation_shape(), stage.activation_dtype(), stage.activation_device());
        batch.push_back({at.comm->recv(buf, holder(vs - 1).stage, message_tag(false, in.microbatch, vs, vstages)), buf,
                         label("recv F", in)});
        received_act[key] = buf;
        act_batch[key] = waited + posted.size();  // the number the batch being posted gets
        break;
      }
      case PipeOp::send_forward: {
        const trace::Span span("p2p", label("post send F", in), args(in));
        Tensor out = take(outputs, key, "output to send");
        batch.push_back({at.comm->send(out, holder(vs + 1).stage, message_tag(false, in.microbatch, vs + 1, vstages)),
                         out, label("send F", in)});
        break;
      }
      case PipeOp::recv_backward: {
        const trace::Span span("p2p", label("post recv B", in), args(in));
        Tensor buf = Tensor::empty(stage.activation_shape(), stage.activation_dtype(), stage.activation_device());
        batch.push_back({at.comm->recv(buf, holder(vs + 1).stage, message_tag(true, in.microbatch, vs, vstages)), buf,
                         label("recv B", in)});
        received_grad[key] = buf;
        grad_batch[key] = waited + posted.size();
        break;
      }
      case PipeOp::send_backward: {
        const trace::Span span("p2p", label("post send B", in), args(in));
        Tensor g = take(input_grads, key, "input gradient to send");
        batch.push_back({at.comm->send(g, holder(vs - 1).stage, message_tag(true, in.microbatch, vs - 1, vstages)), g,
                         label("send B", in)});
        break;
      }
      case PipeOp::forward: {
        before_compute(act_batch, key);
        const trace::Span span("compute", label("F", in), args(in));
        Tensor input = vs == 0 ? Tensor() : take(received_act, key, "received activation");
        Tensor out = stage.forward(in.microbatch, in.chunk, input);
        // The next virtual stage on this rank (the turn of a V) takes the output as its input, with no transfer.
        if (const auto next = local_neighbour(at.placement, p, at.chunks, {at.stage, in.chunk}, 1))
          received_act[{in.microbatch, *next}] = out;
        else if (vs + 1 < vstages)
          outputs[key] = out;
        break;
      }
      case PipeOp::backward:
      case PipeOp::backward_input: {
        before_compute(grad_batch, key);
        const bool split = in.op == PipeOp::backward_input;  // "B" either way: the input gradient's path
        const trace::Span span("compute", label("B", in), args(in));
        Tensor grad = vs + 1 == vstages ? Tensor() : take(received_grad, key, "received gradient");
        Tensor din =
            split ? stage.backward_input(in.microbatch, in.chunk, grad) : stage.backward(in.microbatch, in.chunk, grad);
        if (const auto prev = local_neighbour(at.placement, p, at.chunks, {at.stage, in.chunk}, -1))
          received_grad[{in.microbatch, *prev}] = din;
        else if (vs > 0)
          input_grads[key] = din;
        break;
      }
      case PipeOp::backward_weight: {
        // No wait: the transfers posted before it stay in flight while the weight gradients run.
        if (at.waits_on_use) seal();
        const trace::Span span("compute", label("W", in), args(in));
        stage.backward_weight(in.microbatch, in.chunk);
        break;
      }
    }
  }
  flush();
}

}  // namespace mt
