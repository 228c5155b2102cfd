// communicator.h: collectives and point-to-point transfers among the ranks of one group, behind one
// interface: Gloo over TCP for CPU ranks (comm_gloo), NCCL for GPUs (comm_nccl).
#pragma once
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor/tensor.h"
#include "parallel/store/store.h"

namespace mt {

// A collective or transfer that failed or timed out; the message names the group, the operation, this rank
// and, where known, the rank it waited for.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { sum, max };

// An operation in flight. wait() returns once the op's result may be used (throwing CommError on failure
// or timeout): on host backends (Gloo) when it has completed; on device backends (NCCL) once the compute
// stream is ordered after it, without blocking the host (cudaStreamWaitEvent), so later kernels see the
// result and a host read of a result (Tensor::to, to_floats, item) waits for it like for any kernel.
// Stalls and failures of device ops are caught by the backend's watchdog, which aborts the communicator.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Starts the op now where the backend would otherwise defer it (NCCL queues a send/recv until a wait or the next
  // collective, to batch both directions): its transfer then runs on the communicator's stream, ordered after the
  // work already queued on the compute stream, while later compute proceeds. A no-op elsewhere.
  virtual void start() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // rank within the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "tp[0,1]" for messages

  // All ops take f32, bf16 or f16 tensors (reductions in fp32 for 16-bit types where the backend lacks them)
  // and are asynchronous: the tensors must stay alive and untouched until wait() returns.
  virtual std::unique_ptr<Work> all_reduce(Tensor& t, ReduceOp op) = 0;
  // in: (size * n) elements; out: the n-element block of this rank of the sum.
  virtual std::unique_ptr<Work> reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in: n elements; out: (size * n) elements, block r from rank r.
  virtual std::unique_ptr<Work> all_gather(const Tensor& in, Tensor& out) = 0;
  virtual std::unique_ptr<Work> broadcast(Tensor& t, int root) = 0;
  virtual std::unique_ptr<Work> send(const Tensor& t, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> recv(Tensor& t, int peer, int tag) = 0;
  // Variable-count all-to-all (the MoE token dispatch and its return). in: this rank's blocks for every member
  // in rank order, send_counts[r] elements for rank r (contiguous from in's start); out: the blocks received,
  // recv_counts[r] elements from rank r, in rank order. Counts are elements (rows x hidden), known on both
  // sides beforehand (exchange them first with exchange_counts): send_counts[r] here must equal recv_counts
  // of this rank on rank r. sum(send_counts) <= in.numel(), sum(recv_counts) <= out.numel(); elements past
  // them are untouched; a zero count sends nothing. Moves bytes: any dtype, in and out alike. A count vector
  // whose size is not the group's is std::invalid_argument naming the op; other misuse is CommError.
  virtual std::unique_ptr<Work> all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                           const std::vector<int64_t>& recv_counts) = 0;
  // Blocks the host until every member has reached it (and, on device backends, everything posted before
  // it has completed): the host-side synchronisation around checkpoints.
  virtual void barrier() = 0;

  // True when collectives run to completion on the calling thread (Gloo), so overlapping them with compute
  // needs a thread of their own; false when they are enqueued and return at once (NCCL), so one thread can
  // issue them all in program order (NCCL can deadlock when two threads issue collectives of different
  // communicators in different orders on different ranks).
  virtual bool collectives_block_caller() const = 0;
  // The communicator that moves the data: itself, or the one a wrapper (make_staged_communicator) stages
  // tensors for. What is done on raw device buffers or split off a communicator is done on its backend.
  virtual Communicator& backend() { return *this; }
};

// Sums a few host doubles over the group (a blocking f64 all-reduce; any backend): the losses, counters and
// grad-norm partial sums that every rank must agree on, carried as doubles so nothing is rounded on the way.
std::vector<double> sum_doubles(Communicator& comm, std::vector<double> values);

// The counts of an all_to_all seen from the receiving side (blocking; any backend): returns recv_counts, whose
// element r is send_counts[this rank] of rank r. Every member calls it with its own send_counts (size() of
// them, each >= 0). An all_gather of the counts as int64, bit for bit: exact for any count (f32 is not above 2^24).
std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& send_counts);

// A communicator of one rank: no peers, no rendezvous, tensors on any device (every op is at most a local
// copy, done when it returns; send and recv have no peer and throw CommError). The expert-parallel group
// of a job without expert parallelism, which would otherwise cost a rendezvous or an NCCL split.
std::unique_ptr<Communicator> make_self_communicator(std::string name);

// One rank of a group in a meta run (core/meta/meta.h: the planner's measured step): ops check their arguments and
// are done at once, moving nothing; outputs with memory get this rank's data, as if every rank held what it holds.
struct MetaCommOptions {
  std::string name;  // for messages ("tp[0,1]")
  int rank = 0;
  int size = 1;
  bool gloo = true;  // mirror the workspaces a Gloo group allocates inside its ops (false: NCCL's, none)
  // The MoE layer's exchange of its counts (a sum of doubles in which each rank fills its own block): this rank
  // receives this many times its balanced share of rows (plan --moe-imbalance). Set on the expert-parallel group.
  double receive_factor = 1;
};
std::unique_ptr<Communicator> make_meta_communicator(MetaCommOptions opt);

struct GlooOptions {
  std::string name;          // group name, for messages and store prefixes ("" -> "gloo[0,1]")
  std::vector<int> members;  // global ranks, ascending; this rank must be one of them
  int global_rank = 0;
  std::string hostname = "127.0.0.1";  // interface the Gloo TCP device binds to
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // When every member runs on this host: collectives of at most 64 KiB per rank through a shared-memory segment
  // (parallel/comm/shared_rounds.h; parallel.gloo_shared_memory). Every member must agree, else all use TCP.
  bool shared_memory = true;
};

// Creates the Gloo communicator of one group, rendezvousing through `store` (prefixed by the group name).
// Every member must call it with the same name and members. Creating the same group again (a second
// communicator for overlapped traffic) gets fresh store keys: each rank counts its creations per name in
// the store, so ranks must create their groups in the same order. Blocks until every member has joined;
// a member missing after opt.timeout gives CommError naming it. Misuse (a rank outside members, members
// not ascending, timeout <= 0) gives CommError naming the group.
//
// Gloo specifics: collectives run on the calling thread and return a completed Work; send and recv are
// posted at once and complete in Work::wait(), so a stage may post both before waiting (tags match
// transfers between the same pair of ranks). Every op is bounded by opt.timeout. bf16/f16 reductions run
// in fp32 and round once. all_gather, broadcast, send, recv and all_to_all move bytes, so they take any
// dtype. After any failure (Gloo closes all connections of the group) every later op throws CommError at
// once, naming the first failure. Dropping an unwaited send/recv Work abandons the transfer without
// blocking. One thread drives a communicator at a time; waiting on its Works from another thread is fine.
// When every member is on this host (opt.shared_memory), collectives of at most 64 KiB per rank go through
// shared memory (parallel/comm/shared_rounds.h) with the same results bit for bit; a member whose process exits fails
// the others' waits at once, and ranks that disagree on a collective's size get CommError naming both sizes.
std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, const GlooOptions& opt);

// Wraps a communicator whose backend moves memory of device `native` (Gloo: cpu, NCCL: cuda) so that it takes
// tensors on any device: each foreign tensor is copied to `native` for the op and the result copied back
// when the op completes (inside wait() for asynchronous ones). Native tensors pass straight through. Lets
// Gloo serve ranks that share a GPU (NCCL refuses that), and NCCL take the trainer's small host exchanges.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> inner, Device native);

#ifdef MEGATRAIN_WITH_NCCL  // set by the build when the CUDA toolkit and NCCL are found
struct NcclOptions {
  std::string name;          // group name, for messages and store keys ("" -> "nccl[0,1]")
  std::vector<int> members;  // global ranks, ascending; this rank must be one of them
  int global_rank = 0;
  int device = 0;  // CUDA device ordinal this rank drives (usually the local rank)
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// Creates the NCCL communicator of one group on opt.device. The group's first member publishes an NCCL
// unique id in `store` under "nccl/<name>/<n>/id" (n counts this rank's creations of the group, as for
// Gloo, so ranks must create their groups in the same order); the others wait for it up to opt.timeout.
// Misuse gives CommError naming the group; so does a first member that never publishes, an init that
// does not finish within opt.timeout, and any failing CUDA or NCCL call (naming the call).
//
// NCCL specifics: ops take CUDA tensors only (a host tensor is CommError). Each op is enqueued on the
// communicator's own stream after the work already queued on the compute stream (core/cuda); wait()
// polls its completion (and NCCL's asynchronous errors) for up to opt.timeout from its start, and on an
// error or timeout aborts the communicator and throws CommError naming the group, op and rank; every
// later op then throws at once. send and recv are queued and issued together, as one NCCL group, at the
// first wait() on any of them or at the next collective, so a stage may post both directions before
// waiting (NCCL has no tags: transfers between two ranks match in posting order; tags must be >= 0).
// Dropping a Work whose transfer was not issued yet abandons it; an issued op keeps its tensors alive
// until it completes. all_gather, broadcast, send, recv and all_to_all move bytes, so they take any dtype;
// reductions take f32, bf16 and f16 natively. all_to_all is one NCCL group of a ncclSend and a ncclRecv per
// peer with a nonzero count. Note: NCCL's max may not propagate NaN like the Gloo one; reduce an
// explicit found-inf flag instead.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Store> store, const NcclOptions& opt);

// The communicator of one group split off `parent` (an NCCL communicator) with ncclCommSplit: no store, no
// new bootstrap. Collective over the parent: every rank of the parent calls it, in the same order, with the
// members of its own group of this split (ascending global ranks), or with no members when it joins none
// (it then takes part and gets nullptr). The new communicator runs on the parent's device; opt.device is
// ignored. Errors as for make_nccl_communicator.
std::unique_ptr<Communicator> split_nccl_communicator(Communicator& parent, const NcclOptions& opt);

// "2.28.3 (built with 2.28.3)": the NCCL library this process loaded (ncclGetVersion) and the headers it was
// built against; the two can differ (the GPU machine's NCCL comes from its own pip packages).
std::string nccl_version();

// Device memory outside any Tensor: the ops of an NCCL
// communicator on raw device pointers, with the same checks and Works. The caller keeps the memory alive
// until wait() returns. `comm` must come from make_nccl_communicator (otherwise CommError).
namespace nccl_raw {
struct DeviceBuffer {
  void* ptr = nullptr;  // CUDA device memory of numel elements of dtype
  int64_t numel = 0;
  DType dtype = DType::f32;
};
std::unique_ptr<Work> all_reduce(Communicator& comm, DeviceBuffer buf, ReduceOp op);
std::unique_ptr<Work> reduce_scatter(Communicator& comm, DeviceBuffer in, DeviceBuffer out);
std::unique_ptr<Work> all_gather(Communicator& comm, DeviceBuffer in, DeviceBuffer out);
std::unique_ptr<Work> broadcast(Communicator& comm, DeviceBuffer buf, int root);
std::unique_ptr<Work> send(Communicator& comm, DeviceBuffer buf, int peer, int tag);
std::unique_ptr<Work> recv(Communicator& comm, DeviceBuffer buf, int peer, int tag);
}  // namespace nccl_raw
#endif  // MEGATRAIN_WITH_NCCL

}  // namespace mt
