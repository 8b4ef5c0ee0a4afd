#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::RandomFloats;

TEST(RopeTest, BothLayoutsMatchDoubleReference) {
  std::mt19937 rng(3);
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
    for (int64_t head_dim : {8, 64, 128}) {
      const int64_t tokens = 5, heads = 3, stride = heads * head_dim + 7;
      std::vector<float> inv_freq(head_dim / 2);
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / head_dim));
      }
      const std::vector<int32_t> positions = {0, 1, 17, 4095, 131071};
      std::vector<float> x = RandomFloats(tokens * stride, rng);
      const std::vector<float> x0 = x;
      ApplyRope(RopeArgs{x.data(), tokens, heads, head_dim, stride, positions.data(),
                         inv_freq.data(), layout});
      const int64_t half = head_dim / 2;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            const int64_t ia = layout == RopeLayout::kInterleaved ? 2 * i : i;
            const int64_t ib = layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
            const int64_t base = t * stride + h * head_dim;
            // The angle is defined in fp32; cos/sin and the rotation in double.
            const double angle = static_cast<float>(positions[t]) * inv_freq[i];
            const double a = x0[base + ia], b = x0[base + ib];
            EXPECT_NEAR(x[base + ia], a * std::cos(angle) - b * std::sin(angle), 1e-6);
            EXPECT_NEAR(x[base + ib], a * std::sin(angle) + b * std::cos(angle), 1e-6);
          }
        }
        // Padding after the heads is untouched.
        for (int64_t e = heads * head_dim; e < stride; ++e) {
          EXPECT_EQ(x[t * stride + e], x0[t * stride + e]);
        }
      }
    }
  }
}

// MLA rotates only the rope part at the end of each head: the first head_dim - rotary_dim
// values stay as they are, and the last rotary_dim turn like a head of that width.
TEST(RopeTest, RotaryDimTurnsOnlyTheTailOfEachHead) {
  std::mt19937 rng(5);
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
    const int64_t tokens = 3, heads = 2, head_dim = 40, rotary = 8, stride = heads * head_dim;
    std::vector<float> inv_freq(rotary / 2);
    for (int64_t i = 0; i < rotary / 2; ++i) {
      inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / rotary));
    }
    const std::vector<int32_t> positions = {0, 9, 300};
    std::vector<float> x = RandomFloats(tokens * stride, rng);
    std::vector<float> tails(tokens * heads * rotary);  // the tails alone, as whole heads
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < rotary; ++i) {
          tails[(t * heads + h) * rotary + i] =
              x[t * stride + h * head_dim + head_dim - rotary + i];
        }
      }
    }
    const std::vector<float> x0 = x;
    ApplyRope(RopeArgs{x.data(), tokens, heads, head_dim, stride, positions.data(), inv_freq.data(),
                       layout, rotary});
    ApplyRope(RopeArgs{tails.data(), tokens, heads, rotary, heads * rotary, positions.data(),
                       inv_freq.data(), layout});
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < head_dim; ++i) {
          const int64_t at = t * stride + h * head_dim + i;
          if (i < head_dim - rotary) {
            EXPECT_EQ(x[at], x0[at]);
          } else {
            EXPECT_EQ(x[at], tails[(t * heads + h) * rotary + i - (head_dim - rotary)]);
          }
        }
      }
    }
  }
}

TEST(RopeTest, PositionZeroIsIdentity) {
  std::vector<float> x = {1, 2, 3, 4};
  const std::vector<float> inv_freq = {1.0f, 0.5f};
  const int32_t pos = 0;
  ApplyRope(RopeArgs{x.data(), 1, 1, 4, 4, &pos, inv_freq.data(), RopeLayout::kHalfSplit});
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace kvserve::cpu
