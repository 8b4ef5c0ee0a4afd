#include "kernels/cpu/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
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

// A batch of sequences with contiguous K/V/Q (the reference's view) and the same data scattered
// into a paged cache over shuffled physical blocks (the kernel's view).
class Batch {
 public:
  Batch(const std::vector<SeqSpec>& seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
        int64_t block_size, int32_t window, uint32_t seed)
      : seqs_(seqs),
        num_heads_(num_heads),
        layout_{num_kv_heads, head_dim, block_size},
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
    // Shuffled physical blocks, plus spare ones; NaN everywhere so stray reads show up.
    const int64_t num_blocks = total_blocks + 3;
    std::vector<int32_t> physical(static_cast<size_t>(num_blocks));
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng);
    const size_t cache_elems = static_cast<size_t>(num_blocks * kv_width * block_size);
    k_cache_.assign(cache_elems, std::numeric_limits<float>::quiet_NaN());
    v_cache_.assign(cache_elems, std::numeric_limits<float>::quiet_NaN());
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
                   slots.data(), layout_, k_cache_.data(), v_cache_.data());
    }
  }

  int64_t q_stride() const { return num_heads_ * layout_.head_dim + 1; }
  int64_t out_stride() const { return num_heads_ * layout_.head_dim + 2; }
  int64_t num_tokens() const { return num_tokens_; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(layout_.head_dim)); }

  std::vector<float> Run(ThreadPool* pool) const {
    std::vector<float> out(static_cast<size_t>(num_tokens_ * out_stride()), 0.0f);
    PagedAttentionArgs args{q_.data(),
                            q_stride(),
                            out.data(),
                            out_stride(),
                            static_cast<int64_t>(seqs_.size()),
                            num_heads_,
                            q_start_.data(),
                            q_len_.data(),
                            context_len_.data(),
                            tables_.data(),
                            table_stride_,
                            k_cache_.data(),
                            v_cache_.data(),
                            layout_,
                            scale(),
                            window_};
    PagedAttention(args, pool);
    return out;
  }

  // Naive attention in double over the contiguous K/V: the head_dim outputs of (s, j, h).
  std::vector<double> Reference(size_t s, int64_t j, int64_t h) const {
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
      for (int64_t e = 0; e < hd; ++e) dot += double{q[e]} * keys_[s][t * kv_width + kvh * hd + e];
      scores.push_back(dot * scale());
      max_score = std::max(max_score, scores.back());
    }
    double sum = 0;
    std::vector<double> acc(static_cast<size_t>(hd), 0.0);
    for (int64_t t = 0; t <= pos; ++t) {
      if (scores[t] == -1e300) continue;
      const double p = std::exp(scores[t] - max_score);
      sum += p;
      for (int64_t d = 0; d < hd; ++d) acc[d] += p * values_[s][t * kv_width + kvh * hd + d];
    }
    for (double& a : acc) a /= sum;
    return acc;
  }

  void ExpectMatchesReference(const std::vector<float>& out) const {
    for (size_t s = 0; s < seqs_.size(); ++s) {
      for (int64_t j = 0; j < seqs_[s].q_len; ++j) {
        for (int64_t h = 0; h < num_heads_; ++h) {
          const std::vector<double> ref = Reference(s, j, h);
          for (int64_t d = 0; d < layout_.head_dim; ++d) {
            const float got = out[(q_start_[s] + j) * out_stride() + h * layout_.head_dim + d];
            ASSERT_NEAR(got, ref[d], 2e-5)
                << "seq " << s << " query " << j << " head " << h << " dim " << d;
          }
        }
      }
    }
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
  std::vector<float> q_;
  std::vector<int32_t> q_start_, q_len_, context_len_, tables_;
  int64_t table_stride_ = 0;
  int64_t num_tokens_ = 0;
  std::vector<float> k_cache_, v_cache_;
};

// Decode, prefill and chunked prefill at contexts 1/15/16/17/97 in one batch.
std::vector<SeqSpec> MixedSeqs() {
  return {{1, 1, 11},  {15, 1, 12},  {16, 16, 13}, {17, 5, 14},
          {97, 1, 15}, {97, 97, 16}, {17, 17, 17}, {16, 1, 18}};
}

void CheckBatchIndependence() {
  ThreadPool pool2(2), pool3(3);
  const std::vector<SeqSpec> seqs = MixedSeqs();
  const Batch batch(seqs, 8, 2, 64, 16, 0, 42);
  const std::vector<float> base = batch.Run(nullptr);
  for (ThreadPool* pool : {&pool2, &pool3}) {
    const std::vector<float> out = batch.Run(pool);
    ASSERT_EQ(0, std::memcmp(out.data(), base.data(), out.size() * sizeof(float)));
  }
  // Each sequence alone, with a different physical block placement.
  for (size_t s = 0; s < seqs.size(); ++s) {
    const Batch alone({seqs[s]}, 8, 2, 64, 16, 0, 1000 + static_cast<uint32_t>(s));
    const std::vector<float> out = alone.Run(&pool2);
    for (int64_t j = 0; j < seqs[s].q_len; ++j) {
      ASSERT_EQ(0, std::memcmp(alone.Row(out, 0, j), batch.Row(base, s, j), batch.RowBytes()))
          << "seq " << s << " query " << j;
    }
  }
}

// A query token's output is bit-identical whether it is computed in a full prefill, in a chunk of
// a chunked prefill or as a decode step (the engine relies on this), and whatever the block size.
void CheckPrefillChunkedDecode() {
  constexpr int32_t kCtx = 97;
  constexpr uint32_t kSeed = 77;
  ThreadPool pool(2);
  for (int32_t window : {0, 7}) {
    std::vector<float> first_block_size_result;
    for (int64_t block_size : {16, 1, 5}) {
      const Batch prefill({{kCtx, kCtx, kSeed}}, 4, 2, 64, block_size, window, 5);
      const std::vector<float> full = prefill.Run(&pool);
      prefill.ExpectMatchesReference(full);
      if (first_block_size_result.empty()) first_block_size_result = full;
      ASSERT_EQ(
          0, std::memcmp(full.data(), first_block_size_result.data(), full.size() * sizeof(float)))
          << "block size " << block_size;
      // Chunk: the last 40 tokens of the same 97.
      const Batch chunk({{kCtx, 40, kSeed}}, 4, 2, 64, block_size, window, 6);
      const std::vector<float> chunk_out = chunk.Run(nullptr);
      for (int64_t j = 0; j < 40; ++j) {
        ASSERT_EQ(0, std::memcmp(chunk.Row(chunk_out, 0, j), prefill.Row(full, 0, kCtx - 40 + j),
                                 prefill.RowBytes()));
      }
      // Decode steps at a few positions p (context p + 1), batched together.
      const std::vector<int32_t> positions = {0, 15, 16, 50, 96};
      std::vector<SeqSpec> steps;
      for (int32_t p : positions) steps.push_back({p + 1, 1, kSeed});
      const Batch decode(steps, 4, 2, 64, block_size, window, 7);
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
    for (int64_t group : {1, 2, 4, 8}) {
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
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(PagedAttentionTest, ResultsIndependentOfBatchAndThreads) {
  for (CpuIsa isa : SupportedIsas()) {
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    const ScopedIsa scoped(isa);
    CheckBatchIndependence();
    if (HasFatalFailure()) return;
  }
}

TEST(PagedAttentionTest, PrefillChunkedAndDecodeAgreeBitwise) {
  for (CpuIsa isa : SupportedIsas()) {
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    const ScopedIsa scoped(isa);
    CheckPrefillChunkedDecode();
    if (HasFatalFailure()) return;
  }
}

TEST(PagedAttentionTest, SimdPathsAgreeWithScalar) {
  const Batch batch(MixedSeqs(), 8, 2, 72, 16, 0, 9);  // head_dim 72: SIMD tails
  std::vector<float> scalar;
  {
    const ScopedIsa scoped(CpuIsa::kScalar);
    scalar = batch.Run(nullptr);
  }
  for (CpuIsa isa : SupportedIsas()) {
    const ScopedIsa scoped(isa);
    const std::vector<float> out = batch.Run(nullptr);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], scalar[i], 1e-5) << CpuIsaName(isa) << " element " << i;
    }
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

}  // namespace
}  // namespace kvserve::cpu
