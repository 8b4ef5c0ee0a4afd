#ifndef KVSERVE_KERNELS_CUDA_SAMPLING_H_
#define KVSERVE_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sampling_args.h"

namespace kvserve::cuda {

/// GPU twin of CpuBackend::SampleTopKTopP, one launch for all rows, one block per row. The block
/// selects the k best logits by a radix threshold instead of sorting the vocabulary: logits map
/// to 32-bit keys in RanksBefore's order (-0.0 as +0.0, NaN lowest); pass 1 histograms the top
/// 12 key bits in shared memory and a block-wide scan finds the bin of the k-th best; when that
/// bin and the bins above it hold at most 2048 logits, pass 2 gathers them into shared memory,
/// where a bitonic sort under RanksBefore orders them. A more crowded bin costs one histogram
/// pass per further digit (bits 19..8, then 7..0) before the gather; if even the whole key
/// leaves more than 2048 exact ties (e.g. a vocabulary masked to -inf), a last pass takes the
/// better logits and the first ties in index order. Model-like logits take two passes over the
/// row, crowded ones three, and none more than four. Then one thread does the softmax, nucleus
/// cut and draw in the CPU's order, so the pick is the CPU's bit for bit.
///
/// Each row has its own parameters (SampleRowParams). At a temperature other than 1 the keys are
/// the host sampler's scaled logits, (logit - max) * (1 / temperature), so ties that the scaling
/// creates rank by index as on the host; that costs one more pass, for the maximum. A row with
/// NaN or +inf (seen in the first histogram pass) or only -inf yields -1.
cudaError_t SampleTopKTopP(const SampleTopKTopPArgs& args, cudaStream_t stream);

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_SAMPLING_H_
