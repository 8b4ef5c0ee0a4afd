#ifndef KVSERVE_KERNELS_CUDA_ROPE_KV_WRITE_H_
#define KVSERVE_KERNELS_CUDA_ROPE_KV_WRITE_H_

#include <cuda_runtime_api.h>

#include "kernels/op_args.h"

namespace kvserve::cuda {

/// GPU twin of cpu::ApplyRope (q and k, in place) + cpu::WriteKvCache, fused into one kernel:
/// one thread block per token rotates its heads, then one warp per kv head encodes K and V into
/// the paged cache (int8 / fp8: absmax scale per row, codes rounded half to even as on the CPU).
/// cos/sin use CUDA's precise cosf/sinf (within 2 ulp of the CPU's).
cudaError_t RopeKvWrite(const RopeKvWriteArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_ROPE_KV_WRITE_H_
