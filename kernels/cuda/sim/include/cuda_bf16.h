#ifndef KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_BF16_H_
#define KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_BF16_H_

// __nv_bfloat16 under the simulator, with the device's round-to-nearest-even conversion.

#include <cstdint>

#include "cuda_fp16.h"

struct __nv_bfloat16 {
  uint16_t __x;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{kvserve::FloatToBF16(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return kvserve::BF16ToFloat(b.__x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_BF16_H_
