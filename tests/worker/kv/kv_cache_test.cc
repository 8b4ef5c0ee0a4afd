#include "worker/kv/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/kv_dtype.h"
#include "worker/model/model_config.h"

namespace kvserve {
namespace {

ModelConfig SmallConfig() {
  ModelConfig c;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  return c;
}

TEST(KvCacheTest, BytesPerTokenPerDType) {
  const ModelConfig c = SmallConfig();  // L = 3, kv heads = 2, d = 8
  EXPECT_EQ(KvCache::BytesPerToken(c), 2 * 3 * 2 * 8 * 4);  // default f32
  EXPECT_EQ(KvCache::BytesPerToken(c, KvCacheDType::kF32), 2 * 3 * 2 * 8 * 4);
  EXPECT_EQ(KvCache::BytesPerToken(c, KvCacheDType::kF16), 2 * 3 * 2 * 8 * 2);
  EXPECT_EQ(KvCache::BytesPerToken(c, KvCacheDType::kBF16), 2 * 3 * 2 * 8 * 2);
  EXPECT_EQ(KvCache::BytesPerToken(c, KvCacheDType::kInt8), 2 * 3 * 2 * (8 + 4));
  EXPECT_EQ(KvCache::BytesPerToken(c, KvCacheDType::kFp8E4M3), 2 * 3 * 2 * (8 + 4));
  ModelConfig big;  // Llama-3-8B-like shard: 32 layers, 8 kv heads, d = 128
  big.num_layers = 32;
  big.num_kv_heads = 8;
  big.head_dim = 128;
  EXPECT_EQ(KvCache::BytesPerToken(big, KvCacheDType::kF16), 131072);
  EXPECT_EQ(KvCache::BytesPerToken(big, KvCacheDType::kInt8), 2 * 32 * 8 * 132);
}

TEST(KvCacheTest, CreatesZeroedStorageOfEachDType) {
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)));
    absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(SmallConfig(), 5, 4, dtype);
    ASSERT_TRUE(cache.ok()) << cache.status();
    KvCache& kv = **cache;
    EXPECT_EQ(kv.dtype(), dtype);
    EXPECT_EQ(kv.layout().dtype, dtype);
    EXPECT_EQ(kv.layout().num_kv_heads, 2);
    EXPECT_EQ(kv.layout().head_dim, 8);
    EXPECT_EQ(kv.block_size(), 4);
    EXPECT_EQ(kv.num_blocks(), 5);
    EXPECT_EQ(kv.num_layers(), 3);
    const int64_t rows = 5 * 2 * 4;
    const int64_t bytes = rows * 8 * KvCacheDTypeElemBytes(dtype);
    for (int l = 0; l < 3; ++l) {
      for (const cpu::KvCacheBuffer b : {kv.k(l), kv.v(l)}) {
        ASSERT_NE(b.data, nullptr);
        const auto* data = static_cast<const uint8_t*>(b.data);
        for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(data[i], 0) << i;
        EXPECT_EQ(b.scales != nullptr, KvCacheDTypeHasScales(dtype));
        if (b.scales != nullptr) {
          for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(b.scales[r], 0.0f);
        }
      }
      EXPECT_NE(kv.k(l).data, kv.v(l).data);
    }
  }
}

// Resident memory of this process, from /proc/self/statm.
int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long pages_total = 0, pages_resident = 0;
  const int got = f != nullptr ? std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) : 0;
  if (f != nullptr) std::fclose(f);
  return got == 2 ? static_cast<int64_t>(pages_resident) * 4096 : -1;
}

// A host pool costs RAM only for the blocks written: a 768 MiB pool adds next to nothing to the
// resident set until blocks are used, then about what they hold.
TEST(KvCacheTest, AHostPoolCostsMemoryOnlyForTheBlocksWritten) {
  const ModelConfig config = SmallConfig();  // 3 layers x K,V x 2 kv heads x d 8, f32
  const int64_t block = 16;
  const int64_t block_bytes = config.num_kv_heads * block * config.head_dim * 4;  // 1 KiB
  const int64_t blocks = (int64_t{128} << 20) / block_bytes;  // 128 MiB per buffer, 768 MiB in all
  const int64_t before = ResidentBytes();
  ASSERT_GT(before, 0);
  std::unique_ptr<KvCache> cache = *KvCache::Create(config, blocks, block);
  const int64_t created = ResidentBytes();
  EXPECT_LT(created - before, int64_t{16} << 20) << "creating the pool touched it";
  // Write 8 MiB of one buffer: the resident set grows by about that much.
  std::memset(cache->k(0).data, 1, size_t{8} << 20);
  const int64_t written = ResidentBytes();
  EXPECT_GE(written - created, int64_t{7} << 20);
  EXPECT_LT(written - created, int64_t{24} << 20);
  EXPECT_EQ(static_cast<const uint8_t*>(cache->k(1).data)[12345], 0);  // untouched: zero
}

TEST(KvCacheTest, RejectsBadSizes) {
  EXPECT_EQ(KvCache::Create(SmallConfig(), 0, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(SmallConfig(), 4, -1, KvCacheDType::kInt8).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelConfig no_heads = SmallConfig();
  no_heads.num_kv_heads = 0;
  const absl::Status status = KvCache::Create(no_heads, 4, 16).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("num_kv_heads"), std::string::npos) << status;
  EXPECT_EQ(KvCache::Create(SmallConfig(), int64_t{1} << 60, 16).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(
      KvCache::Create(SmallConfig(), int64_t{1} << 58, 16, KvCacheDType::kFp8E4M3).status().code(),
      absl::StatusCode::kResourceExhausted);
}

// Writes random tokens into block 1 of every layer through cpu::WriteKvCache (the model's path),
// copies block 1 to block 3 and checks block 3 now reads back the same elements and scales while
// block 2 is untouched; attention over either block gives bit-identical results.
TEST(KvCacheTest, CopyBlockCopiesDataAndScales) {
  const ModelConfig config = SmallConfig();
  const int64_t kv_width = 2 * 8, block = 4;
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    SCOPED_TRACE(std::string(KvCacheDTypeName(dtype)));
    std::unique_ptr<KvCache> cache = *KvCache::Create(config, 5, block, dtype);
    std::mt19937 rng(static_cast<uint32_t>(dtype) + 1);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> k(static_cast<size_t>(block * kv_width)), v(k.size());
    const int64_t slots[4] = {4, 5, 6, 7};  // block 1
    for (int l = 0; l < 3; ++l) {
      for (float& f : k) f = dist(rng);
      for (float& f : v) f = dist(rng);
      cpu::WriteKvCache(k.data(), v.data(), block, kv_width, kv_width, slots, cache->layout(),
                        cache->k(l), cache->v(l));
      // What was stored reads back as the encoding of the input.
      const int64_t row_bytes = 8 * KvCacheDTypeElemBytes(dtype);
      for (int64_t t = 0; t < block; ++t) {
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t row = (1 * 2 + h) * block + t;
          std::vector<uint8_t> want(static_cast<size_t>(row_bytes));
          float want_scale = 0.0f;
          cpu::EncodeKvVector(dtype, k.data() + t * kv_width + h * 8, 8, want.data(), &want_scale);
          const auto* got = static_cast<const uint8_t*>(cache->k(l).data) + row * row_bytes;
          ASSERT_EQ(std::memcmp(got, want.data(), want.size()), 0) << "layer " << l;
          if (KvCacheDTypeHasScales(dtype)) {
            ASSERT_EQ(cache->k(l).scales[row], want_scale);
          }
        }
      }
    }
    cache->CopyBlock(1, 3);
    const int64_t rows = 2 * block;
    const int64_t bytes = rows * 8 * KvCacheDTypeElemBytes(dtype);
    for (int l = 0; l < 3; ++l) {
      for (const cpu::KvCacheBuffer b : {cache->k(l), cache->v(l)}) {
        const auto* data = static_cast<const uint8_t*>(b.data);
        EXPECT_EQ(std::memcmp(data + 3 * bytes, data + 1 * bytes, static_cast<size_t>(bytes)), 0);
        for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(data[2 * bytes + i], 0);
        if (b.scales != nullptr) {
          for (int64_t r = 0; r < rows; ++r) {
            EXPECT_EQ(b.scales[3 * rows + r], b.scales[1 * rows + r]);
            EXPECT_GT(b.scales[3 * rows + r], 0.0f);
            EXPECT_EQ(b.scales[2 * rows + r], 0.0f);
          }
        }
      }
    }
    // Decode-style attention of the 4th token over block 1, then over its copy: same bits.
    std::vector<float> q(4 * 8), out1(q.size()), out3(q.size());
    for (float& f : q) f = dist(rng);
    const int32_t q_start = 0, q_len = 1, context = 4;
    for (int32_t table : {1, 3}) {
      cpu::PagedAttentionArgs args{};
      args.q = q.data();
      args.q_stride = 32;
      args.out = table == 1 ? out1.data() : out3.data();
      args.out_stride = 32;
      args.num_seqs = 1;
      args.num_heads = 4;
      args.q_start = &q_start;
      args.q_len = &q_len;
      args.context_len = &context;
      args.block_tables = &table;
      args.block_table_stride = 1;
      args.k_cache = cache->k(2);
      args.v_cache = cache->v(2);
      args.layout = cache->layout();
      args.scale = 1.0f / std::sqrt(8.0f);
      cpu::PagedAttention(args, nullptr);
    }
    EXPECT_EQ(std::memcmp(out1.data(), out3.data(), out1.size() * sizeof(float)), 0);
    EXPECT_TRUE(std::isfinite(out1[0]));
  }
}

}  // namespace
}  // namespace kvserve
