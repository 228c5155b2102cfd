// tensor.h: a contiguous view (dtype, shape, device, offset) into storage owned by the device's allocator.
// zero_, copy_from (across dtypes and devices), to, to_floats and item work on every device; data<T>() and
// raw() are the memory itself, host-readable only for Device::cpu.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor/allocator.h"
#include "core/base/dtype.h"

namespace mt {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
// Product of the dimensions; throws std::invalid_argument on a negative dimension or int64 overflow.
int64_t shape_numel(const Shape& s);
// No tensor may exceed 2^48 bytes (256 TiB, far beyond any device): a larger request is a corrupted size,
// refused before the allocator sees it.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 48;

struct Storage {
  Storage(size_t bytes, Device device, MemKind kind);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  MemKind kind;
};

// Views are always contiguous (row-major); view() and slice() share storage.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu, MemKind kind = MemKind::activation);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu, MemKind kind = MemKind::activation);
  // A host tensor holding `values` rounded to dtype.
  static Tensor from_floats(std::span<const float> values, Shape shape, DType dtype = DType::f32);
  static Tensor from_ints(std::span<const int32_t> values, Shape shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu; }
  MemKind kind() const { return storage_ ? storage_->kind : MemKind::activation; }

  void* raw() const { return static_cast<char*>(storage_->ptr) + offset_bytes_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Same storage, new shape of the same element count.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along dim 0, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;

  void zero_();
  // Copies src into this tensor with dtype conversion (same element count). Into e4m3 / e5m2 it rounds to
  // nearest even and saturates (core/base/dtype.h), with no scale: scaled casts are fp8_quantize (ops.h).
  void copy_from(const Tensor& src);
  Tensor clone(MemKind kind = MemKind::activation) const;
  // A copy on device d (same dtype and shape).
  Tensor to(Device d, MemKind kind = MemKind::activation) const;
  // Host copy of the values as floats (any floating or integer dtype, any device).
  std::vector<float> to_floats() const;
  float item() const;  // the single element as float

  std::string describe() const;  // "bf16[4, 64]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

// Throws std::invalid_argument naming `what` unless t has the expected shape.
void check_shape(const Tensor& t, const Shape& expected, const char* what);

}  // namespace mt
