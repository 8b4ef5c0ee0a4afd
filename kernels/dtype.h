#ifndef KVSERVE_KERNELS_DTYPE_H_
#define KVSERVE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvserve {

/// Element types of weight tensors as stored in model files and kept in memory.
/// Quantized types are stored in blocks along the innermost (row) dimension:
///   kQ8_0: 32 elements per block = fp16 scale d, then 32 int8 q; x = d * q.          34 bytes
///   kQ4_0: 32 elements per block = fp16 scale d, then 16 bytes of nibbles; element j < 16 is
///          the low nibble of byte j, element j + 16 its high nibble; x = d * (nibble - 8).   18 bytes
/// (These are the GGUF/ggml block layouts.)
enum class DType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0 };

/// Elements per storage block (1 for plain types).
constexpr int64_t DTypeBlockElems(DType t) {
  return (t == DType::kQ8_0 || t == DType::kQ4_0) ? 32 : 1;
}

/// Bytes per storage block.
constexpr int64_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
  }
  return 0;
}

/// Bytes needed for a row of `n` elements; `n` must be a multiple of DTypeBlockElems.
constexpr int64_t DTypeRowBytes(DType t, int64_t n) {
  return n / DTypeBlockElems(t) * DTypeBlockBytes(t);
}

constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
  }
  return "?";
}

/// IEEE half -> float, exact for every input (including subnormals, inf, NaN).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

/// float -> IEEE half, round to nearest even, overflow to inf, NaN kept NaN.
inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal
    if (abs < 0x33000000u) return sign;           // rounds to zero
    // value = m * 2^(e - 150); the half subnormal unit is 2^-24, so the count is m >> (126 - e).
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const int rshift = static_cast<int>(126 - e);
    uint32_t half_m = m >> rshift;
    const uint32_t rem = m & ((1u << rshift) - 1u);
    const uint32_t halfway = 1u << (rshift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return sign | static_cast<uint16_t>(half_m);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

/// bfloat16 -> float (exact).
inline float BF16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

/// float -> bfloat16, round to nearest even, NaN kept NaN.
inline uint16_t FloatToBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kvserve

#endif  // KVSERVE_KERNELS_DTYPE_H_
