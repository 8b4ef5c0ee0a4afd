#include "kernels/cpu/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/kv_dtype.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::RandomFloats;
using testing::ScopedIsa;
using testing::SupportedIsas;

// A sequence's data comes from its own seed, position by position (K, V and Q rows of position
// t are drawn in order), so the same seed gives the same tokens whatever the context length,
// q_len or batch: prefixes and batch members can be compared bit for bit.
struct SeqSpec {
  int32_t context_len;
  int32_t q_len;
  uint32_t seed;
};

// Independent decode of one element of a cache row (the test's own reading of the layout).
double DecodeCached(KvCacheDType dtype, const uint8_t* data, const float* scales, int64_t row,
                    int64_t head_dim, int64_t d) {
  const int64_t at = row * head_dim + d;
  switch (dtype) {
    case KvCacheDType::kF32: {
      float f;
      std::memcpy(&f, data + 4 * at, 4);
      return f;
    }
    case KvCacheDType::kF16:
    case KvCacheDType::kBF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * at, 2);
      return dtype == KvCacheDType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
    }
    case KvCacheDType::kInt8:
      return double{scales[row]} * static_cast<int8_t>(data[at]);
    case KvCacheDType::kFp8E4M3:
      return double{scales[row]} * testing::RefFp8E4M3Decode(data[at]);
  }
  return 0.0;
}

// A batch of sequences with contiguous K/V/Q (the reference's view) and the same data scattered
// into a paged cache of `dtype` over shuffled physical blocks (the kernel's view). The reference
// can use the original f32 K/V or the values the cache actually holds (decoded independently).
class Batch {
 public:
  Batch(const std::vector<SeqSpec>& seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
        int64_t block_size, int32_t window, uint32_t seed,
        KvCacheDType dtype = KvCacheDType::kF32)
      : seqs_(seqs),
        num_heads_(num_heads),
        layout_{num_kv_heads, head_dim, block_size, dtype},
        window_(window) {
    std::mt19937 rng(seed);
    const int64_t kv_width = num_kv_heads * head_dim;
    int64_t max_blocks = 1;
    int64_t total_blocks = 0;
    for (const SeqSpec& s : seqs_) {
      const int64_t blocks = (s.context_len + block_size - 1) / block_size;
      max_blocks = std::max(max_blocks, blocks);
      total_blocks += blocks;
      std::mt19937 seq_rng(s.seed);
      std::vector<float> k, v, q;
      for (int32_t t = 0; t < s.context_len; ++t) {
        for (float f : RandomFloats(static_cast<size_t>(kv_width), seq_rng)) k.push_back(f);
        for (float f : RandomFloats(static_cast<size_t>(kv_width), seq_rng)) v.push_back(f);
        const std::vector<float> q_row =
            RandomFloats(static_cast<size_t>(num_heads * head_dim), seq_rng, -2.0f, 2.0f);
        if (t >= s.context_len - s.q_len) {
          q.insert(q.end(), q_row.begin(), q_row.end());
          q.push_back(0.0f);  // row padding (q_stride = width + 1)
        }
      }
      keys_.push_back(std::move(k));
      values_.push_back(std::move(v));
      q_.insert(q_.end(), q.begin(), q.end());
      q_start_.push_back(static_cast<int32_t>(num_tokens_));
      q_len_.push_back(s.q_len);
      context_len_.push_back(s.context_len);
      num_tokens_ += s.q_len;
    }
    // Shuffled physical blocks, plus spare ones; NaN everywhere so stray reads show up (0xff
    // bytes are NaN in f32 / f16 / bf16 / fp8; int8 rows get NaN scales).
    const int64_t num_blocks = total_blocks + 3;
    std::vector<int32_t> physical(static_cast<size_t>(num_blocks));
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng);
    const size_t cache_rows = static_cast<size_t>(num_blocks * num_kv_heads * block_size);
    const size_t cache_bytes = cache_rows * head_dim * KvCacheDTypeElemBytes(dtype);
    k_cache_.assign(cache_bytes, 0xff);
    v_cache_.assign(cache_bytes, 0xff);
    k_scales_.assign(cache_rows, std::numeric_limits<float>::quiet_NaN());
    v_scales_.assign(cache_rows, std::numeric_limits<float>::quiet_NaN());
    table_stride_ = max_blocks + 2;
    tables_.assign(static_cast<size_t>(seqs_.size() * table_stride_), -1);
    size_t next = 0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      std::vector<int64_t> slots;
      for (int64_t t = 0; t < seqs_[s].context_len; ++t) {
        if (t % block_size == 0) tables_[s * table_stride_ + t / block_size] = physical[next++];
        slots.push_back(tables_[s * table_stride_ + t / block_size] * block_size + t % block_size);
      }
      WriteKvCache(keys_[s].data(), values_[s].data(), seqs_[s].context_len, kv_width, kv_width,
                   slots.data(), layout_, KvCacheBuffer(k_cache_.data(), k_scales_.data()),
                   KvCacheBuffer(v_cache_.data(), v_scales_.data()));
      // What the cache holds, per token, in the contiguous order of keys_ / values_.
      std::vector<double> k_held, v_held;
      for (int64_t t = 0; t < seqs_[s].context_len; ++t) {
        for (int64_t h = 0; h < num_kv_heads; ++h) {
          const int64_t row = (slots[t] / block_size * num_kv_heads + h) * block_size +
                              slots[t] % block_size;
          for (int64_t d = 0; d < head_dim; ++d) {
            k_held.push_back(
                DecodeCached(dtype, k_cache_.data(), k_scales_.data(), row, head_dim, d));
            v_held.push_back(
                DecodeCached(dtype, v_cache_.data(), v_scales_.data(), row, head_dim, d));
          }
        }
      }
      held_keys_.push_back(std::move(k_held));
      held_values_.push_back(std::move(v_held));
    }
  }

  int64_t q_stride() const { return num_heads_ * layout_.head_dim + 1; }
  int64_t out_stride() const { return num_heads_ * layout_.head_dim + 2; }
  int64_t num_tokens() const { return num_tokens_; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(layout_.head_dim)); }

  // All query heads, or (one KV head only) `count` of them from `first` as a group of their own;
  // the other heads' outputs stay 0.
  std::vector<float> Run(ThreadPool* pool, int64_t first = 0, int64_t count = 0) const {
    std::vector<float> out(static_cast<size_t>(num_tokens_ * out_stride()), 0.0f);
    if (count == 0) count = num_heads_;
    const int64_t offset = first * layout_.head_dim;
    PagedAttentionArgs args{q_.data() + offset,
                            q_stride(),
                            out.data() + offset,
                            out_stride(),
                            static_cast<int64_t>(seqs_.size()),
                            count,
                            q_start_.data(),
                            q_len_.data(),
                            context_len_.data(),
                            tables_.data(),
                            table_stride_,
                            ConstKvCacheBuffer(k_cache_.data(), k_scales_.data()),
                            ConstKvCacheBuffer(v_cache_.data(), v_scales_.data()),
                            layout_,
                            scale(),
                            window_};
    PagedAttention(args, pool);
    return out;
  }

  // Naive attention in double over the contiguous K/V: the head_dim outputs of (s, j, h). `held`:
  // use the values the cache holds (decoded) instead of the original f32 K/V.
  std::vector<double> Reference(size_t s, int64_t j, int64_t h, bool held = true) const {
    const auto key = [&](int64_t at) { return held ? held_keys_[s][at] : keys_[s][at]; };
    const auto value = [&](int64_t at) { return held ? held_values_[s][at] : values_[s][at]; };
    const int64_t hd = layout_.head_dim;
    const int64_t kv_width = layout_.num_kv_heads * hd;
    const int64_t kvh = h / (num_heads_ / layout_.num_kv_heads);
    const int64_t pos = seqs_[s].context_len - seqs_[s].q_len + j;
    const float* q = q_.data() + (q_start_[s] + j) * q_stride() + h * hd;
    std::vector<double> scores;
    double max_score = -1e300;
    for (int64_t t = 0; t <= pos; ++t) {
      if (window_ > 0 && pos - t >= window_) {
        scores.push_back(-1e300);
        continue;
      }
      double dot = 0;
      for (int64_t e = 0; e < hd; ++e) dot += double{q[e]} * key(t * kv_width + kvh * hd + e);
      scores.push_back(dot * scale());
      max_score = std::max(max_score, scores.back());
    }
    double sum = 0;
    std::vector<double> acc(static_cast<size_t>(hd), 0.0);
    for (int64_t t = 0; t <= pos; ++t) {
      if (scores[t] == -1e300) continue;
      const double p = std::exp(scores[t] - max_score);
      sum += p;
      for (int64_t d = 0; d < hd; ++d) acc[d] += p * value(t * kv_width + kvh * hd + d);
    }
    for (double& a : acc) a /= sum;
    return acc;
  }

  // Every output within `tol` of the reference (held: over the cache's values; else over the
  // original f32 K/V). Returns the largest difference seen.
  double ExpectMatchesReference(const std::vector<float>& out, double tol = 2e-5,
                                bool held = true) const {
    double worst = 0.0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      for (int64_t j = 0; j < seqs_[s].q_len; ++j) {
        for (int64_t h = 0; h < num_heads_; ++h) {
          const std::vector<double> ref = Reference(s, j, h, held);
          for (int64_t d = 0; d < layout_.head_dim; ++d) {
            const float got = out[(q_start_[s] + j) * out_stride() + h * layout_.head_dim + d];
            worst = std::max(worst, std::fabs(got - ref[d]));
            EXPECT_NEAR(got, ref[d], tol)
                << "seq " << s << " query " << j << " head " << h << " dim " << d;
            if (::testing::Test::HasFailure()) return worst;
          }
        }
      }
    }
    return worst;
  }

  // Output row of sequence s, query j (all heads).
  const float* Row(const std::vector<float>& out, size_t s, int64_t j) const {
    return out.data() + (q_start_[s] + j) * out_stride();
  }
  size_t RowBytes() const { return num_heads_ * layout_.head_dim * sizeof(float); }

 private:
  std::vector<SeqSpec> seqs_;
  int64_t num_heads_;
  PagedKvLayout layout_;
  int32_t window_;
  std::vector<std::vector<float>> keys_, values_;  // [context, kv_heads * head_dim] per seq
  std::vector<std::vector<double>> held_keys_, held_values_;  // same, as the cache holds them
  std::vector<float> q_;
  std::vector<int32_t> q_start_, q_len_, context_len_, tables_;
  int64_t table_stride_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<uint8_t> k_cache_, v_cache_;
  std::vector<float> k_scales_, v_scales_;
};

// Decode, prefill and chunked prefill at contexts 1/15/16/17/97 in one batch.
std::vector<SeqSpec> MixedSeqs() {
  return {{1, 1, 11},  {15, 1, 12},  {16, 16, 13}, {17, 5, 14},
          {97, 1, 15}, {97, 97, 16}, {17, 17, 17}, {16, 1, 18}};
}

void CheckBatchIndependence(KvCacheDType dtype) {
  ThreadPool pool2(2), pool3(3);
  const std::vector<SeqSpec> seqs = MixedSeqs();
  const Batch batch(seqs, 8, 2, 64, 16, 0, 42, dtype);
  const std::vector<float> base = batch.Run(nullptr);
  for (ThreadPool* pool : {&pool2, &pool3}) {
    const std::vector<float> out = batch.Run(pool);
    ASSERT_EQ(0, std::memcmp(out.data(), base.data(), out.size() * sizeof(float)));
  }
  // Each sequence alone, with a different physical block placement.
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Batch alone({seqs[s]}, 8, 2, 64, 16, 0, 1000 + static_cast<uint32_t>(s), dtype);
    const std::vector<float> out = alone.Run(&pool2);
    for (int64_t j = 0; j < seqs[s].q_len; ++j) {
      ASSERT_EQ(0, std::memcmp(alone.Row(out, 0, j), batch.Row(base, s, j), batch.RowBytes()))
          << "seq " << s << " query " << j;
    }
  }
}

// A query token's output is bit-identical whether it is computed in a full prefill, in a chunk of
// a chunked prefill or as a decode step (the engine relies on this), and whatever the block size.
// For int8 / fp8 this also needs quantization to depend on the token alone (per-token scales).
void CheckPrefillChunkedDecode(KvCacheDType dtype) {
  constexpr int32_t kCtx = 97;
  constexpr uint32_t kSeed = 77;
  ThreadPool pool(2);
  for (int32_t window : {0, 7}) {
    std::vector<float> first_block_size_result;
    for (int64_t block_size : {16, 1, 5}) {
      const Batch prefill({{kCtx, kCtx, kSeed}}, 4, 2, 64, block_size, window, 5, dtype);
      const std::vector<float> full = prefill.Run(&pool);
      prefill.ExpectMatchesReference(full);
      if (::testing::Test::HasFailure()) return;
      if (first_block_size_result.empty()) first_block_size_result = full;
      ASSERT_EQ(
          0, std::memcmp(full.data(), first_block_size_result.data(), full.size() * sizeof(float)))
          << "block size " << block_size;
      // Chunk: the last 40 tokens of the same 97.
      const Batch chunk({{kCtx, 40, kSeed}}, 4, 2, 64, block_size, window, 6, dtype);
      const std::vector<float> chunk_out = chunk.Run(nullptr);
      for (int64_t j = 0; j < 40; ++j) {
        ASSERT_EQ(0, std::memcmp(chunk.Row(chunk_out, 0, j), prefill.Row(full, 0, kCtx - 40 + j),
                                 prefill.RowBytes()));
      }
      // Decode steps at a few positions p (context p + 1), batched together.
      const std::vector<int32_t> positions = {0, 15, 16, 50, 96};
      std::vector<SeqSpec> steps;
      for (int32_t p : positions) steps.push_back({p + 1, 1, kSeed});
      const Batch decode(steps, 4, 2, 64, block_size, window, 7, dtype);
      const std::vector<float> decode_out = decode.Run(&pool);
      for (size_t i = 0; i < positions.size(); ++i) {
        ASSERT_EQ(0, std::memcmp(decode.Row(decode_out, i, 0), prefill.Row(full, 0, positions[i]),
                                 prefill.RowBytes()))
            << "position " << positions[i];
      }
    }
  }
}

TEST(PagedAttentionTest, MatchesContiguousNaiveAttention) {
  ThreadPool pool(2);
  uint32_t seed = 1;
  for (int64_t head_dim : {8, 64, 128}) {
    for (int64_t group : {1, 2, 3, 4, 5, 8}) {
      for (int64_t block_size : {16, 1}) {
        for (int32_t window : {0, 5}) {
          SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " group " + std::to_string(group) +
                       " block " + std::to_string(block_size) + " window " +
                       std::to_string(window));
          const int64_t kv_heads = 2;
          const Batch batch(MixedSeqs(), kv_heads * group, kv_heads, head_dim, block_size, window,
                            seed++);
          for (CpuIsa isa : SupportedIsas()) {
            SCOPED_TRACE(std::string(CpuIsaName(isa)));
            const ScopedIsa scoped(isa);
            batch.ExpectMatchesReference(batch.Run(seed % 2 ? &pool : nullptr));
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

TEST(PagedAttentionTest, ResultsIndependentOfBatchAndThreads) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (CpuIsa isa : SupportedIsas()) {
      SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)) + " " + std::string(CpuIsaName(isa)));
      const ScopedIsa scoped(isa);
      CheckBatchIndependence(dtype);
      if (HasFailure()) return;
    }
  }
}

// Keys are visited in runs contiguous in one cache block, and the SIMD score loops reduce a run's
// keys 16 (AVX-512) or 8 (AVX2) at a time, then 4 or 1: one block of 1 key, 5, 16 or 32 cuts the
// same contexts into runs of every length, and every key's score must keep its bits.
TEST(PagedAttentionTest, ResultsIndependentOfBlockSize) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (int64_t head_dim : {64, 77}) {
      for (CpuIsa isa : SupportedIsas()) {
        SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)) + " " + std::string(CpuIsaName(isa)) +
                     " head_dim " + std::to_string(head_dim));
        const ScopedIsa scoped(isa);
        const std::vector<float> base =
            Batch(MixedSeqs(), 8, 2, head_dim, 1, 0, 5, dtype).Run(nullptr);
        for (int64_t block_size : {5, 16, 32}) {
          const std::vector<float> out =
              Batch(MixedSeqs(), 8, 2, head_dim, block_size, 0, 5, dtype).Run(nullptr);
          ASSERT_EQ(out.size(), base.size());
          ASSERT_EQ(0, std::memcmp(out.data(), base.data(), out.size() * sizeof(float)))
              << "block size " << block_size;
        }
      }
    }
  }
}

TEST(PagedAttentionTest, PrefillChunkedAndDecodeAgreeBitwise) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (CpuIsa isa : SupportedIsas()) {
      SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)) + " " + std::string(CpuIsaName(isa)));
      const ScopedIsa scoped(isa);
      CheckPrefillChunkedDecode(dtype);
      if (HasFailure()) return;
    }
  }
}

// The SIMD loops take a group's query heads four, two or one at a time, sharing each K/V row's
// decode: every head keeps its bits whether it is computed with its group (7 heads: 4 + 2 + 1) or
// alone.
TEST(PagedAttentionTest, EachQueryHeadKeepsItsBitsWhateverItsGroup) {
  constexpr int64_t kGroup = 7;
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (int64_t head_dim : {64, 77}) {
      const Batch batch(MixedSeqs(), kGroup, 1, head_dim, 16, 0, 21, dtype);
      for (CpuIsa isa : SupportedIsas()) {
        SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)) + " " + std::string(CpuIsaName(isa)) +
                     " head_dim " + std::to_string(head_dim));
        const ScopedIsa scoped(isa);
        const std::vector<float> grouped = batch.Run(nullptr);
        for (int64_t h = 0; h < kGroup; ++h) {
          const std::vector<float> alone = batch.Run(nullptr, h, 1);
          for (int64_t t = 0; t < batch.num_tokens(); ++t) {
            const int64_t at = t * batch.out_stride() + h * head_dim;
            ASSERT_EQ(0, std::memcmp(alone.data() + at, grouped.data() + at,
                                     static_cast<size_t>(head_dim) * sizeof(float)))
                << "head " << h << " token " << t;
          }
        }
      }
    }
  }
}

TEST(PagedAttentionTest, SimdPathsAgreeWithScalar) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (int64_t head_dim : {72, 77}) {  // SIMD tails of 8 and of 13 elements
      const Batch batch(MixedSeqs(), 8, 2, head_dim, 16, 0, 9, dtype);
      std::vector<float> scalar;
      {
        const ScopedIsa scoped(CpuIsa::kScalar);
        scalar = batch.Run(nullptr);
      }
      for (CpuIsa isa : SupportedIsas()) {
        const ScopedIsa scoped(isa);
        const std::vector<float> out = batch.Run(nullptr);
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_NEAR(out[i], scalar[i], 1e-5) << KvCacheDTypeName(dtype) << " " << CpuIsaName(isa)
                                               << " head_dim " << head_dim << " element " << i;
        }
      }
    }
  }
}

// The softmax loop of every ISA path gives the scalar loop's bits (attention_kernels.h: the same
// exp and the same order of sums), for rows of every length up to past a few SIMD widths, groups
// that take the four-row and one-row loops, rows with -inf scores and rows far below zero; and it
// is a softmax (checked in double).
TEST(PagedAttentionTest, SoftmaxGivesTheScalarBitsOnEveryPath) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> score(-30.0f, 30.0f);
  const internal::AttentionKernels scalar = internal::AttentionKernelsScalar(KvCacheDType::kF32);
  for (CpuIsa isa : SupportedIsas()) {
    internal::AttentionKernels kernels = scalar;
    if (isa == CpuIsa::kAvx2) kernels = internal::AttentionKernelsAvx2(KvCacheDType::kF32);
    if (isa == CpuIsa::kAvx512) kernels = internal::AttentionKernelsAvx512(KvCacheDType::kF32);
    for (int64_t group : {1, 3, 4, 7}) {
      for (int64_t keys = 1; keys <= 70; ++keys) {
        std::vector<float> probs(static_cast<size_t>(group * keys));
        for (float& p : probs) p = score(rng);
        if (keys > 2) probs[1] = -std::numeric_limits<float>::infinity();
        if (group > 1) {
          for (int64_t i = 0; i < keys; ++i) probs[keys + i] -= 1000.0f;  // row 1: all far down
        }
        std::vector<float> want = probs, got = probs;
        std::vector<float> want_inv(static_cast<size_t>(group)), got_inv(want_inv.size());
        scalar.softmax(want.data(), group, keys, want_inv.data());
        kernels.softmax(got.data(), group, keys, got_inv.data());
        const std::string where = std::string(CpuIsaName(isa)) + " group " + std::to_string(group) +
                                  " keys " + std::to_string(keys);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float))) << where;
        ASSERT_EQ(0, std::memcmp(want_inv.data(), got_inv.data(), got_inv.size() * sizeof(float)))
            << where;
        for (int64_t g = 0; g < group; ++g) {
          const float* row = probs.data() + g * keys;
          const double max = *std::max_element(row, row + keys);
          double total = 0.0;
          for (int64_t i = 0; i < keys; ++i) total += std::exp(double{row[i]} - max);
          for (int64_t i = 0; i < keys; ++i) {
            const double p = std::exp(double{row[i]} - max) / total;
            ASSERT_NEAR(got[g * keys + i] * got_inv[g], p, 1e-5 * p + 1e-30) << where;
          }
        }
      }
    }
  }
}

// Every int8 / fp8 code decodes exactly on every path: a one-token context makes the output the
// V row times its scale, element by element (K is all zero codes, so the score is 0).
TEST(PagedAttentionTest, EveryQuantizedCodeDecodesExactly) {
  for (KvCacheDType dtype : {KvCacheDType::kInt8, KvCacheDType::kFp8E4M3}) {
    for (int64_t head_dim : {256, 37}) {  // all codes; a SIMD tail
      const PagedKvLayout layout{1, head_dim, 2, dtype};
      // One block of 2 slots; the token is slot 0 (slot 1 is never read).
      std::vector<uint8_t> k_cache(static_cast<size_t>(2 * head_dim), 0), v_cache(k_cache);
      for (int64_t d = 0; d < head_dim; ++d) {
        v_cache[d] = static_cast<uint8_t>(head_dim == 256 ? d : 0x60 + d);
      }
      const std::vector<float> k_scales = {1.0f, 0.0f}, v_scales = {0.5f, 0.0f};
      const std::vector<float> q(static_cast<size_t>(head_dim), 1.0f);
      std::vector<float> out(q.size());
      const int32_t q_start = 0, q_len = 1, context = 1, table = 0;
      const ConstKvCacheBuffer k_buf(k_cache.data(), k_scales.data());
      const ConstKvCacheBuffer v_buf(v_cache.data(), v_scales.data());
      const PagedAttentionArgs args{q.data(), head_dim, out.data(), head_dim, 1, 1, &q_start,
                                    &q_len, &context, &table, 1, k_buf, v_buf, layout, 1.0f, 0};
      for (CpuIsa isa : SupportedIsas()) {
        const ScopedIsa scoped(isa);
        PagedAttention(args, nullptr);
        for (int64_t d = 0; d < head_dim; ++d) {
          const uint8_t code = v_cache[d];
          const double want = 0.5 * (dtype == KvCacheDType::kInt8
                                         ? static_cast<double>(static_cast<int8_t>(code))
                                         : testing::RefFp8E4M3Decode(code));
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(out[d])) << CpuIsaName(isa) << " code " << int{code};
          } else {
            EXPECT_EQ(out[d], want) << KvCacheDTypeName(dtype) << " " << CpuIsaName(isa)
                                    << " code " << int{code};
          }
        }
      }
    }
  }
}

// Loose bound on |attention over the dtype's cache - attention over the f32 K/V| for this test's
// data (K, V uniform in [-1, 1], Q in [-2, 2]): the dtype's own rounding, not the kernel's.
double F32Tolerance(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kF32:
      return 2e-5;
    case KvCacheDType::kF16:
      return 2e-3;
    case KvCacheDType::kBF16:
      return 1.5e-2;
    case KvCacheDType::kInt8:
      return 1.5e-2;
    case KvCacheDType::kFp8E4M3:
      return 8e-2;
  }
  return 0.0;
}

// Every dtype: tight against a double reference over the values the cache holds (the kernel
// dequantizes exactly), loose against the f32 reference (what the dtype costs in accuracy).
TEST(PagedAttentionTest, EveryDTypeMatchesReferences) {
  ThreadPool pool(2);
  uint32_t seed = 100;
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    double worst_held = 0.0, worst_f32 = 0.0;
    for (int64_t head_dim : {8, 77, 128}) {
      for (int64_t group : {1, 3, 4}) {
        for (int64_t block_size : {16, 1}) {
          for (int32_t window : {0, 5}) {
            SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)) + " head_dim " +
                         std::to_string(head_dim) + " group " + std::to_string(group) + " block " +
                         std::to_string(block_size) + " window " + std::to_string(window));
            const int64_t kv_heads = 2;
            const Batch batch(MixedSeqs(), kv_heads * group, kv_heads, head_dim, block_size,
                              window, seed++, dtype);
            for (CpuIsa isa : SupportedIsas()) {
              SCOPED_TRACE(std::string(CpuIsaName(isa)));
              const ScopedIsa scoped(isa);
              const std::vector<float> out = batch.Run(seed % 2 ? &pool : nullptr);
              worst_held = std::max(worst_held, batch.ExpectMatchesReference(out, 2e-5, true));
              worst_f32 = std::max(
                  worst_f32, batch.ExpectMatchesReference(out, F32Tolerance(dtype), false));
              if (HasFailure()) return;
            }
          }
        }
      }
    }
    std::printf("%-5s max |out - ref(held)| %.3g, max |out - ref(f32)| %.3g\n",
                std::string(KvCacheDTypeName(dtype)).c_str(), worst_held, worst_f32);
  }
}

TEST(PagedAttentionTest, WriteKvCacheSkipsNegativeSlots) {
  const PagedKvLayout layout{2, 4, 2};
  std::vector<float> k(2 * 8), v(2 * 8);
  std::iota(k.begin(), k.end(), 1.0f);
  std::iota(v.begin(), v.end(), 100.0f);
  std::vector<float> k_cache(2 * 2 * 2 * 4, -1.0f), v_cache(k_cache);
  const int64_t slots[2] = {3, -1};  // token 0 -> block 1, offset 1; token 1 is padding
  WriteKvCache(k.data(), v.data(), 2, 8, 8, slots, layout, k_cache.data(), v_cache.data());
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t d = 0; d < 4; ++d) {
      const int64_t at = ((1 * 2 + h) * 2 + 1) * 4 + d;
      EXPECT_EQ(k_cache[at], k[h * 4 + d]);
      EXPECT_EQ(v_cache[at], v[h * 4 + d]);
    }
  }
  EXPECT_EQ(std::count(k_cache.begin(), k_cache.end(), -1.0f), 32 - 8);
}

TEST(PagedAttentionTest, WriteKvCacheQuantizesPerTokenAndHead) {
  const PagedKvLayout layout{2, 4, 2, KvCacheDType::kInt8};
  // Token 0: head 0 absmax 2.54, head 1 absmax 0.127; token 1 is padding.
  const std::vector<float> k = {2.54f, -1.27f, 0.01f, 0.0f, 0.127f, 0.0635f, -0.127f, 0.0f,
                                9.0f,  9.0f,   9.0f,  9.0f, 9.0f,   9.0f,    9.0f,    9.0f};
  std::vector<float> v(16, 0.0f);  // all zero: scale 0
  std::vector<uint8_t> k_cache(2 * 2 * 2 * 4, 0x55), v_cache(k_cache);
  std::vector<float> k_scales(2 * 2 * 2, -1.0f), v_scales(k_scales);
  const int64_t slots[2] = {3, -1};  // block 1, offset 1
  WriteKvCache(k.data(), v.data(), 2, 8, 8, slots, layout,
               KvCacheBuffer(k_cache.data(), k_scales.data()),
               KvCacheBuffer(v_cache.data(), v_scales.data()));
  const int64_t row0 = (1 * 2 + 0) * 2 + 1, row1 = (1 * 2 + 1) * 2 + 1;
  EXPECT_EQ(k_scales[row0], 2.54f / 127.0f);
  EXPECT_EQ(k_scales[row1], 0.127f / 127.0f);
  EXPECT_EQ(v_scales[row0], 0.0f);
  EXPECT_EQ(v_scales[row1], 0.0f);
  const int8_t want0[4] = {127, -64, 0, 0};  // -1.27 / 0.02 ~ -63.5
  const int8_t want1[4] = {127, 64, -127, 0};  // 0.0635 / 0.001 ~ 63.5
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(static_cast<int8_t>(k_cache[row0 * 4 + d]), want0[d]) << d;
    EXPECT_EQ(static_cast<int8_t>(k_cache[row1 * 4 + d]), want1[d]) << d;
    EXPECT_EQ(v_cache[row0 * 4 + d], 0);
  }
  // Nothing else touched.
  EXPECT_EQ(std::count(k_cache.begin(), k_cache.end(), 0x55), 32 - 8);
  EXPECT_EQ(std::count(k_scales.begin(), k_scales.end(), -1.0f), 8 - 2);
}

}  // namespace
}  // namespace kvserve::cpu
