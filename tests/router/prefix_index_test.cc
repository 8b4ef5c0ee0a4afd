// The router's prefix index: resets, deltas, worker removal and the longest leading run.

#include "router/prefix_index.h"

#include <thread>
#include <vector>

#include "common/block_hash/block_hash.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

BlockKey Key(uint64_t n) { return BlockKey{n, n * 31 + 7}; }

std::vector<KvDelta> Stored(std::initializer_list<uint64_t> ns, KvTier tier = KvTier::kDevice) {
  std::vector<KvDelta> out;
  for (uint64_t n : ns) out.push_back({KvDelta::Type::kStored, Key(n), tier});
  return out;
}

std::vector<KvDelta> Evicted(std::initializer_list<uint64_t> ns, KvTier tier = KvTier::kDevice) {
  std::vector<KvDelta> out;
  for (uint64_t n : ns) out.push_back({KvDelta::Type::kEvicted, Key(n), tier});
  return out;
}

std::vector<BlockKey> Keys(std::initializer_list<uint64_t> ns) {
  std::vector<BlockKey> out;
  for (uint64_t n : ns) out.push_back(Key(n));
  return out;
}

TEST(PrefixIndexTest, LongestLeadingRunOnly) {
  PrefixIndex index;
  index.Apply(0, true, Stored({1, 2, 4}));
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1, 2, 3, 4})), 2);  // 3 missing: 4 is not reusable
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1, 2, 4})), 3);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({2, 1})), 2);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({3, 1, 2})), 0);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({})), 0);
  EXPECT_EQ(index.MatchedBlocks(7, Keys({1})), 0);  // unknown worker
}

TEST(PrefixIndexTest, ResetReplacesTheWorkersKeysOnly) {
  PrefixIndex index;
  index.Apply(0, true, Stored({1, 2, 3}));
  index.Apply(1, true, Stored({1, 2}));
  index.Apply(0, true, Stored({9}));
  EXPECT_EQ(index.NumBlocks(0), 1u);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1})), 0);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({9})), 1);
  EXPECT_EQ(index.MatchedBlocks(1, Keys({1, 2, 3})), 2);
  EXPECT_EQ(index.NumKeys(), 3u);  // 1, 2 (worker 1) and 9 (worker 0)
  index.Apply(0, true, {});        // an empty snapshot empties the worker
  EXPECT_EQ(index.NumBlocks(0), 0u);
}

TEST(PrefixIndexTest, DeltasApplyInOrder) {
  PrefixIndex index;
  index.Apply(0, false, Stored({1, 2, 3}));
  index.Apply(0, false, Evicted({2}));
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1, 2, 3})), 1);
  // Evict then store again within one batch: held at the end.
  std::vector<KvDelta> batch = Evicted({1});
  for (const KvDelta& d : Stored({1, 2})) batch.push_back(d);
  index.Apply(0, false, batch);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1, 2, 3})), 3);
  // Duplicates and evictions of unknown keys are harmless.
  index.Apply(0, false, Stored({1, 1}));
  index.Apply(0, false, Evicted({42}));
  EXPECT_EQ(index.NumBlocks(0), 3u);
  // A reset batch may carry deltas after the snapshot.
  std::vector<KvDelta> snapshot = Stored({5, 6});
  snapshot.push_back({KvDelta::Type::kEvicted, Key(5)});
  index.Apply(0, true, snapshot);
  EXPECT_EQ(index.NumBlocks(0), 1u);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({6})), 1);
}

TEST(PrefixIndexTest, RemovingAWorkerDropsItsKeysButNotOthers) {
  PrefixIndex index;
  index.Apply(0, true, Stored({1, 2}));
  index.Apply(1, true, Stored({1, 3}));
  index.RemoveWorker(0);
  EXPECT_EQ(index.NumBlocks(0), 0u);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1})), 0);
  EXPECT_EQ(index.MatchedBlocks(1, Keys({1, 3})), 2);
  EXPECT_EQ(index.NumKeys(), 2u);
  index.RemoveWorker(1);
  index.RemoveWorker(1);
  EXPECT_EQ(index.NumKeys(), 0u);
}

TEST(PrefixIndexTest, ManyWorkersInOneLookup) {
  PrefixIndex index;
  index.Apply(3, true, Stored({1, 2, 3}));
  index.Apply(5, true, Stored({1}));
  index.Apply(8, true, Stored({2, 3}));
  const std::vector<WorkerId> workers = {5, 8, 3, 9};
  const std::vector<PrefixMatchCount> got = index.MatchedBlocks(workers, Keys({1, 2, 3}));
  std::vector<int> blocks;
  for (const PrefixMatchCount& m : got) blocks.push_back(m.blocks);
  EXPECT_EQ(blocks, (std::vector<int>{1, 0, 3, 0}));
}

TEST(PrefixIndexTest, AKeyStaysHeldWhileAnyTierHoldsIt) {
  PrefixIndex index;
  index.Apply(0, true, Stored({1, 2, 3}));
  index.Apply(0, false, Stored({1, 2, 3}, KvTier::kHost));
  index.Apply(0, false, Stored({3}, KvTier::kDisk));
  // The device pool drops 2 and 3: they are still held, below the device.
  index.Apply(0, false, Evicted({2, 3}));
  const WorkerId w[] = {0};
  PrefixMatchCount m = index.MatchedBlocks(w, Keys({1, 2, 3}))[0];
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.device_blocks, 1);
  EXPECT_EQ(index.NumBlocks(0), 3u);
  // The host tier drops them too: 3 is still on disk, 2 is gone and ends the run.
  index.Apply(0, false, Evicted({2, 3}, KvTier::kHost));
  m = index.MatchedBlocks(w, Keys({1, 2, 3}))[0];
  EXPECT_EQ(m.blocks, 1);
  EXPECT_EQ(m.device_blocks, 1);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({3})), 1);
  EXPECT_EQ(index.NumBlocks(0), 2u);
  // Evicting from a tier that does not hold the key changes nothing.
  index.Apply(0, false, Evicted({1}, KvTier::kDisk));
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1})), 1);
  // A snapshot replaces every tier.
  index.Apply(0, true, Stored({5}, KvTier::kDisk));
  EXPECT_EQ(index.MatchedBlocks(0, Keys({1})), 0);
  EXPECT_EQ(index.MatchedBlocks(0, Keys({5})), 1);
  EXPECT_EQ(index.NumKeys(), 1u);
}

TEST(PrefixIndexTest, RealBlockKeysOfSharedPrefixes) {
  // Two prompts sharing their first 32 tokens share their first two block keys.
  std::vector<TokenId> a(50), b(50);
  for (int i = 0; i < 50; ++i) {
    a[i] = i + 1;
    b[i] = i < 32 ? i + 1 : 1000 + i;
  }
  const std::vector<BlockKey> ka = HashFullBlocks(a, 16, "");
  const std::vector<BlockKey> kb = HashFullBlocks(b, 16, "");
  ASSERT_EQ(ka.size(), 3u);
  PrefixIndex index;
  std::vector<KvDelta> deltas;
  for (const BlockKey& k : ka) deltas.push_back({KvDelta::Type::kStored, k});
  index.Apply(0, true, deltas);
  EXPECT_EQ(index.MatchedBlocks(0, ka), 3);
  EXPECT_EQ(index.MatchedBlocks(0, kb), 2);
  // A different cache salt shares nothing.
  EXPECT_EQ(index.MatchedBlocks(0, HashFullBlocks(a, 16, "tenant-b")), 0);
}

TEST(PrefixIndexTest, WaitForBlockCountSeesWritesFromOtherThreads) {
  PrefixIndex index;
  EXPECT_FALSE(index.WaitForBlockCount(0, 1, absl::Milliseconds(1)));
  std::thread writer([&] { index.Apply(0, true, Stored({1, 2})); });
  EXPECT_TRUE(index.WaitForBlockCount(0, 2, absl::Seconds(10)));
  writer.join();
}

}  // namespace
}  // namespace kvserve
