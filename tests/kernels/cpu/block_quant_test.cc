// The GGUF block formats beyond q8_0/q4_0 (kernels/cpu/block_quant.h): blocks built by hand from
// the layout description decode to values worked out here; quantise -> dequantise stays within
// error bounds; matmuls with these weights match a double reference on every ISA path.

#include "kernels/cpu/block_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::DecodeRows;
using testing::EncodeRows;
using testing::RandomFloats;
using testing::ScopedIsa;
using testing::SupportedIsas;

constexpr DType kNewTypes[] = {DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                               DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// fp16 bit patterns of exactly representable scales.
constexpr uint16_t kHalf0_5 = 0x3800, kHalf0_25 = 0x3400, kHalf0_125 = 0x3000,
                   kHalfMinus1_5 = 0xbe00;

void PutU16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> Decode(const std::vector<uint8_t>& block, DType dtype) {
  EXPECT_EQ(static_cast<int64_t>(block.size()), DTypeBlockBytes(dtype));
  std::vector<float> y(DTypeBlockElems(dtype));
  ConvertRowToF32(block.data(), dtype, DTypeBlockElems(dtype), y.data());
  return y;
}

// Sub-block scales and mins of the q4_k / q5_k test block: j >= 4 use all 6 bits, so the packing
// of their top 2 bits into scales[0..7] is exercised.
constexpr int kSc[8] = {1, 2, 3, 63, 17, 33, 48, 5};
constexpr int kMin[8] = {0, 1, 2, 3, 40, 21, 63, 16};
// kSc/kMin packed by hand: scales[j] = sc_j | (sc_{j+4} >> 4) << 6, scales[j + 4] =
// m_j | (m_{j+4} >> 4) << 6, scales[j + 8] = (sc_{j+4} & 15) | (m_{j+4} & 15) << 4 (j < 4).
constexpr uint8_t kPackedScales[12] = {0x41, 0x82, 0xC3, 0x3F, 0x80, 0x41,
                                       0xC2, 0x43, 0x81, 0x51, 0xF0, 0x05};

int LowNibble(int c, int l) { return (l + 3 * c) % 16; }
int HighNibble(int c, int l) { return (7 * l + c) % 16; }

// A q4_k block (or, with `with_qh`, a q5_k one): d = 0.5, dmin = 0.25, the scales above, nibbles
// from LowNibble/HighNibble, qh[l] = 37 * l mod 256.
std::vector<uint8_t> HandBuiltK(bool with_qh) {
  std::vector<uint8_t> b(with_qh ? 176 : 144);
  PutU16(kHalf0_5, &b[0]);
  PutU16(kHalf0_25, &b[2]);
  std::memcpy(&b[4], kPackedScales, 12);
  uint8_t* qs = &b[with_qh ? 48 : 16];
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] = static_cast<uint8_t>(LowNibble(c, l) | (HighNibble(c, l) << 4));
    }
  }
  if (with_qh) {
    for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<uint8_t>(37 * l);
  }
  return b;
}

TEST(BlockQuantTest, Q4KHandBuiltBlock) {
  const std::vector<float> y = Decode(HandBuiltK(false), DType::kQ4_K);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      EXPECT_EQ(y[64 * c + l], 0.5 * kSc[2 * c] * LowNibble(c, l) - 0.25 * kMin[2 * c])
          << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l],
                0.5 * kSc[2 * c + 1] * HighNibble(c, l) - 0.25 * kMin[2 * c + 1])
          << c << " " << l;
    }
  }
  // Worked out on paper: element 165 = chunk 2, high half, l = 5: nibble (35 + 2) % 16 = 5 in
  // sub-block 5 (sc 33, m 21): 0.5 * 33 * 5 - 0.25 * 21.
  EXPECT_EQ(y[165], 77.25f);
  // Element 223 = chunk 3, low half, l = 31: nibble (31 + 9) % 16 = 8, sub-block 6 (48, 63).
  EXPECT_EQ(y[223], 0.5f * 48 * 8 - 0.25f * 63);
}

TEST(BlockQuantTest, Q5KHandBuiltBlock) {
  const std::vector<float> y = Decode(HandBuiltK(true), DType::kQ5_K);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int qh = (37 * l) & 0xff;
      const int lo = LowNibble(c, l) + 16 * ((qh >> (2 * c)) & 1);
      const int hi = HighNibble(c, l) + 16 * ((qh >> (2 * c + 1)) & 1);
      EXPECT_EQ(y[64 * c + l], 0.5 * kSc[2 * c] * lo - 0.25 * kMin[2 * c]) << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l], 0.5 * kSc[2 * c + 1] * hi - 0.25 * kMin[2 * c + 1])
          << c << " " << l;
    }
  }
  // Element 165: qh[5] = 185 = 0b10111001 has bit 2c + 1 = 5 set, so q = 5 + 16.
  EXPECT_EQ(y[165], 0.5f * 33 * 21 - 0.25f * 21);
  // Element 5 (chunk 0, low half): bit 0 of 185 is set too: q = (5 + 0) + 16, sub-block 0.
  EXPECT_EQ(y[5], 0.5f * 1 * 21 - 0.25f * 0);
  // Element 2: qh[2] = 74 = 0b01001010, bit 0 clear: q = 2.
  EXPECT_EQ(y[2], 0.5f * 1 * 2);
}

TEST(BlockQuantTest, Q6KHandBuiltBlock) {
  constexpr int8_t kScales[16] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 127, -128};
  auto q6 = [](int e) { return (13 * e + 7) % 64; };  // the stored 6-bit value of element e
  std::vector<uint8_t> b(210, 0);
  // Per the layout: half h, group g, lane l -> element 128h + 32g + l; low 4 bits in
  // ql[64h + 32(g & 1) + l] (low nibble for g < 2), high 2 bits at bit 2g of qh[32h + l].
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int v = q6(128 * h + 32 * g + l);
        b[64 * h + 32 * (g & 1) + l] |= static_cast<uint8_t>((v & 15) << (g < 2 ? 0 : 4));
        b[128 + 32 * h + l] |= static_cast<uint8_t>((v >> 4) << (2 * g));
      }
    }
  }
  std::memcpy(&b[192], kScales, 16);
  PutU16(kHalf0_125, &b[208]);
  const std::vector<float> y = Decode(b, DType::kQ6_K);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.125 * kScales[e / 16] * (q6(e) - 32)) << e;
  }
  EXPECT_EQ(y[0], 0.125f * 1 * (7 - 32));
  // Element 239: q6 = (3107 + 7) % 64 = 42, sub-block 14 (scale 127): 0.125 * 127 * 10.
  EXPECT_EQ(y[239], 158.75f);
  // Element 255: q6 = (3315 + 7) % 64 = 58, scale -128: 0.125 * -128 * 26.
  EXPECT_EQ(y[255], -416.0f);
}

TEST(BlockQuantTest, Q4_1HandBuiltBlock) {
  std::vector<uint8_t> b(20);
  PutU16(kHalf0_5, &b[0]);
  PutU16(kHalfMinus1_5, &b[2]);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = Decode(b, DType::kQ4_1);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5 * j - 1.5) << j;
    EXPECT_EQ(y[j + 16], 0.5 * (15 - j) - 1.5) << j;
  }
}

TEST(BlockQuantTest, Q5_0AndQ5_1HandBuiltBlocks) {
  const uint32_t qh = 0xA5C3F00Fu;  // bit j is the 5th bit of element j
  std::vector<uint8_t> b0(22), b1(24);
  PutU16(kHalf0_25, &b0[0]);
  PutU16(kHalf0_5, &b1[0]);
  PutU16(kHalfMinus1_5, &b1[2]);
  for (int i = 0; i < 4; ++i) {
    b0[2 + i] = b1[4 + i] = static_cast<uint8_t>(qh >> (8 * i));  // little-endian
  }
  for (int j = 0; j < 16; ++j) {
    b0[6 + j] = b1[8 + j] = static_cast<uint8_t>(((3 * j) % 16) | (((5 * j + 1) % 16) << 4));
  }
  const std::vector<float> y0 = Decode(b0, DType::kQ5_0);
  const std::vector<float> y1 = Decode(b1, DType::kQ5_1);
  for (int j = 0; j < 32; ++j) {
    const int nibble = j < 16 ? (3 * j) % 16 : (5 * (j - 16) + 1) % 16;
    const int q = nibble + 16 * static_cast<int>((qh >> j) & 1);
    EXPECT_EQ(y0[j], 0.25 * (q - 16)) << j;
    EXPECT_EQ(y1[j], 0.5 * q - 1.5) << j;
  }
  // Element 16: high nibble of byte 0 is 1, bit 16 of qh (0xC3 -> bit 0 of byte 2) is 1: q 17.
  EXPECT_EQ(y0[16], 0.25f);
}

// Decoding matches the independent per-element reference (kernel_test_util's DecodeRows)
// exactly, for random blocks of every new type.
TEST(BlockQuantTest, DecoderMatchesReferenceOnRandomBytes) {
  std::mt19937 rng(5);
  for (DType dtype : kNewTypes) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const int64_t k = 4 * DTypeBlockElems(dtype), rows = 3;
    std::vector<uint8_t> bytes(DTypeRowBytes(dtype, k) * rows);
    for (uint8_t& v : bytes) v = static_cast<uint8_t>(rng());
    // Keep the fp16 fields finite and modest: rewrite each block's halves.
    for (size_t off = 0; off < bytes.size(); off += DTypeBlockBytes(dtype)) {
      const uint16_t d = FloatToHalf(std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -6));
      const uint16_t m = FloatToHalf(-std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -5));
      if (dtype == DType::kQ6_K) {
        PutU16(d, &bytes[off + 208]);
      } else {
        PutU16(d, &bytes[off]);
        if (dtype != DType::kQ5_0) PutU16(m & 0x7fff, &bytes[off + 2]);
      }
    }
    const std::vector<double> ref = DecodeRows(dtype, bytes, rows, k);
    std::vector<float> got(rows * k);
    for (int64_t r = 0; r < rows; ++r) {
      ConvertRowToF32(bytes.data() + r * DTypeRowBytes(dtype, k), dtype, k, got.data() + r * k);
    }
    for (int64_t i = 0; i < rows * k; ++i) {
      ASSERT_EQ(got[i], static_cast<float>(ref[i])) << i;
    }
  }
}

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / v.size());
}

// Relative RMS error of quantise -> dequantise on uniform [-1, 1) rows, against bounds about
// 1.3x what this quantiser measures (a uniform grid of step 2 / levels would give
// (2 / levels) / sqrt(12) / 0.577: q4 ~0.067, q5 ~0.032, q6 (16-element sub-blocks) ~0.016).
TEST(BlockQuantTest, RoundTripErrorBounds) {
  struct Case {
    DType dtype;
    double max_rel_rms;
  };
  for (const Case& c :
       {Case{DType::kQ4_1, 0.075}, Case{DType::kQ5_0, 0.038}, Case{DType::kQ5_1, 0.038},
        Case{DType::kQ4_K, 0.075}, Case{DType::kQ5_K, 0.038}, Case{DType::kQ6_K, 0.02}}) {
    SCOPED_TRACE(std::string(DTypeName(c.dtype)));
    std::mt19937 rng(11);
    const int64_t n = 4096;
    std::vector<float> x = RandomFloats(n, rng);
    // One block of zeros and one constant block: must stay exact / near exact.
    for (int i = 0; i < 256; ++i) x[i] = 0.0f;
    std::vector<uint8_t> q(DTypeRowBytes(c.dtype, n));
    QuantizeRow(x.data(), c.dtype, n, q.data());
    std::vector<float> y(n);
    ConvertRowToF32(q.data(), c.dtype, n, y.data());
    std::vector<float> err(n);
    for (int64_t i = 0; i < n; ++i) err[i] = y[i] - x[i];
    for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], 0.0f) << i;
    const double rel = Rms(err) / Rms(x);
    std::printf("%s round trip: relative RMS error %.4f\n", std::string(DTypeName(c.dtype)).c_str(),
                rel);
    EXPECT_LT(rel, c.max_rel_rms);
    // And every element within a couple of quantisation steps of its input.
    for (int64_t i = 0; i < n; ++i) ASSERT_LT(std::fabs(err[i]), 0.25) << i;
  }
}

// Small-magnitude and one-signed rows: scales stay finite, the error stays relative.
TEST(BlockQuantTest, RoundTripOfScaledAndShiftedRows) {
  std::mt19937 rng(12);
  for (DType dtype : kNewTypes) {
    for (float scale : {1e-3f, 10.0f}) {
      for (float shift : {0.0f, 1.0f}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " scale " + std::to_string(scale) + " shift " +
                     std::to_string(shift));
        const int64_t n = 512;
        std::vector<float> x = RandomFloats(n, rng, shift - 1.0f, shift + 1.0f);
        for (float& v : x) v *= scale;
        std::vector<uint8_t> q(DTypeRowBytes(dtype, n));
        QuantizeRow(x.data(), dtype, n, q.data());
        std::vector<float> y(n);
        ConvertRowToF32(q.data(), dtype, n, y.data());
        std::vector<float> err(n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(std::isfinite(y[i])) << i;
          err[i] = y[i] - x[i];
        }
        EXPECT_LT(Rms(err) / Rms(x), 0.1);
      }
    }
  }
}

// Matmul with the new weight types on every ISA path this machine runs (the SIMD paths forward
// formats they have no kernel for to the scalar one) against a double reference of the decoded
// weights; k spans several super-blocks, n is odd.
TEST(BlockQuantTest, MatmulMatchesReferenceOnEveryIsa) {
  std::mt19937 rng(13);
  ThreadPool pool(2);
  for (DType dtype : kNewTypes) {
    const int64_t m = 3, n = 17, k = 768;
    const std::vector<float> x = RandomFloats(m * k, rng);
    const std::vector<uint8_t> w = EncodeRows(dtype, RandomFloats(n * k, rng), n, k);
    const std::vector<double> w_ref = DecodeRows(dtype, w, n, k);
    for (CpuIsa isa : SupportedIsas()) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + std::string(CpuIsaName(isa)));
      ScopedIsa scoped(isa);
      std::vector<float> y(m * n);
      Matmul(MatmulArgs{x.data(), k, w.data(), dtype, nullptr, y.data(), n, m, n, k}, &pool);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0, sum_abs = 0;
          for (int64_t e = 0; e < k; ++e) {
            ref += static_cast<double>(x[i * k + e]) * w_ref[j * k + e];
            sum_abs += std::fabs(static_cast<double>(x[i * k + e]) * w_ref[j * k + e]);
          }
          // Integer-dot kernels quantise activations to 8 bits: allow ~1% of sum |x w|.
          ASSERT_NEAR(y[i * n + j], ref, 1e-2 * sum_abs) << i << " " << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
