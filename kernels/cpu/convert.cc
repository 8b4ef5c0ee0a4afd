#include "kernels/cpu/convert.h"

#include <cstring>

#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/kv_quant.h"

namespace kvserve::cpu {
namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void StoreU16(uint16_t v, uint8_t* p) { std::memcpy(p, &v, sizeof(v)); }

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
    case DType::kF8E4M3:  // the codes' values; the row's scale is kept apart
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(bytes[i]);
      return;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      DequantizeRow(src, dtype, n, dst);
      return;
  }
}

void ConvertRowFromF32(const float* src, int64_t n, DType dtype, void* dst) {
  auto* bytes = static_cast<uint8_t*>(dst);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(FloatToHalf(src[i]), bytes + 2 * i);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(FloatToBF16(src[i]), bytes + 2 * i);
      return;
    case DType::kF8E4M3:  // unscaled codes
      for (int64_t i = 0; i < n; ++i) bytes[i] = FloatToFp8E4M3(src[i]);
      return;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      QuantizeRow(src, dtype, n, dst);
      return;
  }
}

}  // namespace kvserve::cpu
