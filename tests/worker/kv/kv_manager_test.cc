#include "worker/kv/kv_manager.h"

#include <numeric>
#include <ostream>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {

// Readable failure messages (found by ADL).
void PrintTo(const KvEvent& e, std::ostream* os) {
  *os << (e.type == KvEvent::Type::kStored ? "stored(" : "evicted(") << e.key.ToString() << ")";
}
void PrintTo(const BlockCopy& c, std::ostream* os) { *os << c.src << "->" << c.dst; }

namespace {

using Ids = std::vector<BlockId>;
using Events = std::vector<KvEvent>;

#define ASSERT_KV_OK(kv)                            \
  do {                                              \
    const absl::Status st = (kv).CheckInvariants(); \
    ASSERT_TRUE(st.ok()) << st;                     \
  } while (0)

KvManager Make(int32_t num_blocks, int32_t block_size = 4, int32_t sliding_window = 0,
               bool prefix_caching = true) {
  KvManagerOptions o;
  o.num_blocks = num_blocks;
  o.block_size = block_size;
  o.sliding_window = sliding_window;
  o.enable_prefix_caching = prefix_caching;
  absl::StatusOr<KvManager> kv = KvManager::Create(o);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return *std::move(kv);
}

Ids Table(const KvManager& kv, SeqId seq) {
  const std::span<const BlockId> t = kv.BlockTable(seq);
  return Ids(t.begin(), t.end());
}

// Tokens first, first + 1, ..., first + n - 1.
std::vector<TokenId> Seq(TokenId first, int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Starts `seq` on the cached prefix of `prompt`, allocating slots for the whole prompt.
bool Start(KvManager& kv, SeqId seq, const std::vector<TokenId>& prompt,
           std::string_view salt = "") {
  const PrefixMatch m = kv.FindCachedPrefix(prompt, salt);
  return kv.AllocateNew(seq, m, static_cast<int32_t>(prompt.size()) - m.num_tokens, salt);
}

TEST(KvManagerTest, CreateValidatesOptions) {
  KvManagerOptions o;
  o.num_blocks = 1;
  absl::StatusOr<KvManager> kv = KvManager::Create(o);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kv.status().message().find("num_blocks"), std::string_view::npos);

  o.num_blocks = 8;
  o.block_size = 0;
  EXPECT_NE(KvManager::Create(o).status().message().find("block_size"), std::string_view::npos);
  o.block_size = 4096;
  EXPECT_FALSE(KvManager::Create(o).ok());
  o.block_size = 16;
  o.sliding_window = -1;
  EXPECT_NE(KvManager::Create(o).status().message().find("sliding_window"), std::string_view::npos);
  o.sliding_window = 0;
  ASSERT_TRUE(KvManager::Create(o).ok());
  EXPECT_EQ(KvManager::Create(o)->stats().total_blocks, 7);
}

TEST(KvManagerTest, NumBlocksNeededIsCeil) {
  KvManager kv = Make(8, 4);
  EXPECT_EQ(kv.NumBlocksNeeded(0), 0);
  EXPECT_EQ(kv.NumBlocksNeeded(1), 1);
  EXPECT_EQ(kv.NumBlocksNeeded(4), 1);
  EXPECT_EQ(kv.NumBlocksNeeded(5), 2);
  EXPECT_EQ(kv.NumBlocksNeeded(2147483647), 536870912);
  EXPECT_TRUE(kv.CanAllocate(7));
  EXPECT_FALSE(kv.CanAllocate(8));
}

TEST(KvManagerTest, AppendCrossesBlockBoundaries) {
  KvManager kv = Make(9, 4);  // blocks 1..8
  ASSERT_TRUE(kv.AllocateNew(1, {}, 5, ""));
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2}));
  EXPECT_EQ(kv.NumSlots(1), 8);
  EXPECT_EQ(kv.NumTokens(1), 5);
  ASSERT_TRUE(kv.Append(1, 3));  // fills block 2 exactly
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2}));
  ASSERT_TRUE(kv.Append(1, 1));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3}));
  ASSERT_TRUE(kv.Append(1, 6));  // 15 tokens
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3, 4}));
  ASSERT_TRUE(kv.Append(1, 0));
  ASSERT_KV_OK(kv);
  EXPECT_EQ(kv.NumSlots(1), 16);
  EXPECT_EQ(kv.stats().used_blocks, 4);
  EXPECT_EQ(kv.stats().free_blocks, 4);
  EXPECT_TRUE(kv.TakeCopies().empty());
}

TEST(KvManagerTest, AppendIsAllOrNothing) {
  KvManager kv = Make(4, 4);  // blocks 1..3
  ASSERT_TRUE(kv.AllocateNew(1, {}, 6, ""));
  EXPECT_FALSE(kv.Append(1, 7));  // 13 tokens need 4 blocks, 3 exist
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2}));
  EXPECT_EQ(kv.NumTokens(1), 6);
  ASSERT_TRUE(kv.Append(1, 6));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3}));
  EXPECT_FALSE(kv.Append(1, 1));
  EXPECT_EQ(kv.NumTokens(1), 12);
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, FreeReleasesTailFirst) {
  KvManager kv = Make(9, 4);
  ASSERT_TRUE(kv.AllocateNew(1, {}, 12, ""));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3}));
  kv.Free(1);
  ASSERT_KV_OK(kv);
  EXPECT_FALSE(kv.HasSequence(1));
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{4, 5, 6, 7, 8, 3, 2, 1}));
}

TEST(KvManagerTest, SecondRequestReusesTheCachedPrefix) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> prompt = Seq(100, 13);  // 3 full blocks + 1 token
  PrefixMatch m = kv.FindCachedPrefix(prompt, "");
  EXPECT_TRUE(m.blocks.empty());
  EXPECT_EQ(m.num_tokens, 0);
  ASSERT_TRUE(kv.AllocateNew(1, m, 13, ""));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3, 4}));
  kv.Commit(1, prompt, 13);
  ASSERT_KV_OK(kv);
  const std::vector<BlockKey> keys = HashFullBlocks(prompt, 4, "");
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(kv.TakeEvents(), (Events{{KvEvent::Type::kStored, keys[0]},
                                     {KvEvent::Type::kStored, keys[1]},
                                     {KvEvent::Type::kStored, keys[2]}}));

  m = kv.FindCachedPrefix(prompt, "");
  EXPECT_EQ(m.blocks, (Ids{1, 2, 3}));
  EXPECT_EQ(m.num_tokens, 12);
  ASSERT_TRUE(kv.AllocateNew(2, m, 1, ""));
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 2), (Ids{1, 2, 3, 5}));
  for (BlockId b : {1, 2, 3}) EXPECT_EQ(kv.pool().ref_count(b), 2);
  EXPECT_EQ(kv.pool().ref_count(4), 1);
  KvManager::Stats s = kv.stats();
  EXPECT_EQ(s.prefix_query_tokens, 26);
  EXPECT_EQ(s.prefix_hit_tokens, 12);
  EXPECT_EQ(s.used_blocks, 5);

  // After both finish the blocks stay cached; a third request takes them back from the queue.
  kv.Free(2);
  kv.Free(1);
  ASSERT_KV_OK(kv);
  s = kv.stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.cached_free_blocks, 3);
  EXPECT_EQ(s.free_blocks, 8);
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{6, 7, 8, 5, 4, 3, 2, 1}));
  ASSERT_TRUE(Start(kv, 3, prompt));
  EXPECT_EQ(Table(kv, 3), (Ids{1, 2, 3, 6}));
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{7, 8, 5, 4}));
  EXPECT_EQ(kv.stats().prefix_hit_tokens, 24);
  EXPECT_TRUE(kv.TakeEvents().empty());
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, PrefixMatchStopsAtTheFirstMiss) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> prompt = Seq(0, 16);
  ASSERT_TRUE(Start(kv, 1, prompt));
  kv.Commit(1, prompt, 16);
  std::vector<TokenId> other = prompt;
  other[5] = 777;  // block 1 differs, so block 2 cannot match even though its tokens agree
  other.push_back(1);
  const PrefixMatch m = kv.FindCachedPrefix(other, "");
  EXPECT_EQ(m.blocks, (Ids{1}));
  EXPECT_EQ(m.num_tokens, 4);
}

TEST(KvManagerTest, NeverMatchesTheWholePrompt) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> prompt = Seq(7, 12);  // exactly 3 blocks
  ASSERT_TRUE(Start(kv, 1, prompt));
  kv.Commit(1, prompt, 12);
  EXPECT_EQ(kv.TakeEvents().size(), 3u);

  PrefixMatch m = kv.FindCachedPrefix(prompt, "");
  EXPECT_EQ(m.blocks, (Ids{1, 2}));  // the last token must be computed again
  EXPECT_EQ(m.num_tokens, 8);
  std::vector<TokenId> longer = prompt;
  longer.push_back(5);
  EXPECT_EQ(kv.FindCachedPrefix(longer, "").blocks, (Ids{1, 2, 3}));
  EXPECT_TRUE(kv.FindCachedPrefix(Seq(7, 4), "").blocks.empty());
  EXPECT_TRUE(kv.FindCachedPrefix(Seq(7, 5), "").blocks == (Ids{1}));
  EXPECT_TRUE(kv.FindCachedPrefix({}, "").blocks.empty());
  EXPECT_EQ(kv.stats().prefix_query_tokens, 12 + 12 + 13 + 4 + 5);
  EXPECT_EQ(kv.stats().prefix_hit_tokens, 8 + 12 + 4);

  ASSERT_TRUE(kv.AllocateNew(2, m, 4, ""));
  EXPECT_EQ(Table(kv, 2), (Ids{1, 2, 4}));
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, SaltsSeparateTenants) {
  KvManager kv = Make(17, 4);
  const std::vector<TokenId> prompt = Seq(50, 13);
  ASSERT_TRUE(Start(kv, 1, prompt, "tenant-a"));
  kv.Commit(1, prompt, 13);
  EXPECT_TRUE(kv.FindCachedPrefix(prompt, "tenant-b").blocks.empty());
  EXPECT_TRUE(kv.FindCachedPrefix(prompt, "").blocks.empty());
  EXPECT_EQ(kv.FindCachedPrefix(prompt, "tenant-a").blocks, (Ids{1, 2, 3}));

  ASSERT_TRUE(Start(kv, 2, prompt, "tenant-b"));
  EXPECT_EQ(Table(kv, 2), (Ids{5, 6, 7, 8}));
  kv.Commit(2, prompt, 13);
  const std::vector<BlockKey> b_keys = HashFullBlocks(prompt, 4, "tenant-b");
  const Events events = kv.TakeEvents();
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[3].key, b_keys[0]);
  EXPECT_EQ(events[5].key, b_keys[2]);
  EXPECT_EQ(kv.FindCachedPrefix(prompt, "tenant-b").blocks, (Ids{5, 6, 7}));
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, CommitIsIncrementalAndMatchesHashFullBlocks) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> tokens = Seq(3, 14);
  const std::vector<BlockKey> keys = HashFullBlocks(tokens, 4, "s");
  ASSERT_TRUE(kv.AllocateNew(1, {}, 6, "s"));
  kv.Commit(1, tokens, 3);
  EXPECT_TRUE(kv.TakeEvents().empty());
  kv.Commit(1, tokens, 6);
  EXPECT_EQ(kv.TakeEvents(), (Events{{KvEvent::Type::kStored, keys[0]}}));
  kv.Commit(1, tokens, 6);  // idempotent
  EXPECT_TRUE(kv.TakeEvents().empty());
  ASSERT_TRUE(kv.Append(1, 8));
  kv.Commit(1, tokens, 14);
  EXPECT_EQ(kv.TakeEvents(),
            (Events{{KvEvent::Type::kStored, keys[1]}, {KvEvent::Type::kStored, keys[2]}}));
  EXPECT_EQ(kv.pool().Lookup(keys[2]), 3);
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, SameBlocksComputedTwiceAreCachedOnce) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> prompt = Seq(0, 9);
  ASSERT_TRUE(Start(kv, 1, prompt));
  ASSERT_TRUE(Start(kv, 2, prompt));  // nothing committed yet: no hit
  EXPECT_EQ(Table(kv, 2), (Ids{4, 5, 6}));
  kv.Commit(1, prompt, 9);
  kv.Commit(2, prompt, 9);
  EXPECT_EQ(kv.TakeEvents().size(), 2u);
  EXPECT_FALSE(kv.pool().key(4).has_value());
  EXPECT_EQ(kv.FindCachedPrefix(prompt, "").blocks, (Ids{1, 2}));
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, PrefixCachingOffCachesNothing) {
  KvManager kv = Make(9, 4, 0, /*prefix_caching=*/false);
  const std::vector<TokenId> prompt = Seq(0, 13);
  ASSERT_TRUE(Start(kv, 1, prompt));
  kv.Commit(1, prompt, 13);
  EXPECT_TRUE(kv.TakeEvents().empty());
  EXPECT_TRUE(kv.FindCachedPrefix(prompt, "").blocks.empty());
  kv.Free(1);
  EXPECT_EQ(kv.stats().cached_free_blocks, 0);
  EXPECT_EQ(kv.stats().prefix_query_tokens, 0);
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, FullPoolEvictsCachedFreeChainTailsFirst) {
  KvManager kv = Make(9, 4);  // blocks 1..8
  const std::vector<TokenId> a = Seq(0, 16);
  ASSERT_TRUE(Start(kv, 1, a));
  kv.Commit(1, a, 16);
  const std::vector<BlockKey> keys = HashFullBlocks(a, 4, "");
  kv.TakeEvents();
  kv.Free(1);
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{5, 6, 7, 8, 4, 3, 2, 1}));
  EXPECT_EQ(kv.stats().cached_free_blocks, 4);

  // Six blocks for an unrelated prompt: the four never-cached blocks, then a's tail (4, 3).
  ASSERT_TRUE(Start(kv, 2, Seq(1000, 24)));
  EXPECT_EQ(Table(kv, 2), (Ids{5, 6, 7, 8, 4, 3}));
  EXPECT_EQ(kv.TakeEvents(),
            (Events{{KvEvent::Type::kEvicted, keys[3]}, {KvEvent::Type::kEvicted, keys[2]}}));
  ASSERT_KV_OK(kv);
  std::vector<TokenId> a_again = a;
  a_again.push_back(0);
  EXPECT_EQ(kv.FindCachedPrefix(a_again, "").blocks, (Ids{1, 2}));  // the head survived
  EXPECT_EQ(kv.stats().cached_free_blocks, 2);
  EXPECT_EQ(kv.stats().free_blocks, 2);
}

TEST(KvManagerTest, AllocateNewIsAllOrNothingAndNeverEvictsItsOwnMatch) {
  KvManager kv = Make(8, 4);  // blocks 1..7
  const std::vector<TokenId> prompt = Seq(0, 16);
  ASSERT_TRUE(kv.AllocateNew(1, {}, 12, ""));
  kv.Commit(1, prompt, 12);
  kv.Free(1);
  ASSERT_TRUE(kv.AllocateNew(9, {}, 16, ""));  // takes 4, 5, 6, 7
  EXPECT_EQ(Table(kv, 9), (Ids{4, 5, 6, 7}));
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{3, 2, 1}));  // all three cached-free
  kv.TakeEvents();

  const PrefixMatch m = kv.FindCachedPrefix(prompt, "");
  ASSERT_EQ(m.blocks, (Ids{1, 2, 3}));
  // The pool counts 3 free blocks, but they are exactly the matched ones: a 4th is impossible.
  EXPECT_FALSE(kv.AllocateNew(2, m, 4, ""));
  ASSERT_KV_OK(kv);
  EXPECT_FALSE(kv.HasSequence(2));
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{3, 2, 1}));
  EXPECT_EQ(kv.stats().cached_free_blocks, 3);
  EXPECT_TRUE(kv.TakeEvents().empty());
  // Zero new tokens beyond the match fits without any new block.
  ASSERT_TRUE(kv.AllocateNew(3, m, 0, ""));
  EXPECT_EQ(Table(kv, 3), (Ids{1, 2, 3}));
  kv.Free(3);

  kv.Free(9);
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{3, 2, 1, 7, 6, 5, 4}));
  const PrefixMatch m2 = kv.FindCachedPrefix(prompt, "");
  ASSERT_TRUE(kv.AllocateNew(2, m2, 4, ""));
  EXPECT_EQ(Table(kv, 2), (Ids{1, 2, 3, 7}));
  EXPECT_TRUE(kv.TakeEvents().empty());  // nothing evicted
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, ForkSharesBlocksAndCopiesThePartialBlockOnFirstWrite) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> prompt = Seq(0, 6);
  ASSERT_TRUE(Start(kv, 1, prompt));
  kv.Commit(1, prompt, 6);
  kv.Fork(1, 2);
  kv.Fork(1, 3);
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 2), (Ids{1, 2}));
  EXPECT_EQ(kv.NumTokens(3), 6);
  EXPECT_EQ(kv.pool().ref_count(1), 3);
  EXPECT_EQ(kv.pool().ref_count(2), 3);
  EXPECT_EQ(kv.stats().used_blocks, 2);

  ASSERT_TRUE(kv.Append(1, 1));  // position 6 is in shared block 2
  EXPECT_EQ(Table(kv, 1), (Ids{1, 3}));
  EXPECT_EQ(kv.TakeCopies(), (std::vector<BlockCopy>{{2, 3}}));
  ASSERT_TRUE(kv.Append(2, 1));
  EXPECT_EQ(Table(kv, 2), (Ids{1, 4}));
  EXPECT_EQ(kv.TakeCopies(), (std::vector<BlockCopy>{{2, 4}}));
  ASSERT_TRUE(kv.Append(3, 1));  // the last sharer writes in place
  EXPECT_EQ(Table(kv, 3), (Ids{1, 2}));
  EXPECT_TRUE(kv.TakeCopies().empty());
  EXPECT_EQ(kv.pool().ref_count(1), 3);  // the full block stays shared
  EXPECT_EQ(kv.pool().ref_count(2), 1);
  ASSERT_KV_OK(kv);

  // Filling the block and moving on needs no copies.
  ASSERT_TRUE(kv.Append(1, 3));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 3, 5}));
  EXPECT_TRUE(kv.TakeCopies().empty());
  kv.Free(1);
  kv.Free(2);
  kv.Free(3);
  ASSERT_KV_OK(kv);
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KvManagerTest, ForkOfFullBlocksNeverCopies) {
  KvManager kv = Make(9, 4);
  ASSERT_TRUE(kv.AllocateNew(1, {}, 8, ""));
  kv.Fork(1, 2);
  ASSERT_TRUE(kv.Append(1, 1));
  ASSERT_TRUE(kv.Append(2, 1));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3}));
  EXPECT_EQ(Table(kv, 2), (Ids{1, 2, 4}));
  EXPECT_TRUE(kv.TakeCopies().empty());
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, CopyOnWriteCountsTheCopyInAllOrNothing) {
  KvManager kv = Make(3, 4);  // blocks 1..2
  ASSERT_TRUE(kv.AllocateNew(1, {}, 2, ""));
  kv.Fork(1, 2);
  ASSERT_TRUE(kv.Append(1, 1));  // copy 1 -> 2
  EXPECT_EQ(kv.TakeCopies(), (std::vector<BlockCopy>{{1, 2}}));
  kv.Fork(1, 3);
  EXPECT_FALSE(kv.Append(1, 1));  // would need a copy, pool is empty
  EXPECT_TRUE(kv.TakeCopies().empty());
  EXPECT_EQ(kv.NumTokens(1), 3);
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, ForkContinuesThePrefixChain) {
  KvManager kv = Make(9, 4);
  const std::vector<TokenId> prompt = Seq(0, 6);
  ASSERT_TRUE(Start(kv, 1, prompt));
  kv.Commit(1, prompt, 6);
  kv.Fork(1, 2);
  std::vector<TokenId> child = prompt;
  child.insert(child.end(), {90, 91, 92});
  ASSERT_TRUE(kv.Append(2, 3));
  kv.TakeCopies();
  kv.Commit(2, child, 9);
  std::vector<TokenId> query = child;
  query.push_back(0);
  EXPECT_EQ(kv.FindCachedPrefix(query, "").blocks, (Ids{1, Table(kv, 2)[1]}));
  ASSERT_KV_OK(kv);
}

TEST(KvManagerTest, SlidingWindowReleasesBlocksNoQueryCanSee) {
  KvManager kv = Make(9, 4, /*sliding_window=*/6);
  ASSERT_TRUE(kv.AllocateNew(1, {}, 20, ""));
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3, 4, 5}));
  kv.ReleaseOutOfWindow(1, 8);  // next query at 8 sees keys 3..8: block 0 still visible
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3, 4, 5}));
  kv.ReleaseOutOfWindow(1, 9);  // sees 4..9: block 0 (keys 0..3) is dead
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 1), (Ids{0, 2, 3, 4, 5}));
  EXPECT_EQ(kv.pool().ref_count(1), 0);
  kv.ReleaseOutOfWindow(1, 20);  // sees 15..20
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 1), (Ids{0, 0, 0, 4, 5}));
  EXPECT_EQ(kv.NumSlots(1), 20);
  EXPECT_EQ(kv.stats().used_blocks, 2);
  EXPECT_EQ(kv.pool().FreeQueue(), (Ids{6, 7, 8, 1, 3, 2}));
  kv.ReleaseOutOfWindow(1, 20);  // idempotent
  kv.Fork(1, 2);
  ASSERT_KV_OK(kv);
  EXPECT_EQ(Table(kv, 2), (Ids{0, 0, 0, 4, 5}));
  ASSERT_TRUE(kv.Append(2, 1));
  EXPECT_EQ(Table(kv, 2), (Ids{0, 0, 0, 4, 5, 6}));
  kv.Free(1);
  kv.Free(2);
  ASSERT_KV_OK(kv);
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KvManagerTest, FullAttentionNeverReleases) {
  KvManager kv = Make(9, 4);
  ASSERT_TRUE(kv.AllocateNew(1, {}, 20, ""));
  kv.ReleaseOutOfWindow(1, 20);
  EXPECT_EQ(Table(kv, 1), (Ids{1, 2, 3, 4, 5}));
}

TEST(KvManagerTest, ThirtyTwoSequencesHoldASharedPrefixOnce) {
  constexpr int kBlockSize = 16;
  constexpr int kSeqs = 32;
  KvManager kv = Make(129, kBlockSize);
  const std::vector<TokenId> prefix = Seq(1, 256);
  for (SeqId s = 0; s < kSeqs; ++s) {
    std::vector<TokenId> prompt = prefix;
    for (int i = 0; i < 10; ++i) prompt.push_back(static_cast<TokenId>(5000 + s * 10 + i));
    const PrefixMatch m = kv.FindCachedPrefix(prompt, "");
    EXPECT_EQ(m.num_tokens, s == 0 ? 0 : 256) << "seq " << s;
    ASSERT_TRUE(kv.AllocateNew(s, m, static_cast<int32_t>(prompt.size()) - m.num_tokens, ""));
    kv.Commit(s, prompt, static_cast<int32_t>(prompt.size()));
    ASSERT_KV_OK(kv);
  }
  const Ids shared = Table(kv, 0);
  for (SeqId s = 0; s < kSeqs; ++s) {
    const Ids t = Table(kv, s);
    ASSERT_EQ(t.size(), 17u);
    EXPECT_TRUE(std::equal(t.begin(), t.begin() + 16, shared.begin()));
    EXPECT_EQ(t[16], s == 0 ? 17 : 17 + s);
  }
  for (BlockId b = 1; b <= 16; ++b) EXPECT_EQ(kv.pool().ref_count(b), kSeqs);
  const KvManager::Stats st = kv.stats();
  EXPECT_EQ(st.used_blocks, 16 + kSeqs);
  EXPECT_EQ(st.free_blocks, 128 - 16 - kSeqs);
  EXPECT_EQ(st.prefix_query_tokens, int64_t{kSeqs} * 266);
  EXPECT_EQ(st.prefix_hit_tokens, int64_t{kSeqs - 1} * 256);
  for (SeqId s = 0; s < kSeqs; ++s) kv.Free(s);
  ASSERT_KV_OK(kv);
  EXPECT_EQ(kv.stats().used_blocks, 0);
  EXPECT_EQ(kv.stats().cached_free_blocks, 16);
}

TEST(KvManagerDeathTest, MisuseAborts) {
  KvManager kv = Make(9, 4);
  ASSERT_TRUE(kv.AllocateNew(1, {}, 4, ""));
  EXPECT_DEATH(kv.Append(42, 1), "unknown sequence 42");
  EXPECT_DEATH(kv.AllocateNew(1, {}, 4, ""), "already exists");
  const std::vector<TokenId> tokens = Seq(0, 8);
  EXPECT_DEATH(kv.Commit(1, tokens, 8), "num_computed 8");
}

}  // namespace
}  // namespace kvserve
