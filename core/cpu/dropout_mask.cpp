// dropout_mask.cpp: see dropout_mask.h. With AVX2 (checked at run time), eight Philox blocks go through the ten
// rounds at once; the 32 x 32 -> 64-bit products of the even and odd lanes come from two _mm256_mul_epu32. Without
// AVX2, and for the columns before the first and after the last whole group of eight blocks, rng.h's scalar
// dropout_row_scales runs: every column gets the same bits either way.
#include "core/cpu/dropout_mask.h"

#include <algorithm>

#include "core/base/rng.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MT_HAVE_AVX2_PATH 1
#endif

namespace mt::cpu {

namespace {

constexpr int64_t kLanes = 8;  // Philox blocks per group (32 columns)

#if MT_HAVE_AVX2_PATH
// hi and lo 32 bits of m * x per 32-bit lane.
__attribute__((target("avx2"))) inline void mul_hi_lo(__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(x, m);                                               // lanes 0, 2, 4, 6
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), _mm256_srli_epi64(m, 32));  // lanes 1, 3, 5, 7
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// keep[0, 32) for blocks [block0, block0 + 8) at (sample, row): rng.h's dropout_block and philox4x32_10, one
// block per lane.
__attribute__((target("avx2"))) void group_scales_avx2(const DropoutRow& r, uint64_t block0, float scale, float* keep) {
  const uint64_t seed = r.seed, site = r.site, sample = r.sample, row = r.row;
  const float p = r.p;
  const uint64_t k = seed ^ (site * 0x9E3779B97F4A7C15ull);
  uint32_t k0 = static_cast<uint32_t>(k), k1 = static_cast<uint32_t>(k >> 32);
  const uint32_t b = static_cast<uint32_t>(block0);
  __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(b)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i c1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(row)));
  __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(sample)));
  __m256i c3 = _mm256_set1_epi32(
      static_cast<int>(static_cast<uint32_t>(sample >> 32) ^ static_cast<uint32_t>(row >> 32) * 0x9E3779B9u));
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  alignas(32) uint32_t w[4][kLanes];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w[0]), c0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(w[1]), c1);
  _mm256_store_si256(reinterpret_cast<__m256i*>(w[2]), c2);
  _mm256_store_si256(reinterpret_cast<__m256i*>(w[3]), c3);
  for (int64_t l = 0; l < kLanes; ++l)
    for (int64_t v = 0; v < 4; ++v) keep[4 * l + v] = uniform_from_bits(w[v][l]) >= p ? scale : 0.f;
}

bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

}  // namespace

void dropout_keep_scales(const DropoutRow& r, uint64_t col0, int64_t n, float* keep) {
#if MT_HAVE_AVX2_PATH
  if (have_avx2()) {
    // Columns before the first whole block go through rng.h's row function, then groups of eight blocks.
    const uint64_t first_block = (col0 + 3) / 4;
    const int64_t head = std::min<int64_t>(n, static_cast<int64_t>(first_block * 4 - col0));
    dropout_row_scales(r, col0, head, keep);
    const float scale = 1.f / (1.f - r.p);
    int64_t j = head;
    for (; j + 4 * kLanes <= n; j += 4 * kLanes)
      group_scales_avx2(r, (col0 + static_cast<uint64_t>(j)) / 4, scale, keep + j);
    if (j < n) dropout_row_scales(r, col0 + static_cast<uint64_t>(j), n - j, keep + j);
    return;
  }
#endif
  dropout_row_scales(r, col0, n, keep);
}

}  // namespace mt::cpu
