#include "common/block_hash/block_hash.h"

#include <xxhash.h>

#include <cstddef>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// Bytes of one block's hash input kept on the stack: 16 tokens plus a short salt fit.
constexpr size_t kInlineBytes = 128;
using ByteBuffer = absl::InlinedVector<unsigned char, kInlineBytes>;

void PutU32(ByteBuffer& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

void PutU64(ByteBuffer& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

}  // namespace

std::string BlockKey::ToString() const {
  return absl::StrCat(absl::Hex(hi, absl::kZeroPad16), absl::Hex(lo, absl::kZeroPad16));
}

BlockKey HashBlock(const BlockKey& parent, std::span<const TokenId> tokens,
                   std::string_view extra_key) {
  ByteBuffer buf;
  buf.reserve(24 + 4 * tokens.size() + extra_key.size());
  PutU64(buf, parent.hi);
  PutU64(buf, parent.lo);
  PutU32(buf, static_cast<uint32_t>(tokens.size()));
  for (TokenId t : tokens) PutU32(buf, static_cast<uint32_t>(t));
  PutU32(buf, static_cast<uint32_t>(extra_key.size()));
  buf.insert(buf.end(), extra_key.begin(), extra_key.end());
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return BlockKey{h.high64, h.low64};
}

std::vector<BlockKey> HashFullBlocks(std::span<const TokenId> tokens, int block_size,
                                     std::string_view cache_salt) {
  std::vector<BlockKey> keys;
  if (block_size <= 0) return keys;
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size);
  keys.reserve(num_full);
  BlockKey parent = kRootBlockKey;
  for (size_t i = 0; i < num_full; ++i) {
    parent = HashBlock(parent, tokens.subspan(i * block_size, block_size),
                       i == 0 ? cache_salt : std::string_view());
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace kvserve
