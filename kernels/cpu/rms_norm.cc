#include "kernels/cpu/rms_norm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_isa.h"

namespace kvserve::cpu {
namespace internal {

void RmsNormRowBase(float* x, const float* residual, const float* weight, float* y, int64_t dim,
                    float eps) {
  constexpr int kLanes = 8;
  if (residual != nullptr) {
    for (int64_t i = 0; i < dim; ++i) x[i] += residual[i];
  }
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= dim; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += x[i + l] * x[i + l];
  }
  for (int l = 0; i + l < dim; ++l) lane[l] += x[i + l] * x[i + l];
  const float sum =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t j = 0; j < dim; ++j) y[j] = x[j] * inv * weight[j];
}

}  // namespace internal

void RmsNorm(const RmsNormArgs& args, ThreadPool* pool) {
  if (args.rows <= 0) return;
  const auto row_fn = ForActiveIsa(&internal::RmsNormRowBase, &internal::RmsNormRowAvx2,
                                   &internal::RmsNormRowAvx512);
  const int64_t residual_stride = args.residual_stride != 0 ? args.residual_stride : args.dim;
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      row_fn(args.x + r * args.x_stride,
             args.residual != nullptr ? args.residual + r * residual_stride : nullptr, args.weight,
             args.y + r * args.y_stride, args.dim, args.eps);
    }
  };
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(args.dim, 1));
  if (pool == nullptr || args.rows < 2 * min_rows) {
    run(0, args.rows);
  } else {
    pool->ParallelFor(args.rows, min_rows, run);
  }
}

}  // namespace kvserve::cpu
