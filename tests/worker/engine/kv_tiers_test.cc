// The prefix cache's tiers below the device pool (host memory, disk) on stories260K: with them
// on, prefixes the device pool has dropped are restored instead of recomputed, and every request
// still gets exactly the tokens and log-probabilities it gets with them off; the disk tier
// carries the prefix cache across an engine restart.

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/engine/engine_test_util.h"
#include "worker/engine/engine.h"

namespace kvserve {
namespace {

using testing_engine::Collected;
using testing_engine::Drain;
using testing_engine::RunInTurn;

class KvTiersTest : public testing_engine::StoriesModelTest {
 protected:
  // A device pool of 24 blocks of 16 tokens: far less than the prefixes below need together.
  static EngineOptions SmallPool() {
    EngineOptions o;
    o.num_threads = 1;
    o.check_invariants = true;
    o.num_kv_blocks = 24;
    o.block_size = 16;
    return o;
  }

  // Eight prefixes of 4 full blocks, each asked twice: 64 prefix blocks, 2.7 times the device
  // pool.
  static std::vector<EngineRequest> Workload() { return testing_engine::SharedPrefixRounds(8); }

  // Submits every request at once (preemption in the small pool) and collects them.
  static std::vector<Collected> RunTogether(Engine& engine,
                                            const std::vector<EngineRequest>& requests) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const EngineRequest& r : requests) streams.push_back(*engine.Submit(r));
    std::vector<Collected> out;
    for (auto& s : streams) out.push_back(Drain(*s)[0]);
    return out;
  }

  static void ExpectSame(const std::vector<Collected>& got, const std::vector<Collected>& want,
                         const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
      EXPECT_EQ(got[i].logprobs, want[i].logprobs) << what << ", request " << i;
    }
  }
};

TEST_F(KvTiersTest, EvictedPrefixesComeBackFromHostMemoryWithTheSameTokens) {
  for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kInt8}) {
    SCOPED_TRACE(KvCacheDTypeName(dtype));
    EngineOptions off = SmallPool();
    off.kv_cache_dtype = dtype;
    std::unique_ptr<Engine> plain = *Engine::Create(model_, off);
    const std::vector<Collected> want = RunInTurn(*plain, Workload());
    const EngineStats plain_stats = plain->stats();

    EngineOptions on = off;
    on.kv_offload.host_bytes = int64_t{16} << 20;
    std::unique_ptr<Engine> tiered = *Engine::Create(model_, on);
    ExpectSame(RunInTurn(*tiered, Workload()), want, "host tier");
    const EngineStats st = tiered->stats();
    // The second round's prefixes (4 blocks each) were all dropped by the device pool and all
    // restored from host memory; without the tier they were recomputed.
    EXPECT_EQ(st.prefix_restored_tokens, 8 * 64);
    EXPECT_EQ(st.kv_tiers.restored_from_host, 8 * 4);
    EXPECT_EQ(st.kv_tiers.restored_from_disk, 0);
    EXPECT_GE(st.prefix_hit_tokens, plain_stats.prefix_hit_tokens + 8 * 64);
    EXPECT_GT(st.kv_tiers.offloaded_blocks, 8 * 4);
    EXPECT_GT(st.kv_tiers.host_blocks, 0);
    testing_engine::ExpectPoolFree(*tiered);
  }
}

TEST_F(KvTiersTest, ConcurrencyPreemptionAndTensorParallelismKeepTheTokens) {
  // Long enough answers that the running requests outgrow the pool and preempt each other.
  std::vector<EngineRequest> requests = Workload();
  for (EngineRequest& r : requests) r.params.max_tokens = 40;
  for (int tp : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp));
    EngineOptions off = SmallPool();
    off.tensor_parallel_size = tp;
    off.num_threads = tp;
    std::unique_ptr<Engine> plain = *Engine::Create(model_, off);
    const std::vector<Collected> want = RunInTurn(*plain, requests);

    EngineOptions on = off;
    on.kv_offload.host_bytes = int64_t{16} << 20;
    std::unique_ptr<Engine> tiered = *Engine::Create(model_, on);
    ExpectSame(RunTogether(*tiered, requests), want, "together");
    ExpectSame(RunTogether(*tiered, requests), want, "together, again");
    const EngineStats st = tiered->stats();
    EXPECT_GT(st.num_preemptions, 0);
    EXPECT_GT(st.kv_tiers.restored_from_host, 0);
    testing_engine::ExpectPoolFree(*tiered);
  }
}

TEST_F(KvTiersTest, TheDiskTierSurvivesARestart) {
  const std::vector<EngineRequest> requests = Workload();
  EngineOptions off = SmallPool();
  std::unique_ptr<Engine> plain = *Engine::Create(model_, off);
  const std::vector<Collected> want = RunInTurn(*plain, requests);

  EngineOptions on = off;
  on.kv_offload.disk_dir = test_util::TestScratchDir();
  on.kv_offload.disk_bytes = int64_t{64} << 20;
  const std::vector<EngineRequest> first_round(requests.begin(), requests.begin() + 8);
  {
    std::unique_ptr<Engine> engine = *Engine::Create(model_, on);
    ExpectSame(RunInTurn(*engine, first_round),
               std::vector<Collected>(want.begin(), want.begin() + 8), "before the restart");
  }  // the engine's end finishes the queued writes
  for (bool with_host : {false, true}) {
    SCOPED_TRACE(with_host ? "disk and host tiers" : "disk tier alone");
    EngineOptions o = on;
    if (with_host) o.kv_offload.host_bytes = int64_t{16} << 20;
    std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
    ExpectSame(RunInTurn(*engine, requests), want, "after the restart");
    const EngineStats st = engine->stats();
    // Every prefix of both rounds came from disk once: nothing of the first run was in memory.
    EXPECT_GE(st.kv_tiers.restored_from_disk, 8 * 4);
    EXPECT_EQ(st.kv_tiers.disk.bad_files, 0);
    EXPECT_GT(st.kv_tiers.disk.files, 0);
    testing_engine::ExpectPoolFree(*engine);
  }
  // Another KV layout (int8 instead of f32) does not see those files: nothing is restored.
  EngineOptions other = on;
  other.kv_cache_dtype = KvCacheDType::kInt8;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, other);
  RunInTurn(*engine, first_round);
  EXPECT_EQ(engine->stats().kv_tiers.restored_from_disk, 0);
}

// A damaged block file at restart is not served: the engine recomputes from that block on and
// the tokens do not change. Another tenant (cache salt) never restores this tenant's blocks.
TEST_F(KvTiersTest, DamagedFilesAndOtherTenantsGetNothingFromTheTiers) {
  const std::vector<EngineRequest> requests = Workload();
  const std::vector<EngineRequest> first_round(requests.begin(), requests.begin() + 8);
  std::unique_ptr<Engine> plain = *Engine::Create(model_, SmallPool());
  const std::vector<Collected> want = RunInTurn(*plain, first_round);

  EngineOptions on = SmallPool();
  on.kv_offload.disk_dir = test_util::TestScratchDir();
  on.kv_offload.disk_bytes = int64_t{64} << 20;
  { RunInTurn(**Engine::Create(model_, on), first_round); }
  // Flip one byte in the middle of every file.
  int damaged = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(on.kv_offload.disk_dir)) {
    if (!entry.is_regular_file()) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    char c = 0;
    f.get(c);
    f.seekp(200);
    f.put(static_cast<char>(c ^ 1));
    ++damaged;
  }
  ASSERT_GE(damaged, 8 * 4);
  std::unique_ptr<Engine> engine = *Engine::Create(model_, on);
  ExpectSame(RunInTurn(*engine, first_round), want, "damaged files");
  EngineStats st = engine->stats();
  EXPECT_EQ(st.kv_tiers.restored_from_disk, 0);
  // The first block of each prompt was looked up, found damaged and removed.
  EXPECT_EQ(st.kv_tiers.disk.bad_files, 8);
  testing_engine::ExpectPoolFree(*engine);

  // Tenant b asks tenant a's prompts after a's blocks left the device pool: nothing restored.
  EngineOptions host = SmallPool();
  host.kv_offload.host_bytes = int64_t{16} << 20;
  engine = *Engine::Create(model_, host);
  std::vector<EngineRequest> a = first_round;
  for (EngineRequest& r : a) r.cache_salt = "tenant-a";
  RunInTurn(*engine, a);
  std::vector<EngineRequest> b = first_round;
  for (EngineRequest& r : b) {
    r.cache_salt = "tenant-b";
    r.request_id += "-b";
  }
  ExpectSame(RunInTurn(*engine, b), want, "tenant b");
  st = engine->stats();
  EXPECT_EQ(st.kv_tiers.restored_from_host, 0);
  EXPECT_EQ(st.prefix_hit_tokens, 0);
  // Tenant a again: restored from host memory.
  for (EngineRequest& r : a) r.request_id += "-again";
  ExpectSame(RunInTurn(*engine, a), want, "tenant a again");
  EXPECT_GT(engine->stats().kv_tiers.restored_from_host, 0);
}

// The KV event stream reports the host tier as well as the device pool, and the deltas agree
// with a snapshot taken afterwards: the router's index sees what the worker can restore.
TEST_F(KvTiersTest, KvEventsReportWhichTierHoldsEachBlock) {
  EngineOptions o = SmallPool();
  o.run_loop_thread = false;
  o.kv_offload.host_bytes = int64_t{16} << 20;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::shared_ptr<KvEventStream> events = engine->SubscribeKvEvents();
  // Key -> bit per tier, from the deltas.
  absl::flat_hash_map<BlockKey, int> held;
  int host_stored = 0;
  int device_evicted = 0;
  auto replay = [&](KvEventStream& stream, absl::flat_hash_map<BlockKey, int>* into) {
    KvEventBatch batch;
    while (stream.Next(&batch, std::chrono::milliseconds(0))) {
      if (batch.reset) into->clear();
      for (const KvEvent& e : batch.events) {
        const int bit = 1 << static_cast<int>(e.tier);
        if (e.type == KvEvent::Type::kStored) {
          (*into)[e.key] |= bit;
          if (e.tier == KvTier::kHost) ++host_stored;
        } else {
          if (e.tier == KvTier::kDevice) ++device_evicted;
          auto it = into->find(e.key);
          if (it != into->end() && (it->second &= ~bit) == 0) into->erase(it);
        }
      }
    }
  };
  for (const EngineRequest& r : Workload()) {
    std::shared_ptr<RequestStream> s = *engine->Submit(r);
    while (engine->StepOnce()) {
    }
    Drain(*s);
    replay(*events, &held);
  }
  EXPECT_GT(host_stored, 0);
  EXPECT_GT(device_evicted, 0);
  // Every prefix block is held somewhere; the device pool alone holds at most 24.
  int on_host = 0;
  for (const auto& [key, bits] : held) on_host += (bits & 2) != 0;
  EXPECT_GE(on_host, 8 * 4);
  std::shared_ptr<KvEventStream> late = engine->SubscribeKvEvents();
  engine->StepOnce();
  absl::flat_hash_map<BlockKey, int> snapshot;
  replay(*late, &snapshot);
  EXPECT_EQ(snapshot, held);
}

// The fingerprint that names a disk tier's files: the same for two loads of one file, different
// when one weight byte differs (a fine-tune of the same architecture).
TEST_F(KvTiersTest, ModelFingerprintFollowsTheWeights) {
  const BlockKey a = ModelWeightsFingerprint(*model_->weights);
  LoadedModel again = *LoadModel(testing_golden::kStoriesGguf);
  EXPECT_EQ(ModelWeightsFingerprint(*again.weights), a);
  TensorView& wk = again.weights->layers[1].wk;
  std::vector<uint8_t> copy(static_cast<const uint8_t*>(wk.data),
                            static_cast<const uint8_t*>(wk.data) + wk.nbytes());
  copy[copy.size() - 3] ^= 1;
  wk.data = copy.data();
  EXPECT_NE(ModelWeightsFingerprint(*again.weights), a);
}

TEST_F(KvTiersTest, BadSettingsAreRefusedByName) {
  EngineOptions o = SmallPool();
  o.kv_offload.disk_dir = test_util::TestScratchDir();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("--kv-disk-bytes"), std::string::npos)
      << engine.status();
  o = SmallPool();
  o.kv_offload.host_bytes = 100;  // less than one block
  engine = Engine::Create(model_, o);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("--kv-offload-memory"), std::string::npos)
      << engine.status();
  o = SmallPool();
  o.kv_offload.host_bytes = int64_t{1} << 20;
  o.scheduler.enable_prefix_caching = false;
  engine = Engine::Create(model_, o);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("prefix caching"), std::string::npos) << engine.status();
}

}  // namespace
}  // namespace kvserve
