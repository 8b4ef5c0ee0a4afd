#include "common/block_hash/block_hash.h"

#include <xxhash.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

// The golden values below were produced outside this code base: the documented byte layout was
// written with Python's struct module ('<QQI', '<i' per token, '<I' + bytes) and hashed with
// Debian's `xxhsum -H2` (XXH3-128, canonical big-endian hex). A failure means the wire format of
// block keys changed, which breaks routers that compute the same keys.

TEST(BlockHashTest, RootKeyIsTheDocumentedTag) {
  EXPECT_EQ(kRootBlockKey.ToString(), "a6cf8cf7ddd57a5c91cbfab443de011a");
  const std::string tag = "kvserve.block_hash.v1";
  const XXH128_hash_t h = XXH3_128bits(tag.data(), tag.size());
  EXPECT_EQ(kRootBlockKey.hi, h.high64);
  EXPECT_EQ(kRootBlockKey.lo, h.low64);
}

TEST(BlockHashTest, GoldenSingleBlock) {
  const std::vector<TokenId> tokens = {1, 2, 3, 42, 128000, -1, 0, 7};
  EXPECT_EQ(HashBlock(kRootBlockKey, tokens, "tenant-a").ToString(),
            "99b1dfbd45f18909fd98f686aab160eb");
}

TEST(BlockHashTest, GoldenEmptyBlock) {
  EXPECT_EQ(HashBlock(kRootBlockKey, {}, "").ToString(), "a57d3fd6d5e553b7dfccddbe98e8568d");
}

TEST(BlockHashTest, GoldenChainOfFullBlocks) {
  std::vector<TokenId> tokens;
  for (TokenId t = 100; t < 110; ++t) tokens.push_back(t);
  // block_size 4: two full blocks, the trailing two tokens get no key.
  const std::vector<BlockKey> keys = HashFullBlocks(tokens, 4, "salt");
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].ToString(), "79be6011519d09426afde2c45f633f18");
  EXPECT_EQ(keys[1].ToString(), "7ce8be03c7bffc935d695b8ff3a1859d");
}

TEST(BlockHashTest, HashFullBlocksChainsHashBlock) {
  const std::vector<TokenId> tokens = {5, 6, 7, 8, 9, 10, 11};
  const std::vector<BlockKey> keys = HashFullBlocks(tokens, 3, "x");
  ASSERT_EQ(keys.size(), 2u);
  const std::span<const TokenId> all(tokens);
  const BlockKey k0 = HashBlock(kRootBlockKey, all.subspan(0, 3), "x");
  EXPECT_EQ(keys[0], k0);
  EXPECT_EQ(keys[1], HashBlock(k0, all.subspan(3, 3), ""));
}

TEST(BlockHashTest, ToStringZeroPads) {
  EXPECT_EQ((BlockKey{0x1, 0xab}).ToString(), "000000000000000100000000000000ab");
}

TEST(BlockHashTest, DifferentInputsGiveDifferentKeys) {
  const std::vector<TokenId> a = {1, 2, 3, 4};
  const std::vector<TokenId> b = {1, 2, 3, 5};
  const BlockKey base = HashBlock(kRootBlockKey, a, "");
  EXPECT_NE(base, HashBlock(kRootBlockKey, b, ""));        // tokens
  EXPECT_NE(base, HashBlock(kRootBlockKey, a, "tenant"));  // extra key
  EXPECT_NE(base, HashBlock(BlockKey{1, 2}, a, ""));       // parent
  EXPECT_EQ(base, HashBlock(kRootBlockKey, a, ""));        // deterministic
  // The length prefixes keep token and salt bytes apart: moving bytes across the boundary
  // changes the key.
  const std::vector<TokenId> three = {1, 2, 3};
  const std::string four_bytes("\x04\x00\x00\x00", 4);
  EXPECT_NE(base, HashBlock(kRootBlockKey, three, four_bytes));
}

TEST(BlockHashTest, SaltSeparatesWholeChains) {
  std::vector<TokenId> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 3);
  const std::vector<BlockKey> a = HashFullBlocks(tokens, 16, "tenant-a");
  const std::vector<BlockKey> b = HashFullBlocks(tokens, 16, "tenant-b");
  const std::vector<BlockKey> none = HashFullBlocks(tokens, 16, "");
  ASSERT_EQ(a.size(), 4u);
  absl::flat_hash_set<BlockKey> all;
  for (const auto* keys : {&a, &b, &none}) all.insert(keys->begin(), keys->end());
  EXPECT_EQ(all.size(), 12u);  // no key shared between tenants, at any depth
}

TEST(BlockHashTest, PrefixesShareLeadingKeys) {
  std::vector<TokenId> long_prompt(50);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<TokenId>(i);
  std::vector<TokenId> other = long_prompt;
  other[40] = 9999;  // differs in block 2 (tokens 32..47)
  const std::vector<BlockKey> a = HashFullBlocks(long_prompt, 16, "");
  const std::vector<BlockKey> b = HashFullBlocks(other, 16, "");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
}

TEST(BlockHashTest, PartialAndDegenerateInputs) {
  const std::vector<TokenId> tokens = {1, 2, 3};
  EXPECT_TRUE(HashFullBlocks(tokens, 4, "").empty());
  EXPECT_TRUE(HashFullBlocks(tokens, 0, "").empty());
  EXPECT_TRUE(HashFullBlocks(tokens, -2, "").empty());
  EXPECT_TRUE(HashFullBlocks({}, 16, "").empty());
  EXPECT_EQ(HashFullBlocks(tokens, 1, "").size(), 3u);
}

}  // namespace
}  // namespace kvserve
