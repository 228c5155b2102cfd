// backend_cuda.cpp: the CUDA op table (core/tensor/backend.h), filled from core/tensor/backend_ops.inc with the
// functions of ops_cuda.h, and the CUDA runtime: the DeviceRuntime over runtime.h, host_copies.h and
// attention_backend.h, so that the rest of megatrain reaches the GPU without naming CUDA.
#include "core/cuda/attention_backend.h"
#include "core/cuda/host_copies.h"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/runtime.h"
#include "core/tensor/backend.h"

namespace mt::cuda {

namespace {

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() const noexcept override { return cuda::device_count(); }
  std::string unavailable_reason() const override { return cuda::unavailable_reason(); }
  void select_device(int ordinal) override { cuda::select_device(ordinal); }
  std::string device_description() const override { return cuda::device_description(); }
  double peak_bf16_tflops() const override { return cuda::peak_bf16_tflops(); }
  std::vector<RuntimeLibrary> libraries() const override {
    // cuDNN (fused attention for bf16 / fp16) is optional; cuBLASLt, loaded at the first GEMM, is not.
    bool cublaslt_ok = false;
    std::string cublaslt = cublaslt_status(&cublaslt_ok);
    return {{.name = "cudnn", .status = cudnn_version(), .usable = true},
            {.name = "cublaslt", .status = std::move(cublaslt), .usable = cublaslt_ok}};
  }
  std::string attention_description(DType dtype, float dropout_p) const override {
    return attention_path_description(dtype, dropout_p);
  }

  void synchronize() override { cuda::synchronize(); }
  void* create_timing_event() override { return cuda::create_timing_event(); }
  void record_timing_event(void* event) override { record_on_compute_stream(event); }
  float elapsed_ms(void* start, void* end) override { return cuda::elapsed_ms(start, end); }
  void destroy_timing_event(void* event) noexcept override { cuda::destroy_timing_event(event); }
  void* create_copy_stream() override { return cuda::create_copy_stream(); }
  void destroy_copy_stream(void* stream) noexcept override { cuda::destroy_copy_stream(stream); }
  void* create_sync_event() override { return cuda::create_sync_event(); }
  void destroy_sync_event(void* event) noexcept override { cuda::destroy_sync_event(event); }
  void record_event(void* event, void* stream) override { cuda::record_event(event, stream); }
  void stream_wait_event(void* stream, void* event) override { cuda::stream_wait_event(stream, event); }
  void wait_event(void* event) override { cuda::wait_event(event); }

  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    cuda::copy_bytes(dst, dst_device, src, src_device, bytes);
  }
  void copy_async(void* dst, const void* src, size_t bytes, void* stream) override {
    cuda::copy_async(dst, src, bytes, stream);
  }
  void fill_zero(void* dst, size_t bytes) override { cuda::fill_zero(dst, bytes); }
  void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) override {
    cuda::convert(src, src_dtype, dst, dst_dtype, n);
  }

  Allocator& allocator() override { return caching_allocator(); }
  void* alloc_pinned(size_t bytes) override { return cuda::alloc_pinned(bytes); }
  void free_pinned(void* ptr) noexcept override { cuda::free_pinned(ptr); }
};

}  // namespace

void register_backend() {
  static const BackendOps table = [] {
    BackendOps t;
#define MT_BACKEND_OP(name, params) t.name = &name;
#include "core/tensor/backend_ops.inc"
#undef MT_BACKEND_OP
    return t;
  }();
  static CudaRuntime runtime;
  mt::register_backend(Device::cuda, table, &runtime);
}

}  // namespace mt::cuda
