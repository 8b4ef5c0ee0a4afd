#ifndef KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_RUNTIME_H_
#define KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_RUNTIME_H_

// <cuda_runtime.h> under the simulator: the runtime API plus the device-side language
// (kernels/cuda/sim/include/kvsim_device.h).

#include "cuda_runtime_api.h"
#include "kvsim_device.h"

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_CUDA_RUNTIME_H_
