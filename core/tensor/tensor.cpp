#include "core/tensor/tensor.h"

#include <cstring>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/tensor/backend.h"

namespace mt {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(s));
    if (__builtin_mul_overflow(n, d, &n))
      throw std::invalid_argument("shape " + shape_str(s) + " has more elements than int64 can count");
  }
  return n;
}

Storage::Storage(size_t bytes_, Device device_, MemKind kind_) : bytes(bytes_), device(device_), kind(kind_) {
  ptr = allocator_for(device).allocate(bytes, kind);
}

Storage::~Storage() { allocator_for(device).deallocate(ptr, bytes, kind); }

Tensor Tensor::empty(Shape shape, DType dtype, Device device, MemKind kind) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  int64_t bytes = 0;
  if (__builtin_mul_overflow(t.numel_, static_cast<int64_t>(dtype_size(dtype)), &bytes) || bytes > kMaxTensorBytes)
    throw std::invalid_argument(fmt::format("tensor of shape {} ({}) needs more than the {} bytes one tensor may hold",
                                            shape_str(shape), dtype_name(dtype), kMaxTensorBytes));
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device, kind);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device, MemKind kind) {
  Tensor t = empty(std::move(shape), dtype, device, kind);
  t.zero_();
  return t;
}

Tensor Tensor::from_floats(std::span<const float> values, Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw std::invalid_argument(
        fmt::format("from_floats: {} values for shape {}", values.size(), shape_str(t.shape())));
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = values[i];
    switch (dtype) {
      case DType::f32:
        t.data<float>()[i] = v;
        break;
      case DType::bf16:
        t.data<uint16_t>()[i] = float_to_bf16(v);
        break;
      case DType::f16:
        t.data<uint16_t>()[i] = float_to_f16(v);
        break;
      case DType::i32:
        t.data<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DType::i64:
        t.data<int64_t>()[i] = static_cast<int64_t>(v);
        break;
      case DType::f64:
        t.data<double>()[i] = v;
        break;
      case DType::e4m3:
        t.data<uint8_t>()[i] = float_to_e4m3(v);
        break;
      case DType::e5m2:
        t.data<uint8_t>()[i] = float_to_e5m2(v);
        break;
    }
  }
  return t;
}

Tensor Tensor::from_ints(std::span<const int32_t> values, Shape shape) {
  Tensor t = empty(std::move(shape), DType::i32);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw std::invalid_argument(fmt::format("from_ints: {} values for shape {}", values.size(), shape_str(t.shape())));
  if (t.nbytes() > 0) std::memcpy(t.raw(), values.data(), t.nbytes());  // an empty span's data() may be null
  return t;
}

Tensor Tensor::view(Shape shape) const {
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument(fmt::format("view: cannot view {} as {}", describe(), shape_str(shape)));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  if (ndim() == 0 || begin < 0 || end < begin || end > shape_[0])
    throw std::invalid_argument(fmt::format("slice: rows [{}, {}) out of range for {}", begin, end, describe()));
  Tensor t = *this;
  int64_t row = numel_ / std::max<int64_t>(shape_[0], 1);
  t.offset_bytes_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  t.numel_ = t.shape_[0] * row;
  return t;
}

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (device() == Device::cpu) {
    std::memset(raw(), 0, nbytes());
    return;
  }
  device_runtime(device(), "zero_").fill_zero(raw(), nbytes());
}

namespace {

float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::bf16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::i32:
      return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    case DType::i64:
      return static_cast<float>(static_cast<const int64_t*>(base)[i]);
    case DType::f64:
      return static_cast<float>(static_cast<const double*>(base)[i]);
    case DType::e4m3:
      return e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::e5m2:
      return e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.f;
}

}  // namespace

void Tensor::copy_from(const Tensor& src) {
  if (src.numel() != numel_)
    throw std::invalid_argument(fmt::format("copy_from: {} into {}", src.describe(), describe()));
  if (device() != Device::cpu || src.device() != Device::cpu) {
    // The device's runtime moves the bytes (the host's side of a copy is plain memory to it).
    DeviceRuntime& rt = device_runtime(device() != Device::cpu ? device() : src.device(), "copy_from");
    if (src.dtype() == dtype_) return rt.copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
    if (device() == src.device()) return rt.convert(src.raw(), src.dtype(), raw(), dtype_, numel_);
    // Across devices and dtypes: convert where the source lives, then move the bytes.
    Tensor converted = empty(shape_, dtype_, src.device(), MemKind::workspace);
    converted.copy_from(src);
    return copy_from(converted);
  }
  if (src.dtype() == dtype_) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  const void* s = src.raw();
  for (int64_t i = 0; i < numel_; ++i) {
    float v = load_as_float(s, src.dtype(), i);
    switch (dtype_) {
      case DType::f32:
        data<float>()[i] = v;
        break;
      case DType::bf16:
        data<uint16_t>()[i] = float_to_bf16(v);
        break;
      case DType::f16:
        data<uint16_t>()[i] = float_to_f16(v);
        break;
      case DType::i32:
        data<int32_t>()[i] = static_cast<int32_t>(v);
        break;
      case DType::i64:
        data<int64_t>()[i] = static_cast<int64_t>(v);
        break;
      case DType::f64:
        data<double>()[i] = v;
        break;
      case DType::e4m3:
        data<uint8_t>()[i] = float_to_e4m3(v);  // saturating (core/base/dtype.h)
        break;
      case DType::e5m2:
        data<uint8_t>()[i] = float_to_e5m2(v);
        break;
    }
  }
}

Tensor Tensor::clone(MemKind kind) const { return to(device(), kind); }

Tensor Tensor::to(Device d, MemKind kind) const {
  Tensor t = empty(shape_, dtype_, d, kind);
  t.copy_from(*this);
  return t;
}

std::vector<float> Tensor::to_floats() const {
  if (device() != Device::cpu) return to(Device::cpu, MemKind::workspace).to_floats();
  std::vector<float> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[i] = load_as_float(raw(), dtype_, i);
  return out;
}

float Tensor::item() const {
  if (numel_ != 1) throw std::invalid_argument("item: tensor " + describe() + " has more than one element");
  if (device() != Device::cpu) return to(Device::cpu, MemKind::workspace).item();
  return load_as_float(raw(), dtype_, 0);
}

std::string Tensor::describe() const { return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_)); }

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  if (!t.defined() || t.shape() != expected)
    throw std::invalid_argument(fmt::format("{}: expected shape {}, got {}", what, shape_str(expected),
                                            t.defined() ? shape_str(t.shape()) : "undefined"));
}

}  // namespace mt
