// attention_cudnn_calls.cpp: the calls of cuDNN's fused attention (attention_cudnn.h): the pointers each graph of
// attention_cudnn.cpp runs on (strided views into qkv, the queries gathered when R > 1), for whole sequences and for
// context-parallel ring blocks, and what is refused before any graph is built. The layout is described at the top
// of attention_cudnn.cpp.
#include "core/cuda/attention_cudnn.h"

#if defined(MEGATRAIN_WITH_CUDNN)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda/attention_cudnn_detail.h"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/runtime.h"

namespace mt::cuda {

using namespace cudnn_detail;  // NOLINT(google-build-using-namespace): the graphs

namespace {

// cuDNN's kernels load q, k, v, o with 16-byte vectors and the frontend refuses other pointers at execute time:
// a misaligned view (a slice at an odd offset) goes to the kernel instead.
std::string misaligned(std::initializer_list<std::pair<const char*, const void*> > ptrs) {
  for (const auto& [name, p] : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return fmt::format("{} is not 16-byte aligned", name);
  return "";
}

// Shape and dtype conditions checked before any graph is built.
std::string refuse_early(const Tensor& qkv) {
  if (qkv.dtype() != DType::bf16 && qkv.dtype() != DType::f16)
    return fmt::format("cuDNN's fused attention takes bf16 or fp16, not {}", dtype_name(qkv.dtype()));
  if (qkv.dim(4) % 8 != 0)
    return fmt::format("head dimension D = {} is not a multiple of 8 (cuDNN needs 16-byte aligned rows)", qkv.dim(4));
  return "";
}

Key key_of(const Tensor& qkv, bool backward, bool causal, int64_t window) {
  Key k{backward,   qkv.dtype(), qkv.dim(0),
        qkv.dim(1), qkv.dim(2),  qkv.dim(3) - 2,
        qkv.dim(4), causal,      !backward || cudnn_backward_deterministic()};
  k.window = window;
  return k;
}

// The sliding window of a whole sequence's call: one of T keys or more binds nothing (query i sees i + 1 <= T keys
// anyway), so it is none and shares the windowless graph.
int64_t binding_window(int64_t window, int64_t T) { return window > 0 && window < T ? window : 0; }

// cuDNN's fused SDPA masks a sliding window (the frontend's diagonal band left bound, SDPA_attributes::
// set_diagonal_band_left_bound) from cuDNN 9.2.0 on; the frontend's validate() refuses what a later version lacks.
std::string refuse_window(int64_t window) {
  const int64_t v = cudnn_runtime_version();
  if (window > 0 && v < 90200)
    return fmt::format("a sliding window (window {}) needs cuDNN 9.2.0 or later, this is cuDNN {}", window, v);
  return "";
}

// R > 1: the query slots of qkv (B, T, G, R + 2, D) and a contiguous (B, T, H, D) buffer are B T G rows of R D
// elements, (R + 2) D apart in qkv and R D apart in the buffer: one strided 2-D copy each way.
struct QuerySlots {
  size_t rows, row_bytes, qkv_pitch;
  explicit QuerySlots(const Tensor& qkv) {
    const size_t es = dtype_size(qkv.dtype());
    const int64_t R = qkv.dim(3) - 2, D = qkv.dim(4);
    rows = static_cast<size_t>(qkv.dim(0) * qkv.dim(1) * qkv.dim(2));
    row_bytes = static_cast<size_t>(R * D) * es;
    qkv_pitch = static_cast<size_t>((R + 2) * D) * es;
  }
};

// A (B, T, H, D) buffer of qkv's dtype on the device (the queries or their gradient when R > 1).
Tensor query_buffer(const Tensor& qkv) {
  return Tensor::empty({qkv.dim(0), qkv.dim(1), qkv.dim(2) * (qkv.dim(3) - 2), qkv.dim(4)}, qkv.dtype(), Device::cuda,
                       MemKind::workspace);
}

// q (B, T, H, D) := the query slots of qkv.
void gather_queries(const Tensor& qkv, Tensor& q) {
  const QuerySlots s(qkv);
  copy_2d(q.raw(), s.row_bytes, qkv.raw(), s.qkv_pitch, s.row_bytes, s.rows);
}

// The query slots of dqkv := dq (B, T, H, D).
void scatter_query_grads(const Tensor& dq, Tensor& dqkv) {
  const QuerySlots s(dqkv);
  copy_2d(dqkv.raw(), s.qkv_pitch, dq.raw(), s.row_bytes, s.row_bytes, s.rows);
}

}  // namespace

std::string cudnn_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, bool causal, int64_t window) {
  if (std::string why = refuse_early(qkv); !why.empty()) return why;
  window = binding_window(window, qkv.dim(1));
  if (std::string why = refuse_window(window); !why.empty()) return why;
  const int64_t R = qkv.dim(3) - 2, D = qkv.dim(4);
  char* base = static_cast<char*>(qkv.raw());
  const size_t es = dtype_size(qkv.dtype());
  void *k = base + R * D * es, *v = base + (R + 1) * D * es;
  if (std::string why = misaligned({{"qkv", base}, {"out", out.raw()}, {"lse", lse.raw()}}); !why.empty()) return why;
  const PlannedGraph plan = plan_for(key_of(qkv, false, causal, window));
  if (!plan.refused.empty()) return plan.refused;
  Tensor q_buf;  // R > 1: the queries gathered (B, T, H, D); freed after the enqueue, reused in stream order
  void* q = base;
  if (R > 1) {
    q_buf = query_buffer(qkv);
    gather_queries(qkv, q_buf);
    q = q_buf.raw();
  }
  std::unordered_map<int64_t, void*> pack{{kQ, q}, {kK, k}, {kV, v}, {kO, out.raw()}, {kStats, lse.raw()}};
  execute(plan, pack, "attention_forward");
  return "";
}

std::string cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     Tensor& dqkv, bool causal, int64_t window) {
  if (std::string why = refuse_early(qkv); !why.empty()) return why;
  window = binding_window(window, qkv.dim(1));
  if (std::string why = refuse_window(window); !why.empty()) return why;
  const int64_t R = qkv.dim(3) - 2, D = qkv.dim(4);
  const size_t es = dtype_size(qkv.dtype());
  char* base = static_cast<char*>(qkv.raw());
  char* dbase = static_cast<char*>(dqkv.raw());
  if (std::string why =
          misaligned({{"qkv", base}, {"out", out.raw()}, {"lse", lse.raw()}, {"dout", dout.raw()}, {"dqkv", dbase}});
      !why.empty())
    return why;
  const PlannedGraph plan = plan_for(key_of(qkv, true, causal, window));
  if (!plan.refused.empty()) return plan.refused;
  Tensor q_buf, dq_buf;  // R > 1: the gathered queries and their gradient (B, T, H, D)
  void *q = base, *dq = dbase;
  if (R > 1) {
    q_buf = query_buffer(qkv);
    dq_buf = query_buffer(qkv);
    gather_queries(qkv, q_buf);
    q = q_buf.raw();
    dq = dq_buf.raw();
  }
  std::unordered_map<int64_t, void*> pack{{kQ, q},         {kK, base + R * D * es},   {kV, base + (R + 1) * D * es},
                                          {kO, out.raw()}, {kDO, dout.raw()},         {kStats, lse.raw()},
                                          {kDQ, dq},       {kDK, dbase + R * D * es}, {kDV, dbase + (R + 1) * D * es}};
  execute(plan, pack, "attention_backward");
  if (R > 1) scatter_query_grads(dq_buf, dqkv);
  return "";
}

// ---- context-parallel ring blocks ------------------------------------------------------------------------------

namespace {

// A local sequence's rows as runs of consecutive positions: one, or two when the positions jump at split_at.
struct PositionRun {
  int64_t row0, rows, pos0;
  int64_t last() const { return pos0 + rows - 1; }
};
std::vector<PositionRun> runs_of(const SequencePositions& p, int64_t n) {
  if (p.split_at > 0 && p.split_at < n)
    return {{0, p.split_at, p.position_offset}, {p.split_at, n - p.split_at, p.split_position}};
  return {{0, n, p.position_offset}};
}

}  // namespace

CudnnBlock cudnn_block_of(int64_t Tq, int64_t Tk, const AttentionBlockOptions& opt, std::string* why) {
  why->clear();
  if (!opt.causal) return {0, Tq, 0, Tk, false};  // a window needs causal attention (the op checks it)
  const std::vector<PositionRun> qr = runs_of(opt.q, Tq), kr = runs_of(opt.k, Tk);
  // A window binds no visible pair when the latest query lies within it of the earliest key (a visible key is at
  // most that far behind its query): then it is none, and every call below is the windowless one.
  int64_t q_last = qr[0].last(), k_first = kr[0].pos0;
  for (const PositionRun& q : qr) q_last = std::max(q_last, q.last());
  for (const PositionRun& k : kr) k_first = std::min(k_first, k.pos0);
  const int64_t window = opt.window > 0 && q_last - k_first >= opt.window ? opt.window : 0;
  // The same positions on both sides (a rank's own block), in increasing order: causal over local rows is causal
  // over positions.
  const bool same = Tq == Tk && qr.size() == kr.size() &&
                    std::equal(qr.begin(), qr.end(), kr.begin(), [](const PositionRun& a, const PositionRun& b) {
                      return a.row0 == b.row0 && a.rows == b.rows && a.pos0 == b.pos0;
                    });
  if (same) {
    if (qr.size() == 2 && qr[1].pos0 <= qr[0].last()) {
      *why = "a block whose second chunk lies before its first";
      return {};
    }
    // A band over local rows is the window over positions only where rows are consecutive positions.
    if (window > 0 && qr.size() == 2 && qr[1].pos0 != qr[0].last() + 1) {
      *why =
          fmt::format("a sliding window (window {}) over a block whose chunks are not consecutive positions", window);
      return {};
    }
    return {0, Tq, 0, Tk, true, window};
  }
  // Otherwise every (query run, key run) pair must be wholly visible or wholly hidden (later keys, or keys before
  // every query's window), and the query runs that see any key must see the same keys: one full (non-causal) call.
  int64_t q0 = -1, q1 = -1, k0 = -1, k1 = -1;
  for (const PositionRun& q : qr) {
    int64_t lo = -1, hi = -1;  // the key rows this query run sees
    for (const PositionRun& k : kr) {
      const bool hidden = k.pos0 > q.last() || (window > 0 && k.last() <= q.pos0 - window);
      if (hidden) continue;
      const bool whole = k.last() <= q.pos0 && (window == 0 || k.pos0 > q.last() - window);
      if (!whole) {
        *why = fmt::format("key positions [{}, {}] are partly visible to query positions [{}, {}]{}", k.pos0, k.last(),
                           q.pos0, q.last(), window > 0 ? fmt::format(" (window {})", window) : "");
        return {};
      }
      if (lo < 0) lo = k.row0;
      hi = k.row0 + k.rows;
    }
    if (lo < 0) continue;
    if (k0 >= 0 && (lo != k0 || hi != k1)) {
      *why = "query chunks that see different key chunks (two cuDNN calls)";
      return {};
    }
    k0 = lo;
    k1 = hi;
    if (q0 < 0) q0 = q.row0;
    q1 = q.row0 + q.rows;
  }
  if (q0 < 0) return {};  // no query sees a key of this block
  return {q0, q1 - q0, k0, k1 - k0, false};
}

namespace {

Key block_key(const Tensor& qkv, const Tensor& kv, const CudnnBlock& blk, bool backward) {
  Key k = key_of(qkv, backward, blk.causal, blk.window);
  k.block = true;
  k.q_rows = blk.q_rows;
  k.Tk = kv.dim(1);
  k.k_rows = blk.k_rows;
  return k;
}

// Why this block cannot go to cuDNN before any graph: the dtype and head dimension, the dropout (cuDNN's own
// Philox stream is not megatrain's layout-invariant mask), and a chunk pair one call cannot express.
std::string refuse_block(const Tensor& qkv, const Tensor& kv, const AttentionBlockOptions& opt, CudnnBlock& blk) {
  if (std::string why = refuse_early(qkv); !why.empty()) return why;
  if (opt.dropout_p != 0.f) return fmt::format("dropout {:g} needs layout-invariant masks", opt.dropout_p);
  std::string why;
  blk = cudnn_block_of(qkv.dim(1), kv.dim(1), opt, &why);
  if (why.empty()) why = refuse_window(blk.window);
  // The call's rows start inside the tensors: at multiples of D elements (16 bytes, D a multiple of 8) except the
  // f32 Stats, at q0 floats.
  if (why.empty() && blk.q0 % 4 != 0)
    why = fmt::format("the block's first query row {} leaves its Stats rows not 16-byte aligned", blk.q0);
  return why;
}

}  // namespace

std::string cudnn_attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                          const AttentionBlockOptions& opt) {
  CudnnBlock blk;
  if (std::string why = refuse_block(qkv, kv, opt, blk); !why.empty()) return why;
  if (std::string why = misaligned({{"qkv", qkv.raw()}, {"kv", kv.raw()}, {"out", out.raw()}, {"lse", lse.raw()}});
      !why.empty())
    return why;
  if (blk.empty()) {  // no row sees a key of this block: out 0, lse -inf (what the merge leaves alone)
    out.zero_();
    cuda::fill_(lse, -INFINITY);
    return "";
  }
  const PlannedGraph plan = plan_for(block_key(qkv, kv, blk, false));
  if (!plan.refused.empty()) return plan.refused;
  const int64_t T = qkv.dim(1), G = qkv.dim(2), R = qkv.dim(3) - 2, D = qkv.dim(4), H = G * R;
  const size_t es = dtype_size(qkv.dtype());
  Tensor o = query_buffer(qkv);  // cuDNN's O (B, T, H, D) in qkv's dtype, widened into out after the call
  if (blk.q_rows < T) {
    o.zero_();
    cuda::fill_(lse, -INFINITY);
  }
  Tensor q_buf;  // R > 1: the queries gathered (B, T, H, D)
  char* q = static_cast<char*>(qkv.raw()) + blk.q0 * G * (R + 2) * D * es;
  if (R > 1) {
    q_buf = query_buffer(qkv);
    gather_queries(qkv, q_buf);
    q = static_cast<char*>(q_buf.raw()) + blk.q0 * H * D * es;
  }
  char* k = static_cast<char*>(kv.raw()) + blk.k0 * G * 2 * D * es;
  std::unordered_map<int64_t, void*> pack{{kQ, q},
                                          {kK, k},
                                          {kV, k + D * es},
                                          {kO, static_cast<char*>(o.raw()) + blk.q0 * H * D * es},
                                          {kStats, lse.data<float>() + blk.q0}};
  execute(plan, pack, "attention_block_forward");
  out.copy_from(o);
  return "";
}

std::string cudnn_attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                           const Tensor& dout, Tensor& dq, Tensor& dkv,
                                           const AttentionBlockOptions& opt) {
  CudnnBlock blk;
  if (std::string why = refuse_block(qkv, kv, opt, blk); !why.empty()) return why;
  if (std::string why = misaligned({{"qkv", qkv.raw()},
                                    {"kv", kv.raw()},
                                    {"out", out.raw()},
                                    {"lse", lse.raw()},
                                    {"dout", dout.raw()},
                                    {"dq", dq.raw()},
                                    {"dkv", dkv.raw()}});
      !why.empty())
    return why;
  if (blk.empty()) return "";  // nothing of this block reaches a query
  const PlannedGraph plan = plan_for(block_key(qkv, kv, blk, true));
  if (!plan.refused.empty()) return plan.refused;
  const int64_t B = qkv.dim(0), T = qkv.dim(1), G = qkv.dim(2), R = qkv.dim(3) - 2, D = qkv.dim(4), H = G * R;
  const size_t es = dtype_size(qkv.dtype());
  // The call's Stats rows, packed (B, H, q_rows) when they are not all of lse's (stats_strides).
  float* stats = static_cast<float*>(lse.raw()) + blk.q0;
  Tensor stats_buf;
  if (blk.q_rows < T) {
    stats_buf = Tensor::empty({B * H * blk.q_rows}, DType::f32, Device::cuda, MemKind::workspace);
    const size_t row = static_cast<size_t>(blk.q_rows) * sizeof(float);
    copy_2d(stats_buf.raw(), row, stats, static_cast<size_t>(T) * sizeof(float), row, static_cast<size_t>(B * H));
    stats = stats_buf.data<float>();
  }
  Tensor q_buf;
  const char* q = static_cast<const char*>(qkv.raw()) + blk.q0 * G * (R + 2) * D * es;
  if (R > 1) {
    q_buf = query_buffer(qkv);
    gather_queries(qkv, q_buf);
    q = static_cast<const char*>(q_buf.raw()) + blk.q0 * H * D * es;
  }
  // cuDNN writes dQ, dK, dV in qkv's dtype: into zeroed buffers, widened and added to the f32 accumulators after.
  Tensor dq_io = query_buffer(qkv), dkv_io = Tensor::empty(kv.shape(), kv.dtype(), Device::cuda, MemKind::workspace);
  dq_io.zero_();
  dkv_io.zero_();
  const char* k = static_cast<const char*>(kv.raw()) + blk.k0 * G * 2 * D * es;
  char* dk = static_cast<char*>(dkv_io.raw()) + blk.k0 * G * 2 * D * es;
  const int64_t row = blk.q0 * H * D * es;  // byte offset of the call's first query row in (B, T, H, D)
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<char*>(q)},
                                          {kK, const_cast<char*>(k)},
                                          {kV, const_cast<char*>(k + D * es)},
                                          {kO, static_cast<char*>(out.raw()) + row},
                                          {kDO, static_cast<char*>(dout.raw()) + row},
                                          {kStats, stats},
                                          {kDQ, static_cast<char*>(dq_io.raw()) + row},
                                          {kDK, dk},
                                          {kDV, dk + D * es}};
  execute(plan, pack, "attention_block_backward");
  Tensor wide = Tensor::empty(dq.shape(), DType::f32, Device::cuda, MemKind::workspace);
  wide.copy_from(dq_io);
  cuda::add(dq, wide, dq);
  Tensor wide_kv = Tensor::empty(dkv.shape(), DType::f32, Device::cuda, MemKind::workspace);
  wide_kv.copy_from(dkv_io);
  cuda::add(dkv, wide_kv, dkv);
  return "";
}

}  // namespace mt::cuda

#endif  // MEGATRAIN_WITH_CUDNN
