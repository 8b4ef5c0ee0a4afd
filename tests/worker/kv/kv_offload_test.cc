#include "worker/kv/kv_offload.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/logging/logging.h"
#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockBytes = 64;

BlockKey Key(uint64_t n) { return BlockKey{n * 0x9e3779b97f4a7c15ULL, n + 1}; }

// The bytes of block `n`: distinct for every n.
std::vector<uint8_t> Bytes(uint64_t n) {
  std::vector<uint8_t> v(kBlockBytes);
  for (int64_t i = 0; i < kBlockBytes; ++i) v[i] = static_cast<uint8_t>(n * 31 + i);
  return v;
}

KvTierIdentity Identity(uint64_t model = 1, const std::string& layout = "layout-a") {
  return KvTierIdentity{BlockKey{model, model}, layout};
}

std::unique_ptr<KvDiskTier> OpenDisk(const std::string& dir, int64_t capacity = 1 << 20,
                                     const KvTierIdentity& identity = Identity()) {
  absl::StatusOr<std::unique_ptr<KvDiskTier>> disk =
      KvDiskTier::Open(dir, capacity, kBlockBytes, identity);
  EXPECT_TRUE(disk.ok()) << disk.status();
  return disk.ok() ? std::move(*disk) : nullptr;
}

// Captures the warning lines logged while it lives.
class LogCapture {
 public:
  LogCapture() {
    logging::SetLogSink([this](std::string_view line) { lines_.emplace_back(line); });
  }
  ~LogCapture() { logging::SetLogSink(nullptr); }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

TEST(KvHostTierTest, KeepsTheMostRecentlyUsedBlocks) {
  std::unique_ptr<KvHostTier> host = *KvHostTier::Create(2, kBlockBytes);
  for (uint64_t n : {1, 2}) {
    const std::vector<uint8_t> b = Bytes(n);
    std::memcpy(host->Put(Key(n)), b.data(), b.size());
  }
  ASSERT_NE(host->Get(Key(1)), nullptr);  // 1 is now more recent than 2
  const std::vector<uint8_t> b3 = Bytes(3);
  std::memcpy(host->Put(Key(3)), b3.data(), b3.size());
  EXPECT_TRUE(host->Contains(Key(1)));
  EXPECT_FALSE(host->Contains(Key(2)));
  EXPECT_TRUE(host->Contains(Key(3)));
  EXPECT_EQ(host->size(), 2);
  EXPECT_EQ(host->evictions(), 1);
  for (uint64_t n : {1, 3}) {
    EXPECT_EQ(std::memcmp(host->Get(Key(n)), Bytes(n).data(), kBlockBytes), 0) << n;
  }
  host->Erase(Key(1));
  EXPECT_FALSE(host->Contains(Key(1)));
  std::memcpy(host->Put(Key(4)), Bytes(4).data(), kBlockBytes);  // takes the erased slot
  EXPECT_EQ(host->evictions(), 1);
  EXPECT_EQ(std::memcmp(host->Get(Key(3)), Bytes(3).data(), kBlockBytes), 0);
  EXPECT_FALSE(KvHostTier::Create(0, kBlockBytes).ok());
}

TEST(KvDiskTierTest, BlocksSurviveReopening) {
  const std::string dir = test_util::TestScratchDir();
  {
    std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
    for (uint64_t n = 1; n <= 3; ++n) disk->Write(Key(n), Bytes(n).data());
    // Readable while queued and once written.
    std::vector<uint8_t> got(kBlockBytes);
    ASSERT_TRUE(disk->Read(Key(2), got.data()));
    EXPECT_EQ(got, Bytes(2));
    disk->Flush();
    EXPECT_EQ(disk->stats().files, 3);
    EXPECT_EQ(disk->stats().writes, 3);
    EXPECT_TRUE(fs::exists(disk->PathOf(Key(1))));
  }
  std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
  EXPECT_EQ(disk->stats().files, 3);
  for (uint64_t n = 1; n <= 3; ++n) {
    ASSERT_TRUE(disk->Contains(Key(n)));
    std::vector<uint8_t> got(kBlockBytes);
    ASSERT_TRUE(disk->Read(Key(n), got.data())) << n;
    EXPECT_EQ(got, Bytes(n)) << n;
  }
  EXPECT_FALSE(disk->Contains(Key(9)));
  std::vector<uint8_t> got(kBlockBytes);
  EXPECT_FALSE(disk->Read(Key(9), got.data()));
  EXPECT_EQ(disk->stats().bad_files, 0);
}

TEST(KvDiskTierTest, EventsSayWhichFilesComeAndGo) {
  const std::string dir = test_util::TestScratchDir();
  std::unique_ptr<KvDiskTier> disk = OpenDisk(dir, 2 * (80 + kBlockBytes));
  for (uint64_t n = 1; n <= 3; ++n) disk->Write(Key(n), Bytes(n).data());
  disk->Flush();
  const std::vector<KvEvent> want = {
      {KvEvent::Type::kStored, Key(1), KvTier::kDisk},
      {KvEvent::Type::kStored, Key(2), KvTier::kDisk},
      {KvEvent::Type::kStored, Key(3), KvTier::kDisk},
      {KvEvent::Type::kEvicted, Key(1), KvTier::kDisk},  // over the size
  };
  EXPECT_EQ(disk->TakeEvents(), want);
  EXPECT_EQ(disk->Keys(), (std::vector<BlockKey>{Key(2), Key(3)}));
  // A reopened tier reports the files it found.
  disk = OpenDisk(dir, 2 * (80 + kBlockBytes));
  EXPECT_EQ(disk->TakeEvents().size(), 2u);
  std::unique_ptr<KvHostTier> host = *KvHostTier::Create(1, kBlockBytes);
  host->Put(Key(1));
  host->Put(Key(2));
  const std::vector<KvEvent> host_want = {
      {KvEvent::Type::kStored, Key(1), KvTier::kHost},
      {KvEvent::Type::kEvicted, Key(1), KvTier::kHost},
      {KvEvent::Type::kStored, Key(2), KvTier::kHost},
  };
  EXPECT_EQ(host->TakeEvents(), host_want);
}

TEST(KvDiskTierTest, KeepsWithinItsSizeDroppingTheLeastRecentlyUsed) {
  const std::string dir = test_util::TestScratchDir();
  // Room for two files (80-byte header + 64 bytes each), not three.
  std::unique_ptr<KvDiskTier> disk = OpenDisk(dir, 2 * (80 + kBlockBytes) + 10);
  disk->Write(Key(1), Bytes(1).data());
  disk->Write(Key(2), Bytes(2).data());
  disk->Flush();
  std::vector<uint8_t> got(kBlockBytes);
  ASSERT_TRUE(disk->Read(Key(1), got.data()));  // 2 is now the least recently used
  disk->Write(Key(3), Bytes(3).data());
  disk->Flush();
  EXPECT_TRUE(disk->Contains(Key(1)));
  EXPECT_FALSE(disk->Contains(Key(2)));
  EXPECT_FALSE(fs::exists(disk->PathOf(Key(2))));
  EXPECT_TRUE(disk->Contains(Key(3)));
  EXPECT_LE(disk->stats().bytes, 2 * (80 + kBlockBytes) + 10);
}

// Writes block 1 through a tier, then lets `damage` change its file before a fresh tier (with
// `identity`) reads it: the read must fail, remove the file and warn once.
void ExpectRejected(const std::function<void(const std::string& path)>& damage,
                    const std::string& reason, const KvTierIdentity& identity = Identity()) {
  const std::string dir = test_util::TestScratchDir();
  std::string path;
  {
    std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
    disk->Write(Key(1), Bytes(1).data());
    disk->Flush();
    path = disk->PathOf(Key(1));
  }
  std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
  damage(path);
  // The file as another identity's tier would find it: moved into that tier's directory.
  std::unique_ptr<KvDiskTier> reader;
  if (identity.model != Identity().model || identity.layout != Identity().layout) {
    reader = OpenDisk(dir, 1 << 20, identity);
    fs::copy_file(path, reader->PathOf(Key(1)));
    reader.reset();
    reader = OpenDisk(dir, 1 << 20, identity);
  }
  KvDiskTier& tier = reader != nullptr ? *reader : *disk;
  ASSERT_TRUE(tier.Contains(Key(1)));
  LogCapture log;
  std::vector<uint8_t> got(kBlockBytes, 0);
  EXPECT_FALSE(tier.Read(Key(1), got.data())) << reason;
  EXPECT_FALSE(tier.Contains(Key(1))) << reason;
  EXPECT_FALSE(fs::exists(tier.PathOf(Key(1)))) << reason;
  EXPECT_EQ(tier.stats().bad_files, 1) << reason;
  ASSERT_EQ(log.lines().size(), 1u) << reason;
  EXPECT_NE(log.lines()[0].find(reason), std::string::npos) << log.lines()[0];
  EXPECT_FALSE(tier.Read(Key(1), got.data()));  // gone: no second warning
  EXPECT_EQ(log.lines().size(), 1u);
}

void FlipByte(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x40));
}

TEST(KvDiskTierTest, CorruptedBlockFilesAreNeverServed) {
  ExpectRejected([](const std::string& p) { FlipByte(p, 80 + 17); }, "payload checksum");
  ExpectRejected([](const std::string& p) { FlipByte(p, 60); }, "header checksum");
  ExpectRejected([](const std::string& p) { FlipByte(p, 0); }, "not a kvserve block file");
}

TEST(KvDiskTierTest, TruncatedBlockFilesAreNeverServed) {
  ExpectRejected([](const std::string& p) { fs::resize_file(p, 80 + kBlockBytes - 1); },
                 "truncated payload");
  ExpectRejected([](const std::string& p) { fs::resize_file(p, 40); }, "truncated header");
  ExpectRejected([](const std::string& p) { fs::resize_file(p, 80 + kBlockBytes + 3); },
                 "trailing bytes");
}

TEST(KvDiskTierTest, ForeignBlockFilesAreNeverServed) {
  ExpectRejected([](const std::string&) {}, "another model", Identity(2));
  ExpectRejected([](const std::string&) {}, "another KV layout", Identity(1, "layout-b"));
  // A file renamed to another block's key.
  const std::string dir = test_util::TestScratchDir();
  std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
  disk->Write(Key(1), Bytes(1).data());
  disk->Flush();
  fs::copy_file(disk->PathOf(Key(1)), disk->PathOf(Key(2)));
  disk = OpenDisk(dir);
  std::vector<uint8_t> got(kBlockBytes);
  EXPECT_FALSE(disk->Read(Key(2), got.data()));
  EXPECT_TRUE(disk->Read(Key(1), got.data()));
  EXPECT_EQ(disk->stats().bad_files, 1);
}

TEST(KvDiskTierTest, OpeningRemovesUnfinishedWritesAndRefusesBadSettings) {
  const std::string dir = test_util::TestScratchDir();
  std::string tmp;
  {
    std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
    tmp = disk->PathOf(Key(5)) + ".tmp";
    std::ofstream(tmp) << "half a block";
  }
  std::unique_ptr<KvDiskTier> disk = OpenDisk(dir);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(disk->Contains(Key(5)));
  EXPECT_FALSE(KvDiskTier::Open(dir, 0, kBlockBytes, Identity()).ok());
  EXPECT_FALSE(KvDiskTier::Open("", 1 << 20, kBlockBytes, Identity()).ok());
  std::ofstream(dir + "/file") << "x";
  EXPECT_FALSE(KvDiskTier::Open(dir + "/file/sub", 1 << 20, kBlockBytes, Identity()).ok());
}

// A device pool of `n` blocks in plain memory, for the offloader. `queued`: copies run only
// at KvBlockAccess::finish, as a device's stream would run them, so an offloader that reads a
// copy's result too early, or changes its source too soon, gets the wrong bytes.
struct FakePool {
  explicit FakePool(int n, bool queued = false)
      : bytes(static_cast<size_t>(n * kBlockBytes)), queued(queued) {}
  KvBlockAccess Access() {
    KvBlockAccess a;
    a.block_bytes = kBlockBytes;
    a.read = [this](BlockId b, uint8_t* dst) {
      Run([this, b, dst] { std::memcpy(dst, bytes.data() + b * kBlockBytes, kBlockBytes); });
      return absl::OkStatus();
    };
    a.write = [this](BlockId b, const uint8_t* src) {
      Run([this, b, src] { std::memcpy(bytes.data() + b * kBlockBytes, src, kBlockBytes); });
      return absl::OkStatus();
    };
    if (queued) {
      a.finish = [this] {
        for (auto& op : ops) op();
        ops.clear();
        return absl::OkStatus();
      };
    }
    return a;
  }
  void Run(std::function<void()> op) {
    if (queued) {
      ops.push_back(std::move(op));
    } else {
      op();
    }
  }
  void Fill(BlockId b, uint64_t n) {
    std::memcpy(bytes.data() + b * kBlockBytes, Bytes(n).data(), kBlockBytes);
  }
  std::vector<uint8_t> Block(BlockId b) const {
    return {bytes.begin() + b * kBlockBytes, bytes.begin() + (b + 1) * kBlockBytes};
  }
  std::vector<uint8_t> bytes;
  bool queued;
  std::vector<std::function<void()>> ops;
};

TEST(KvOffloaderTest, QueuedCopiesReachTheHostAndDiskTiersIntact) {
  FakePool pool(8, /*queued=*/true);
  KvOffloadOptions o;
  o.host_bytes = 2 * kBlockBytes;
  o.disk_dir = test_util::TestScratchDir();
  o.disk_bytes = 1 << 20;
  std::unique_ptr<KvOffloader> off = *KvOffloader::Create(o, pool.Access(), Identity());
  for (BlockId b = 1; b <= 3; ++b) pool.Fill(b, b);
  // Three blocks through a host tier of two: the first must reach the disk before its slot is
  // reused, though its copy was only queued.
  off->Offload(std::vector<StoredBlock>{{1, Key(1)}, {2, Key(2)}, {3, Key(3)}});
  // The device reuses the blocks: a later "kernel" in stream order overwrites them.
  for (BlockId b = 1; b <= 3; ++b) pool.Run([&pool, b] { pool.Fill(b, 100 + b); });
  off->Flush();
  EXPECT_EQ(off->stats().disk.files, 3);
  // Restored from host (3, 2) and disk (1) into other blocks, each with its own bytes.
  for (BlockId b = 3; b >= 1; --b) ASSERT_TRUE(off->Restore(Key(b), 4 + b)) << b;
  ASSERT_TRUE(pool.Access().finish().ok());
  for (BlockId b = 1; b <= 3; ++b) EXPECT_EQ(pool.Block(4 + b), Bytes(b)) << b;
  EXPECT_EQ(off->stats().restored_from_host, 2);
  EXPECT_EQ(off->stats().restored_from_disk, 1);
}

TEST(KvOffloaderTest, RestoresFromHostThenDiskAndCounts) {
  FakePool pool(8);
  KvOffloadOptions o;
  o.host_bytes = 2 * kBlockBytes;
  o.disk_dir = test_util::TestScratchDir();
  o.disk_bytes = 1 << 20;
  std::unique_ptr<KvOffloader> off = *KvOffloader::Create(o, pool.Access(), Identity());
  for (BlockId b = 1; b <= 3; ++b) pool.Fill(b, b);
  const std::vector<StoredBlock> stored = {{1, Key(1)}, {2, Key(2)}, {3, Key(3)}};
  off->Offload(stored);
  off->Flush();
  KvOffloader::Stats s = off->stats();
  EXPECT_EQ(s.offloaded_blocks, 3);
  EXPECT_EQ(s.host_blocks, 2);  // block 1 fell out of the host tier, not off the disk
  EXPECT_EQ(s.disk.files, 3);
  ASSERT_TRUE(off->Contains(Key(1)));
  ASSERT_TRUE(off->Restore(Key(3), 6));
  EXPECT_EQ(pool.Block(6), Bytes(3));
  ASSERT_TRUE(off->Restore(Key(1), 7));
  EXPECT_EQ(pool.Block(7), Bytes(1));
  s = off->stats();
  EXPECT_EQ(s.restored_from_host, 1);
  EXPECT_EQ(s.restored_from_disk, 1);
  EXPECT_FALSE(off->Contains(Key(4)));
  EXPECT_FALSE(off->Restore(Key(4), 5));
  // Offloading a block the host tier holds copies nothing again.
  const std::vector<StoredBlock> again = {{3, Key(3)}};
  off->Offload(again);
  EXPECT_EQ(off->stats().offloaded_blocks, 3);
}

TEST(KvOffloaderTest, DiskWithoutHostTierAndBadSettings) {
  FakePool pool(4);
  KvOffloadOptions o;
  o.disk_dir = test_util::TestScratchDir();
  o.disk_bytes = 1 << 20;
  std::unique_ptr<KvOffloader> off = *KvOffloader::Create(o, pool.Access(), Identity());
  pool.Fill(1, 11);
  const std::vector<StoredBlock> stored = {{1, Key(1)}};
  off->Offload(stored);
  off->Flush();
  ASSERT_TRUE(off->Restore(Key(1), 2));
  EXPECT_EQ(pool.Block(2), Bytes(11));
  KvOffloadOptions bad;
  bad.host_bytes = kBlockBytes - 1;
  EXPECT_FALSE(KvOffloader::Create(bad, pool.Access(), Identity()).ok());
  bad = KvOffloadOptions();
  bad.disk_dir = o.disk_dir;
  EXPECT_FALSE(KvOffloader::Create(bad, pool.Access(), Identity()).ok());  // no --kv-disk-bytes
  bad.host_bytes = -1;
  EXPECT_FALSE(KvOffloader::Create(bad, pool.Access(), Identity()).ok());
}

// A block source over a map, for KvManager alone.
class MapSource : public KvBlockSource {
 public:
  bool Contains(const BlockKey& key) override { return blocks.contains(key); }
  bool Restore(const BlockKey& key, BlockId dst) override {
    if (failing.contains(key)) return false;
    restored.push_back({dst, key});
    return true;
  }
  absl::flat_hash_set<BlockKey> blocks;
  absl::flat_hash_set<BlockKey> failing;
  std::vector<StoredBlock> restored;
};

TEST(KvManagerBlockSourceTest, ChainsContinueIntoTheSourceWithoutEvictingTheMatch) {
  KvManagerOptions o;
  o.num_blocks = 6;  // 5 usable: the 4 blocks of the chain and the prompt's last token
  o.block_size = 2;
  KvManager kv = *KvManager::Create(o);
  MapSource source;
  kv.SetBlockSource(&source);
  std::vector<TokenId> prompt(9);
  std::iota(prompt.begin(), prompt.end(), 10);
  const std::vector<BlockKey> keys = HashFullBlocks(prompt, 2, "");
  ASSERT_EQ(keys.size(), 4u);
  // Blocks 0 and 1 of the chain on the device (cached-free), 2 and 3 only in the source.
  ASSERT_TRUE(kv.AllocateNew(1, PrefixMatch{}, 4, ""));
  kv.Commit(1, prompt, 4);
  const std::vector<StoredBlock> stored = kv.TakeStoredBlocks();
  ASSERT_EQ(stored.size(), 2u);
  kv.Free(1);
  source.blocks = {keys[2], keys[3]};
  const PrefixMatch m = kv.FindCachedPrefix(prompt, "");
  ASSERT_EQ(m.blocks.size(), 4u);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.blocks[0], stored[0].block);
  EXPECT_EQ(m.blocks[1], stored[1].block);
  ASSERT_EQ(source.restored.size(), 2u);
  EXPECT_EQ(source.restored[0].key, keys[2]);
  EXPECT_EQ(source.restored[1].key, keys[3]);
  EXPECT_EQ(kv.stats().prefix_restored_tokens, 4);
  EXPECT_TRUE(kv.TakeStoredBlocks().empty());  // restored blocks are not offloaded again
  ASSERT_TRUE(kv.CheckInvariants().ok());
  ASSERT_TRUE(kv.AllocateNew(2, m, 1, ""));
  EXPECT_EQ(kv.NumTokens(2), 9);
  kv.Free(2);
  ASSERT_TRUE(kv.CheckInvariants().ok());
}

TEST(KvManagerBlockSourceTest, AFailedRestoreEndsThePrefix) {
  KvManagerOptions o;
  o.num_blocks = 8;
  o.block_size = 2;
  KvManager kv = *KvManager::Create(o);
  MapSource source;
  kv.SetBlockSource(&source);
  std::vector<TokenId> prompt(7);
  std::iota(prompt.begin(), prompt.end(), 3);
  const std::vector<BlockKey> keys = HashFullBlocks(prompt, 2, "salt");
  source.blocks = {keys[0], keys[1], keys[2]};
  source.failing = {keys[1]};
  const PrefixMatch m = kv.FindCachedPrefix(prompt, "salt");
  EXPECT_EQ(m.blocks.size(), 1u);
  EXPECT_EQ(kv.pool().num_free(), 7);  // the failed block went back
  // Another tenant's salt finds nothing.
  source.failing.clear();
  EXPECT_TRUE(kv.FindCachedPrefix(prompt, "other").blocks.empty());
  ASSERT_TRUE(kv.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvserve
