// attention_cudnn.cpp: causal attention forward and backward through cuDNN's fused SDPA (flash attention), built
// with the header-only cuDNN frontend's graph API. The only file that includes cudnn_frontend.h (compiled by
// the host compiler, once).
//
// Layout: qkv (B, T, G, R + 2, D) holds per group its R query heads, its key and its value (ops.h); cuDNN takes
// grouped-query attention natively: Q (B, H, T, D) with H = G R heads, K and V (B, G, T, D), query head h using
// key/value head h / R (the frontend sums dK, dV over each group's heads). K and V are strided views into qkv:
// element (b, g, t, d) of k sits at ((b T + t) G + g)(R + 2) D + R D + d, so in cuDNN's (B, G, T, D) order its
// strides are (T G (R + 2) D, (R + 2) D, G (R + 2) D, 1), v the same one D further; dk and dv are written through
// the same strides into dqkv.
//   R = 1 (GPT's (B, T, H, 3, D)): q is a strided view too (strides (T H 3D, 3D, H 3D, 1)) and dq is written
//   in place: nothing is copied.
//   R > 1: the query heads of a token are R contiguous blocks of D per group, (R + 2) D apart, so their offsets
//   g (R + 2) D + r D are not one stride over h. The queries are gathered into a contiguous (B, T, H, D) buffer
//   (one strided 2-D copy: B T G rows of R D elements) before the call, and dq comes back through one such
//   buffer, scattered into dqkv's query slots after it.
// out and dout (B, T, H, D) have strides (T H D, D, H D, 1); lse (B, H, T) is cuDNN's Stats (B, H, T, 1).
// cuDNN's Stats is max + ln(sum exp(s - max)) over a row of scaled scores s = scale q.k: the CPU's lse.
//
// Differences from the CPU reference, within the bf16 / fp16 tolerances: cuDNN rounds the probabilities to the
// io dtype before P V (and dS before its products), and takes delta = rowsum(dO o O) from the rounded out,
// where the CPU sums rowsum(P o dP) from recomputed probabilities.
//
// Graphs (validated, support-checked, plans built) are cached per (dtype, B, T, G, R, D, causal); one that cuDNN
// cannot run is cached too, with the reason, so the check is not repeated on every call. One cudnnHandle per
// process (a process drives one GPU), created on first use and set to the compute stream on every call.
#include "core/cuda/attention_cudnn.h"

#include <cmath>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#if defined(MEGATRAIN_WITH_CUDNN)
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cudnn_frontend.h>

#include "core/cuda/runtime.h"
#endif

namespace mt::cuda {

#if !defined(MEGATRAIN_WITH_CUDNN)

bool cudnn_attention_built() { return false; }
int64_t cudnn_runtime_version() { return 0; }
int64_t cudnn_compiled_version() { return 0; }
std::string cudnn_frontend_version() { return ""; }

std::string cudnn_attention_forward(const Tensor&, Tensor&, Tensor&, bool) {
  return "this megatrain was built without cuDNN";
}
std::string cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, bool) {
  return "this megatrain was built without cuDNN";
}
std::string cudnn_attention_validate(const CudnnSdpaGraph&, int) { return "this megatrain was built without cuDNN"; }

#else

namespace fe = cudnn_frontend;

namespace {

// The graphs' tensor ids (the variant pack's keys).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Key {
  bool backward;
  DType dtype;
  int64_t B, T, G, R, D;  // H = G R query heads
  bool causal;
  bool deterministic;  // the backward's algorithm (true for every forward key)
  auto operator<=>(const Key&) const = default;
  int64_t H() const { return G * R; }
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN cannot run this key
  int64_t workspace_bytes = 0;
  std::string refused;  // why, when graph is null
};

struct State {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::shared_ptr<const Plan> > plans;
};

// Never destroyed: the handle and graphs would otherwise be released after the CUDA runtime shut down at exit.
State& state() {
  static State* s = new State;
  return *s;
}

void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(
        fmt::format("cuDNN error {} ({}) in {}", static_cast<int>(status), cudnnGetErrorString(status), call));
}

// The handle, bound to the compute stream. Called with state().mu held.
cudnnHandle_t handle_locked(State& s) {
  if (s.handle == nullptr) {
    current_device();  // the handle belongs to the device current on this thread
    check_cudnn(cudnnCreate(&s.handle), "cudnnCreate");
  }
  check_cudnn(cudnnSetStream(s.handle, static_cast<cudaStream_t>(compute_stream())), "cudnnSetStream");
  return s.handle;
}

fe::DataType_t io_type(DType dt) { return dt == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

// cuDNN's (B, heads, T, D) dimension order and the strides of the views (see the top of the file).
std::vector<int64_t> q_dims(const Key& k) { return {k.B, k.H(), k.T, k.D}; }  // Q, O, dO, dQ
std::vector<int64_t> kv_dims(const Key& k) { return {k.B, k.G, k.T, k.D}; }   // K, V, dK, dV
std::vector<int64_t> qkv_strides(const Key& k) {  // a slot of qkv (B, T, G, R + 2, D) over (B, G, T, D)
  const int64_t slots = (k.R + 2) * k.D;
  return {k.T * k.G * slots, slots, k.G * slots, 1};
}
std::vector<int64_t> out_strides(const Key& k) { return {k.T * k.H() * k.D, k.D, k.H() * k.D, 1}; }
// Q and dQ: in place in qkv for R = 1, else the contiguous (B, T, H, D) buffer (out's strides).
std::vector<int64_t> q_strides(const Key& k) { return k.R == 1 ? qkv_strides(k) : out_strides(k); }
std::vector<int64_t> stats_dims(const Key& k) { return {k.B, k.H(), k.T, 1}; }
std::vector<int64_t> stats_strides(const Key& k) { return {k.H() * k.T, k.T, 1, 1}; }

float scale_of(const Key& k) { return 1.f / std::sqrt(static_cast<float>(k.D)); }  // the CPU's expression

std::shared_ptr<fe::graph::Graph> new_graph(const Key& k) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                    std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

// Top-left causal mask: query i sees keys j <= i (T_q == T_kv, so the alignment is the CPU's either way).
template <class Attributes>
void set_causal(Attributes& a, bool causal) {
  if (causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
}

void build_forward(fe::graph::Graph& g, const Key& k) {
  const auto dims = q_dims(k), kvd = kv_dims(k), kvs = qkv_strides(k);
  auto q = input(g, "Q", kQ, dims, q_strides(k)), kk = input(g, "K", kK, kvd, kvs), v = input(g, "V", kV, kvd, kvs);
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("megatrain_attention_forward")
                   .set_generate_stats(true)
                   .set_attn_scale(scale_of(k));
  set_causal(attrs, k.causal);
  auto [o, stats] = g.sdpa(q, kk, v, attrs);
  o->set_output(true).set_uid(kO).set_dim(dims).set_stride(out_strides(k));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(k))
      .set_stride(stats_strides(k));
}

void build_backward(fe::graph::Graph& g, const Key& k) {
  const auto dims = q_dims(k), qs = q_strides(k), os = out_strides(k), kvd = kv_dims(k), kvs = qkv_strides(k);
  auto q = input(g, "Q", kQ, dims, qs), kk = input(g, "K", kK, kvd, kvs), v = input(g, "V", kV, kvd, kvs);
  auto o = input(g, "O", kO, dims, os), dout = input(g, "dO", kDO, dims, os);
  auto stats = input(g, "Stats", kStats, stats_dims(k), stats_strides(k));
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("megatrain_attention_backward")
                   .set_attn_scale(scale_of(k))
                   .set_deterministic_algorithm(k.deterministic);  // true: the same inputs, the same bits
  set_causal(attrs, k.causal);
  auto [dq, dk, dv] = g.sdpa_backward(q, kk, v, o, dout, stats, attrs);
  dq->set_output(true).set_uid(kDQ).set_dim(dims).set_stride(qs);
  dk->set_output(true).set_uid(kDK).set_dim(kvd).set_stride(kvs);  // summed over the group's heads by cuDNN
  dv->set_output(true).set_uid(kDV).set_dim(kvd).set_stride(kvs);
}

// Builds the graph of `k` through cuDNN's support check; a graph cuDNN cannot run comes back with the reason.
std::string describe(const Key& k) {
  return fmt::format("cuDNN SDPA {} (B={}, T={}, H={}, G={}, D={}, {}{}{})", k.backward ? "backward" : "forward", k.B,
                     k.T, k.H(), k.G, k.D, dtype_name(k.dtype), k.causal ? ", causal" : "",
                     k.backward && !k.deterministic ? ", non-deterministic" : "");
}

// The graph of `k`, described (tensors and the SDPA node), not yet validated. `sm` > 0 names the target GPU
// architecture instead of asking the device; it must be set before the nodes are added (each copies it).
std::shared_ptr<fe::graph::Graph> describe_graph(const Key& k, int sm = 0) {
  auto g = new_graph(k);
  if (sm > 0) g->set_sm_version(sm);
  if (k.backward)
    build_backward(*g, k);
  else
    build_forward(*g, k);
  return g;
}

std::shared_ptr<const Plan> make_plan(cudnnHandle_t h, const Key& k) {
  auto plan = std::make_shared<Plan>();
  auto refuse = [&](const char* stage, const std::string& message) {
    plan->graph.reset();
    plan->refused = fmt::format("{}: {}: {}", describe(k), stage, message);
    return plan;
  };
  try {
    auto g = describe_graph(k);
    fe::error_t e = g->validate();
    if (!e.is_good()) return refuse("validate", e.get_message());
    e = g->build_operation_graph(h);
    if (!e.is_good()) return refuse("build_operation_graph", e.get_message());
    e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (!e.is_good()) return refuse("create_execution_plans", e.get_message());
    e = g->check_support();
    if (!e.is_good()) return refuse("check_support", e.get_message());
    e = g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    if (!e.is_good()) return refuse("build_plans", e.get_message());
    int64_t ws = 0;
    e = g->get_workspace_size(ws);
    if (!e.is_good()) return refuse("get_workspace_size", e.get_message());
    plan->graph = std::move(g);
    plan->workspace_bytes = ws;
  } catch (const std::exception& ex) {
    return refuse("exception", ex.what());
  }
  return plan;
}

// The cached plan of `k` (built on first use) and the handle bound to the compute stream.
std::shared_ptr<const Plan> plan_for(const Key& k, cudnnHandle_t& h) {
  State& s = state();
  std::lock_guard lock(s.mu);
  h = handle_locked(s);
  auto it = s.plans.find(k);
  if (it == s.plans.end()) it = s.plans.emplace(k, make_plan(h, k)).first;
  return it->second;
}

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

Key key_of(const Tensor& qkv, bool backward, bool causal) {
  return Key{backward,   qkv.dtype(), qkv.dim(0),
             qkv.dim(1), qkv.dim(2),  qkv.dim(3) - 2,
             qkv.dim(4), causal,      !backward || cudnn_backward_deterministic()};
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

void execute(const Plan& plan, cudnnHandle_t h, std::unordered_map<int64_t, void*>& pack, const char* op) {
  Tensor ws;  // from the caching allocator; freed after the enqueue, reused in stream order
  if (plan.workspace_bytes > 0)
    ws = Tensor::empty({(plan.workspace_bytes + 3) / 4}, DType::f32, Device::cuda, MemKind::workspace);
  fe::error_t e = plan.graph->execute(h, pack, ws.defined() ? ws.raw() : nullptr);
  if (!e.is_good()) throw std::runtime_error(fmt::format("{}: cuDNN SDPA execute failed: {}", op, e.get_message()));
}

}  // namespace

bool cudnn_attention_built() { return true; }

std::string cudnn_attention_validate(const CudnnSdpaGraph& c, int sm) {
  const Key k{c.backward, c.dtype, c.B, c.T, c.G, c.R, c.D, c.causal, !c.backward || c.deterministic};
  if (k.dtype != DType::bf16 && k.dtype != DType::f16)
    return fmt::format("{}: cuDNN's fused attention takes bf16 or fp16", describe(k));
  try {
    auto g = describe_graph(k, sm);
    fe::error_t e = g->validate();
    if (!e.is_good()) return fmt::format("{}: validate (sm_{}): {}", describe(k), sm, e.get_message());
  } catch (const std::exception& ex) {
    return fmt::format("{}: validate (sm_{}): exception: {}", describe(k), sm, ex.what());
  }
  return "";
}
int64_t cudnn_runtime_version() { return static_cast<int64_t>(cudnnGetVersion()); }
int64_t cudnn_compiled_version() { return CUDNN_VERSION; }
std::string cudnn_frontend_version() {
  return fmt::format("{}.{}.{}", CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
                     CUDNN_FRONTEND_PATCH_VERSION);
}

std::string cudnn_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, bool causal) {
  if (std::string why = refuse_early(qkv); !why.empty()) return why;
  const int64_t R = qkv.dim(3) - 2, D = qkv.dim(4);
  char* base = static_cast<char*>(qkv.raw());
  const size_t es = dtype_size(qkv.dtype());
  void *k = base + R * D * es, *v = base + (R + 1) * D * es;
  if (std::string why = misaligned({{"qkv", base}, {"out", out.raw()}, {"lse", lse.raw()}}); !why.empty()) return why;
  cudnnHandle_t h = nullptr;
  const auto plan = plan_for(key_of(qkv, false, causal), h);
  if (!plan->graph) return plan->refused;
  Tensor q_buf;  // R > 1: the queries gathered (B, T, H, D); freed after the enqueue, reused in stream order
  void* q = base;
  if (R > 1) {
    q_buf = query_buffer(qkv);
    gather_queries(qkv, q_buf);
    q = q_buf.raw();
  }
  std::unordered_map<int64_t, void*> pack{{kQ, q}, {kK, k}, {kV, v}, {kO, out.raw()}, {kStats, lse.raw()}};
  execute(*plan, h, pack, "attention_forward");
  return "";
}

std::string cudnn_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     Tensor& dqkv, bool causal) {
  if (std::string why = refuse_early(qkv); !why.empty()) return why;
  const int64_t R = qkv.dim(3) - 2, D = qkv.dim(4);
  const size_t es = dtype_size(qkv.dtype());
  char* base = static_cast<char*>(qkv.raw());
  char* dbase = static_cast<char*>(dqkv.raw());
  if (std::string why =
          misaligned({{"qkv", base}, {"out", out.raw()}, {"lse", lse.raw()}, {"dout", dout.raw()}, {"dqkv", dbase}});
      !why.empty())
    return why;
  cudnnHandle_t h = nullptr;
  const auto plan = plan_for(key_of(qkv, true, causal), h);
  if (!plan->graph) return plan->refused;
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
  execute(*plan, h, pack, "attention_backward");
  if (R > 1) scatter_query_grads(dq_buf, dqkv);
  return "";
}

#endif  // MEGATRAIN_WITH_CUDNN

}  // namespace mt::cuda
