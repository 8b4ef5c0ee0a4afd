// Serving-side micro-benchmarks: KV block pool operations, prefix-cache lookup, tokenizer
// throughput, and the paging-vs-static capacity of a fixed KV budget.
//
//   build-*/bench/serving_bench --benchmark_counters_tabular=true
//
// BM_PagingCapacity is a simulation, not a timing: it admits requests with lognormal total
// lengths (prompt + output, median ~300 tokens, clipped to max-model-len 4096) into a KvManager of
// a fixed number of blocks until the pool is full, and reports how many run at once, against how
// many fit when each reserves max-model-len (static allocation).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/block_hash/block_hash.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer_loader/tokenizer_loader.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/kv_manager.h"

namespace kvserve {
namespace {

constexpr int32_t kBlockSize = 16;

// Allocate n blocks one by one, then free them (Unref) in allocation order. Arg: n.
void BM_BlockPoolAllocateFree(benchmark::State& state) {
  const auto n = static_cast<int32_t>(state.range(0));
  BlockPool pool(n + 1);
  std::vector<BlockId> blocks(static_cast<size_t>(n));
  for (auto _ : state) {
    for (int32_t i = 0; i < n; ++i) blocks[i] = *pool.Allocate();
    for (int32_t i = 0; i < n; ++i) pool.Unref(blocks[i]);
  }
  state.SetItemsProcessed(state.iterations() * n * 2);
}
BENCHMARK(BM_BlockPoolAllocateFree)->Arg(1024)->Arg(65536);

// AllocateMany of a 64-block sequence, then free; the pool holds 64k blocks. Items = blocks.
void BM_BlockPoolAllocateMany(benchmark::State& state) {
  BlockPool pool(65537);
  std::vector<BlockId> blocks;
  for (auto _ : state) {
    blocks.clear();
    pool.AllocateMany(64, &blocks);
    for (BlockId b : blocks) pool.Unref(b);
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_BlockPoolAllocateMany);

// Lookup of cached keys (hits) in a pool whose every block is cached. Arg: cached blocks.
void BM_BlockPoolLookup(benchmark::State& state) {
  const auto n = static_cast<int32_t>(state.range(0));
  BlockPool pool(n + 1);
  std::vector<BlockKey> keys;
  std::vector<TokenId> tokens(kBlockSize);
  BlockKey parent = kRootBlockKey;
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < kBlockSize; ++j) tokens[j] = i * kBlockSize + j;
    parent = HashBlock(parent, tokens, "");
    const BlockId b = *pool.Allocate();
    pool.CacheBlock(b, parent);
    keys.push_back(parent);
  }
  std::mt19937 rng(3);
  std::shuffle(keys.begin(), keys.end(), rng);
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool.Lookup(keys[i]));
    if (++i == keys.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_BlockPoolLookup)->Arg(1024)->Arg(65536);

// HashFullBlocks of a prompt. Arg: prompt tokens. Items = tokens.
void BM_HashFullBlocks(benchmark::State& state) {
  std::vector<TokenId> tokens(static_cast<size_t>(state.range(0)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 31 % 32000);
  for (auto _ : state) benchmark::DoNotOptimize(HashFullBlocks(tokens, kBlockSize, "salt"));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_HashFullBlocks)->Arg(256)->Arg(4096);

// FindCachedPrefix of a prompt whose first half is cached (a shared system prompt), in a
// manager of 64k blocks. Arg: prompt tokens. Items = tokens.
void BM_FindCachedPrefix(benchmark::State& state) {
  const auto len = static_cast<int32_t>(state.range(0));
  KvManager kv = *KvManager::Create({.num_blocks = 65537, .block_size = kBlockSize});
  std::vector<TokenId> prompt(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i) prompt[i] = i * 31 % 32000;
  // Cache the first half under sequence 1.
  const std::vector<TokenId> half(prompt.begin(), prompt.begin() + len / 2);
  kv.AllocateNew(1, PrefixMatch{}, len / 2, "");
  kv.Commit(1, half, len / 2);
  for (auto _ : state) {
    const PrefixMatch m = kv.FindCachedPrefix(prompt, "");
    benchmark::DoNotOptimize(m.num_tokens);
  }
  state.SetItemsProcessed(state.iterations() * len);
}
BENCHMARK(BM_FindCachedPrefix)->Arg(512)->Arg(4096);

// ---- Tokenizer encode throughput (bytes/s of input text). ----

std::string BenchText() {
  // English prose with digits, punctuation and some non-ASCII, repeated to ~256 KiB.
  const std::string para =
      "Once upon a time, in a small town by the sea, there lived a girl named Lily. She loved "
      "to collect shells (1,234 of them by 2024!) and to read about the world's oceans: the "
      "Pacific, the Atlantic, the Indian. \"Why is the sea salty?\" she asked her mom. Her mom "
      "smiled and said, \"Rivers carry minerals - sodium, chlorine - into it.\" Caf\xc3\xa9s, "
      "na\xc3\xafve r\xc3\xa9sum\xc3\xa9s and \xe2\x82\xac" "5 coffees were part of her days.\n\n";
  std::string text;
  while (text.size() < (size_t{256} << 10)) text += para;
  return text;
}

void RunTokenizer(benchmark::State& state, const std::string& path) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(path);
  if (!tok.ok()) {
    state.SkipWithError(tok.status().ToString().c_str());
    return;
  }
  const std::string text = BenchText();
  size_t tokens = 0;
  for (auto _ : state) {
    absl::StatusOr<std::vector<TokenId>> ids = (*tok)->Encode(text);
    tokens = ids.ok() ? ids->size() : 0;
    benchmark::DoNotOptimize(tokens);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(tokens) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

void BM_TokenizerEncodeGpt2(benchmark::State& state) {
  RunTokenizer(state, KVSERVE_SHARED_DIR "/models/tokenizers/gpt2/tokenizer.json");
}
BENCHMARK(BM_TokenizerEncodeGpt2)->Unit(benchmark::kMillisecond);

void BM_TokenizerEncodeStories(benchmark::State& state) {
  RunTokenizer(state, KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
}
BENCHMARK(BM_TokenizerEncodeStories)->Unit(benchmark::kMillisecond);

// ---- Paging vs static allocation in a fixed KV budget (a simulation with KvManager). ----

// Total (prompt + output) lengths: lognormal with median `median`, sigma 0.8, clipped to
// [16, max_len].
std::vector<int32_t> SampleLengths(int n, double median, int32_t max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> dist(std::log(median), 0.8);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& l : out) {
    l = static_cast<int32_t>(std::clamp(dist(rng), 16.0, static_cast<double>(max_len)));
  }
  return out;
}

// Args: KV budget in blocks (of 16 tokens), max-model-len. Admits requests in order, each
// holding blocks for its full length (its peak: prompt + all output tokens), until one does not
// fit. Counters: paged = sequences running at once with paging; static = budget /
// max-model-len reservations; gain = paged / static; used = fraction of the budget's slots
// holding tokens with paging (the rest is the partial last block of each sequence).
void BM_PagingCapacity(benchmark::State& state) {
  const auto budget_blocks = static_cast<int32_t>(state.range(0));
  const auto max_len = static_cast<int32_t>(state.range(1));
  double paged = 0, used = 0;
  int runs = 0;
  for (auto _ : state) {
    // Several draws of the length distribution; the counters are their mean.
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      KvManager kv = *KvManager::Create(
          {.num_blocks = budget_blocks + 1, .block_size = kBlockSize,
           .enable_prefix_caching = false});
      const std::vector<int32_t> lengths = SampleLengths(100000, 300, max_len, seed);
      int64_t tokens = 0;
      int32_t admitted = 0;
      for (int32_t len : lengths) {
        if (!kv.AllocateNew(admitted, PrefixMatch{}, len, "")) break;
        tokens += len;
        ++admitted;
      }
      paged += admitted;
      used += static_cast<double>(tokens) / (static_cast<double>(budget_blocks) * kBlockSize);
      ++runs;
    }
  }
  const double static_seqs =
      std::floor(static_cast<double>(budget_blocks) * kBlockSize / max_len);
  state.counters["paged_seqs"] = paged / runs;
  state.counters["static_seqs"] = static_seqs;
  state.counters["gain"] = paged / runs / std::max(static_seqs, 1.0);
  state.counters["slots_used"] = used / runs;
}
BENCHMARK(BM_PagingCapacity)
    ->ArgNames({"blocks", "max_len"})
    ->Args({16384, 4096})   // 262k token slots
    ->Args({65536, 4096})   // 1M token slots
    ->Args({65536, 32768})  // a long-context model
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
