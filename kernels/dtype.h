#ifndef KVSERVE_KERNELS_DTYPE_H_
#define KVSERVE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvserve {

/// Element types of weight tensors as stored in model files and kept in memory.
/// Quantized types are stored in blocks along the innermost (row) dimension (the GGUF/ggml block
/// layouts; fp16 fields and the uint32 are little-endian and need not be aligned):
///   kQ8_0: 32 elements per block = fp16 scale d, then 32 int8 q; x = d * q.           34 bytes
///   kQ4_0: 32 elements per block = fp16 scale d, then 16 bytes of nibbles; element j < 16 is
///          the low nibble of byte j, element j + 16 its high nibble; x = d * (nibble - 8).
///                                                                                     18 bytes
///   kQ4_1: 32 elements = fp16 d, fp16 m, 16 bytes of nibbles as kQ4_0; x = d * nibble + m.
///                                                                                     20 bytes
///   kQ5_0: 32 elements = fp16 d, uint32 qh, 16 bytes of nibbles as kQ4_0; element j takes bit j
///          of qh as its 5th bit; x = d * (q5 - 16).                                   22 bytes
///   kQ5_1: 32 elements = fp16 d, fp16 m, uint32 qh, 16 bytes of nibbles; x = d * q5 + m.
///                                                                                     24 bytes
///   K-quants: 256-element super-blocks (DTypeBlockElems), sub-block scales packed inside:
///   kQ4_K: fp16 d, fp16 dmin, scales[12], qs[128]. Eight 32-element sub-blocks j with 6-bit scale
///          sc_j and min m_j: j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63; j >= 4:
///          sc = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4,
///          m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4. Chunk c < 4 holds elements
///          64c .. 64c + 63: element 64c + l (l < 32) is the low nibble of qs[32c + l] in sub-block
///          2c, element 64c + 32 + l its high nibble in sub-block 2c + 1; x = d*sc*q - dmin*m.
///                                                                                        144 bytes
///   kQ5_K: fp16 d, fp16 dmin, scales[12], qh[32], qs[128]: kQ4_K plus a 5th bit: element
///          64c + l takes bit 2c of qh[l], element 64c + 32 + l bit 2c + 1.               176 bytes
///   kQ6_K: ql[128], qh[64], int8 scales[16], fp16 d. Sixteen 16-element sub-blocks (element e has
///          scale scales[e / 16]). In half h < 2 (elements 128h ..), for l < 32 and group g < 4,
///          element 128h + 32g + l has low 4 bits from ql[64h + 32(g & 1) + l] (low nibble for
///          g < 2, high for g >= 2) and high 2 bits (qh[32h + l] >> 2g) & 3; x = d*sc*(q6 - 32).
///                                                                                        210 bytes
///   kF8E4M3: one OCP FP8 E4M3FN code per element (kernels/cpu/kv_quant.h), 1 byte. A matrix in
///          this type carries one f32 scale per row beside its codes (PreparedMatrix::scales,
///          cpu::MatmulArgs::w_scale): w[r, c] = scale[r] * value(code[r, c]). Backends make it
///          from f32 / f16 / bf16 weights at load (BackendOptions::fp8_weights); no model file
///          stores it.
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kF8E4M3
};

/// Elements per storage block (1 for plain types).
constexpr int64_t DTypeBlockElems(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 256;
  }
  return 1;
}

/// True for the block-quantized types (those with more than one element per block).
constexpr bool DTypeIsQuantized(DType t) { return DTypeBlockElems(t) > 1; }

/// Bytes per storage block.
constexpr int64_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kQ8_0: return 34;
    case DType::kQ4_0: return 18;
    case DType::kQ4_1:
      return 20;
    case DType::kQ5_0:
      return 22;
    case DType::kQ5_1:
      return 24;
    case DType::kQ4_K:
      return 144;
    case DType::kQ5_K:
      return 176;
    case DType::kQ6_K:
      return 210;
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
    case DType::kQ4_1:
      return "q4_1";
    case DType::kQ5_0:
      return "q5_0";
    case DType::kQ5_1:
      return "q5_1";
    case DType::kQ4_K:
      return "q4_k";
    case DType::kQ5_K:
      return "q5_k";
    case DType::kQ6_K:
      return "q6_k";
    case DType::kF8E4M3:
      return "f8_e4m3";
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
