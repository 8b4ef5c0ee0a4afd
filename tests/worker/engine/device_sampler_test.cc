// DeviceSampler against the host Sampler, on the CPU twin of the device kernel
// (CpuBackend::SampleTopKTopP): which requests it takes, and that for those it draws exactly the
// host sampler's tokens from the same seed (cuda_ops_test holds the CUDA kernel to the twin, bit
// for bit; cuda_engine_test runs both paths through the engine).

#include "worker/engine/device_sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/engine/sampler.h"

namespace kvserve {
namespace {

SamplingParams Params(float temperature, int32_t top_k, float top_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

TEST(DeviceSamplerTest, TakesOnlyWhatTheKernelReproduces) {
  constexpr int32_t kVocab = 1000;
  std::optional<SampleRowParams> row = DeviceSampler::RowParams(Params(0.7f, 40, 0.9f, 1), kVocab);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->temperature, 0.7f);
  EXPECT_EQ(row->top_k, 40);
  EXPECT_EQ(row->top_p, 0.9f);
  // Greedy, whatever top_k says: the argmax, as top 1 at temperature 1.
  row = DeviceSampler::RowParams(Params(0.0f, 0, 0.5f, 1), kVocab);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->top_k, 1);
  EXPECT_EQ(row->temperature, 1.0f);
  EXPECT_EQ(row->top_p, 1.0f);
  EXPECT_TRUE(DeviceSampler::RowParams(Params(1.0f, kMaxSampleTopK, 1.0f, 1), kVocab));
  // Not served: the whole vocabulary (top_k 0), more than 64, k reaching the vocabulary size.
  EXPECT_FALSE(DeviceSampler::RowParams(Params(1.0f, 0, 0.9f, 1), kVocab));
  EXPECT_FALSE(DeviceSampler::RowParams(Params(1.0f, kMaxSampleTopK + 1, 1.0f, 1), kVocab));
  EXPECT_FALSE(DeviceSampler::RowParams(Params(1.0f, 10, 1.0f, 1), 10));
  SamplingParams p = Params(1.0f, 10, 1.0f, 1);
  p.logprobs = 0;
  EXPECT_FALSE(DeviceSampler::RowParams(p, kVocab));
  p = Params(0.0f, 0, 1.0f, 1);
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(DeviceSampler::RowParams(p, kVocab));  // penalties, even greedy
  p = Params(1.0f, 10, 1.0f, 1);
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(DeviceSampler::RowParams(p, kVocab));
  p = Params(1.0f, 10, 1.0f, 1);
  p.min_p = 0.1f;
  EXPECT_FALSE(DeviceSampler::RowParams(p, kVocab));
}

// `rows` rows of `vocab` logits of one kind.
std::vector<float> Logits(const std::string& kind, int64_t rows, int64_t vocab) {
  std::mt19937 rng(static_cast<uint32_t>(kind.size() * 7919 + vocab));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> out(rows * vocab);
  for (float& x : out) {
    if (kind == "normal") {
      x = normal(rng);
    } else if (kind == "ulps") {
      // Values a few ulps apart.
      x = 1.0f + static_cast<float>(rng() % 64) * 0x1p-23f;
    } else if (kind == "collapse") {
      // Distinct values that the temperature step's logit - max (the max is 8, below) rounds
      // onto a few: their ties then rank by id, not by the raw logits.
      x = 0.1f + static_cast<float>(rng() % 4096) * 0x1p-27f;
    } else {  // "quantized": crowds of exact ties
      x = std::round(normal(rng) / 2.0f);
    }
  }
  if (kind == "collapse") {
    for (int64_t r = 0; r < rows; ++r) out[r * vocab + (r * 37) % vocab] = 8.0f;
  }
  return out;
}

TEST(DeviceSamplerTest, CpuTwinDrawsTheHostSamplersTokens) {
  cpu::CpuBackend backend(nullptr);
  DeviceSampler device(&backend);
  constexpr int64_t kRows = 4;
  constexpr int kSteps = 12;
  for (const std::string kind : {"normal", "ulps", "collapse", "quantized"}) {
    for (const int64_t vocab : {int64_t{300}, int64_t{5000}}) {
      const std::vector<float> logits = Logits(kind, kRows, vocab);
      // Every combination is one row of each launch, with its own pair of samplers: `host`
      // samples on the host, `twin` only hands out uniforms.
      std::vector<SamplingParams> params;
      for (float temperature : {1.0f, 0.7f, 1.3f, 3.0f, 1e3f, 0.0f}) {
        for (int32_t top_k : {1, 2, 7, 40, 64}) {
          for (float top_p : {1.0f, 0.9f, 0.5f, 0.1f}) {
            params.push_back(Params(temperature, top_k, top_p, 7 * params.size() + 1));
          }
        }
      }
      std::vector<Sampler> host, twin;
      for (const SamplingParams& p : params) {
        host.push_back(*Sampler::Create(p, static_cast<int32_t>(vocab)));
        twin.push_back(*Sampler::Create(p, static_cast<int32_t>(vocab)));
      }
      int64_t differ = 0;
      for (int step = 0; step < kSteps; ++step) {
        std::vector<SampleRowParams> rows;
        std::vector<int32_t> want;
        for (size_t i = 0; i < params.size(); ++i) {
          SampleRowParams row = *DeviceSampler::RowParams(params[i], static_cast<int32_t>(vocab));
          row.row = static_cast<int64_t>((i + step) % kRows);
          if (!params[i].IsGreedy()) row.uniform = twin[i].NextUniform();
          rows.push_back(row);
          const std::span<const float> logits_row(logits.data() + row.row * vocab, vocab);
          want.push_back(host[i].Sample(logits_row, {}, {})->token);
        }
        std::vector<int32_t> got(rows.size());
        ASSERT_TRUE(device.Sample(logits.data(), vocab, rows, got).ok());
        for (size_t i = 0; i < rows.size(); ++i) {
          differ += got[i] != want[i];
          EXPECT_EQ(got[i], want[i])
              << kind << " vocab " << vocab << " step " << step << ": t " << params[i].temperature
              << " k " << params[i].top_k << " p " << params[i].top_p;
        }
      }
      ASSERT_EQ(differ, 0) << kind << " vocab " << vocab;
    }
  }
}

TEST(DeviceSamplerTest, RefusesTheRowsTheHostSamplerRefuses) {
  cpu::CpuBackend backend(nullptr);
  DeviceSampler device(&backend);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {1.0f,  std::nanf(""), 2.0f,    // NaN
                                     1.0f,  kInf,          2.0f,    // +inf
                                     -kInf, -kInf,         -kInf,   // every token masked
                                     -kInf, 0.5f,          -kInf};  // fine
  for (float temperature : {1.0f, 0.5f}) {
    std::vector<SampleRowParams> rows;
    for (int64_t r = 0; r < 4; ++r) {
      rows.push_back({.row = r, .uniform = 0.5, .temperature = temperature, .top_k = 2});
    }
    std::vector<int32_t> got(4);
    ASSERT_TRUE(device.Sample(logits.data(), 3, rows, got).ok());
    EXPECT_EQ(got, (std::vector<int32_t>{-1, -1, -1, 1})) << "t " << temperature;
    Sampler host = *Sampler::Create(Params(temperature, 2, 1.0f, 1), 3);
    for (int64_t r = 0; r < 3; ++r) {
      EXPECT_FALSE(host.Sample(std::span<const float>(logits.data() + 3 * r, 3), {}, {}).ok());
    }
  }
}

}  // namespace
}  // namespace kvserve
