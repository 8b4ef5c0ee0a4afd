#ifndef KVSERVE_WORKER_KV_KV_OFFLOAD_H_
#define KVSERVE_WORKER_KV_KV_OFFLOAD_H_

// Tiers of the prefix cache below the device pool.
//
// Every full block the prefix cache registers is copied, when the step that computed it ends,
// into a bounded host-memory tier (LRU) and, when a directory is given, written by a background
// thread to a disk tier under its chain hash (write-through). A block that later leaves the device
// pool therefore needs no copy; a prefix lookup that runs out of device blocks continues in the
// host tier, then on disk, and restores what it finds into free device blocks
// (KvManager::FindCachedPrefix with a KvBlockSource). The bytes restored are the bytes computed,
// so the tokens are the same whether a block was restored or recomputed.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/block_hash/block_hash.h"
#include "kernels/backend.h"
#include "worker/kv/kv_manager.h"
#include "worker/model/weights.h"

namespace kvserve {

/// Reads and writes whole blocks of the device pool (every layer and rank): KvCache::ReadBlock and
/// WriteBlock, or ShardedKvCache's. The copies may be queued (a device's stream): `finish` waits
/// for them; until then a read's bytes are not there and a write's source must not change.
struct KvBlockAccess {
  int64_t block_bytes = 0;
  std::function<absl::Status(BlockId, uint8_t*)> read;
  std::function<absl::Status(BlockId, const uint8_t*)> write;
  /// Null: the copies complete before read / write return.
  std::function<absl::Status()> finish;
  /// Where the host tier's memory comes from when it can be copied to and from without staging
  /// (Backend::AllocHost: page-locked for CUDA); null or unsupported: ordinary mapped memory.
  Backend* host_memory = nullptr;
};

/// What a block's bytes depend on besides its tokens: a block file written for another model or
/// another cache layout is foreign and never served.
struct KvTierIdentity {
  /// Of the weights (ModelWeightsFingerprint).
  BlockKey model;
  /// Everything that shapes a block's bytes: layers, kv heads, head size, KV dtype, block size,
  /// tensor-parallel split (KvLayoutDescription).
  std::string layout;
};

/// A bounded LRU of block copies in host memory: `capacity` slots of `block_bytes`, in one mapping
/// whose pages are committed as slots are first filled. Not thread-safe (the engine loop owns it).
class KvHostTier {
 public:
  /// Fails when the memory cannot be had. With `pinned` (whose AllocHost succeeds) the slots are
  /// its page-locked memory, committed at once; otherwise one mapping committed as slots fill.
  static absl::StatusOr<std::unique_ptr<KvHostTier>> Create(int64_t capacity, int64_t block_bytes,
                                                            Backend* pinned = nullptr);
  ~KvHostTier();
  KvHostTier(const KvHostTier&) = delete;
  KvHostTier& operator=(const KvHostTier&) = delete;

  bool Contains(const BlockKey& key) const { return index_.contains(key); }
  /// The bytes cached under `key`, now the most recently used; null when absent.
  const uint8_t* Get(const BlockKey& key);
  /// The bytes cached under `key` without touching the LRU order; null when absent.
  const uint8_t* Peek(const BlockKey& key) const;
  /// Whether the slots are page-locked memory of a backend.
  bool pinned() const { return pinned_ != nullptr; }
  /// A slot for `key` to be filled by the caller, the most recently used: the least recently
  /// used entry makes room when the tier is full. Requires !Contains(key).
  uint8_t* Put(const BlockKey& key);
  /// The key the next Put would push out, or null when a slot is free.
  const BlockKey* NextEvicted() const {
    return free_slots_.empty() && next_slot_ >= capacity_ && !lru_.empty() ? &lru_.front().key
                                                                           : nullptr;
  }
  /// Forgets `key` (a slot whose fill failed).
  void Erase(const BlockKey& key);

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  int64_t block_bytes() const { return block_bytes_; }
  /// Entries pushed out to make room.
  int64_t evictions() const { return evictions_; }
  /// Host-tier events (stored, evicted) since the last call, oldest first.
  std::vector<KvEvent> TakeEvents() { return std::exchange(events_, {}); }
  /// Every key held, least recently used first.
  std::vector<BlockKey> Keys() const;

 private:
  KvHostTier(int64_t capacity, int64_t block_bytes, uint8_t* base, size_t mapped, Backend* pinned)
      : capacity_(capacity),
        block_bytes_(block_bytes),
        base_(base),
        mapped_(mapped),
        pinned_(pinned) {}

  struct Entry {
    BlockKey key;
    int64_t slot = 0;
  };
  uint8_t* Slot(int64_t slot) const { return base_ + slot * block_bytes_; }

  int64_t capacity_;
  int64_t block_bytes_;
  uint8_t* base_;
  size_t mapped_;
  Backend* pinned_;       // owner of base_ when page-locked, else null (base_ is a mapping)
  std::list<Entry> lru_;  // least recently used first
  absl::flat_hash_map<BlockKey, std::list<Entry>::iterator> index_;
  std::vector<int64_t> free_slots_;
  int64_t next_slot_ = 0;
  int64_t evictions_ = 0;
  std::vector<KvEvent> events_;
};

/// Block files under one directory, one per chain hash, at most `capacity_bytes` in all (least
/// recently used removed first). Files live in a subdirectory named by the identity's hash, so
/// models and layouts sharing a directory do not collide, and each file's header names the model
/// fingerprint, layout, KV dtype, block size and a checksum of the bytes (docs/architecture.md,
/// "KV tiers"). Writes run on a background thread (temporary file, then rename); reads run on the
/// caller's thread. Thread-safe.
class KvDiskTier {
 public:
  /// Creates the directory if needed, removes unfinished temporary files and indexes the block
  /// files there (oldest modification first in the LRU). Fails naming the directory when it
  /// cannot be created or read.
  static absl::StatusOr<std::unique_ptr<KvDiskTier>> Open(const std::string& dir,
                                                          int64_t capacity_bytes,
                                                          int64_t block_bytes,
                                                          const KvTierIdentity& identity);
  /// Finishes the queued writes.
  ~KvDiskTier();
  KvDiskTier(const KvDiskTier&) = delete;
  KvDiskTier& operator=(const KvDiskTier&) = delete;

  /// Whether a block file (written or queued) exists for `key`.
  bool Contains(const BlockKey& key) const;
  /// Reads `key`'s bytes into `dst` (block_bytes). A file that is truncated, corrupted or
  /// written for another identity is never served: it is removed with one warning, and the read
  /// returns false, as it does for a missing key.
  bool Read(const BlockKey& key, uint8_t* dst);
  /// Queues a copy of `bytes` (block_bytes) to be written as `key`'s file. Dropped (and counted)
  /// when more than 64 MiB of writes are already queued.
  void Write(const BlockKey& key, const uint8_t* bytes);
  /// Waits until every queued write is on disk.
  void Flush();

  /// The directory the files are in (the identity's subdirectory).
  const std::string& dir() const { return dir_; }
  /// A block's file: 32 hex digits of its key and ".kvb".
  std::string PathOf(const BlockKey& key) const;
  /// Disk-tier events (a file complete, a file removed) since the last call, oldest first; the
  /// files found at Open count as stored.
  std::vector<KvEvent> TakeEvents();
  /// Keys of every file on disk, least recently used first.
  std::vector<BlockKey> Keys() const;

  struct Stats {
    int64_t files = 0;
    int64_t bytes = 0;
    int64_t capacity_bytes = 0;
    int64_t writes = 0;
    int64_t write_drops = 0;
    int64_t write_failures = 0;
    /// Files found unusable (truncated, corrupted, foreign) and removed.
    int64_t bad_files = 0;
  };
  Stats stats() const;

 private:
  KvDiskTier(std::string dir, int64_t capacity_bytes, int64_t block_bytes,
             const KvTierIdentity& identity);
  void Run();
  /// Writes one file; updates the index.
  void WriteFile(const BlockKey& key, const std::vector<uint8_t>& bytes);
  /// Adds `key` (file of `bytes`) as the most recent entry and removes the least recently used
  /// files beyond the capacity. Requires mu_.
  void IndexLocked(const BlockKey& key, int64_t bytes);
  /// Forgets `key`'s file (recording an eviction event when `record`).
  void DropLocked(const BlockKey& key, bool record = true);
  /// Drops and deletes a bad file, warning once with `why`.
  void Reject(const BlockKey& key, const std::string& why);

  const std::string dir_;
  const int64_t capacity_bytes_;
  const int64_t block_bytes_;
  const BlockKey model_;
  const uint64_t layout_hash_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<BlockKey> lru_;  // least recently used first
  struct FileEntry {
    std::list<BlockKey>::iterator it;
    int64_t bytes = 0;
  };
  absl::flat_hash_map<BlockKey, FileEntry> files_;
  int64_t total_bytes_ = 0;
  struct Job {
    BlockKey key;
    std::vector<uint8_t> bytes;
  };
  std::deque<Job> queue_;
  absl::flat_hash_set<BlockKey> queued_;
  int64_t queued_bytes_ = 0;
  std::vector<KvEvent> events_;
  bool writing_ = false;
  bool stop_ = false;
  Stats stats_;
  std::thread thread_;
};

/// Sizes of the tiers (0 / empty: that tier is off).
struct KvOffloadOptions {
  /// Host-memory tier (--kv-offload-memory).
  int64_t host_bytes = 0;
  /// Disk tier directory (--kv-disk-dir) and its size (--kv-disk-bytes).
  std::string disk_dir;
  int64_t disk_bytes = 0;

  bool enabled() const { return host_bytes > 0 || !disk_dir.empty(); }
};

/// The engine's tiers below the device pool: the KvBlockSource its KvManager restores from, and
/// the write-through of newly cached blocks (Offload). Single-threaded like the engine loop.
class KvOffloader : public KvBlockSource {
 public:
  /// INVALID_ARGUMENT when a size is negative, the disk tier has no size, or the host tier holds
  /// less than one block; the disk tier's own errors otherwise.
  static absl::StatusOr<std::unique_ptr<KvOffloader>> Create(const KvOffloadOptions& options,
                                                             KvBlockAccess access,
                                                             const KvTierIdentity& identity);
  /// Writes the last Offload's blocks to disk (the device pool must still be there).
  ~KvOffloader() override;

  bool Contains(const BlockKey& key) override;
  bool Restore(const BlockKey& key, BlockId dst) override;

  /// Copies newly cached device blocks into the host tier and queues them for the disk tier
  /// (blocks a tier already holds are only marked recently used there). With a device the
  /// copies into the host tier are queued, not waited for: they are waited for, and those
  /// blocks handed to the disk tier, at the next Offload (or Flush), so a step never waits
  /// for its own copies.
  void Offload(std::span<const StoredBlock> blocks);
  /// Waits for the disk tier's queued writes (tests, shutdown).
  void Flush();
  /// Copies the bytes cached under `key` in the host or disk tier into `dst` (block_bytes)
  /// without restoring them or changing the LRU order; false when neither tier has them.
  bool ReadCached(const BlockKey& key, uint8_t* dst);
  /// Host and disk tier events since the last call (KvEvent::tier says which).
  std::vector<KvEvent> TakeEvents();
  /// A kStored event for every block the tiers hold (for a KV event snapshot).
  void AppendSnapshot(std::vector<KvEvent>* events) const;

  struct Stats {
    /// Bytes of one block (every layer and rank).
    int64_t block_bytes = 0;
    int64_t host_capacity_blocks = 0;
    int64_t host_blocks = 0;
    int64_t host_evictions = 0;
    KvDiskTier::Stats disk;
    /// Device blocks copied down (to the host tier, or straight to disk without one).
    int64_t offloaded_blocks = 0;
    /// Blocks restored into the device pool, by the tier they came from.
    int64_t restored_from_host = 0;
    int64_t restored_from_disk = 0;
    /// Copies to or from the device that failed.
    int64_t copy_failures = 0;
  };
  Stats stats() const;

  const KvHostTier* host() const { return host_.get(); }
  KvDiskTier* disk() const { return disk_.get(); }

 private:
  explicit KvOffloader(KvBlockAccess access) : access_(std::move(access)) {}
  /// Waits for the queued copies (KvBlockAccess::finish); false (counted) when they failed.
  bool FinishCopies();
  /// Waits for the copies of the last Offload and hands those blocks to the disk tier.
  void WritePendingToDisk();

  KvBlockAccess access_;
  std::unique_ptr<KvHostTier> host_;
  std::unique_ptr<KvDiskTier> disk_;
  std::vector<uint8_t> scratch_;  // one block read from disk (or going there without a host tier)
  /// Blocks of the last Offload whose copies into the host tier may still be queued, due on disk.
  std::vector<BlockKey> pending_disk_;
  absl::flat_hash_set<BlockKey> pending_set_;
  Stats stats_;
};

/// A 128-bit fingerprint of everything in `weights` that a cached K or V can depend on: the
/// configuration numbers that shape attention and positions, and every tensor's name, type,
/// shape and the hash of up to 64 KiB at each end of its bytes (cheap at start-up: weights stay
/// mapped, not read). Two files of the same model and quantization give the same fingerprint.
BlockKey ModelWeightsFingerprint(const ModelWeights& weights);

/// The layout part of KvTierIdentity: what the bytes of one block depend on.
std::string KvLayoutDescription(int num_layers, int64_t kv_heads, int64_t head_dim, bool has_v,
                                const std::string& kv_dtype, int64_t block_size, int tp_size,
                                int64_t block_bytes);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_KV_OFFLOAD_H_
