#ifndef KVSERVE_KERNELS_CUDA_CUDA_COMMON_CUH_
#define KVSERVE_KERNELS_CUDA_CUDA_COMMON_CUH_

// Device helpers shared by the CUDA kernels: element decoding of weights and KV-cache entries,
// the KV encoders (twins of kernels/cpu/kv_quant.cc) and warp reductions.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/kv_dtype.h"

namespace kvserve::cuda {

inline constexpr int kWarp = 32;

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even, NaN kept NaN (kvserve::FloatToBF16).
__device__ __forceinline__ uint16_t FloatToBf16Bits(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Activations between ops (Backend::activation_dtype) are f32 or bf16; `p` addresses elements of
// that type whatever its static type, and i counts elements. A kernel takes the dtype as a
// runtime flag where the branch is uniform and cheap, or as a template argument in inner loops.
__device__ __forceinline__ float LoadAct(const void* p, int64_t i, bool bf16) {
  return bf16 ? Bf16BitsToFloat(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void StoreAct(void* p, int64_t i, float v, bool bf16) {
  if (bf16) {
    static_cast<uint16_t*>(p)[i] = FloatToBf16Bits(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// OCP FP8 E4M3FN -> float (cpu::Fp8E4M3ToFloat).
__device__ __forceinline__ float Fp8ToFloat(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xfu;
  const uint32_t m = code & 0x7u;
  if (e == 0xfu && m == 0x7u) return __uint_as_float(0x7fc00000u | ((code & 0x80u) << 24));
  const float mag = e == 0 ? static_cast<float>(m) * 0.001953125f  // m * 2^-9
                           : ldexpf(static_cast<float>(8 + m), static_cast<int>(e) - 10);
  return (code & 0x80u) ? -mag : mag;
}

// float -> FP8 E4M3FN, round half to even, saturating (cpu::FloatToFp8E4M3, bit for bit).
__device__ __forceinline__ uint8_t FloatToFp8(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;
  if (abs < 0x3c800000u) return sign | static_cast<uint8_t>(rintf(__uint_as_float(abs) * 512.0f));
  uint32_t r = (abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
  r -= (127u - 7u) << 3;
  if (r > 0x7eu) r = 0x7eu;
  return sign | static_cast<uint8_t>(r);
}

// Element `i` of a KV buffer in dtype D, decoded but not scaled.
template <KvCacheDType D>
__device__ __forceinline__ float LoadKv(const void* data, int64_t i) {
  if constexpr (D == KvCacheDType::kF32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (D == KvCacheDType::kF16) {
    return HalfBitsToFloat(static_cast<const uint16_t*>(data)[i]);
  } else if constexpr (D == KvCacheDType::kBF16) {
    return Bf16BitsToFloat(static_cast<const uint16_t*>(data)[i]);
  } else if constexpr (D == KvCacheDType::kInt8) {
    return static_cast<float>(static_cast<const int8_t*>(data)[i]);
  } else {
    return Fp8ToFloat(static_cast<const uint8_t*>(data)[i]);
  }
}

// The scale of KV row `row` (1 for unscaled dtypes).
template <KvCacheDType D>
__device__ __forceinline__ float KvScale(const float* scales, int64_t row) {
  if constexpr (D == KvCacheDType::kInt8 || D == KvCacheDType::kFp8E4M3) {
    return scales[row];
  } else {
    return 1.0f;
  }
}

__device__ __forceinline__ float LoadHalfAt(const uint8_t* p) {
  return HalfBitsToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// The 5-bit value of element j (< 32) of a q5_0 / q5_1 block: nibble from qs, 5th bit bit j of
// the little-endian uint32 at qh.
__device__ __forceinline__ int LoadQ5(const uint8_t* qh, const uint8_t* qs, int j) {
  const int nibble = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
  return nibble | (((qh[j / 8] >> (j % 8)) & 1) << 4);
}

// The 6-bit scale and min of sub-block j (< 8) of a q4_k/q5_k super-block, from its 12 packed
// scale bytes (block + 4): j < 4 in the low 6 bits of bytes j and j + 4, j >= 4 split between a
// nibble of byte j + 4 and the top 2 bits of bytes j - 4 and j.
struct KScaleMin {
  int scale;
  int min;
};
__device__ __forceinline__ KScaleMin Q45KScaleMin(const uint8_t* scales, int j) {
  return j < 4 ? KScaleMin{scales[j] & 63, scales[j + 4] & 63}
               : KScaleMin{(scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4),
                           (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4)};
}

// Quant l (< 32) of sub-block j of a q4_k super-block (qh == nullptr) or q5_k one (qh: its 32
// high-bit bytes): sub-blocks 2c and 2c + 1 share the 32 bytes qs[32c..] as low/high nibbles.
__device__ __forceinline__ int Q45KQuant(const uint8_t* qh, const uint8_t* qs, int j, int l) {
  int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
  if (qh != nullptr) q |= ((qh[l] >> j) & 1) << 4;
  return q;
}

// Quant l (< 32) of sub-block j of a q6_k super-block, minus 32: a nibble of ql (bytes 0..127)
// and two bits of qh (bytes 128..191), halves h = j / 4 of 128 elements each.
__device__ __forceinline__ int Q6KQuant(const uint8_t* block, int j, int l) {
  const int h = j / 4;
  const int g = j % 4;
  const uint8_t low = block[64 * h + 32 * (g & 1) + l];
  const int nibble = g < 2 ? (low & 0xf) : (low >> 4);
  return (nibble | (((block[128 + 32 * h + l] >> (2 * g)) & 3) << 4)) - 32;
}

// Element e (< 256) of a q4_k block (qh == nullptr) or q5_k block; cpu::DequantizeRow's order.
__device__ __forceinline__ float LoadQ45K(const uint8_t* block, const uint8_t* qh,
                                          const uint8_t* qs, int e) {
  const KScaleMin sm = Q45KScaleMin(block + 4, e / 32);
  const int q = Q45KQuant(qh, qs, e / 32, e % 32);
  const float ds = LoadHalfAt(block) * static_cast<float>(sm.scale);
  const float dm = LoadHalfAt(block + 2) * static_cast<float>(sm.min);
  return ds * static_cast<float>(q) - dm;
}

// Element e (< 256) of a q6_k block.
__device__ __forceinline__ float LoadQ6K(const uint8_t* block, int e) {
  const float ds =
      LoadHalfAt(block + 208) * static_cast<float>(static_cast<int8_t>(block[192 + e / 16]));
  return ds * static_cast<float>(Q6KQuant(block, e / 32, e % 32));
}

// Element c of a weight row stored in `dtype` (GGUF block layouts, kernels/dtype.h), decoded in
// cpu::DequantizeRow's order so both give the same floats.
__device__ __forceinline__ float LoadWeight(const uint8_t* row, DType dtype, int64_t c) {
  switch (dtype) {
    case DType::kF32:
      return reinterpret_cast<const float*>(row)[c];
    case DType::kF16:
      return HalfBitsToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
    case DType::kBF16:
      return Bf16BitsToFloat(reinterpret_cast<const uint16_t*>(row)[c]);
    case DType::kF8E4M3:  // the code's value; the row scale is kept apart
      return Fp8ToFloat(row[c]);
    case DType::kQ8_0: {
      const uint8_t* block = row + (c / 32) * 34;
      return LoadHalfAt(block) * static_cast<float>(static_cast<int8_t>(block[2 + c % 32]));
    }
    case DType::kQ4_0: {
      const uint8_t* block = row + (c / 32) * 18;
      const int j = static_cast<int>(c % 32);
      const uint8_t byte = block[2 + (j & 15)];
      const int nibble = j < 16 ? (byte & 0xf) : (byte >> 4);
      return LoadHalfAt(block) * static_cast<float>(nibble - 8);
    }
    case DType::kQ4_1: {
      const uint8_t* block = row + (c / 32) * 20;
      const int j = static_cast<int>(c % 32);
      const uint8_t byte = block[4 + (j & 15)];
      const int nibble = j < 16 ? (byte & 0xf) : (byte >> 4);
      return LoadHalfAt(block) * static_cast<float>(nibble) + LoadHalfAt(block + 2);
    }
    case DType::kQ5_0: {
      const uint8_t* block = row + (c / 32) * 22;
      const int q = LoadQ5(block + 2, block + 6, static_cast<int>(c % 32));
      return LoadHalfAt(block) * static_cast<float>(q - 16);
    }
    case DType::kQ5_1: {
      const uint8_t* block = row + (c / 32) * 24;
      const int q = LoadQ5(block + 4, block + 8, static_cast<int>(c % 32));
      return LoadHalfAt(block) * static_cast<float>(q) + LoadHalfAt(block + 2);
    }
    case DType::kQ4_K: {
      const uint8_t* block = row + (c / 256) * 144;
      return LoadQ45K(block, nullptr, block + 16, static_cast<int>(c % 256));
    }
    case DType::kQ5_K: {
      const uint8_t* block = row + (c / 256) * 176;
      return LoadQ45K(block, block + 16, block + 48, static_cast<int>(c % 256));
    }
    case DType::kQ6_K:
      return LoadQ6K(row + (c / 256) * 210, static_cast<int>(c % 256));
  }
  return 0.0f;
}

// The paged cache row of KV head `kv_head` at position `pos` of a sequence whose block-table row
// is `table`: block table[pos / block_size], row pos % block_size of that block's kv_heads x
// block_size rows. 32-bit division (positions and block sizes are int32; a 64-bit one is a long
// software sequence on the GPU).
__device__ __forceinline__ int64_t PagedRow(const int32_t* table, int64_t pos, int64_t block_size,
                                            int64_t kv_heads, int64_t kv_head) {
  const int32_t p = static_cast<int32_t>(pos);
  const int32_t bs = static_cast<int32_t>(block_size);
  return (static_cast<int64_t>(table[p / bs]) * kv_heads + kv_head) * bs + p % bs;
}

// Calls f(std::integral_constant<KvCacheDType, D>{}) for the runtime dtype D, so a generic
// lambda can instantiate a kernel template per dtype (C++17: no template lambdas in nvcc here).
template <KvCacheDType D>
using KvTag = std::integral_constant<KvCacheDType, D>;

template <typename F>
void DispatchKvDType(KvCacheDType dtype, F&& f) {
  switch (dtype) {
    case KvCacheDType::kF32:
      f(KvTag<KvCacheDType::kF32>{});
      break;
    case KvCacheDType::kF16:
      f(KvTag<KvCacheDType::kF16>{});
      break;
    case KvCacheDType::kBF16:
      f(KvTag<KvCacheDType::kBF16>{});
      break;
    case KvCacheDType::kInt8:
      f(KvTag<KvCacheDType::kInt8>{});
      break;
    case KvCacheDType::kFp8E4M3:
      f(KvTag<KvCacheDType::kFp8E4M3>{});
      break;
  }
}

// The tensor-core attention kernels' instances: f(KvTag<DT>{}, std::integral_constant<int, D>{})
// for every KV dtype but f32 and head dims 64, 128 and 256. Returns false (f not called) for
// another pair.
template <typename F>
bool DispatchTensorCoreKv(KvCacheDType dtype, int64_t head_dim, F&& f) {
  if (dtype == KvCacheDType::kF32 || (head_dim != 64 && head_dim != 128 && head_dim != 256)) {
    return false;
  }
  DispatchKvDType(dtype, [&](auto tag) {
    if constexpr (decltype(tag)::value != KvCacheDType::kF32) {
      if (head_dim == 64) {
        f(tag, std::integral_constant<int, 64>{});
      } else if (head_dim == 128) {
        f(tag, std::integral_constant<int, 128>{});
      } else {
        f(tag, std::integral_constant<int, 256>{});
      }
    }
  });
  return true;
}

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_CUDA_COMMON_CUH_
