#ifndef KVSERVE_KERNELS_CUDA_SILU_MUL_H_
#define KVSERVE_KERNELS_CUDA_SILU_MUL_H_

#include <cuda_runtime_api.h>

#include "kernels/op_args.h"

namespace kvserve::cuda {

/// GPU twin of cpu::SiluMul: out = silu(gate) * up, elementwise; device pointers.
cudaError_t SiluMul(const SiluMulArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_SILU_MUL_H_
