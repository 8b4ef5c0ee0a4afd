#ifndef KVSERVE_KERNELS_CPU_KV_QUANT_H_
#define KVSERVE_KERNELS_CPU_KV_QUANT_H_

// Conversions between f32 and the KV-cache element types (kernels/kv_dtype.h).

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace kvserve::cpu {

/// Largest finite FP8 E4M3FN magnitude.
inline constexpr float kFp8E4M3Max = 448.0f;

/// float -> OCP FP8 E4M3FN (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals
/// m * 2^-9; no infinities; 0x7f / 0xff are NaN). Rounds to nearest even and saturates: finite
/// values beyond ±448 and ±inf give ±448; NaN gives 0x7f (with the input's sign bit).
uint8_t FloatToFp8E4M3(float x);

/// OCP FP8 E4M3FN -> float, exact for every code (NaN for 0x7f and 0xff).
float Fp8E4M3ToFloat(uint8_t code);

/// The 256 values of Fp8E4M3ToFloat, indexed by code (for table lookups in the kernels).
const float* Fp8E4M3DecodeTable();

/// Stores one vector of n floats as `dtype` at `dst` (n elements of KvCacheDTypeElemBytes):
///   f32: copied; f16 / bf16: rounded to nearest even;
///   int8: *scale = absmax / 127, q = round-half-even(x / scale) clamped to [-127, 127];
///   fp8: *scale = absmax / 448, q = FloatToFp8E4M3(x / scale).
/// For int8 / fp8 an all-zero vector stores scale 0 and zero codes. `scale` is only written for
/// dtypes with scales (it may be nullptr otherwise).
void EncodeKvVector(KvCacheDType dtype, const float* x, int64_t n, void* dst, float* scale);

/// Reads back one vector written by EncodeKvVector: out[i] = value of element i (times `scale`
/// for int8 / fp8; `scale` is ignored for the others).
void DecodeKvVector(KvCacheDType dtype, const void* src, float scale, int64_t n, float* out);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_KV_QUANT_H_
