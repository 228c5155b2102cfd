// grad_buffer.h: the one gradient buffer of a rank (after Megatron's param-and-grad buffer). Every
// parameter's gradient is a view into one flat fp32 storage, cut into buckets of whole parameters in reverse
// order (the order backward finishes them). As soon as every parameter of a bucket is marked ready (its last
// microbatch's backward is done), the bucket's data-parallel reduction starts while backward goes on: an
// all-reduce, or with the distributed optimizer a reduce-scatter in place (each bucket is padded to a multiple
// of the group size and rank r owns block r of every bucket, as Megatron shards).
//
// With shard_gradients (ZeRO-2) there is no full-size buffer: a bucket's storage is allocated when backward is
// about to write one of its gradients (prepare()), reduce-scattered as soon as each of its parameters has been
// marked ready since the last time (every microbatch, not only the last) and none is still awaiting a deferred
// weight gradient, then added into the bucket's fp32 shard (the only step-long gradient memory: 1/n of it) and
// dropped. Parameters summed over another group first (grad_sums) get buckets of their own, kept whole for the step
// and reduce-scattered by finalize() after those sums. Summing over ranks per microbatch before the microbatches
// (instead of after) changes the order of the additions: bit-identical with one microbatch, rounding level else.
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
#include "parallel/comm/communicator.h"

namespace mt {

struct GradBufferOptions {
  int64_t bucket_elements = 40000000;  // a bucket closes once it holds at least this many elements
  bool shard = false;                  // reduce-scatter (distributed optimizer) instead of all-reduce
  bool shard_gradients = false;        // with shard: ZeRO-2 (no full-size buffer, see above)
  Communicator* tensor = nullptr;      // sums Parameter::grad_sums.tensor gradients (null or size 1: none)
  Communicator* embedding = nullptr;   // sums Parameter::grad_sums.embedding gradients (null or size 1: none)
  std::string name = "gradients";      // what the timeline (core/tensor/trace.h) calls its reductions
  // ZeRO-3 (parallel/sharding/sharded_parameters.h): the gathering unit of each parameter; a bucket never holds two units'
  // parameters, so a unit is gathered bucket by bucket. Empty: buckets are cut by size only.
  std::unordered_map<const Parameter*, int> units;
  // Hybrid sharding (parallel/sharding/hybrid_shard.h, parallel.shard_group): this rank's replica group (the ranks at its
  // place in the other shard groups; used by the reducer only). With G replicas each bucket is padded to a multiple
  // of the data-parallel size D and sharded over D / G ranks (shard_rank()); null or size 1: over all D.
  Communicator* replicas = nullptr;
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
    int pending = 0;                 // parameters not yet ready this step (since the last flush: ZeRO-2)
    // ZeRO-2 only:
    bool whole = false;   // its parameters are summed over another group first: storage kept for the step
    Tensor storage;       // (end - begin) f32 while backward writes it, else undefined (whole: always)
    Tensor accum;         // (shard) f32: this rank's block, summed over the flushes of the step
    int outstanding = 0;  // prepare()s of its parameters not yet matched by a mark
  };

  // Starts a step: zeroes every gradient; no parameter is ready.
  void begin_step();
  // ZeRO-2: backward is about to write these parameters' gradients (before a layer's backward; a deferred weight
  // gradient counts until its mark): their buckets get storage. Elsewhere a no-op.
  void prepare(const std::vector<Parameter*>& params);
  // Marks gradients as final for this step (ZeRO-2: for this microbatch); buckets that become complete start reducing. Parameters that
  // still need a sum over another group (grad_sums) wait for finalize().
  void mark_ready(const std::vector<Parameter*>& params);
  // Sums over the tensor and embedding groups, marks every parameter not yet marked (in reverse buffer order,
  // so every rank launches the remaining buckets in the same order), waits until every bucket is reduced,
  // and rethrows a failure.
  void finalize();

  const Tensor& data() const { return flat_; }  // (padded total) f32; undefined under ZeRO-2
  // This rank's reduced block of bucket b (sharded): a view of data(), or ZeRO-2's accumulator.
  Tensor shard_of(size_t bucket) const;
  Device device() const { return device_; }
  bool per_microbatch() const { return opt_.shard_gradients; }  // marks every microbatch's gradients
  // Elements of the step-long gradient memory (the full buffer, or the shards and whole buckets of ZeRO-2).
  int64_t resident_elements() const;
  const std::vector<Parameter*>& params() const { return params_; }
  int64_t offset(const Parameter* p) const { return offset_.at(p); }  // first element in data()
  // A parameter's shape as laid out (its value may be released between uses under ZeRO-3).
  const Shape& shape(const Parameter* p) const { return shape_.at(p); }
  // ZeRO-2: the bytes of the largest bucket whose storage lives only from its first prepare() to its flush (0
  // without sharded gradients): what one reduction in flight beside backward holds.
  int64_t largest_transient_bytes() const;
  size_t bucket_of(const Parameter* p) const { return bucket_of_.at(p); }
  bool holds(const Parameter* p) const { return bucket_of_.contains(p); }  // one of params()
  // In backward order: buckets()[0] holds the last parameters.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  bool sharded() const { return opt_.shard; }
  int dp_rank() const { return dp_ ? dp_->rank() : 0; }
  int dp_size() const { return dp_ ? dp_->size() : 1; }
  // The ranks a bucket is sharded over (the shard group: dp_size() without hybrid sharding) and this rank's block.
  int shard_count() const { return dp_size() / replica_count(); }
  int shard_rank() const { return dp_rank() % shard_count(); }
  int replica_count() const { return opt_.replicas ? opt_.replicas->size() : 1; }

 private:
  bool sums_elsewhere(const Parameter* p) const;
  void ready(Parameter* p);         // mu_ held
  void flush_ready(size_t bucket);  // mu_ held; ZeRO-2: launches the bucket's storage if complete
  void give_storage(Bucket& b);     // mu_ held; ZeRO-2: fresh zeroed storage, the gradients views of it
  void launch(size_t bucket);
  void worker();
  void reduce(size_t bucket, std::vector<std::unique_ptr<Work>>* keep);
  // ZeRO-2: one flush of a bucket's storage (detached from the gradients).
  struct Flush {
    size_t bucket;
    Tensor storage;
  };
  // Reduce-scatters in place and adds this rank's block into the bucket's shard; keep: returns the Work in flight
  // instead (the caller adds once it is waited on: drain_flushes).
  std::unique_ptr<Work> reduce_flush(Flush& f, bool keep);
  void drain_flushes(size_t keep_last);  // mu_ held, on the caller: adds the completed ones into the shards
  // This rank's reduced block `mine` of `bucket` (hybrid: over the whole group in rank order, then across replicas).
  std::unique_ptr<Work> scatter(const Tensor& bucket, Tensor& mine);

  std::vector<Parameter*> params_;  // in buffer order
  GradBufferOptions opt_;
  std::unique_ptr<Communicator> dp_;
  Tensor flat_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, int64_t> offset_;
  std::unordered_map<const Parameter*, Shape> shape_;
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
  Device device_;
  std::deque<Flush> flushes_;                      // ZeRO-2: queued (worker) or in flight (caller), in launch order
  std::deque<std::unique_ptr<Work>> flush_works_;  // ZeRO-2 on the caller: the in-flight flushes' works
  std::unordered_map<const Parameter*, int> prepared_;  // ZeRO-2: prepare()s minus marks
  size_t launched_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace mt
