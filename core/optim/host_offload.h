// host_offload.h: ZeRO-Offload (optimizer.offload: true). A rank's fp32 master weights and Adam moments live in
// host memory (MemKind::host: pinned on a GPU machine), and the AdamW step runs on the host: the reduced gradients
// go device -> host, the CPU backend's fused AdamW updates the state on several threads, and the updated values
// (rounded to the compute dtype, or the fp32 masters) go host -> device. The step is cut into chunks of the flat
// state: on CUDA the copies run on a side stream ordered by events, so chunk k + 1's gradients travel while the
// host updates chunk k, and chunk k's values travel while the host updates chunk k + 1. On the CPU backend the
// same chunks are copied in place (the "device" is host memory too), so the path is tested without a GPU.
//
// The update is the same element by element as the device's (the CPU and CUDA AdamW are bit for bit equal), so a
// run with offload trains exactly as one without. AdamW and the distributed optimizer (ZeRO-1/2/3) hold one of
// these for their state when AdamWConfig::offload is set; the trainer does not know.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"

namespace mt {

struct OffloadOptions {
  bool enabled = false;
  // Elements of the flat state per chunk of the pipelined step (the gradient and value staging hold two chunks);
  // a chunk is a quarter of the state at most (at least four chunks to overlap).
  int64_t chunk_elements = int64_t{1} << 22;
  int threads = 0;  // host threads of the AdamW step; 0: the machine's cores (at least 1)
};

// The host bytes a state of n elements takes under `opt` (masters, moments, two chunks of gradient and value
// staging) with values in `value_dtype`: what MemKind::host holds, and what plan predicts.
int64_t offload_host_bytes(int64_t n, DType value_dtype, const OffloadOptions& opt);

class HostOffload {
 public:
  // Elements [begin, end) of the flat state: one parameter's (or one parameter's part of a shard).
  struct Segment {
    int64_t begin, end;
    bool decay = true;  // weight decay applies
  };
  // A state of n elements (zeros; the owner writes the initial masters) over `segments` (in increasing order,
  // not overlapping; elements outside every segment are never updated), whose gradients come from and whose values
  // go to `device`, the values in `value_dtype` (f32: the masters themselves are copied back).
  HostOffload(int64_t n, std::vector<Segment> segments, DType value_dtype, Device device, OffloadOptions opt);
  ~HostOffload();
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  // (n) f32 each, host memory (MemKind::host).
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }

  // One AdamW step with `opt`: grads[i] (segment i's elements, f32, on the device) are read after the work
  // enqueued on the compute stream so far, and values[i] (segment i's elements in value_dtype, on the device)
  // hold the updated values for the work enqueued after it returns. The host waits for the gradients only.
  void step(const AdamWOptions& opt, const std::vector<Tensor>& grads, const std::vector<Tensor>& values);

 private:
  struct Piece {  // a segment's part of one chunk
    size_t segment;
    int64_t begin, end;  // in the flat state
  };
  std::vector<Piece> pieces_of(int64_t chunk_begin, int64_t chunk_end) const;
  void update_chunk(int64_t chunk_begin, const std::vector<Piece>& pieces, const Tensor& grads, const Tensor& values,
                    const AdamWOptions& opt);

  int64_t n_;
  std::vector<Segment> segments_;
  DType value_dtype_;
  Device device_;
  OffloadOptions opt_;
  int64_t chunk_ = 0;  // elements per chunk
  Tensor master_, exp_avg_, exp_avg_sq_;
  Tensor grad_staging_[2];   // (chunk) f32 host
  Tensor value_staging_[2];  // (chunk) value_dtype host; undefined for f32 (the masters are copied)
  class Copies;              // the copy stream and its events (CUDA) or plain copies (CPU)
  std::unique_ptr<Copies> copies_;
  class Workers;  // the host threads of the update
  std::unique_ptr<Workers> workers_;
};

}  // namespace mt
