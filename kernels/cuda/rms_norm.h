#ifndef KVSERVE_KERNELS_CUDA_RMS_NORM_H_
#define KVSERVE_KERNELS_CUDA_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include "kernels/cpu/rms_norm.h"

namespace kvserve::cuda {

/// GPU twin of cpu::RmsNorm (fused residual add + RMSNorm), same arguments, device pointers.
/// The sum of squares is a block tree reduction, so results differ from the CPU's fixed 8-lane
/// order by rounding only.
cudaError_t RmsNorm(const cpu::RmsNormArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_RMS_NORM_H_
