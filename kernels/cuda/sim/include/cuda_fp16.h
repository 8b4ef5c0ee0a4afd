#ifndef KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_FP16_H_
#define KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_FP16_H_

// __half under the simulator: IEEE binary16 with the device's round-to-nearest-even conversions,
// which are kvserve's own (kernels/dtype.h: the CPU path rounds the same way).

#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

struct __half {
  uint16_t __x;
};

namespace kvsim {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace kvsim

inline __half __float2half_rn(float f) { return __half{kvserve::FloatToHalf(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return kvserve::HalfToFloat(h.__x); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_FP16_H_
