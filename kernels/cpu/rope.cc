#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace kvserve::cpu {

void ApplyRope(const RopeArgs& args) {
  const int64_t rotary = args.rotary_dim > 0 ? args.rotary_dim : args.head_dim;
  const int64_t half = rotary / 2;
  thread_local std::vector<float> cos_sin;
  cos_sin.resize(static_cast<size_t>(2 * half));
  // Element offsets of pair i's two members inside a head.
  const bool interleaved = args.layout == RopeLayout::kInterleaved;
  for (int64_t t = 0; t < args.num_tokens; ++t) {
    const float pos = static_cast<float>(args.positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * args.inv_freq[i];
      cos_sin[2 * i] = std::cos(angle);
      cos_sin[2 * i + 1] = std::sin(angle);
    }
    float* token = args.x + t * args.token_stride;
    for (int64_t h = 0; h < args.num_heads; ++h) {
      float* head = token + h * args.head_dim + (args.head_dim - rotary);
      for (int64_t i = 0; i < half; ++i) {
        float* pa = interleaved ? head + 2 * i : head + i;
        float* pb = interleaved ? head + 2 * i + 1 : head + i + half;
        const float a = *pa;
        const float b = *pb;
        const float c = cos_sin[2 * i];
        const float s = cos_sin[2 * i + 1];
        *pa = a * c - b * s;
        *pb = a * s + b * c;
      }
    }
  }
}

}  // namespace kvserve::cpu
