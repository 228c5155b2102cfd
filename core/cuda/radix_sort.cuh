// radix_sort.cuh (nvcc only): CUB's stable radix sort of (uint32 or uint64 key, int32 value) pairs on the compute
// stream, its temporary storage from the caching allocator. The sorts of embedding_backward (token positions by table
// row) and moe_dispatch_index (choices by expert, and by (expert, weight) for token dropping).
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/kernels.cuh"

namespace mt::cuda {

// keys_out / values_out := the n pairs sorted by key ascending, stably (equal keys keep their input order). Every
// key lies in [0, max_key]: only the bits that hold max_key are sorted on. n must fit an int (the callers check it
// and say what their pairs are).
template <class Key>
inline void stable_sort_pairs(const Key* keys_in, Key* keys_out, const int32_t* values_in, int32_t* values_out,
                              int64_t n, uint64_t max_key) {
  static_assert(std::is_same_v<Key, uint32_t> || std::is_same_v<Key, uint64_t>, "uint32 or uint64 keys");
  constexpr int kKeyBits = 8 * static_cast<int>(sizeof(Key));
  int end_bit = 0;
  while (end_bit < kKeyBits && (uint64_t{1} << end_bit) <= max_key) ++end_bit;
  const int count = static_cast<int>(n);
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in, values_out, count, 0,
                                                end_bit, stream()));
  Tensor temp = Tensor::empty({std::max<int64_t>(1, ceil_div(static_cast<int64_t>(temp_bytes), 4))}, DType::i32,
                              Device::cuda, MemKind::workspace);
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, keys_in, keys_out, values_in, values_out, count,
                                                0, end_bit, stream()));
}

}  // namespace mt::cuda
