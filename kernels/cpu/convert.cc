#include "kernels/cpu/convert.h"

#include <cstring>

namespace kvserve::cpu {
namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

void ConvertRowToF32(const void* src, DType dtype, int64_t n, float* dst) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(LoadU16(bytes + 2 * i));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(LoadU16(bytes + 2 * i));
      return;
    case DType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* block = bytes + b * 34;
        const float d = HalfToFloat(LoadU16(block));
        const auto* q = reinterpret_cast<const int8_t*>(block + 2);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<float>(q[j]) * d;
      }
      return;
    case DType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* block = bytes + b * 18;
        const float d = HalfToFloat(LoadU16(block));
        for (int j = 0; j < 16; ++j) {
          const uint8_t q = block[2 + j];
          dst[b * 32 + j] = static_cast<float>((q & 15) - 8) * d;
          dst[b * 32 + j + 16] = static_cast<float>((q >> 4) - 8) * d;
        }
      }
      return;
  }
}

}  // namespace kvserve::cpu
