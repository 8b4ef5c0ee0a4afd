// The simulator's twins of the tensor-core instructions (kernels/cuda/ptx.cuh) against the PTX
// ISA: mma.m16n8k16 (bf16 and f16, f32 accumulation) against a scalar reference on random
// operands, ldmatrix .x4 and .x4.trans against the documented fragment layout, and the two
// combined the way the prefill attention kernel combines them (S = Q K^T, O = P V), and the fp8
// -> f16 pair conversion.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/sim/internal.h"
#include "kernels/dtype.h"
#include "tests/kernels/cuda/sim/sim_memory.h"
#include "tests/kernels/cuda/sim/sim_ptx_kernels.h"

namespace kvserve::simtest {
namespace {

// n random values in [-2, 2) as bf16 (or f16) bits.
std::vector<uint16_t> RandomB16(size_t n, bool f16, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) v = f16 ? FloatToHalf(dist(*rng)) : FloatToBF16(dist(*rng));
  return out;
}

float B16(uint16_t bits, bool f16) { return f16 ? HalfToFloat(bits) : BF16ToFloat(bits); }

// The twin's documented order: c, then the 16 exact products added in k order, each addition
// rounded to f32.
float SequentialDot(float c, const std::vector<float>& x, const std::vector<float>& y) {
  float acc = c;
  for (size_t k = 0; k < x.size(); ++k) acc += x[k] * y[k];
  return acc;
}

class SimPtxTest : public ::testing::Test {
 protected:
  void SetUp() override { kvsim::SetRaceCheck(kvsim::AccessHooksBuiltIn()); }
  void TearDown() override { kvsim::SetRaceCheck(false); }
};

TEST_F(SimPtxTest, MmaM16N8K16MatchesAScalarReference) {
  std::mt19937 rng(7);
  for (bool f16 : {false, true}) {
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE(testing::Message() << (f16 ? "f16" : "bf16") << " trial " << trial);
      const std::vector<uint16_t> a = RandomB16(16 * 16, f16, &rng);
      const std::vector<uint16_t> b = RandomB16(16 * 8, f16, &rng);
      std::vector<float> c(16 * 8);
      std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
      for (float& v : c) v = dist(rng);
      uint16_t* da = Upload(a);
      uint16_t* db = Upload(b);
      float* dc = Upload(c);
      float* dd = DeviceAlloc<float>(16 * 8);
      ASSERT_EQ(LaunchMma(da, db, dc, dd, f16), cudaSuccess);
      const std::vector<float> d = Download(dd, 16 * 8);
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
          std::vector<float> row(16), col(16);
          double exact = c[m * 8 + n];
          double magnitude = std::fabs(exact);
          for (int k = 0; k < 16; ++k) {
            row[k] = B16(a[m * 16 + k], f16);
            col[k] = B16(b[k * 8 + n], f16);
            exact += static_cast<double>(row[k]) * col[k];
            magnitude += std::fabs(static_cast<double>(row[k]) * col[k]);
          }
          const float got = d[m * 8 + n];
          // Bit for bit the twin's order, and within f32 rounding of the exact result (16
          // roundings of partial sums no larger than `magnitude`).
          EXPECT_EQ(got, SequentialDot(c[m * 8 + n], row, col)) << "d[" << m << "][" << n << "]";
          EXPECT_NEAR(got, exact, 16 * magnitude * std::ldexp(1.0, -24));
        }
      }
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
      cudaFree(dd);
    }
  }
}

TEST_F(SimPtxTest, LdMatrixX4FollowsTheFragmentLayout) {
  std::vector<uint16_t> src(4 * 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(0x1000 + i);
  uint16_t* dsrc = Upload(src);
  uint32_t* dout = DeviceAlloc<uint32_t>(32 * 4);
  // M_i[r][c] = src[64 i + 8 r + c]; lane 4g + t receives (M_i[g][2t], M_i[g][2t + 1]), or with
  // .trans (M_i[2t][g], M_i[2t + 1][g]), the first element in the low half.
  auto m = [&](int i, int r, int c) { return static_cast<uint32_t>(src[64 * i + 8 * r + c]); };
  for (bool trans : {false, true}) {
    SCOPED_TRACE(trans ? "trans" : "plain");
    ASSERT_EQ(LaunchLdMatrix(dsrc, dout, trans), cudaSuccess);
    const std::vector<uint32_t> got = Download(dout, 32 * 4);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4;
      const int t = lane % 4;
      for (int i = 0; i < 4; ++i) {
        const uint32_t want = trans ? m(i, 2 * t, g) | (m(i, 2 * t + 1, g) << 16)
                                    : m(i, g, 2 * t) | (m(i, g, 2 * t + 1) << 16);
        EXPECT_EQ(got[lane * 4 + i], want) << "lane " << lane << " register " << i;
      }
    }
  }
  cudaFree(dsrc);
  cudaFree(dout);
}

TEST_F(SimPtxTest, LdMatrixFeedsMmaAsThePrefillKernelUsesThem) {
  std::mt19937 rng(11);
  const std::vector<uint16_t> a = RandomB16(256, false, &rng);
  const std::vector<uint16_t> kt = RandomB16(256, false, &rng);  // [n][k]
  const std::vector<uint16_t> v = RandomB16(256, false, &rng);   // [k][n]
  uint16_t* da = Upload(a);
  uint16_t* dkt = Upload(kt);
  uint16_t* dv = Upload(v);
  float* dkt_out = DeviceAlloc<float>(256);
  float* dv_out = DeviceAlloc<float>(256);
  ASSERT_EQ(LaunchLdMatrixMma(da, dkt, dv, dkt_out, dv_out), cudaSuccess);
  const std::vector<float> got_kt = Download(dkt_out, 256);
  const std::vector<float> got_v = Download(dv_out, 256);
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      std::vector<float> row(16), kcol(16), vcol(16);
      for (int k = 0; k < 16; ++k) {
        row[k] = BF16ToFloat(a[m * 16 + k]);
        kcol[k] = BF16ToFloat(kt[n * 16 + k]);
        vcol[k] = BF16ToFloat(v[k * 16 + n]);
      }
      EXPECT_EQ(got_kt[m * 16 + n], SequentialDot(0.0f, row, kcol)) << m << "," << n;
      EXPECT_EQ(got_v[m * 16 + n], SequentialDot(0.0f, row, vcol)) << m << "," << n;
    }
  }
  for (void* p : {static_cast<void*>(da), static_cast<void*>(dkt), static_cast<void*>(dv),
                  static_cast<void*>(dkt_out), static_cast<void*>(dv_out)}) {
    cudaFree(p);
  }
}

// OCP FP8 E4M3FN from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits;
// exponent 0 is subnormal (m / 8 * 2^-6); S.1111.111 is NaN, and there is no infinity.
float E4M3(uint8_t code) {
  const int e = (code >> 3) & 0xf;
  const int m = code & 7;
  if (e == 0xf && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (code & 0x80) != 0 ? -mag : mag;
}

// The fp8 KV decode widens codes to f16 for the tensor cores (cvt.rn.f16x2.e4m3x2 on the GPU):
// every code, as the low and the high byte of a pair, gives its exact value.
TEST_F(SimPtxTest, Fp8PairsWidenToF16Exactly) {
  std::vector<uint16_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint16_t>(c | ((255 - c) << 8));
  uint16_t* dcodes = Upload(codes);
  uint32_t* dout = DeviceAlloc<uint32_t>(256);
  ASSERT_EQ(LaunchFp8x2ToHalf2(dcodes, dout, 256), cudaSuccess);
  const std::vector<uint32_t> got = Download(dout, 256);
  for (int c = 0; c < 256; ++c) {
    for (int half = 0; half < 2; ++half) {
      const uint8_t code = static_cast<uint8_t>(half == 0 ? c : 255 - c);
      const float want = E4M3(code);
      const float have = HalfToFloat(static_cast<uint16_t>(got[c] >> (16 * half)));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(have)) << "code " << int{code};
      } else {
        EXPECT_EQ(have, want) << "code " << int{code};
        EXPECT_EQ(std::signbit(have), std::signbit(want)) << "code " << int{code};
      }
    }
  }
  cudaFree(dcodes);
  cudaFree(dout);
}

}  // namespace
}  // namespace kvserve::simtest
