#ifndef KVSERVE_ROUTER_PREFIX_INDEX_H_
#define KVSERVE_ROUTER_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/block_hash/block_hash.h"

namespace kvserve {

/// Identifies a worker inside one router process; never reused for another worker.
using WorkerId = uint32_t;

/// One change to a worker's prefix cache, as its KV event stream reports it.
struct KvDelta {
  enum class Type {
    /// The worker registered a full block with this key.
    kStored,
    /// The block with this key left the worker's cache.
    kEvicted,
  };
  Type type = Type::kStored;
  BlockKey key;
  /// Which of the worker's tiers the key entered or left.
  KvTier tier = KvTier::kDevice;
};

/// How much of a request's leading run of block keys one worker holds.
struct PrefixMatchCount {
  /// The longest leading run held in any tier (the worker restores lower-tier blocks).
  int blocks = 0;
  /// How many of those blocks are in the worker's device pool.
  int device_blocks = 0;
};

/// The router's global view of every worker's prefix cache: block key -> workers holding it (in
/// their device pool, host tier or disk tier), fed by the workers' StreamKvEvents. A key counts
/// as held while any tier holds it. Thread-safe: the KV stream threads write, the dispatcher
/// reads.
class PrefixIndex {
 public:
  /// Applies one event batch of `worker` atomically: with `reset`, everything known about the
  /// worker is dropped first (a snapshot); then the deltas apply in order. Evicting a key from a
  /// tier that does not hold it and storing one a tier holds are no-ops.
  void Apply(WorkerId worker, bool reset, std::span<const KvDelta> deltas);
  /// Forgets every key of `worker` (it left the pool or its stream broke).
  void RemoveWorker(WorkerId worker);

  /// The length of the longest leading run of `keys` that `worker` holds: keys[0..n) all held,
  /// keys[n] not. Only a leading run is reusable since each key hashes its whole prefix.
  int MatchedBlocks(WorkerId worker, std::span<const BlockKey> keys) const;
  /// MatchedBlocks for several workers under one lock, with the device part of each run;
  /// result[i] belongs to workers[i].
  std::vector<PrefixMatchCount> MatchedBlocks(std::span<const WorkerId> workers,
                                              std::span<const BlockKey> keys) const;

  /// Number of keys `worker` holds.
  size_t NumBlocks(WorkerId worker) const;
  /// Number of distinct keys held by any worker.
  size_t NumKeys() const;
  /// Blocks until `worker` holds exactly `count` keys or `timeout` passes; returns whether the
  /// count was reached. For tests and readiness checks: no polling.
  bool WaitForBlockCount(WorkerId worker, size_t count, absl::Duration timeout) const;

 private:
  void StoreLocked(WorkerId worker, const BlockKey& key, KvTier tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(WorkerId worker, const BlockKey& key, KvTier tier)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWorkerLocked(WorkerId worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  /// Key -> the workers holding it (few per key: at most the replica count).
  absl::flat_hash_map<BlockKey, absl::InlinedVector<WorkerId, 4>> holders_ ABSL_GUARDED_BY(mu_);
  /// Worker -> its keys with a bit per tier holding them (1 << KvTier), so a reset or removal
  /// costs the worker's keys, not the whole index.
  absl::flat_hash_map<WorkerId, absl::flat_hash_map<BlockKey, uint8_t>> by_worker_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_PREFIX_INDEX_H_
