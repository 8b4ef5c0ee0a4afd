// Portable attention inner loops.

#include "kernels/cpu/attention_kernels.h"

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;

void Scores(const float* q, const float* k, int64_t count, int64_t head_dim, float scale,
            float* scores) {
  for (int64_t key = 0; key < count; ++key) {
    const float* kr = k + key * head_dim;
    float lane[kLanes] = {};
    int64_t d = 0;
    for (; d + kLanes <= head_dim; d += kLanes) {
      for (int l = 0; l < kLanes; ++l) lane[l] += q[d + l] * kr[d + l];
    }
    for (int l = 0; d + l < head_dim; ++l) lane[l] += q[d + l] * kr[d + l];
    const float dot =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    scores[key] = dot * scale;
  }
}

void Accumulate(const float* probs, const float* v, int64_t count, int64_t head_dim, float* acc) {
  for (int64_t key = 0; key < count; ++key) {
    const float p = probs[key];
    const float* vr = v + key * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * vr[d];
  }
}

}  // namespace

AttentionKernels AttentionKernelsScalar() { return {&Scores, &Accumulate}; }

}  // namespace kvserve::cpu::internal
