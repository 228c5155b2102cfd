// fp8_linear.h: the scaling state of the fp8 GEMMs of the tensor-parallel linear layers (docs/fp8.md).
//
// Each fp8 linear has three scaled operands, its input x, its weight W and its output gradient dY: x and W in
// e4m3, dY in e4m3 (format e4m3) or e5m2 (hybrid). Its three GEMMs take them in fp8: y = x W^T, dx = dY W and
// dW = dY^T x, each accumulating in fp32 and writing bf16 (the weight gradient f32), the scales applied once to the
// sum (gemm_fp8). Biases, activations, norms and everything else stay bf16, the masters fp32.
//
// Scales are layout-invariant:
// - An operand's amax is that of the whole logical tensor: the amax of a tensor-parallel shard (a row-parallel
//   input, any weight, a column-parallel output gradient) is max-all-reduced over the tensor-parallel group; a
//   sequence-parallel input is gathered whole before its GEMM, so its amax is whole already.
// - current: every GEMM's operands are scaled by their own amax, so one microbatch is quantised alike in every
//   layout (the microbatches are the same samples in every layout).
// - delayed: the scales come from the amax history of earlier iterations only. During an iteration each operand
//   records the max of its amaxes over the rank's microbatches; at the iteration's end (step()) those are
//   max-all-reduced over the tensor-parallel and data-parallel groups, so the history entry is the max over every
//   microbatch of the global batch, whatever the layout, and the new scales apply from the next iteration. The
//   first iteration, with an empty history, scales currently (nothing earlier exists).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor/parameter.h"
#include "core/tensor/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

struct Fp8Options {
  DType grad_dtype = DType::e4m3;  // dY's format: e4m3, or e5m2 for the hybrid format
  bool delayed = false;            // the delayed recipe (else current scaling)
  int64_t history_len = 1024;      // delayed: entries of the amax history
  bool use_max = true;             // delayed: the history's max (else the newest entry)
  int margin = 0;                  // scale = fp8_max / amax / 2^margin
};

// The operands of one linear, by index within it.
enum class Fp8Operand { input = 0, weight = 1, grad_output = 2 };

// A tensor in fp8 and the scale_inv that dequantises it (q * scale_inv ~ the tensor).
struct Fp8Tensor {
  Tensor q;          // as stored (R, C), when asked for
  Tensor scale_inv;  // (1) f32 on the device
  Tensor qt;         // its transpose (C, R), when asked for
};

// The layouts of a cast (Fp8Context::quantize): the fp8 GEMMs take their operands only in the TN form (y = x W^T
// reads x and W as stored, dx = dY W reads W^T, dW = dY^T x reads dY^T and x^T), so each linear asks for the layouts
// its GEMMs read, and a matrix wanted in both is cast and transposed in one pass (fp8_quantize_transpose).
enum class Fp8Layout { rows, transposed, both };

// The fp8 state of the linears of one rank (all its model chunks): per operand a scale, its inverse, the
// iteration's running amax and (delayed) the amax history, in one buffer each on the device.
class Fp8Context {
 public:
  Fp8Context(const Fp8Options& opt, Device device);

  // Registers a linear named `name` (its weight is <name>.weight) before allocate(); returns its id.
  int add(const std::string& name);
  void allocate();  // once, after every add

  // t in fp8 as operand `which` of linear `id`. `sharded`: t is this rank's shard of a tensor split over `tp`
  // (its amax is max-reduced over the group for current scaling). An input or output gradient is also a shard of
  // the sequence over the context group, when there is one (set_context_group): its amax is reduced there too. While recording (training, not evaluation),
  // the delayed recipe's running amax takes t's.
  // `layout`: q, qt or both (t a matrix for the transposed layouts).
  Fp8Tensor quantize(int id, Fp8Operand which, const Tensor& t, bool sharded, const TensorParallel& tp,
                     Fp8Layout layout = Fp8Layout::rows) const;
  void set_recording(bool on) { recording_ = on; }
  // Context parallelism: the group whose ranks hold the other chunks of every sequence (null or one rank: none).
  void set_context_group(Communicator* cp) { cp_ = cp && cp->size() > 1 ? cp : nullptr; }
  bool recording() const { return recording_; }

  // The end of a training iteration (delayed recipe; nothing for current): the running amaxes max-reduced over
  // `tp`, the context group and `dp` (either null for one rank), pushed into the history, the scales updated, the
  // running amaxes zeroed.
  void step(Communicator* tp, Communicator* dp);

  // Bumped by every step(): the weights may have changed, so the linears' cached fp8 weights are stale.
  int64_t generation() const { return generation_; }
  // Linear `id`'s weight w in fp8, cast once per iteration (the weights change only at the step, and within an
  // iteration its scale is fixed: the delayed one by design, the current one by the unchanged weight), as Transformer
  // Engine caches it over the microbatches: both layouts, in one pass (the forward reads W, the backward W^T).
  // `sharded`: a tensor-parallel shard.
  const Fp8Tensor& weight(int id, const Tensor& w, bool sharded, const TensorParallel& tp) const;
  // Drops the cached casts of those of `params` that are a registered linear's weight (<name>.weight): ZeRO-3
  // releases a unit's weights after it computes, and their casts go with them (cast again, to the same values, when
  // the unit is gathered again: the same weights under the same scale).
  void drop_weights(const std::vector<Parameter*>& params);
  const Fp8Options& options() const { return opt_; }
  bool delayed_scales_ready() const { return opt_.delayed && filled_ > 0; }
  // Checkpoint state, layout-free: per linear its (3) scales and (3, H) histories (the same on every rank that
  // holds the linear), and the number of history entries so far (at most H).
  const std::vector<std::string>& names() const { return names_; }
  Tensor scales(int id) const;     // (3) f32 view
  Tensor histories(int id) const;  // (3, H) f32 view
  int64_t filled() const { return filled_; }
  // Restores linear `id`'s scales and histories (host tensors of scales()'s and histories()' shapes) and the
  // history count; scale_inv follows the scales.
  void restore(int id, const Tensor& scales, const Tensor& histories);
  void set_filled(int64_t filled);

 private:
  int index(int id, Fp8Operand which) const { return 3 * id + static_cast<int>(which); }
  DType dtype_of(Fp8Operand which) const { return which == Fp8Operand::grad_output ? opt_.grad_dtype : DType::e4m3; }

  Fp8Options opt_;
  Device device_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, int> weight_ids_;  // <name>.weight -> id
  struct WeightCast {
    Fp8Tensor cast;
    int64_t generation = -1;  // of the cast; -1: none kept (dropped, or made by an evaluation)
  };
  mutable std::vector<WeightCast> weights_;  // by id (weight())
  bool recording_ = true;
  Communicator* cp_ = nullptr;  // the context group (set_context_group)
  int64_t generation_ = 0;
  int64_t filled_ = 0;                  // delayed: iterations pushed into the histories (at most history_len)
  Tensor scale_, scale_inv_;            // (n) f32, n = 3 * linears
  Tensor amax_;                         // (n) f32: the iteration's running amaxes (delayed)
  Tensor history_;                      // (n, H) f32 (delayed)
  Tensor fp8_max_;                      // (n) f32: each operand's format's largest finite value
  Tensor fp8_max_e4m3_, fp8_max_grad_;  // (1) f32: the same for one current-scaled tensor
};

// A linear's link to its context (parallel_linear.h): null context when the linear runs in bf16.
struct Fp8Link {
  std::shared_ptr<Fp8Context> ctx;
  int id = -1;
  explicit operator bool() const { return ctx != nullptr; }
  // The weight in fp8 (Fp8Context::weight).
  const Fp8Tensor& weight(const Tensor& w, bool sharded, const TensorParallel& tp) const {
    return ctx->weight(id, w, sharded, tp);
  }
};

}  // namespace mt
