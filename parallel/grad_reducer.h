// grad_reducer.h: data-parallel gradient reduction in buckets, overlapped with backward. The flat gradient
// buffer is cut into buckets of whole parameters in reverse order (the order backward finishes them); as soon
// as every parameter of a bucket is marked ready (its last microbatch's backward is done), the bucket's
// all-reduce starts over the reducer's own data-parallel communicator while backward goes on:
//  * NCCL (collectives are enqueued and return at once): the thread that marks the bucket ready issues it,
//    so one thread issues every collective of the process in program order, the same on every rank (NCCL
//    can deadlock when two threads issue collectives in different orders on different ranks). The overlap
//    comes from the communicator's stream; finish_step() orders the compute stream after the buckets.
//  * Gloo (collectives run on the calling thread): a worker thread runs them, on a communicator of its own.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/parameter.h"
#include "parallel/communicator.h"

namespace mt {

class BucketedGradReducer {
 public:
  // `params` own gradients that are consecutive views, in this order, into `flat_grads`. A bucket closes once
  // it holds at least `bucket_elements` elements. `comm` must be used by this reducer only.
  BucketedGradReducer(std::vector<Parameter*> params, Tensor flat_grads, std::unique_ptr<Communicator> comm,
                      int64_t bucket_elements);
  ~BucketedGradReducer();
  BucketedGradReducer(const BucketedGradReducer&) = delete;
  BucketedGradReducer& operator=(const BucketedGradReducer&) = delete;

  // Starts a step: no parameter is ready.
  void begin_step();
  // Marks gradients as final for this step; buckets that become complete start reducing.
  void mark_ready(const std::vector<Parameter*>& params);
  // Marks every parameter not yet marked (in reverse buffer order, so every rank launches the remaining
  // buckets in the same order: the collectives must match), waits until every bucket is reduced, and
  // rethrows a failure.
  void finish_step();
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // range of the flat buffer
    int pending = 0;             // parameters not yet ready this step
    int size = 0;                // parameters in the bucket
  };
  void launch(size_t bucket);
  void worker();
  Tensor bucket_view(size_t bucket) const { return flat_.slice(buckets_[bucket].begin, buckets_[bucket].end); }

  std::vector<Parameter*> params_;  // in buffer order
  Tensor flat_;
  std::unique_ptr<Communicator> comm_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, size_t> bucket_of_;
  std::unordered_map<const Parameter*, bool> ready_;
  std::mutex mu_;
  std::condition_variable cv_;
  const bool on_caller_;                      // issue on the calling thread (NCCL), else on thread_ (Gloo)
  std::vector<std::unique_ptr<Work>> works_;  // on_caller_: this step's bucket reductions, in launch order
  std::deque<size_t> queue_;
  size_t launched_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace mt
