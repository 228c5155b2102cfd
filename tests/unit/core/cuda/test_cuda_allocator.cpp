// test_cuda_allocator.cpp: the caching device allocator's stream rule. A block that another stream used
// (record_stream) is not handed out again until that stream's work, enqueued before the block was freed, has
// finished; once it has, the next allocation takes the block back (no pending block is left); blocks used only
// by the compute stream are reused at once. Skips without a GPU.
//
// No wait in this file is unbounded. The side stream is held by a host function that polls a flag and gives
// up at a deadline, and nothing that could wait for the held stream runs while it is held: the allocation made
// then is served from the cache (a spare block of the same size is cached before the hold), so there is no
// cudaMalloc, which may synchronise the device. Should a call wait for the stream anyway (a change in the
// allocator), the gate opens at its deadline, the call returns and the test fails saying so, instead of
// hanging. The side stream's end is awaited by polling with a deadline too.
#include <gtest/gtest.h>

#if !defined(MEGATRAIN_WITH_CUDA)

TEST(CudaAllocator, Skipped) { GTEST_SKIP() << "built without the CUDA backend"; }

#else

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/cuda/runtime.h"
#include "core/tensor/tensor.h"

namespace mt {
namespace {

#define SKIP_WITHOUT_GPU()                                                                           \
  do {                                                                                               \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason(); \
  } while (0)

using Clock = std::chrono::steady_clock;
constexpr auto kHoldLimit = std::chrono::seconds(30);   // the longest the side stream is held
constexpr auto kDrainLimit = std::chrono::seconds(60);  // the longest a wait for its end may take

// A side stream held back until release(), or at the latest kHoldLimit after construction: a host function
// enqueued on it polls a flag until then. timed_out() says the deadline, not release(), opened it.
class GatedStream {
 public:
  GatedStream() : gate_(new Gate) {
    gate_->deadline = Clock::now() + kHoldLimit;
    const cudaError_t created = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    EXPECT_EQ(created, cudaSuccess);
    if (created == cudaSuccess) EXPECT_EQ(cudaLaunchHostFunc(stream_, &GatedStream::hold, gate_), cudaSuccess);
  }
  ~GatedStream() {
    release();
    if (!stream_) {
      delete gate_;
    } else if (drained()) {
      cudaStreamDestroy(stream_);
      delete gate_;
    } else {  // the host function may still read the gate: leak both rather than free them under it
      ADD_FAILURE() << "the side stream did not finish within " << kDrainLimit.count() << " s of its release";
    }
  }
  GatedStream(const GatedStream&) = delete;
  GatedStream& operator=(const GatedStream&) = delete;

  void release() { gate_->open.store(true); }
  void* stream() const { return stream_; }
  bool timed_out() const { return gate_->timed_out.load(); }

  // Whether the stream's work has finished, polled for at most kDrainLimit.
  bool drained() const {
    const Clock::time_point until = Clock::now() + kDrainLimit;
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return true;
      if (q != cudaErrorNotReady) {
        ADD_FAILURE() << "cudaStreamQuery: " << cudaGetErrorString(q);
        return false;
      }
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  struct Gate {
    std::atomic<bool> open{false}, timed_out{false};
    Clock::time_point deadline;
  };
  static void CUDART_CB hold(void* p) {
    Gate* g = static_cast<Gate*>(p);
    while (!g->open.load()) {
      if (Clock::now() >= g->deadline) {
        g->timed_out.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  cudaStream_t stream_ = nullptr;
  Gate* gate_;
};

TEST(CudaAllocator, BlocksUsedByAnotherStreamWaitForItBeforeReuse) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;  // 4 MiB: a large block
  cuda::empty_cache();        // from here on the cache holds only the blocks this test frees
  // Both blocks come from cudaMalloc now, before the side stream is held.
  Tensor t = Tensor::empty({n}, DType::f32, Device::cuda);
  Tensor spare_t = Tensor::empty({n}, DType::f32, Device::cuda);
  void* const first = t.raw();
  void* const spare = spare_t.raw();
  ASSERT_NE(first, spare);

  GatedStream side;  // until side.release(), nothing may wait for the device
  cuda::record_stream(static_cast<char*>(first) + 4096, side.stream());  // an inner pointer finds the block
  t = Tensor();        // first: used by the held side stream, so pending
  spare_t = Tensor();  // spare: cached at once, after first would have been had first been cached too
  EXPECT_EQ(cuda::cache_stats().pending_blocks, 1);
  const int64_t mallocs = cuda::cache_stats().device_mallocs;
  {
    // The smallest fitting cached block, the oldest first: first, were it cached; spare, as it is pending.
    Tensor u = Tensor::empty({n}, DType::f32, Device::cuda);
    EXPECT_NE(u.raw(), first) << "a block still in use by the side stream was handed out again";
    EXPECT_EQ(u.raw(), spare);
    EXPECT_EQ(cuda::cache_stats().device_mallocs, mallocs) << "the allocation while the side stream was held "
                                                              "reached cudaMalloc instead of the cached spare block";
    EXPECT_EQ(cuda::cache_stats().pending_blocks, 1);

    side.release();
    ASSERT_TRUE(side.drained()) << "the side stream did not finish within " << kDrainLimit.count() << " s";
    EXPECT_FALSE(side.timed_out()) << "the side stream's gate opened at its " << kHoldLimit.count()
                                   << " s deadline, not at release(): a call made while it was held waited for it";
    Tensor v = Tensor::empty({n}, DType::f32, Device::cuda);  // reclaims the pending block first
    EXPECT_EQ(cuda::cache_stats().pending_blocks, 0);
    EXPECT_EQ(v.raw(), first) << "the block did not come back once the side stream had finished";
  }
}

TEST(CudaAllocator, ComputeStreamBlocksAreReusedAtOnce) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  cuda::empty_cache();  // the only cached block of this size will be t's
  void* first = nullptr;
  {
    Tensor t = Tensor::zeros({n}, DType::f32, Device::cuda);
    first = t.raw();
    cuda::record_stream(t.raw(), cuda::compute_stream());  // no record needed: ordered already
  }
  Tensor u = Tensor::empty({n}, DType::f32, Device::cuda);
  EXPECT_EQ(u.raw(), first);
  EXPECT_EQ(cuda::cache_stats().pending_blocks, 0);
}

}  // namespace
}  // namespace mt

#endif  // MEGATRAIN_WITH_CUDA
