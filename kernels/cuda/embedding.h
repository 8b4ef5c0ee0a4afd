#ifndef KVSERVE_KERNELS_CUDA_EMBEDDING_H_
#define KVSERVE_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_runtime_api.h>

#include "kernels/op_args.h"

namespace kvserve::cuda {

/// GPU twin of cpu::EmbeddingGather: out[i, :] = float(table[ids[i], :]) for every weight dtype
/// (f32, f16, bf16, q8_0, q4_0). All pointers are device pointers.
cudaError_t EmbeddingGather(const EmbeddingArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_EMBEDDING_H_
