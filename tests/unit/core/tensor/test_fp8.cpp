// test_fp8.cpp: the fp8 formats of core/base/dtype.h (e4m3, e5m2: every code, the extremes, round to nearest even
// at every midpoint, saturation, NaN and signed zeros) against a reference written from the format definitions, the
// fp8 tensor copies, and the CPU fp8 scaling ops (fp8_amax, fp8_quantize, fp8_dequantize).
// With MEGATRAIN_FP8_DUMP=FILE, Fp8Dump writes every code's value and a sweep of conversions to FILE for the
// independent check against PyTorch (tests/e2e/fp8_torch_interop.sh, tests/interop/check_fp8_torch.py).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/ops_fp8.h"
#include "core/tensor/tensor.h"
#include "tests/unit/temp_dir.h"

namespace mt {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// One format as its definition states it (OCP FP8), and the functions under test.
struct Format {
  DType dtype;
  int exp_bits, mant_bits, bias;
  float max;         // largest finite value
  uint8_t max_code;  // its code
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
};
const Format kE4m3{DType::e4m3, 4, 3, 7, 448.f, 0x7e, e4m3_to_float, float_to_e4m3};
const Format kE5m2{DType::e5m2, 5, 2, 15, 57344.f, 0x7b, e5m2_to_float, float_to_e5m2};
const Format kFormats[] = {kE4m3, kE5m2};

std::string name(const Format& f) { return std::string(dtype_name(f.dtype)); }

// The value of code c from the definition: NaN for e4m3's S.1111.111 and e5m2's exponent 31 with a mantissa,
// inf for e5m2's exponent 31 without one; subnormals m * 2^(1 - bias - mant), normals (2^mant + m) 2^(e - bias - mant).
double spec_value(const Format& f, uint8_t c) {
  const int e = (c >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = c & ((1 << f.mant_bits) - 1);
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  const int e_max = (1 << f.exp_bits) - 1;
  if (f.dtype == DType::e4m3 && e == e_max && m == (1 << f.mant_bits) - 1) return std::nan("");
  if (f.dtype == DType::e5m2 && e == e_max) return m ? std::nan("") : sign * INFINITY;
  const double mag =
      e == 0 ? std::ldexp(m, 1 - f.bias - f.mant_bits) : std::ldexp((1 << f.mant_bits) + m, e - f.bias - f.mant_bits);
  return sign * mag;
}

// The saturating round-to-nearest-even cast from the definition: the nearest of the finite values (ties to the even
// code), +-max beyond the range (inf included), the canonical NaN 0x7f for any NaN, the sign kept on zeros.
uint8_t reference_encode(const Format& f, float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= f.max) return sign | f.max_code;
  int lo = 0, hi = f.max_code;  // the largest code c with value(c) <= a: value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (spec_value(f, static_cast<uint8_t>(mid)) <= a ? lo : hi) = mid;
  }
  const double below = a - spec_value(f, static_cast<uint8_t>(lo));  // exact in double
  const double above = spec_value(f, static_cast<uint8_t>(hi)) - a;
  const int c = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | c);
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// ---- the formats ---------------------------------------------------------------------------------

TEST(Fp8Format, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_name(DType::e4m3), "e4m3");
  EXPECT_EQ(dtype_name(DType::e5m2), "e5m2");
  EXPECT_EQ(dtype_size(DType::e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::e5m2), 1u);
  for (const char* s : {"e4m3", "fp8_e4m3", "float8_e4m3fn"}) EXPECT_EQ(parse_dtype(s), DType::e4m3) << s;
  for (const char* s : {"e5m2", "fp8_e5m2", "float8_e5m2"}) EXPECT_EQ(parse_dtype(s), DType::e5m2) << s;
  EXPECT_THROW(parse_dtype("fp8"), std::invalid_argument);
  EXPECT_TRUE(is_fp8(DType::e4m3) && is_fp8(DType::e5m2) && !is_fp8(DType::bf16));
  EXPECT_FALSE(is_floating(DType::e4m3) || is_floating(DType::e5m2));  // storage only: ops refuse them
}

TEST(Fp8Format, EveryCodeDecodesAsTheDefinitionSays) {
  for (const Format& f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const double want = spec_value(f, static_cast<uint8_t>(c));
      const float got = f.decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << name(f) << " code " << c;
      } else {
        EXPECT_EQ(bits(got), bits(static_cast<float>(want))) << name(f) << " code " << c << ": " << got;
      }
    }
}

TEST(Fp8Format, EveryCodeRoundTrips) {
  for (const Format& f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const float v = f.decode(static_cast<uint8_t>(c));
      const uint8_t back = f.encode(v);
      if (std::isnan(v))
        EXPECT_TRUE(std::isnan(f.decode(back))) << name(f) << " NaN code " << c << " came back as " << int(back);
      else if (std::isinf(v))  // e5m2's infinities saturate (below)
        EXPECT_EQ(back, (c & 0x80) | f.max_code) << name(f) << " code " << c;
      else
        EXPECT_EQ(back, c) << name(f) << " code " << c << " (" << v << ")";
    }
}

TEST(Fp8Format, Extremes) {
  // e4m3: max 448 = 0x7e, min normal 2^-6 = 0x08, min subnormal 2^-9 = 0x01
  EXPECT_EQ(float_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-448.f), 0xfe);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(float_to_e4m3(0x1p-6f), 0x08);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(float_to_e4m3(-0x1p-9f), 0x81);
  // e5m2: max 57344 = 0x7b, min normal 2^-14 = 0x04, min subnormal 2^-16 = 0x01, inf 0x7c
  EXPECT_EQ(float_to_e5m2(57344.f), 0x7b);
  EXPECT_EQ(float_to_e5m2(-57344.f), 0xfb);
  EXPECT_EQ(e5m2_to_float(0x7b), 57344.f);
  EXPECT_EQ(float_to_e5m2(0x1p-14f), 0x04);
  EXPECT_EQ(e5m2_to_float(0x04), 0x1p-14f);
  EXPECT_EQ(float_to_e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(e5m2_to_float(0x7c), kInf);
  EXPECT_EQ(e5m2_to_float(0xfc), -kInf);
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7d)) && std::isnan(e5m2_to_float(0xff)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)) && std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0x78), 256.f);  // exponent 15 is a normal exponent in e4m3 (no infinities)
}

// Between every two adjacent finite values: the midpoint goes to the even code, one float above it to the upper
// code, one below to the lower; both signs.
TEST(Fp8Format, MidpointsRoundToEven) {
  for (const Format& f : kFormats)
    for (int c = 0; c < f.max_code; ++c) {
      const float a = f.decode(static_cast<uint8_t>(c)), b = f.decode(static_cast<uint8_t>(c + 1));
      const float mid = (a + b) / 2;  // exact: one bit more than the format has
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2);
      const int even = c % 2 == 0 ? c : c + 1;
      for (const uint8_t sign : {uint8_t{0}, uint8_t{0x80}}) {
        const float s = sign ? -1.f : 1.f;
        EXPECT_EQ(f.encode(s * mid), sign | even) << name(f) << " midpoint " << mid;
        EXPECT_EQ(f.encode(s * std::nextafter(mid, kInf)), sign | (c + 1)) << name(f) << " above " << mid;
        EXPECT_EQ(f.encode(s * std::nextafter(mid, 0.f)), sign | c) << name(f) << " below " << mid;
      }
    }
  // Half the smallest subnormal ties to zero (even), just above it to the smallest subnormal.
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(float_to_e4m3(std::nextafter(0x1p-10f, 1.f)), 0x01);
  EXPECT_EQ(float_to_e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(float_to_e5m2(std::nextafter(0x1p-17f, 1.f)), 0x01);
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);   // 1.5 subnormal units: to even 2
  EXPECT_EQ(float_to_e4m3(15 * 0x1p-10f), 0x08);  // 7.5 units: rounds up into the smallest normal
}

TEST(Fp8Format, SaturatesLargeValuesAndInfinities) {
  // e4m3: 464 is the midpoint between 448 and the (NaN) code above; everything beyond 448 clamps.
  for (float v : {449.f, 464.f, 465.f, 480.f, 1e4f, 1e30f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(float_to_e4m3(v), 0x7e) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0xfe) << -v;
  }
  // e5m2: 61440 is the midpoint between 57344 and inf; inf saturates too (as __NV_SATFINITE).
  for (float v : {57345.f, 61439.f, 61440.f, 65536.f, 1e30f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(float_to_e5m2(v), 0x7b) << v;
    EXPECT_EQ(float_to_e5m2(-v), 0xfb) << -v;
  }
}

TEST(Fp8Format, NanAndSignedZeros) {
  for (const Format& f : kFormats) {
    for (float v : {kNan, -kNan, std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffffffffu)})
      EXPECT_EQ(f.encode(v), 0x7f) << name(f) << " NaN bits " << std::hex << bits(v);
    EXPECT_EQ(f.encode(0.f), 0x00);
    EXPECT_EQ(f.encode(-0.f), 0x80) << name(f);
    EXPECT_EQ(f.encode(-1e-30f), 0x80) << name(f) << ": underflow keeps the sign";
    EXPECT_EQ(f.encode(-std::numeric_limits<float>::denorm_min()), 0x80) << name(f);
    EXPECT_EQ(bits(f.decode(0x80)), bits(-0.f)) << name(f);
  }
}

// Random float bit patterns and random values spread over the format's range: the reference, bit for bit.
TEST(Fp8Format, RandomValuesMatchTheReference) {
  std::mt19937 gen(29);
  for (const Format& f : kFormats) {
    std::uniform_real_distribution<float> log2_mag(-f.bias - f.mant_bits - 3.f, std::log2(f.max) + 1.f);
    for (int i = 0; i < 300000; ++i) {
      float x = i % 2 ? std::bit_cast<float>(static_cast<uint32_t>(gen())) : std::exp2(log2_mag(gen));
      if (i % 4 == 0) x = -x;
      ASSERT_EQ(f.encode(x), reference_encode(f, x)) << name(f) << " x=" << x << " bits " << std::hex << bits(x);
    }
  }
}

TEST(Fp8Format, RoundToIsTheStoredValue) {
  EXPECT_EQ(round_to(DType::e4m3, 500.f), 448.f);
  EXPECT_EQ(round_to(DType::e4m3, 0.3f), 0.3125f);
  EXPECT_EQ(round_to(DType::e5m2, kInf), 57344.f);
  EXPECT_EQ(round_to(DType::e5m2, 0.3f), 0.3125f);
}

// ---- tensors -------------------------------------------------------------------------------------

std::vector<float> sample_values() {
  std::vector<float> x = {0.f,      -0.f,     1.f,      -1.f,   448.f,    464.f,     500.f,   -1e6f,  57344.f,
                          61440.f,  7e4f,     kInf,     -kInf,  kNan,     0.3f,      1e-3f,   2e-3f,  0x1p-9f,
                          0x1p-10f, 0x1p-16f, 0x1p-17f, 1e-30f, 3.14159f, -2.71828f, 1.0625f, 1.1875f};
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-600.f, 600.f);
  for (int i = 0; i < 1000; ++i) x.push_back(u(gen) / (1 + i % 50));
  return x;
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// Every copy between a floating dtype and an fp8 one (and between the fp8 ones) is the value rounded to the
// source dtype, then cast to the destination (saturating into fp8).
TEST(Fp8Tensor, CopyFromAcrossDtypes) {
  const std::vector<float> x = sample_values();
  const auto n = static_cast<int64_t>(x.size());
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2};
  for (DType src_dt : all)
    for (DType dst_dt : all) {
      if (!is_fp8(src_dt) && !is_fp8(dst_dt)) continue;
      const Tensor src = Tensor::from_floats(x, {n}, src_dt);
      Tensor dst = Tensor::empty({n}, dst_dt);
      dst.copy_from(src);
      const std::vector<float> got = dst.to_floats();
      for (int64_t i = 0; i < n; ++i) {
        const float want = round_to(dst_dt, round_to(src_dt, x[i]));
        ASSERT_TRUE(same_value(got[i], want)) << dtype_name(src_dt) << " -> " << dtype_name(dst_dt) << " of " << x[i]
                                              << ": got " << got[i] << ", want " << want;
      }
    }
}

TEST(Fp8Tensor, FromFloatsStoresTheCodes) {
  const std::vector<float> x = {1.f, -448.f, 1e9f, kNan, -0.f};
  const Tensor q = Tensor::from_floats(x, {5}, DType::e4m3);
  EXPECT_EQ(q.nbytes(), 5u);
  const uint8_t* c = q.data<uint8_t>();
  EXPECT_EQ(c[0], 0x38);
  EXPECT_EQ(c[1], 0xfe);
  EXPECT_EQ(c[2], 0x7e);
  EXPECT_EQ(c[3], 0x7f);
  EXPECT_EQ(c[4], 0x80);
  EXPECT_EQ(q.describe(), "e4m3[5]");
}

// ---- ops -----------------------------------------------------------------------------------------

Tensor scalar(float v) { return Tensor::from_floats(std::vector<float>{v}, {1}); }

TEST(Fp8Ops, AmaxIsTheLargestMagnitudeCombinedWithAmax) {
  const std::vector<float> x = {0.5f, -3.25f, 2.f, -0.f};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor amax = Tensor::zeros({1}, DType::f32);
    fp8_amax(Tensor::from_floats(x, {2, 2}, dt), amax);
    EXPECT_EQ(amax.item(), 3.25f) << dtype_name(dt);
  }
  Tensor amax = scalar(10.f);  // a larger running amax (another shard's) stays
  fp8_amax(Tensor::from_floats(x, {4}), amax);
  EXPECT_EQ(amax.item(), 10.f);
  Tensor inf_amax = Tensor::zeros({1}, DType::f32);
  fp8_amax(Tensor::from_floats(std::vector<float>{1.f, -kInf}, {2}), inf_amax);
  EXPECT_EQ(inf_amax.item(), kInf);
  // NaN propagates, from x or from amax.
  Tensor nan_x = scalar(1.f);
  fp8_amax(Tensor::from_floats(std::vector<float>{1.f, -kNan, 1e30f}, {3}), nan_x);
  EXPECT_TRUE(std::isnan(nan_x.item()));
  Tensor nan_amax = scalar(kNan);
  fp8_amax(Tensor::from_floats(x, {4}), nan_amax);
  EXPECT_TRUE(std::isnan(nan_amax.item()));
  // Empty x: unchanged. All zeros from -0: stays -0 (amax's sign, an explicit comparison as on the GPU).
  Tensor keep = scalar(2.f);
  fp8_amax(Tensor::empty({0}, DType::f32), keep);
  EXPECT_EQ(keep.item(), 2.f);
  Tensor neg_zero = scalar(-0.f);
  fp8_amax(Tensor::from_floats(std::vector<float>{0.f, -0.f}, {2}), neg_zero);
  EXPECT_EQ(bits(neg_zero.item()), bits(-0.f));
}

TEST(Fp8Ops, QuantizeIsTheSaturatingCastOfTheScaledValue) {
  const std::vector<float> x = sample_values();
  const auto n = static_cast<int64_t>(x.size());
  for (const Format& f : kFormats)
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (float s : {1.f, 0.75f, 448.f / 600.f, 1024.f, 0x1p-8f}) {
        const Tensor xt = Tensor::from_floats(x, {n}, dt);
        Tensor q = Tensor::empty({n}, f.dtype);
        Tensor amax = Tensor::zeros({1}, DType::f32);
        fp8_quantize(xt, scalar(s), q, &amax);
        const std::vector<float> xs = xt.to_floats();
        for (int64_t i = 0; i < n; ++i) {
          const float prod = xs[i] * s;
          ASSERT_EQ(q.data<uint8_t>()[i], f.encode(prod)) << name(f) << " from " << dtype_name(dt) << ", x=" << xs[i];
          ASSERT_EQ(q.data<uint8_t>()[i], reference_encode(f, prod)) << name(f) << ", x=" << xs[i];
        }
        Tensor want_amax = Tensor::zeros({1}, DType::f32);
        fp8_amax(xt, want_amax);
        EXPECT_TRUE(same_value(amax.item(), want_amax.item()));  // NaN: sample_values holds one
        Tensor q2 = Tensor::empty({n}, f.dtype);                 // without the amax: the same codes
        fp8_quantize(xt, scalar(s), q2);
        EXPECT_EQ(std::vector<uint8_t>(q2.data<uint8_t>(), q2.data<uint8_t>() + n),
                  std::vector<uint8_t>(q.data<uint8_t>(), q.data<uint8_t>() + n));
      }
}

TEST(Fp8Ops, DequantizeIsTheCodeTimesScaleInv) {
  for (const Format& f : kFormats) {
    Tensor q = Tensor::empty({16, 16}, f.dtype);
    for (int c = 0; c < 256; ++c) q.data<uint8_t>()[c] = static_cast<uint8_t>(c);
    for (DType out_dt : {DType::f32, DType::bf16, DType::f16})
      for (float s : {1.f, 1.f / 3.f, 1e-3f, 300.f}) {
        Tensor out = Tensor::empty({16, 16}, out_dt);
        fp8_dequantize(q, scalar(s), out);
        const std::vector<float> got = out.to_floats();
        for (int c = 0; c < 256; ++c) {
          const float want = round_to(out_dt, f.decode(static_cast<uint8_t>(c)) * s);
          ASSERT_TRUE(same_value(got[c], want)) << name(f) << " code " << c << " -> " << dtype_name(out_dt);
        }
      }
  }
}

// quantize with scale s, dequantize with 1/s: within half an fp8 step of every in-range value.
TEST(Fp8Ops, QuantizeThenDequantizeIsCloseInRange) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-10.f, 10.f);
  std::vector<float> x(4096);
  for (float& v : x) v = u(gen);
  const Tensor xt = Tensor::from_floats(x, {4096});
  for (const Format& f : kFormats) {
    const float s = f.max / 10.f;
    Tensor q = Tensor::empty({4096}, f.dtype), back = Tensor::empty({4096}, DType::f32);
    fp8_quantize(xt, scalar(s), q);
    fp8_dequantize(q, scalar(1.f / s), back);
    const std::vector<float> got = back.to_floats();
    const double rel = std::ldexp(1.0, -f.mant_bits - 1);  // half an ulp, relative, for normals
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(got[i], x[i], rel * std::fabs(x[i]) * 1.0001 + 1e-3) << name(f) << " x=" << x[i];
  }
}

// The fused cast-and-transpose: out the same codes as fp8_quantize's, out_t their transpose, the amax fp8_amax's;
// either output alone writes the same bytes.
TEST(Fp8Ops, QuantizeTransposeIsTheCastAndItsTranspose) {
  const std::vector<float> v = sample_values();
  for (const auto& [R, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {13, 5}, {16, 24}})
    for (const Format& f : kFormats) {
      std::vector<float> x(static_cast<size_t>(R * C));
      for (size_t i = 0; i < x.size(); ++i) x[i] = v[(i * 37) % v.size()];
      const Tensor xt = Tensor::from_floats(x, {R, C}, DType::bf16);
      Tensor want = Tensor::empty({R, C}, f.dtype), want_amax = Tensor::zeros({1}, DType::f32);
      fp8_quantize(xt, scalar(300.f), want, &want_amax);
      Tensor q = Tensor::empty({R, C}, f.dtype), qt = Tensor::empty({C, R}, f.dtype);
      Tensor amax = Tensor::zeros({1}, DType::f32);
      fp8_quantize_transpose(xt, scalar(300.f), q, qt, &amax);
      EXPECT_TRUE(same_value(amax.item(), want_amax.item()));
      Tensor none, qt_alone = Tensor::empty({C, R}, f.dtype), q_alone = Tensor::empty({R, C}, f.dtype);
      fp8_quantize_transpose(xt, scalar(300.f), none, qt_alone);
      fp8_quantize_transpose(xt, scalar(300.f), q_alone, none);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t w = want.data<uint8_t>()[r * C + c];
          ASSERT_EQ(q.data<uint8_t>()[r * C + c], w) << name(f) << " " << R << "x" << C << " at " << r << "," << c;
          ASSERT_EQ(q_alone.data<uint8_t>()[r * C + c], w);
          ASSERT_EQ(qt.data<uint8_t>()[c * R + r], w) << name(f) << " " << R << "x" << C << " at " << r << "," << c;
          ASSERT_EQ(qt_alone.data<uint8_t>()[c * R + r], w);
        }
    }
  const Tensor x = Tensor::zeros({2, 3}, DType::f32);
  Tensor q = Tensor::empty({2, 3}, DType::e4m3), qt = Tensor::empty({3, 2}, DType::e4m3), none;
  Tensor wrong_t = Tensor::empty({2, 3}, DType::e4m3), e5 = Tensor::empty({3, 2}, DType::e5m2);
  Tensor x3 = Tensor::zeros({1, 2, 3}, DType::f32), q3 = Tensor::empty({1, 2, 3}, DType::e4m3);
  EXPECT_THROW(fp8_quantize_transpose(x, scalar(1.f), none, none), std::invalid_argument);  // nothing to write
  EXPECT_THROW(fp8_quantize_transpose(x, scalar(1.f), q, wrong_t), std::invalid_argument);  // not the transpose
  EXPECT_THROW(fp8_quantize_transpose(x, scalar(1.f), q, e5), std::invalid_argument);       // two formats
  EXPECT_THROW(fp8_quantize_transpose(x3, scalar(1.f), q3, none), std::invalid_argument);   // not a matrix
}

TEST(Fp8Ops, RejectWrongDtypesAndShapes) {
  const Tensor x = Tensor::zeros({4}, DType::f32);
  Tensor q = Tensor::empty({4}, DType::e4m3), f32_out = Tensor::empty({4}, DType::f32);
  EXPECT_THROW(fp8_quantize(x, scalar(1.f), f32_out), std::invalid_argument);  // out must be fp8
  EXPECT_THROW(fp8_quantize(q, scalar(1.f), q), std::invalid_argument);        // x must be floating
  Tensor q3 = Tensor::empty({3}, DType::e5m2);
  EXPECT_THROW(fp8_quantize(x, scalar(1.f), q3), std::invalid_argument);  // shape
  EXPECT_THROW(fp8_quantize(x, Tensor::zeros({2}, DType::f32), q), std::invalid_argument);
  EXPECT_THROW(fp8_quantize(x, Tensor::zeros({1}, DType::bf16), q), std::invalid_argument);
  EXPECT_THROW(fp8_dequantize(x, scalar(1.f), f32_out), std::invalid_argument);  // q must be fp8
  Tensor q_out = Tensor::empty({4}, DType::e4m3);
  EXPECT_THROW(fp8_dequantize(q, scalar(1.f), q_out), std::invalid_argument);  // out must be floating
  Tensor i32_amax = Tensor::zeros({1}, DType::i32);
  EXPECT_THROW(fp8_amax(x, i32_amax), std::invalid_argument);
  // Every other op refuses fp8 with a message that names the dtype.
  Tensor a = Tensor::zeros({2, 2}, DType::e4m3), out = Tensor::zeros({2, 2}, DType::e4m3);
  try {
    add(a, a, out);
    FAIL() << "add accepted e4m3";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("e4m3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gemm(a, a, out), std::invalid_argument);
}

// ---- the dump for the PyTorch check ----------------------------------------------------------------

// Float32 inputs for the PyTorch check: for each format every finite value, every midpoint between adjacent
// values and the floats on either side of it, beyond the range and the specials, with both signs; then random
// values over each range and random float bit patterns.
std::vector<float> sweep_inputs() {
  std::vector<float> x;
  for (const Format& f : kFormats) {
    for (int c = 0; c <= f.max_code; ++c) {
      const float a = f.decode(static_cast<uint8_t>(c));
      const float b = c < f.max_code ? f.decode(static_cast<uint8_t>(c + 1)) : 2 * f.max;
      const float mid = (a + b) / 2;
      for (float v : {a, std::nextafter(a, kInf), mid, std::nextafter(mid, 0.f), std::nextafter(mid, kInf)})
        for (float s : {1.f, -1.f}) x.push_back(s * v);
    }
    std::mt19937 gen(static_cast<uint32_t>(f.mant_bits));
    std::uniform_real_distribution<float> log2_mag(-f.bias - f.mant_bits - 3.f, std::log2(f.max) + 2.f);
    for (int i = 0; i < 100000; ++i) x.push_back((i % 2 ? -1.f : 1.f) * std::exp2(log2_mag(gen)));
  }
  for (float v : {0.f, -0.f, kInf, -kInf, kNan, -kNan, 1e30f, -1e30f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), 0x1p-10f, 0x1p-17f})
    x.push_back(v);
  std::mt19937 gen(290);
  for (int i = 0; i < 100000; ++i) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(gen())));
  return x;
}

// File layout (little-endian): "MTFP8v1\n", u64 n, f32[256] e4m3 code values, f32[256] e5m2 code values,
// f32[n] inputs, u8[n] their e4m3 codes, u8[n] their e5m2 codes: all through Tensor (from_floats, copy_from,
// to_floats), the paths the trainer uses. Written to MEGATRAIN_FP8_DUMP (tests/e2e/fp8_torch_interop.sh reads it
// with torch), else to a temporary file whose size is checked.
TEST(Fp8Dump, WritesConversionsForTheTorchCheck) {
  const mt::testing_util::TempDir tmp("fp8dump");
  const char* env = std::getenv("MEGATRAIN_FP8_DUMP");
  const std::string path = env && *env ? std::string(env) : std::string(tmp / "fp8.bin");
  std::ofstream out(path, std::ios::binary);
  ASSERT_TRUE(out) << path;
  const std::vector<float> x = sweep_inputs();
  const uint64_t n = x.size();
  out.write("MTFP8v1\n", 8);
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  for (const Format& f : kFormats) {
    Tensor codes = Tensor::empty({256}, f.dtype);
    for (int c = 0; c < 256; ++c) codes.data<uint8_t>()[c] = static_cast<uint8_t>(c);
    const std::vector<float> v = codes.to_floats();
    out.write(reinterpret_cast<const char*>(v.data()), 256 * sizeof(float));
  }
  const Tensor xt = Tensor::from_floats(x, {static_cast<int64_t>(n)});
  out.write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(n * sizeof(float)));
  for (const Format& f : kFormats) {
    Tensor q = Tensor::empty({static_cast<int64_t>(n)}, f.dtype);
    q.copy_from(xt);
    out.write(static_cast<const char*>(q.raw()), static_cast<std::streamsize>(n));
  }
  out.close();
  ASSERT_TRUE(out.good()) << "writing " << path;
  EXPECT_EQ(std::filesystem::file_size(path), 16 + 2 * 256 * sizeof(float) + n * (sizeof(float) + 2)) << path;
  std::cout << "wrote " << n << " conversions to " << path << "\n";
}

}  // namespace
}  // namespace mt
