#ifndef KVSERVE_TESTS_KERNELS_CPU_BLOCK_QUANT_REFERENCE_H_
#define KVSERVE_TESTS_KERNELS_CPU_BLOCK_QUANT_REFERENCE_H_

// Test-only reference decoder of the GGUF block formats added after q8_0/q4_0 (q4_1, q5_0, q5_1,
// q4_k, q5_k, q6_k): one element at a time, in double, written from the layout description in
// kernels/dtype.h and independent of kernels/cpu/block_quant.cc.

#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

namespace kvserve::cpu::testing {

inline double RefHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}

// Bit `bit` of a little-endian bit string starting at p.
inline int RefBit(const uint8_t* p, int bit) { return (p[bit / 8] >> (bit % 8)) & 1; }

// Nibble j (< 32) of a 16-byte q4_0-style nibble array: low nibbles first, then high ones.
inline int RefNibble32(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
}

/// Element e of a row stored in one of the types above (0 for any other type).
inline double RefDecodeElement(DType dtype, const uint8_t* row, int64_t e) {
  const int64_t per = DTypeBlockElems(dtype);
  const uint8_t* b = row + (e / per) * DTypeBlockBytes(dtype);
  const int i = static_cast<int>(e % per);
  switch (dtype) {
    case DType::kQ4_1:
      return RefHalf(b) * RefNibble32(b + 4, i) + RefHalf(b + 2);
    case DType::kQ5_0:
      return RefHalf(b) * ((RefNibble32(b + 6, i) + 16 * RefBit(b + 2, i)) - 16);
    case DType::kQ5_1:
      return RefHalf(b) * (RefNibble32(b + 8, i) + 16 * RefBit(b + 4, i)) + RefHalf(b + 2);
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dtype == DType::kQ5_K;
      const uint8_t* s = b + 4;
      const uint8_t* qs = b + (five ? 48 : 16);
      const int sub = i / 32;  // sub-block 0..7; chunk sub / 2 holds sub-blocks 2c and 2c + 1
      const int sc = sub < 4 ? s[sub] % 64 : s[sub + 4] % 16 + 16 * (s[sub - 4] / 64);
      const int m = sub < 4 ? s[sub + 4] % 64 : s[sub + 4] / 16 + 16 * (s[sub] / 64);
      const uint8_t byte = qs[32 * (sub / 2) + i % 32];
      int q = sub % 2 == 0 ? byte % 16 : byte / 16;
      if (five) q += 16 * ((b[16 + i % 32] >> sub) & 1);
      return RefHalf(b) * sc * q - RefHalf(b + 2) * m;
    }
    case DType::kQ6_K: {
      const int h = i / 128, g = (i % 128) / 32, l = i % 32;
      const uint8_t low = b[64 * h + 32 * (g % 2) + l];
      const int lo4 = g < 2 ? low % 16 : low / 16;
      const int hi2 = (b[128 + 32 * h + l] >> (2 * g)) % 4;
      const int sc = static_cast<int8_t>(b[192 + i / 16]);
      return RefHalf(b + 208) * sc * (lo4 + 16 * hi2 - 32);
    }
    default:
      return 0.0;
  }
}

}  // namespace kvserve::cpu::testing

#endif  // KVSERVE_TESTS_KERNELS_CPU_BLOCK_QUANT_REFERENCE_H_
