// attention_cudnn.cpp: causal attention forward and backward through cuDNN's fused SDPA (flash attention): the
// graphs, built with the header-only cuDNN frontend's graph API, their plans and their execution. The only file
// that includes cudnn_frontend.h (compiled by the host compiler, once); the calls that fill the graphs' pointers,
// whole sequences and context-parallel ring blocks, are in attention_cudnn_calls.cpp.
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
// Context-parallel ring blocks (cudnn_attention_block_forward / _backward, attention_cudnn_calls.cpp): a block of this
// rank's queries against one rank's packed keys and values (B, Tk, G, 2, D) is one SDPA call over a query row range
// and a key row range (the whole own block causal; an earlier rank's first chunk, or all of a later rank's keys for
// the second query chunk, full), Stats its log-sum-exp for the merge; backward takes the merged O and Stats, so
// cuDNN's P and Delta are the whole softmax's, and its dQ, dK, dV (qkv's dtype) are added to the ring's f32 sums.
//
// Graphs (validated, support-checked, plans built) are cached per (dtype, B, T, G, R, D, causal, window, a ring
// block's rows); one that cuDNN cannot run is cached too, with the reason, so the check is not repeated on every
// call. One cudnnHandle per process (a process drives one GPU), created on first use and set to the compute stream
// on every call.
#include "core/cuda/attention_cudnn.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#if defined(MEGATRAIN_WITH_CUDNN)
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cudnn_frontend.h>

#include "core/cuda/attention_cudnn_detail.h"
#include "core/cuda/runtime.h"
#endif

namespace mt::cuda {

#if !defined(MEGATRAIN_WITH_CUDNN)

bool cudnn_attention_built() { return false; }
int64_t cudnn_runtime_version() { return 0; }
int64_t cudnn_compiled_version() { return 0; }
std::string cudnn_frontend_version() { return ""; }

std::string cudnn_attention_forward(const Tensor&, Tensor&, Tensor&, bool, int64_t) {
  return "this megatrain was built without cuDNN";
}
std::string cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, bool,
                                     int64_t) {
  return "this megatrain was built without cuDNN";
}
std::string cudnn_attention_validate(const CudnnSdpaGraph&, int) { return "this megatrain was built without cuDNN"; }
CudnnBlock cudnn_block_of(int64_t, int64_t, const AttentionBlockOptions&, std::string* why) {
  *why = "this megatrain was built without cuDNN";
  return {};
}
std::string cudnn_attention_block_forward(const Tensor&, const Tensor&, Tensor&, Tensor&,
                                          const AttentionBlockOptions&) {
  return "this megatrain was built without cuDNN";
}
std::string cudnn_attention_block_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                           Tensor&, Tensor&, const AttentionBlockOptions&) {
  return "this megatrain was built without cuDNN";
}

#else

namespace fe = cudnn_frontend;

namespace cudnn_detail {

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN cannot run this key
  int64_t workspace_bytes = 0;
  std::string refused;  // why, when graph is null
};

namespace {

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

// cuDNN's (B, heads, T, D) dimension order and the strides of the views (see the top of the file). A ring block's
// graph takes q_rows query rows and k_rows key rows (the pointers moved to the call's first rows), its keys and
// values (and dK, dV) from a packed kv (B, Tk, G, 2, D), and its dQ always through a (B, T, H, D) buffer (the ring
// adds it to f32 sums).
int64_t q_len(const Key& k) { return k.block ? k.q_rows : k.T; }
std::vector<int64_t> q_dims(const Key& k) { return {k.B, k.H(), q_len(k), k.D}; }                 // Q, O, dO, dQ
std::vector<int64_t> kv_dims(const Key& k) { return {k.B, k.G, k.block ? k.k_rows : k.T, k.D}; }  // K, V, dK, dV
std::vector<int64_t> qkv_strides(const Key& k) {  // a slot of qkv (B, T, G, R + 2, D) over (B, G, T, D)
  const int64_t slots = (k.R + 2) * k.D;
  return {k.T * k.G * slots, slots, k.G * slots, 1};
}
std::vector<int64_t> kv_strides(const Key& k) {  // a ring block's packed kv (B, Tk, G, 2, D), else qkv's slots
  return k.block ? std::vector<int64_t>{k.Tk * k.G * 2 * k.D, 2 * k.D, k.G * 2 * k.D, 1} : qkv_strides(k);
}
std::vector<int64_t> out_strides(const Key& k) { return {k.T * k.H() * k.D, k.D, k.H() * k.D, 1}; }
// Q and dQ: in place in qkv for R = 1, else the contiguous (B, T, H, D) buffer (out's strides).
std::vector<int64_t> q_strides(const Key& k) { return k.R == 1 ? qkv_strides(k) : out_strides(k); }
std::vector<int64_t> dq_strides(const Key& k) { return k.block ? out_strides(k) : q_strides(k); }
std::vector<int64_t> stats_dims(const Key& k) { return {k.B, k.H(), q_len(k), 1}; }
// Stats rows of lse (B, H, T); a ring block's backward reads them packed (B, H, q_rows) instead: cuDNN below 9.26
// takes only a packed Stats input there (validate() says so).
std::vector<int64_t> stats_strides(const Key& k) {
  const int64_t t = k.block && k.backward ? k.q_rows : k.T;
  return {k.H() * t, t, 1, 1};
}

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

// Top-left causal mask: query i sees keys j <= i (T_q == T_kv, so the alignment is the CPU's either way). A sliding
// window adds the band's left bound: the frontend keeps (i, j) where j + left_bound > i under top-left alignment
// (utils/attn_score_modifiers.h, sliding_window_mask: "column + window_size > row", a CMP_GT), i.e. j > i - window,
// ops.h's rule (HF's kv_idx > q_idx - sliding_window) with left_bound = window.
template <class Attributes>
void set_mask(Attributes& a, bool causal, int64_t window) {
  if (!causal) return;
  a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (window > 0) a.set_diagonal_band_left_bound(static_cast<int>(window));
}

void build_forward(fe::graph::Graph& g, const Key& k) {
  const auto dims = q_dims(k), kvd = kv_dims(k), kvs = kv_strides(k);
  auto q = input(g, "Q", kQ, dims, q_strides(k)), kk = input(g, "K", kK, kvd, kvs), v = input(g, "V", kV, kvd, kvs);
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("megatrain_attention_forward")
                   .set_generate_stats(true)
                   .set_attn_scale(scale_of(k));
  set_mask(attrs, k.causal, k.window);
  auto [o, stats] = g.sdpa(q, kk, v, attrs);
  o->set_output(true).set_uid(kO).set_dim(dims).set_stride(out_strides(k));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(k))
      .set_stride(stats_strides(k));
}

void build_backward(fe::graph::Graph& g, const Key& k) {
  const auto dims = q_dims(k), qs = q_strides(k), os = out_strides(k), kvd = kv_dims(k), kvs = kv_strides(k);
  auto q = input(g, "Q", kQ, dims, qs), kk = input(g, "K", kK, kvd, kvs), v = input(g, "V", kV, kvd, kvs);
  auto o = input(g, "O", kO, dims, os), dout = input(g, "dO", kDO, dims, os);
  auto stats = input(g, "Stats", kStats, stats_dims(k), stats_strides(k));
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("megatrain_attention_backward")
                   .set_attn_scale(scale_of(k))
                   .set_deterministic_algorithm(k.deterministic);  // true: the same inputs, the same bits
  set_mask(attrs, k.causal, k.window);
  auto [dq, dk, dv] = g.sdpa_backward(q, kk, v, o, dout, stats, attrs);
  dq->set_output(true).set_uid(kDQ).set_dim(dims).set_stride(dq_strides(k));
  dk->set_output(true).set_uid(kDK).set_dim(kvd).set_stride(kvs);  // summed over the group's heads by cuDNN
  dv->set_output(true).set_uid(kDV).set_dim(kvd).set_stride(kvs);
}

// Builds the graph of `k` through cuDNN's support check; a graph cuDNN cannot run comes back with the reason.
std::string describe(const Key& k) {
  const std::string block =
      k.block ? fmt::format(", ring block: {} of the query rows against {} of Tk={} keys", k.q_rows, k.k_rows, k.Tk)
              : "";
  const std::string window = k.window > 0 ? fmt::format(", window {}", k.window) : "";
  return fmt::format("cuDNN SDPA {} (B={}, T={}, H={}, G={}, D={}, {}{}{}{}{})", k.backward ? "backward" : "forward",
                     k.B, k.T, k.H(), k.G, k.D, dtype_name(k.dtype), k.causal ? ", causal" : "", window,
                     k.backward && !k.deterministic ? ", non-deterministic" : "", block);
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

}  // namespace

// The cached plan of `k` (built on first use) and the handle bound to the compute stream.
PlannedGraph plan_for(const Key& k) {
  State& s = state();
  std::lock_guard lock(s.mu);
  PlannedGraph g;
  g.handle = handle_locked(s);
  auto it = s.plans.find(k);
  if (it == s.plans.end()) it = s.plans.emplace(k, make_plan(g.handle, k)).first;
  g.plan = it->second;
  if (!g.plan->graph) g.refused = g.plan->refused;
  return g;
}

void execute(const PlannedGraph& g, std::unordered_map<int64_t, void*>& pack, const char* op) {
  const Plan& plan = *g.plan;
  Tensor ws;  // from the caching allocator; freed after the enqueue, reused in stream order
  if (plan.workspace_bytes > 0)
    ws = Tensor::empty({(plan.workspace_bytes + 3) / 4}, DType::f32, Device::cuda, MemKind::workspace);
  fe::error_t e = plan.graph->execute(g.handle, pack, ws.defined() ? ws.raw() : nullptr);
  if (!e.is_good()) throw std::runtime_error(fmt::format("{}: cuDNN SDPA execute failed: {}", op, e.get_message()));
}

}  // namespace cudnn_detail

using namespace cudnn_detail;  // NOLINT(google-build-using-namespace): the graphs

bool cudnn_attention_built() { return true; }

std::string cudnn_attention_validate(const CudnnSdpaGraph& c, int sm) {
  Key k{c.backward, c.dtype, c.B, c.T, c.G, c.R, c.D, c.causal, !c.backward || c.deterministic};
  if (c.q_rows > 0) {
    k.block = true;
    k.q_rows = c.q_rows;
    k.Tk = c.Tk;
    k.k_rows = c.k_rows;
  }
  k.window = c.window;
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

#endif  // MEGATRAIN_WITH_CUDNN

}  // namespace mt::cuda
