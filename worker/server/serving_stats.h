#ifndef KVSERVE_WORKER_SERVER_SERVING_STATS_H_
#define KVSERVE_WORKER_SERVER_SERVING_STATS_H_

#include <atomic>
#include <cstdint>

namespace kvserve {

/// Counters of the worker's RPC layer (the engine keeps its own in EngineStats).
struct ServingStats {
  /// Generate calls accepted by the engine.
  int64_t generate_requests = 0;
  /// Generate calls rejected before reaching the engine or by its Submit.
  int64_t generate_rejected = 0;
  /// Generate streams the client cancelled (or whose deadline expired) before they finished;
  /// each was aborted in the engine before this counter moved.
  int64_t generate_cancelled = 0;
  /// Generate and StreamKvEvents streams open now.
  int64_t open_generate_streams = 0;
  int64_t open_kv_event_streams = 0;
  /// KV block transfer (GenerateRequest.kv_source, Worker/FetchKvBlocks): pulls started and
  /// those that failed (what arrived before the failure is used; the rest is computed), hints
  /// the cost model declined, blocks and bytes received, and blocks and bytes sent to peers.
  int64_t kv_pulls = 0;
  int64_t kv_pull_failures = 0;
  int64_t kv_pulls_declined = 0;
  int64_t kv_pulled_blocks = 0;
  int64_t kv_pulled_bytes = 0;
  int64_t kv_served_blocks = 0;
  int64_t kv_served_bytes = 0;
};

/// The live, thread-safe form of ServingStats that the services update.
struct ServingCounters {
  std::atomic<int64_t> generate_requests{0};
  std::atomic<int64_t> generate_rejected{0};
  std::atomic<int64_t> generate_cancelled{0};
  std::atomic<int64_t> open_generate_streams{0};
  std::atomic<int64_t> open_kv_event_streams{0};
  std::atomic<int64_t> kv_pulls{0};
  std::atomic<int64_t> kv_pull_failures{0};
  std::atomic<int64_t> kv_pulls_declined{0};
  std::atomic<int64_t> kv_pulled_blocks{0};
  std::atomic<int64_t> kv_pulled_bytes{0};
  std::atomic<int64_t> kv_served_blocks{0};
  std::atomic<int64_t> kv_served_bytes{0};

  ServingStats Snapshot() const {
    ServingStats s;
    s.generate_requests = generate_requests.load();
    s.generate_rejected = generate_rejected.load();
    s.generate_cancelled = generate_cancelled.load();
    s.open_generate_streams = open_generate_streams.load();
    s.open_kv_event_streams = open_kv_event_streams.load();
    s.kv_pulls = kv_pulls.load();
    s.kv_pull_failures = kv_pull_failures.load();
    s.kv_pulls_declined = kv_pulls_declined.load();
    s.kv_pulled_blocks = kv_pulled_blocks.load();
    s.kv_pulled_bytes = kv_pulled_bytes.load();
    s.kv_served_blocks = kv_served_blocks.load();
    s.kv_served_bytes = kv_served_bytes.load();
    return s;
  }
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_SERVING_STATS_H_
