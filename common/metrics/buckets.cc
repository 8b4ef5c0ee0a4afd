#include "common/metrics/buckets.h"

#include <cstddef>

namespace kvserve::metrics {

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  if (!(start > 0) || !(factor > 1) || count <= 0) return bounds;
  bounds.reserve(static_cast<size_t>(count));
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) bounds.push_back(bound);
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> bounds;
  if (!(width > 0) || count <= 0) return bounds;
  bounds.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) bounds.push_back(start + width * i);
  return bounds;
}

const std::vector<double>& TimeToFirstTokenBuckets() {
  static const std::vector<double> kBounds = {0.001, 0.005, 0.01,  0.02, 0.04, 0.06, 0.08,
                                              0.1,   0.25,  0.5,   0.75, 1.0,  2.5,  5.0,
                                              7.5,   10.0,  20.0,  40.0, 80.0};
  return kBounds;
}

const std::vector<double>& InterTokenLatencyBuckets() {
  static const std::vector<double> kBounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                              0.15,  0.2,   0.3,  0.4,   0.5,  0.75,  1.0,
                                              2.5,   5.0,   7.5,  10.0,  20.0, 40.0,  80.0};
  return kBounds;
}

const std::vector<double>& RequestPhaseBuckets() {
  static const std::vector<double> kBounds = {0.001, 0.005, 0.01,  0.025, 0.05,  0.1,
                                              0.3,   0.5,   0.8,   1.0,   1.5,   2.0,
                                              2.5,   5.0,   10.0,  15.0,  20.0,  30.0,
                                              40.0,  50.0,  60.0,  120.0, 240.0, 480.0,
                                              960.0, 1920.0, 7680.0};
  return kBounds;
}

const std::vector<double>& TokenCountBuckets() {
  static const std::vector<double> kBounds = ExponentialBuckets(1, 2, 16);
  return kBounds;
}

}  // namespace kvserve::metrics
