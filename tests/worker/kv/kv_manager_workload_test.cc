// Randomized workload over KvManager: thousands of new / step / append / commit / fork / free
// operations from a fixed seed, checking every invariant after every operation.
//
// Besides the manager's own CheckInvariants, the test simulates the physical KV memory: each
// block is an array of block_size token slots. Committing a computed token writes it into its
// slot through the sequence's block table, copy-on-write copies are applied as the engine would,
// and after every operation each live sequence must read back its own tokens from every slot a
// future query can see. That catches wrong sharing (a prefix hit on blocks with other content, a
// write into a block another sequence still reads, a block released while visible) independently
// of the manager's bookkeeping.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/kv/kv_manager.h"

namespace kvserve {
namespace {

struct WorkloadParams {
  int32_t block_size;
  int32_t sliding_window;
  bool prefix_caching;
  int32_t num_blocks;
};

struct LiveSeq {
  std::vector<TokenId> tokens;  // prompt + generated so far
  int32_t num_prompt = 0;
  int32_t num_allocated = 0;  // tokens with slots
  int32_t num_computed = 0;   // tokens written to memory
  std::string salt;
};

class Workload {
 public:
  explicit Workload(const WorkloadParams& p) : p_(p), rng_(12345) {
    KvManagerOptions o;
    o.num_blocks = p.num_blocks;
    o.block_size = p.block_size;
    o.sliding_window = p.sliding_window;
    o.enable_prefix_caching = p.prefix_caching;
    kv_.emplace(*KvManager::Create(o));
    memory_.assign(static_cast<size_t>(p.num_blocks) * p.block_size, kNoToken);
    // A few shared prompt heads so that prefix hits and evictions of shared chains happen.
    for (int f = 0; f < 4; ++f) {
      std::vector<TokenId> head(Uniform(0, 3 * p.block_size));
      for (TokenId& t : head) t = static_cast<TokenId>(Uniform(0, 50));
      families_.push_back(std::move(head));
    }
  }

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int kind = Uniform(0, 99);
      if (live_.empty() || kind < 15) {
        NewSequence();
      } else if (kind < 60) {
        Step(PickLive(), /*commit=*/true);
      } else if (kind < 70) {
        Step(PickLive(), /*commit=*/false);
      } else if (kind < 80) {
        CommitPending(PickLive());
      } else if (kind < 88) {
        Fork(PickLive());
      } else {
        Free(PickLive());
      }
      Verify(op);
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!live_.empty()) {
      Free(live_.begin()->first);
      Verify(num_ops);
      if (::testing::Test::HasFatalFailure()) return;
    }
    const KvManager::Stats st = kv_->stats();
    EXPECT_EQ(st.used_blocks, 0);
    EXPECT_EQ(st.free_blocks, p_.num_blocks - 1);
    EXPECT_EQ(kv_->pool().FreeQueue().size(), static_cast<size_t>(p_.num_blocks - 1));
    EXPECT_GT(num_copies_, 0);
    EXPECT_GT(num_preemptions_, 0);
    if (p_.prefix_caching) {
      EXPECT_GT(st.prefix_hit_tokens, 0);
      EXPECT_GT(num_evictions_, 0);
    }
  }

 private:
  SeqId PickLive() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, static_cast<int>(live_.size()) - 1));
    return it->first;
  }

  void NewSequence() {
    LiveSeq s;
    s.tokens = families_[Uniform(0, static_cast<int>(families_.size()) - 1)];
    const int suffix = Uniform(1, 2 * p_.block_size);
    for (int i = 0; i < suffix; ++i) s.tokens.push_back(static_cast<TokenId>(Uniform(0, 50)));
    s.num_prompt = static_cast<int32_t>(s.tokens.size());
    s.salt = Uniform(0, 3) == 0 ? "tenant-b" : "";
    const PrefixMatch m = kv_->FindCachedPrefix(s.tokens, s.salt);
    // First chunk of the prompt beyond the match (chunked prefill).
    const int32_t rest = s.num_prompt - m.num_tokens;
    const int32_t chunk = std::min(rest, Uniform(1, 3 * p_.block_size));
    const SeqId id = next_id_++;
    if (!kv_->AllocateNew(id, m, chunk, s.salt)) {
      PreemptOne();
      return;
    }
    s.num_allocated = m.num_tokens + chunk;
    s.num_computed = m.num_tokens;  // cached K/V, already in memory
    live_.emplace(id, std::move(s));
  }

  // One engine step for `id`: slots for the next prefill chunk or one decode token, then
  // (optionally) the computation that writes them.
  void Step(SeqId id, bool commit) {
    LiveSeq& s = live_.at(id);
    int32_t n;
    if (s.num_allocated < s.num_prompt) {
      n = std::min(s.num_prompt - s.num_allocated, Uniform(1, 2 * p_.block_size));
    } else {
      if (s.num_allocated < static_cast<int32_t>(s.tokens.size())) return;  // decode pending
      s.tokens.push_back(static_cast<TokenId>(Uniform(0, 50)));
      n = 1;
    }
    if (!kv_->Append(id, n)) {
      if (s.num_allocated < static_cast<int32_t>(s.tokens.size()) &&
          s.num_allocated >= s.num_prompt) {
        s.tokens.pop_back();
      }
      PreemptOne();
      return;
    }
    ApplyCopies();
    s.num_allocated += n;
    if (commit) CommitPending(id);
  }

  // The engine computed every allocated token of `id`: write them, then tell the manager.
  void CommitPending(SeqId id) {
    LiveSeq& s = live_.at(id);
    const std::span<const BlockId> table = kv_->BlockTable(id);
    for (int32_t pos = s.num_computed; pos < s.num_allocated; ++pos) {
      const BlockId b = table[pos / p_.block_size];
      ASSERT_NE(b, kNullBlock) << "writing position " << pos << " into a released block";
      memory_[Slot(b, pos)] = s.tokens[pos];
    }
    s.num_computed = s.num_allocated;
    kv_->Commit(id, s.tokens, s.num_computed);
    kv_->ReleaseOutOfWindow(id, s.num_computed);
  }

  void Fork(SeqId parent) {
    const LiveSeq& s = live_.at(parent);
    // Samples fork once the parent's allocated tokens are all computed.
    if (s.num_computed != s.num_allocated) return;
    const SeqId child = next_id_++;
    kv_->Fork(parent, child);
    live_.emplace(child, live_.at(parent));
  }

  void Free(SeqId id) {
    kv_->Free(id);
    live_.erase(id);
  }

  // Out of blocks: drop the newest sequence, as the scheduler's recompute preemption does.
  void PreemptOne() {
    if (live_.empty()) return;
    ++num_preemptions_;
    Free(std::prev(live_.end())->first);
  }

  void ApplyCopies() {
    for (const BlockCopy& c : kv_->TakeCopies()) {
      ++num_copies_;
      std::copy_n(memory_.begin() + Slot(c.src, 0), p_.block_size,
                  memory_.begin() + Slot(c.dst, 0));
    }
  }

  size_t Slot(BlockId b, int32_t pos) const {
    return static_cast<size_t>(b) * p_.block_size + pos % p_.block_size;
  }

  void Verify(int op) {
    const absl::Status st = kv_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << "after op " << op << ": " << st;
    for (const KvEvent& e : kv_->TakeEvents()) {
      if (e.type == KvEvent::Type::kEvicted) ++num_evictions_;
    }
    for (const auto& [id, s] : live_) {
      ASSERT_EQ(kv_->NumTokens(id), s.num_allocated) << "seq " << id;
      const int32_t unused = kv_->NumSlots(id) - s.num_allocated;
      ASSERT_GE(unused, 0);
      ASSERT_LE(unused, p_.block_size - 1) << "seq " << id << " after op " << op;
      const std::span<const BlockId> table = kv_->BlockTable(id);
      // Keys the next query (at position num_computed) can see.
      int32_t first = 0;
      if (p_.sliding_window > 0) first = std::max(0, s.num_computed - p_.sliding_window + 1);
      for (int32_t pos = first; pos < s.num_computed; ++pos) {
        const BlockId b = table[pos / p_.block_size];
        ASSERT_NE(b, kNullBlock) << "seq " << id << " position " << pos << " released";
        ASSERT_EQ(memory_[Slot(b, pos)], s.tokens[pos])
            << "seq " << id << " position " << pos << " block " << b << " after op " << op;
      }
    }
  }

  WorkloadParams p_;
  std::mt19937 rng_;
  std::optional<KvManager> kv_;
  std::vector<TokenId> memory_;  // [num_blocks][block_size] token ids standing in for K/V
  std::vector<std::vector<TokenId>> families_;
  std::map<SeqId, LiveSeq> live_;
  SeqId next_id_ = 1;
  int num_copies_ = 0;
  int num_preemptions_ = 0;
  int num_evictions_ = 0;
};

class KvManagerWorkloadTest : public ::testing::TestWithParam<WorkloadParams> {};

TEST_P(KvManagerWorkloadTest, RandomOpsKeepEveryInvariant) {
  Workload w(GetParam());
  w.Run(5000);
}

INSTANTIATE_TEST_SUITE_P(Configs, KvManagerWorkloadTest,
                         ::testing::Values(WorkloadParams{4, 0, true, 48},
                                           WorkloadParams{16, 0, true, 40},
                                           WorkloadParams{4, 0, false, 48},
                                           WorkloadParams{4, 10, true, 48},
                                           WorkloadParams{3, 7, true, 64}),
                         [](const ::testing::TestParamInfo<WorkloadParams>& info) {
                           const WorkloadParams& p = info.param;
                           return "bs" + std::to_string(p.block_size) + "_window" +
                                  std::to_string(p.sliding_window) +
                                  (p.prefix_caching ? "_cached" : "_uncached");
                         });

}  // namespace
}  // namespace kvserve
