#include "kernels/cpu/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/kv_dtype.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

double RefFp8Decode(int code) { return testing::RefFp8E4M3Decode(code); }

// Reference rounding: the representable value nearest to x (found by scanning every finite
// code), ties to the code with an even mantissa; beyond the largest magnitude: saturate.
// Returns the code (with x's sign for zero results).
int RefFp8Encode(double x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xff : 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7f; ++c) {  // non-negative finite codes, ascending
    const double err = std::fabs(RefFp8Decode(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

TEST(Fp8E4M3Test, DecodesEveryCodeLikeTheReference) {
  const float* table = Fp8E4M3DecodeTable();
  for (int c = 0; c < 256; ++c) {
    const double ref = RefFp8Decode(c);
    const float got = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), ref) << c;
      EXPECT_EQ(std::signbit(got), c >= 128) << c;
    }
    EXPECT_EQ(std::memcmp(&table[c], &got, sizeof(float)), 0) << c;
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));
}

TEST(Fp8E4M3Test, EncodeInvertsDecodeForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const double value = RefFp8Decode(c);
    const uint8_t code = FloatToFp8E4M3(static_cast<float>(value));
    if (std::isnan(value)) {
      EXPECT_EQ(code & 0x7f, 0x7f) << c;
    } else {
      EXPECT_EQ(code, c) << c;  // includes -0 -> 0x80
    }
  }
}

TEST(Fp8E4M3Test, MidpointsRoundToEvenAndLargeValuesSaturate) {
  for (int c = 0; c + 1 < 0x7f; ++c) {
    const double mid = (RefFp8Decode(c) + RefFp8Decode(c + 1)) / 2;  // exact in float
    const int even = (c & 1) == 0 ? c : c + 1;
    EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(mid)), even) << c;
    EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(-mid)), 0x80 | even) << c;
    EXPECT_EQ(FloatToFp8E4M3(std::nextafter(static_cast<float>(mid), 0.0f)), c) << c;
    EXPECT_EQ(FloatToFp8E4M3(std::nextafter(static_cast<float>(mid), 1e9f)), c + 1) << c;
  }
  EXPECT_EQ(FloatToFp8E4M3(463.99f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(464.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(500.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(1e30f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.5f, -10)), 0x01);
}

TEST(Fp8E4M3Test, RandomFloatsRoundLikeTheReference) {
  std::mt19937 rng(123);
  std::uniform_real_distribution<double> exponent(-14.0, 10.0);
  std::uniform_int_distribution<int> sign(0, 1);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((sign(rng) ? -1.0 : 1.0) * std::exp2(exponent(rng)));
    const uint8_t code = FloatToFp8E4M3(x);
    ASSERT_EQ(code, RefFp8Encode(x)) << x;
    ASSERT_EQ(static_cast<double>(Fp8E4M3ToFloat(code)), RefFp8Decode(RefFp8Encode(x))) << x;
  }
}

std::vector<float> RandomVector(int64_t n, uint32_t seed, float range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

TEST(KvQuantTest, Int8PerVectorScaleAndRoundHalfEven) {
  const std::vector<float> x = {0.5f, -1.5f, 2.5f, 127.0f, -127.0f, 3.49f, 0.0f, -0.5f};
  int8_t q[8];
  float scale = -1.0f;
  EncodeKvVector(KvCacheDType::kInt8, x.data(), 8, q, &scale);
  EXPECT_EQ(scale, 1.0f);  // absmax 127 / 127
  const int8_t want[8] = {0, -2, 2, 127, -127, 3, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], want[i]) << i;

  // Random vectors: the scale is absmax / 127 and every element is within half a step.
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> v = RandomVector(72, seed, 3.0f);
    std::vector<int8_t> codes(v.size());
    EncodeKvVector(KvCacheDType::kInt8, v.data(), 72, codes.data(), &scale);
    float amax = 0.0f;
    for (float f : v) amax = std::max(amax, std::fabs(f));
    EXPECT_EQ(scale, amax / 127.0f);
    std::vector<float> back(v.size());
    DecodeKvVector(KvCacheDType::kInt8, codes.data(), scale, 72, back.data());
    for (size_t i = 0; i < v.size(); ++i) {
      const double exact = static_cast<double>(v[i]) / scale;
      EXPECT_LE(std::fabs(exact - codes[i]), 0.5 + 1e-4) << i;
      EXPECT_EQ(back[i], scale * static_cast<float>(codes[i]));
      EXPECT_GE(codes[i], -127);
    }
  }
}

TEST(KvQuantTest, ZeroVectorsStoreZeroScale) {
  const std::vector<float> zeros(16, 0.0f);
  for (KvCacheDType dtype : {KvCacheDType::kInt8, KvCacheDType::kFp8E4M3}) {
    std::vector<uint8_t> codes(16, 0xaa);
    float scale = -1.0f;
    EncodeKvVector(dtype, zeros.data(), 16, codes.data(), &scale);
    EXPECT_EQ(scale, 0.0f);
    for (uint8_t c : codes) EXPECT_EQ(c, 0);
  }
}

TEST(KvQuantTest, Fp8VectorsUseTheFullRange) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> v = RandomVector(64, 100 + seed, 5.0f);
    std::vector<uint8_t> codes(v.size());
    float scale = 0.0f;
    EncodeKvVector(KvCacheDType::kFp8E4M3, v.data(), 64, codes.data(), &scale);
    float amax = 0.0f;
    for (float f : v) amax = std::max(amax, std::fabs(f));
    EXPECT_EQ(scale, amax / 448.0f);
    std::vector<float> back(v.size());
    DecodeKvVector(KvCacheDType::kFp8E4M3, codes.data(), scale, 64, back.data());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_EQ(codes[i], RefFp8Encode(v[i] / scale)) << i;
      EXPECT_EQ(back[i], scale * static_cast<float>(RefFp8Decode(codes[i]))) << i;
      // 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= scale * 2^-10 below.
      EXPECT_LE(std::fabs(back[i] - v[i]), std::max(std::fabs(v[i]) / 16, scale / 1024) * 1.001f);
    }
  }
}

TEST(KvQuantTest, HalfTypesRoundToNearestEven) {
  const std::vector<float> v = RandomVector(40, 7, 100.0f);
  std::vector<uint16_t> h(v.size());
  std::vector<float> back(v.size());
  EncodeKvVector(KvCacheDType::kF16, v.data(), 40, h.data(), nullptr);
  DecodeKvVector(KvCacheDType::kF16, h.data(), 0.0f, 40, back.data());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(h[i], FloatToHalf(v[i]));
    EXPECT_EQ(back[i], HalfToFloat(h[i]));
  }
  EncodeKvVector(KvCacheDType::kBF16, v.data(), 40, h.data(), nullptr);
  DecodeKvVector(KvCacheDType::kBF16, h.data(), 0.0f, 40, back.data());
  for (size_t i = 0; i < v.size(); ++i) {
    // bf16 keeps the top 16 bits of the nearest-even rounding: check against double rounding.
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    const uint32_t lo = bits & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    std::memcpy(&flo, &lo, 4);
    std::memcpy(&fhi, &hi, 4);
    const double dlo = std::fabs(static_cast<double>(v[i]) - flo);
    const double dhi = std::fabs(static_cast<double>(fhi) - v[i]);
    const float want = dlo < dhi ? flo : (dhi < dlo ? fhi : ((lo >> 16) & 1 ? fhi : flo));
    EXPECT_EQ(back[i], want) << v[i];
  }
  const std::vector<float> f32 = RandomVector(9, 8, 1.0f);
  std::vector<float> copy(9);
  EncodeKvVector(KvCacheDType::kF32, f32.data(), 9, copy.data(), nullptr);
  EXPECT_EQ(copy, f32);
}

TEST(KvDTypeTest, NamesSizesAndScales) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    EXPECT_EQ(KvCacheDTypeFromName(KvCacheDTypeName(dtype)), dtype);
  }
  EXPECT_EQ(KvCacheDTypeFromName("FP8_E4M3"), KvCacheDType::kFp8E4M3);
  EXPECT_EQ(KvCacheDTypeFromName("float16"), KvCacheDType::kF16);
  EXPECT_FALSE(KvCacheDTypeFromName("auto").has_value());
  EXPECT_FALSE(KvCacheDTypeFromName("fp8e5m2").has_value());
  EXPECT_FALSE(KvCacheDTypeFromName("").has_value());
  EXPECT_EQ(KvCacheDTypeElemBytes(KvCacheDType::kF32), 4);
  EXPECT_EQ(KvCacheDTypeElemBytes(KvCacheDType::kBF16), 2);
  EXPECT_EQ(KvCacheDTypeElemBytes(KvCacheDType::kFp8E4M3), 1);
  EXPECT_FALSE(KvCacheDTypeHasScales(KvCacheDType::kF16));
  EXPECT_TRUE(KvCacheDTypeHasScales(KvCacheDType::kInt8));
  EXPECT_EQ(KvCacheDTypeVectorBytes(KvCacheDType::kInt8, 128), 132);
  EXPECT_EQ(KvCacheDTypeVectorBytes(KvCacheDType::kF32, 128), 512);
}

}  // namespace
}  // namespace kvserve::cpu
