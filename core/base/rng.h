// rng.h: Philox4x32-10, a counter-based RNG; every random number is a pure function of (key, counter),
// so what a rank draws depends on global coordinates, never on which rank draws it.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt {

struct Philox4 {
  uint32_t v[4];
};

MT_HOST_DEVICE inline Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    Philox4 next;
    next.v[0] = static_cast<uint32_t>(p1 >> 32) ^ ctr.v[1] ^ k0;
    next.v[1] = static_cast<uint32_t>(p1);
    next.v[2] = static_cast<uint32_t>(p0 >> 32) ^ ctr.v[3] ^ k1;
    next.v[3] = static_cast<uint32_t>(p0);
    ctr = next;
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// A uniform float in [0, 1) from 24 random bits.
MT_HOST_DEVICE inline float uniform_from_bits(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// FNV-1a of a name: turns "layers.3.fc1.weight" or a dropout site into a stream id.
constexpr uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Standard normal number `index` of stream (seed, stream): Box-Muller on one Philox block, so
// element i of a parameter has the same value whichever rank, slice or order draws it.
inline double normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4 ctr{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream),
               static_cast<uint32_t>(stream >> 32)}};
  Philox4 r = philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  uint64_t a = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  uint64_t b = (static_cast<uint64_t>(r.v[2]) << 32) | r.v[3];
  double u1 = (static_cast<double>(a >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * (1.0 / 9007199254740992.0);          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Uniform 64-bit number `index` of stream (seed, stream), for shuffles and other host decisions.
inline uint64_t random_u64_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4 ctr{{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream),
               static_cast<uint32_t>(stream >> 32)}};
  Philox4 r = philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

// Dropout uniforms for columns [4*block, 4*block + 4) at global coordinates (sample, row) of dropout
// site `site` (a stream id naming layer and place): one Philox block serves four neighbouring columns.
MT_HOST_DEVICE inline Philox4 dropout_block(uint64_t seed, uint64_t site, uint64_t sample, uint64_t row,
                                            uint64_t block) {
  Philox4 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(row), static_cast<uint32_t>(sample),
               static_cast<uint32_t>(sample >> 32) ^ static_cast<uint32_t>(row >> 32) * 0x9E3779B9u}};
  uint64_t k = seed ^ (site * 0x9E3779B97F4A7C15ull);
  return philox4x32_10(ctr, static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32));
}

// The uniform in [0, 1) that decides whether element (sample, row, col) of site `site` is kept (u >= p).
MT_HOST_DEVICE inline float dropout_uniform(uint64_t seed, uint64_t site, uint64_t sample, uint64_t row, uint64_t col) {
  return uniform_from_bits(dropout_block(seed, site, sample, row, col >> 2).v[col & 3]);
}

// One row of a dropout mask: its key (seed, site, sample, row) and the drop probability.
struct DropoutRow {
  uint64_t seed = 0, site = 0, sample = 0, row = 0;
  float p = 0;
};

// keep[j] = the keep scale (0 or 1 / (1 - p)) of columns [col0, col0 + n) of row r, one Philox block per four
// columns; the fast path of dropout_uniform for whole rows.
inline void dropout_row_scales(const DropoutRow& r, uint64_t col0, int64_t n, float* keep) {
  const uint64_t seed = r.seed, site = r.site, sample = r.sample, row = r.row;
  const float p = r.p;
  const float scale = 1.f / (1.f - p);
  int64_t j = 0;
  while (j < n) {
    const uint64_t col = col0 + static_cast<uint64_t>(j);
    const Philox4 bits = dropout_block(seed, site, sample, row, col >> 2);
    for (uint64_t lane = col & 3; lane < 4 && j < n; ++lane, ++j)
      keep[j] = uniform_from_bits(bits.v[lane]) >= p ? scale : 0.f;
  }
}

}  // namespace mt
