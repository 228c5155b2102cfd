// test_cuda_allocator.cpp: the caching device allocator's stream rule. A block that another stream used
// (record_stream) is not handed out again until that stream's work, enqueued before the block was freed, has
// finished; blocks used only by the compute stream are reused at once. Skips without a GPU.
#include <gtest/gtest.h>

#if !defined(MEGATRAIN_WITH_CUDA)

TEST(CudaAllocator, Skipped) { GTEST_SKIP() << "built without the CUDA backend"; }

#else

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace mt {
namespace {

#define SKIP_WITHOUT_GPU()                                                                           \
  do {                                                                                               \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason(); \
  } while (0)

// A side stream held back by a host function until release().
class GatedStream {
 public:
  GatedStream() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaLaunchHostFunc(stream_, &GatedStream::hold, &open_), cudaSuccess);
  }
  ~GatedStream() {
    release();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  void release() { open_.store(true); }
  void* stream() const { return stream_; }
  void finish() const { EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

 private:
  static void hold(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  cudaStream_t stream_ = nullptr;
  std::atomic<bool> open_{false};
};

TEST(CudaAllocator, BlocksUsedByAnotherStreamWaitForItBeforeReuse) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;  // 4 MiB: a large block
  GatedStream side;
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({n}, DType::f32, Device::cuda);
    first = t.raw();
    cuda::record_stream(static_cast<char*>(t.raw()) + 4096, side.stream());  // an inner pointer finds the block
  }
  EXPECT_EQ(cuda::cache_stats().pending_blocks, 1);
  {
    Tensor u = Tensor::empty({n}, DType::f32, Device::cuda);
    EXPECT_NE(u.raw(), first) << "a block still in use by the side stream was handed out again";
  }
  side.release();
  side.finish();
  Tensor v = Tensor::empty({n}, DType::f32, Device::cuda);  // reclaims the pending block first
  EXPECT_EQ(cuda::cache_stats().pending_blocks, 0);
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
