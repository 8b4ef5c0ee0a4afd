#include "worker/kv/block_pool.h"

#include <ostream>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {

// Readable failure messages (found by ADL).
void PrintTo(const KvEvent& e, std::ostream* os) {
  *os << (e.type == KvEvent::Type::kStored ? "stored(" : "evicted(") << e.key.ToString() << ")";
}

namespace {

using Events = std::vector<KvEvent>;

#define ASSERT_POOL_OK(pool)                          \
  do {                                                \
    const absl::Status st = (pool).CheckInvariants(); \
    ASSERT_TRUE(st.ok()) << st;                       \
  } while (0)

BlockKey Key(uint64_t n) { return BlockKey{n, n * 31 + 7}; }

TEST(BlockPoolTest, FreshPoolHandsOutBlocksInIdOrderAndNeverTheNullBlock) {
  BlockPool pool(5);
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.capacity(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.FreeQueue(), (std::vector<BlockId>{1, 2, 3, 4}));
  for (BlockId want : {1, 2, 3, 4}) {
    const std::optional<BlockId> b = pool.Allocate();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(*b, want);
    EXPECT_EQ(pool.ref_count(*b), 1);
    ASSERT_POOL_OK(pool);
  }
  EXPECT_FALSE(pool.Allocate().has_value());
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.num_used(), 4);
}

TEST(BlockPoolTest, FreedBlocksAreReusedLeastRecentlyFreedFirst) {
  BlockPool pool(5);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.AllocateMany(4, &got));
  pool.Unref(3);
  pool.Unref(1);
  pool.Unref(4);
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.FreeQueue(), (std::vector<BlockId>{3, 1, 4}));
  EXPECT_EQ(*pool.Allocate(), 3);
  EXPECT_EQ(*pool.Allocate(), 1);
  pool.Unref(2);
  EXPECT_EQ(pool.FreeQueue(), (std::vector<BlockId>{4, 2}));
  ASSERT_POOL_OK(pool);
}

TEST(BlockPoolTest, RefCountsSharers) {
  BlockPool pool(3);
  const BlockId b = *pool.Allocate();
  pool.Ref(b);
  pool.Ref(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  pool.Unref(b);
  pool.Unref(b);
  EXPECT_EQ(pool.num_free(), 1);  // still referenced once
  pool.Unref(b);
  EXPECT_EQ(pool.num_free(), 2);
  ASSERT_POOL_OK(pool);
}

TEST(BlockPoolTest, AllocateManyIsAllOrNothing) {
  BlockPool pool(4);
  std::vector<BlockId> out = {99};
  EXPECT_FALSE(pool.AllocateMany(4, &out));
  EXPECT_EQ(out, (std::vector<BlockId>{99}));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_TRUE(pool.AllocateMany(3, &out));
  EXPECT_EQ(out, (std::vector<BlockId>{99, 1, 2, 3}));
  EXPECT_TRUE(pool.AllocateMany(0, &out));
  ASSERT_POOL_OK(pool);
}

TEST(BlockPoolTest, CachedBlocksStayHitsWhileFreeAndAreEvictedOnReuse) {
  BlockPool pool(4);  // blocks 1..3
  const BlockId a = *pool.Allocate();
  const BlockId b = *pool.Allocate();
  EXPECT_TRUE(pool.CacheBlock(a, Key(1)));
  EXPECT_TRUE(pool.CacheBlock(b, Key(2)));
  EXPECT_EQ(pool.TakeEvents(),
            (Events{{KvEvent::Type::kStored, Key(1)}, {KvEvent::Type::kStored, Key(2)}}));
  EXPECT_TRUE(pool.TakeEvents().empty());
  pool.Unref(b);
  pool.Unref(a);
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_cached_free(), 2);
  EXPECT_EQ(pool.FreeQueue(), (std::vector<BlockId>{3, b, a}));
  EXPECT_EQ(pool.Lookup(Key(1)), a);
  EXPECT_EQ(pool.key(b), Key(2));

  // The uncached block 3 goes first, then b (freed before a) loses its key.
  EXPECT_EQ(*pool.Allocate(), 3);
  EXPECT_TRUE(pool.TakeEvents().empty());
  EXPECT_EQ(*pool.Allocate(), b);
  EXPECT_EQ(pool.TakeEvents(), (Events{{KvEvent::Type::kEvicted, Key(2)}}));
  EXPECT_FALSE(pool.Lookup(Key(2)).has_value());
  EXPECT_FALSE(pool.key(b).has_value());
  EXPECT_EQ(pool.num_cached_free(), 1);
  ASSERT_POOL_OK(pool);
}

TEST(BlockPoolTest, RefPullsACachedFreeBlockOutOfTheMiddleOfTheQueue) {
  BlockPool pool(6);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.AllocateMany(5, &got));
  ASSERT_TRUE(pool.CacheBlock(3, Key(3)));
  for (BlockId b : {2, 3, 4}) pool.Unref(b);
  EXPECT_EQ(pool.FreeQueue(), (std::vector<BlockId>{2, 3, 4}));
  ASSERT_EQ(pool.Lookup(Key(3)), 3);
  pool.Ref(3);
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.FreeQueue(), (std::vector<BlockId>{2, 4}));
  EXPECT_EQ(pool.num_cached_free(), 0);
  EXPECT_EQ(pool.ref_count(3), 1);
  // Pulling the head and the tail works as well.
  pool.Ref(2);
  pool.Ref(4);
  EXPECT_TRUE(pool.FreeQueue().empty());
  ASSERT_POOL_OK(pool);
}

TEST(BlockPoolTest, DuplicateKeysAndRekeyingAreRefused) {
  BlockPool pool(4);
  const BlockId a = *pool.Allocate();
  const BlockId b = *pool.Allocate();
  EXPECT_TRUE(pool.CacheBlock(a, Key(1)));
  EXPECT_FALSE(pool.CacheBlock(b, Key(1)));  // same content computed twice: first copy wins
  EXPECT_FALSE(pool.CacheBlock(a, Key(2)));  // a block keeps its first key
  EXPECT_FALSE(pool.key(b).has_value());
  EXPECT_EQ(pool.Lookup(Key(1)), a);
  EXPECT_EQ(pool.TakeEvents().size(), 1u);
  ASSERT_POOL_OK(pool);
}

TEST(BlockPoolTest, LargePoolOperationsStayConstantTime) {
  // 200k blocks, each freed and pulled back out of the middle of the queue: quadratic behaviour
  // would take minutes, O(1) operations take milliseconds.
  constexpr int32_t kBlocks = 200000;
  BlockPool pool(kBlocks + 1);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.AllocateMany(kBlocks, &got));
  for (BlockId b = 1; b <= kBlocks; ++b) ASSERT_TRUE(pool.CacheBlock(b, Key(b)));
  for (BlockId b = 1; b <= kBlocks; b += 2) pool.Unref(b);
  for (BlockId b = 2; b <= kBlocks; b += 2) pool.Unref(b);
  for (BlockId b = kBlocks / 2 + 1; b <= kBlocks; ++b) pool.Ref(*pool.Lookup(Key(b)));
  ASSERT_POOL_OK(pool);
  EXPECT_EQ(pool.num_free(), kBlocks / 2);
  EXPECT_EQ(pool.num_cached_free(), kBlocks / 2);
  // Head of the queue is now the first odd block freed.
  EXPECT_EQ(*pool.Allocate(), 1);
}

TEST(BlockPoolTest, ForgetAllKeysDropsEveryKeyWithAnEventAndKeepsReferences) {
  BlockPool pool(6);
  const BlockId held = *pool.Allocate();
  const BlockId freed = *pool.Allocate();
  ASSERT_TRUE(pool.CacheBlock(held, Key(1)));
  ASSERT_TRUE(pool.CacheBlock(freed, Key(2)));
  pool.Unref(freed);  // free but still cached
  pool.TakeEvents();
  ASSERT_EQ(pool.num_cached_free(), 1);

  EXPECT_EQ(pool.ForgetAllKeys(), 2);
  EXPECT_FALSE(pool.Lookup(Key(1)).has_value());
  EXPECT_FALSE(pool.Lookup(Key(2)).has_value());
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_cached_free(), 0);
  EXPECT_EQ(pool.ref_count(held), 1);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<KvEvent> events = pool.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  for (const KvEvent& e : events) EXPECT_EQ(e.type, KvEvent::Type::kEvicted);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
  // The block can be cached again under its old key.
  EXPECT_TRUE(pool.CacheBlock(held, Key(1)));
  EXPECT_EQ(pool.ForgetAllKeys(), 1);
  EXPECT_EQ(pool.ForgetAllKeys(), 0);
}

}  // namespace
}  // namespace kvserve
