#include "kernels/cpu/kv_quant.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/dtype.h"

namespace kvserve::cpu {
namespace {

// 2^e for small |e|, exactly, at compile time.
constexpr float PowerOfTwo(int e) {
  float v = 1.0f;
  for (; e > 0; --e) v *= 2.0f;
  for (; e < 0; ++e) v *= 0.5f;
  return v;
}

// The format's definition: (-1)^s * 2^(e - 7) * (1 + m / 8) for e > 0, (-1)^s * 2^-6 * m / 8 for
// e = 0; s.1111.111 is NaN.
constexpr float DecodeFp8(uint32_t code) {
  const bool negative = (code & 0x80u) != 0;
  const uint32_t e = (code >> 3) & 0xfu;
  const uint32_t m = code & 0x7u;
  if (e == 0xfu && m == 0x7u) {
    return negative ? -std::numeric_limits<float>::quiet_NaN()
                    : std::numeric_limits<float>::quiet_NaN();
  }
  const float magnitude = e == 0 ? static_cast<float>(m) * PowerOfTwo(-9)
                                 : static_cast<float>(8 + m) * PowerOfTwo(static_cast<int>(e) - 10);
  return negative ? -magnitude : magnitude;
}

constexpr std::array<float, 256> BuildFp8Table() {
  std::array<float, 256> table{};
  for (uint32_t c = 0; c < 256; ++c) table[c] = DecodeFp8(c);
  return table;
}

constexpr std::array<float, 256> kFp8Table = BuildFp8Table();

float AbsMax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) amax = a;  // NaN never wins
  }
  return amax;
}

}  // namespace

uint8_t FloatToFp8E4M3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;  // NaN
  if (abs < 0x3c800000u) {                     // below 2^-6: subnormal grid m * 2^-9
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    // Exact scaling; nearbyint rounds half to even. 8 (= 2^-6) is the smallest normal's code.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding half to even (a carry bumps the exponent),
  // then rebias the exponent from 127 to 7.
  uint32_t r = (abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
  r -= (127u - 7u) << 3;
  if (r > 0x7eu) r = 0x7eu;  // saturate at 448 (0x7f is NaN)
  return sign | static_cast<uint8_t>(r);
}

float Fp8E4M3ToFloat(uint8_t code) { return kFp8Table[code]; }

const float* Fp8E4M3DecodeTable() { return kFp8Table.data(); }

void EncodeKvVector(KvCacheDType dtype, const float* x, int64_t n, void* dst, float* scale) {
  switch (dtype) {
    case KvCacheDType::kF32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvCacheDType::kF16:
    case KvCacheDType::kBF16: {
      uint16_t* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        out[i] = dtype == KvCacheDType::kF16 ? FloatToHalf(x[i]) : FloatToBF16(x[i]);
      }
      return;
    }
    case KvCacheDType::kInt8: {
      const float s = AbsMax(x, n) / 127.0f;
      *scale = s;
      int8_t* out = static_cast<int8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        float q = s == 0.0f ? 0.0f : std::nearbyint(x[i] / s);
        if (q != q) q = 0.0f;  // NaN input
        q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
        out[i] = static_cast<int8_t>(q);
      }
      return;
    }
    case KvCacheDType::kFp8E4M3: {
      const float s = AbsMax(x, n) / kFp8E4M3Max;
      *scale = s;
      uint8_t* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = s == 0.0f ? 0 : FloatToFp8E4M3(x[i] / s);
      return;
    }
  }
}

void DecodeKvVector(KvCacheDType dtype, const void* src, float scale, int64_t n, float* out) {
  switch (dtype) {
    case KvCacheDType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvCacheDType::kF16:
    case KvCacheDType::kBF16: {
      const uint16_t* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        out[i] = dtype == KvCacheDType::kF16 ? HalfToFloat(in[i]) : BF16ToFloat(in[i]);
      }
      return;
    }
    case KvCacheDType::kInt8: {
      const int8_t* in = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = scale * static_cast<float>(in[i]);
      return;
    }
    case KvCacheDType::kFp8E4M3: {
      const uint8_t* in = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = scale * kFp8Table[in[i]];
      return;
    }
  }
}

}  // namespace kvserve::cpu
