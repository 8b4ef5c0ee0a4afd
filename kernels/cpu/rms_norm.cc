#include "kernels/cpu/rms_norm.h"

#include <algorithm>
#include <cmath>

namespace kvserve::cpu {
namespace {

constexpr int kLanes = 8;

void NormRow(const RmsNormArgs& a, int64_t row) {
  float* x = a.x + row * a.x_stride;
  if (a.residual != nullptr) {
    const int64_t stride = a.residual_stride != 0 ? a.residual_stride : a.dim;
    const float* res = a.residual + row * stride;
    for (int64_t i = 0; i < a.dim; ++i) x[i] += res[i];
  }
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= a.dim; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += x[i + l] * x[i + l];
  }
  for (int l = 0; i + l < a.dim; ++l) lane[l] += x[i + l] * x[i + l];
  const float sum =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(a.dim) + a.eps);
  float* y = a.y + row * a.y_stride;
  for (int64_t j = 0; j < a.dim; ++j) y[j] = x[j] * inv * a.weight[j];
}

}  // namespace

void RmsNorm(const RmsNormArgs& args, ThreadPool* pool) {
  if (args.rows <= 0) return;
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) NormRow(args, r);
  };
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(args.dim, 1));
  if (pool == nullptr || args.rows < 2 * min_rows) {
    run(0, args.rows);
  } else {
    pool->ParallelFor(args.rows, min_rows, run);
  }
}

}  // namespace kvserve::cpu
