// grad_buffer.h: the one gradient buffer of a rank (after Megatron's param-and-grad buffer). Every
// parameter's gradient is a view into one flat fp32 storage, cut into buckets of whole parameters in reverse
// order (the order backward finishes them). As soon as every parameter of a bucket is marked ready (its last
// microbatch's backward is done), the bucket's data-parallel reduction starts while backward goes on: an
// all-reduce, or with the distributed optimizer a reduce-scatter in place (each bucket is padded to a multiple
// of the group size and rank r owns block r of every bucket, as Megatron shards).
//
// finalize() is the one place where a step's gradients are completed: the sums over the other groups a
// parameter names (Parameter::grad_sums: sequence-parallel replicas over TP, the tied embedding copies over the
// embedding group), then the data-parallel buckets not started yet, then the wait.
//
// Threading (the reducer's rules):
//  * NCCL (collectives are enqueued and return at once): the thread that marks a bucket ready issues it, so
//    one thread issues every collective of the process in program order, the same on every rank (NCCL can
//    deadlock when two threads issue collectives in different orders on different ranks). The overlap comes
//    from the communicator's stream; finalize() orders the compute stream after the buckets.
//  * Gloo (collectives run on the calling thread): a worker thread runs them, on a communicator of its own.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <string>
#include <vector>

#include "core/tensor/parameter.h"
#include "parallel/communicator.h"

namespace mt {

struct GradBufferOptions {
  int64_t bucket_elements = 40000000;  // a bucket closes once it holds at least this many elements
  bool shard = false;                  // reduce-scatter (distributed optimizer) instead of all-reduce
  Communicator* tensor = nullptr;      // sums Parameter::grad_sums.tensor gradients (null or size 1: none)
  Communicator* embedding = nullptr;   // sums Parameter::grad_sums.embedding gradients (null or size 1: none)
  std::string name = "gradients";      // what the timeline (core/tensor/trace.h) calls its reductions
};

class GradBuffer {
 public:
  // Lays out the gradients of `params` (in this order) in one flat f32 buffer on `device`; each p->grad becomes
  // a view into it (of p->value's shape). `dp` reduces the buckets over data parallelism and must be used by
  // this buffer only (null or size 1: nothing to reduce).
  GradBuffer(std::vector<Parameter*> params, Device device, std::unique_ptr<Communicator> dp, GradBufferOptions opt);
  ~GradBuffer();
  GradBuffer(const GradBuffer&) = delete;
  GradBuffer& operator=(const GradBuffer&) = delete;

  struct Bucket {
    int64_t begin = 0, end = 0;      // elements [begin, end) of the buffer, padding included (a multiple of
                                     // the group size when sharded)
    int64_t shard = 0;               // sharded: elements each rank owns, block r = [begin + r * shard, + shard)
    std::vector<Parameter*> params;  // in buffer order
    int pending = 0;                 // parameters not yet ready this step
  };

  // Starts a step: zeroes every gradient; no parameter is ready.
  void begin_step();
  // Marks gradients as final for this step; buckets that become complete start reducing. Parameters that
  // still need a sum over another group (grad_sums) wait for finalize().
  void mark_ready(const std::vector<Parameter*>& params);
  // Sums over the tensor and embedding groups, marks every parameter not yet marked (in reverse buffer order,
  // so every rank launches the remaining buckets in the same order), waits until every bucket is reduced,
  // and rethrows a failure.
  void finalize();

  const Tensor& data() const { return flat_; }  // (padded total) f32
  const std::vector<Parameter*>& params() const { return params_; }
  int64_t offset(const Parameter* p) const { return offset_.at(p); }  // first element in data()
  // In backward order: buckets()[0] holds the last parameters.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  bool sharded() const { return opt_.shard; }
  int dp_rank() const { return dp_ ? dp_->rank() : 0; }
  int dp_size() const { return dp_ ? dp_->size() : 1; }

 private:
  bool sums_elsewhere(const Parameter* p) const;
  void ready(Parameter* p);  // mu_ held
  void launch(size_t bucket);
  void worker();
  void reduce(size_t bucket, std::vector<std::unique_ptr<Work>>* keep);

  std::vector<Parameter*> params_;  // in buffer order
  GradBufferOptions opt_;
  std::unique_ptr<Communicator> dp_;
  Tensor flat_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, int64_t> offset_;
  std::unordered_map<const Parameter*, size_t> bucket_of_;
  std::unordered_map<const Parameter*, bool> ready_;
  const bool reduces_;  // a data-parallel group of more than one rank
  // The tied embedding's copies this rank holds: two on zb-v's first stage (its V starts and ends there), which
  // finalize sums here as the embedding group sums copies on two ranks.
  std::vector<Parameter*> embedding_copies_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool on_caller_ = false;                    // issue on the calling thread (NCCL), else on thread_ (Gloo)
  std::vector<std::unique_ptr<Work>> works_;  // on_caller_: this step's bucket reductions, in launch order
  std::deque<size_t> queue_;
  size_t launched_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace mt
