// communicator.h: collectives and point-to-point transfers among the ranks of one group, behind one
// interface: Gloo over TCP for CPU ranks (comm_gloo), NCCL for GPUs (comm_nccl).
#pragma once
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/store.h"

namespace mt {

// A collective or transfer that failed or timed out; the message names the group, the operation, this rank
// and, where known, the rank it waited for.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { sum, max };

// An operation in flight; wait() blocks until it completes (throwing CommError on failure or timeout).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;        // rank within the group
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
  virtual void barrier() = 0;
};

struct GlooOptions {
  std::string name;                  // group name, for messages and store prefixes ("" -> "gloo[0,1]")
  std::vector<int> members;          // global ranks, ascending; this rank must be one of them
  int global_rank = 0;
  std::string hostname = "127.0.0.1";  // interface the Gloo TCP device binds to
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
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
// in fp32 and round once. all_gather, broadcast, send and recv move bytes, so they take any dtype. After
// any failure (Gloo closes all connections of the group) every later op throws CommError at once, naming
// the first failure. Dropping an unwaited send/recv Work abandons the transfer without blocking. One
// thread drives a communicator at a time; waiting on its Works from another thread is fine.
std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Store> store, const GlooOptions& opt);

}  // namespace mt
