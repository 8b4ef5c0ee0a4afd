#ifndef KVSERVE_KERNELS_CUDA_MOE_COMBINE_H_
#define KVSERVE_KERNELS_CUDA_MOE_COMBINE_H_

#include <cuda_runtime_api.h>

#include "kernels/op_args.h"

namespace kvserve::cuda {

/// GPU twin of the CPU backend's MoeCombine: each token's weighted sum of its experts' rows, in
/// slot order; device pointers.
cudaError_t MoeCombine(const MoeCombineArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_MOE_COMBINE_H_
