#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kv_quant.h"

namespace kvserve::cpu {
namespace {

// Below this many multiply-adds per chunk, extra threads cost more than they save.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 15;

struct QueryToken {
  int32_t seq;
  int32_t index;  // j within the sequence's q_len new tokens
};

// A run of keys contiguous in one cache block: `count` keys from `key` (relative to the first key
// attended), at layout row `row` onwards.
struct KeyRun {
  int64_t key, row, count;
};

// Scratch reused across work items on one thread.
struct Scratch {
  std::vector<KeyRun> runs;       // the item being computed
  std::vector<KeyRun> next_runs;  // the thread's next item (its first runs are requested early)
  std::vector<float> probs;       // [group][keys]
  std::vector<float> acc;         // [group][head_dim]
  std::vector<float> inv_sum;     // [group]
};

// Keys first..last of sequence `seq` as runs contiguous in one cache block, in order.
void KeyRuns(const PagedAttentionArgs& a, int64_t seq, int64_t kv_head, int64_t first, int64_t last,
             std::vector<KeyRun>* runs) {
  const PagedKvLayout& l = a.layout;
  const int32_t* table = a.block_tables + seq * a.block_table_stride;
  runs->clear();
  for (int64_t t = first; t <= last;) {
    const int64_t slot = t % l.block_size;
    const int64_t count = std::min(l.block_size - slot, last + 1 - t);
    runs->push_back({t - first,
                     (table[t / l.block_size] * l.num_kv_heads + kv_head) * l.block_size + slot,
                     count});
    t += count;
  }
}

// The position of query token `token` and the first key it attends.
struct QueryKeys {
  int64_t pos, first;
};
QueryKeys KeysOf(const PagedAttentionArgs& a, const QueryToken& token) {
  const int64_t pos = a.context_len[token.seq] - a.q_len[token.seq] + token.index;
  return {pos, a.sliding_window > 0 ? std::max<int64_t>(0, pos - a.sliding_window + 1) : 0};
}

// The runs of keys that `token` attends in kv head `kv_head`.
void ItemRuns(const PagedAttentionArgs& a, const QueryToken& token, int64_t kv_head,
              std::vector<KeyRun>* runs) {
  const QueryKeys keys = KeysOf(a, token);
  KeyRuns(a, token.seq, kv_head, keys.first, keys.pos, runs);
}

// Runs are a cache block's rows of one head: a few KiB in a block placed anywhere in the pool. The
// hardware prefetchers stay within a 4 KiB page and need a stream to train on, so without help
// each run's lines are demand misses, a few at a time: one thread read 4-7 GB/s of K/V. A thread's
// items therefore make one stream of requests: an item's K runs, its V runs, then the next item's
// K runs. While the kernels compute on run r of that stream they request run r + kRunsAhead into
// L1, spread over their loop (RowPrefetch); only the first item of a thread's chunk requests its
// first runs in one burst. Measured on a Zen 5 VM (one thread, f32 K/V, head_dim 64, 4 KiB runs,
// docs/benchmarks.md, "Decode attention prefetch"): continuing the stream into the next item took
// a 72-token context from 10-14 to 17-19 GB/s; spreading the 4 KiB runs instead of one burst each
// took a 1024-token context from 17 to 21, and L1 instead of L2 to 29. (On the Zen 4 VM, before
// the stream crossed items, 4 KiB runs read 17 GB/s in bursts and 15 spread; not measured since.)
constexpr int64_t kRunsAhead = 2;

// Requests a run's rows (and their scales, when the dtype has them) in one burst.
void PrefetchRun(const uint8_t* data, const float* scales, const KeyRun& run, int64_t row_bytes) {
  constexpr int64_t kLine = 64;
  const uint8_t* begin = data + run.row * row_bytes;
  const uint8_t* end = begin + run.count * row_bytes;
  for (const uint8_t* p = begin; p < end; p += kLine) __builtin_prefetch(p, 0, 3);
  if (scales != nullptr) __builtin_prefetch(scales + run.row, 0, 3);
}

// One item's request stream: its K runs, its V runs, then the next item's K runs (none when
// `next` is null).
class RequestStream {
 public:
  RequestStream(const PagedAttentionArgs& a, const std::vector<KeyRun>& runs,
                const std::vector<KeyRun>* next, int64_t row_bytes)
      : runs_(runs), next_(next), row_bytes_(row_bytes) {
    const bool scaled = KvCacheDTypeHasScales(a.layout.dtype);
    k_data_ = static_cast<const uint8_t*>(a.k_cache.data);
    v_data_ = static_cast<const uint8_t*>(a.v_cache.data);
    k_scales_ = scaled ? a.k_cache.scales : nullptr;
    v_scales_ = scaled ? a.v_cache.scales : nullptr;
  }

  // Requests the first kRunsAhead runs of the stream in one burst.
  void Start() const {
    for (int64_t i = 0; i < kRunsAhead; ++i) {
      const Entry e = At(i);
      if (e.run != nullptr) PrefetchRun(e.data, e.scales, *e.run, row_bytes_);
    }
  }

  // For the kernel computing on run `i` of the stream: the rows of run i + kRunsAhead to request
  // (its scales, one line, are requested here).
  internal::RowPrefetch Ahead(int64_t i) const {
    const Entry e = At(i + kRunsAhead);
    if (e.run == nullptr) return {};
    if (e.scales != nullptr) __builtin_prefetch(e.scales + e.run->row, 0, 3);
    return {e.data + e.run->row * row_bytes_, e.run->count};
  }

 private:
  struct Entry {
    const uint8_t* data = nullptr;
    const float* scales = nullptr;
    const KeyRun* run = nullptr;  // null: past the stream's end
  };

  Entry At(int64_t i) const {
    const auto n = static_cast<int64_t>(runs_.size());
    if (i < n) return {k_data_, k_scales_, &runs_[i]};
    if (i < 2 * n) return {v_data_, v_scales_, &runs_[i - n]};
    i -= 2 * n;
    if (next_ != nullptr && i < static_cast<int64_t>(next_->size())) {
      return {k_data_, k_scales_, &(*next_)[i]};
    }
    return {};
  }

  const std::vector<KeyRun>& runs_;
  const std::vector<KeyRun>* next_;
  int64_t row_bytes_;
  const uint8_t* k_data_;
  const uint8_t* v_data_;
  const float* k_scales_;
  const float* v_scales_;
};

// All query heads of one kv head for one query token: K and V rows are read once per group.
// scratch.runs holds the item's runs (ItemRuns); `next` (null for none) the runs of the item the
// thread computes next, and `started` says whether the item before requested this one's first runs.
void AttendGroup(const PagedAttentionArgs& a, const internal::AttentionKernels& kernels,
                 const QueryToken& token, int64_t kv_head, bool started,
                 const std::vector<KeyRun>* next, Scratch& scratch) {
  const int64_t hd = a.layout.head_dim;
  const int64_t group = a.num_heads / a.layout.num_kv_heads;
  const int64_t seq = token.seq;
  const int64_t row = a.q_start[seq] + token.index;
  const QueryKeys query_keys = KeysOf(a, token);
  const int64_t keys = query_keys.pos - query_keys.first + 1;
  const float* q = a.q + row * a.q_stride + kv_head * group * hd;
  const int64_t row_bytes = hd * KvCacheDTypeElemBytes(a.layout.dtype);
  const bool scaled = KvCacheDTypeHasScales(a.layout.dtype);
  const auto* k_data = static_cast<const uint8_t*>(a.k_cache.data);
  const auto* v_data = static_cast<const uint8_t*>(a.v_cache.data);

  const std::vector<KeyRun>& runs = scratch.runs;
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  const RequestStream stream(a, runs, next, row_bytes);
  if (!started) stream.Start();
  scratch.probs.resize(static_cast<size_t>(group * keys));
  float* probs = scratch.probs.data();
  for (int64_t r = 0; r < num_runs; ++r) {
    const KeyRun& run = runs[r];
    const void* k = k_data + run.row * row_bytes;
    const float* k_scales = scaled ? a.k_cache.scales + run.row : nullptr;
    kernels.scores(q, group, k, k_scales, run.count, hd, a.scale, probs + run.key, keys,
                   stream.Ahead(r));
  }
  scratch.inv_sum.resize(static_cast<size_t>(group));
  float* inv_sum = scratch.inv_sum.data();
  kernels.softmax(probs, group, keys, inv_sum);
  scratch.acc.assign(static_cast<size_t>(group * hd), 0.0f);
  float* acc = scratch.acc.data();
  for (int64_t r = 0; r < num_runs; ++r) {
    const KeyRun& run = runs[r];
    const void* v = v_data + run.row * row_bytes;
    const float* v_scales = scaled ? a.v_cache.scales + run.row : nullptr;
    kernels.accumulate(probs + run.key, keys, group, v, v_scales, run.count, hd, acc,
                       stream.Ahead(num_runs + r));
  }
  float* out = a.out + row * a.out_stride + kv_head * group * hd;
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t d = 0; d < hd; ++d) out[g * hd + d] = acc[g * hd + d] * inv_sum[g];
  }
}

internal::AttentionKernels SelectKernels(CpuIsa isa, KvCacheDType dtype) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return internal::AttentionKernelsAvx512(dtype);
    case CpuIsa::kAvx2:
      return internal::AttentionKernelsAvx2(dtype);
    case CpuIsa::kScalar:
      break;
  }
  return internal::AttentionKernelsScalar(dtype);
}

}  // namespace

void WriteKvCache(const float* k, const float* v, int64_t n, int64_t k_stride, int64_t v_stride,
                  const int64_t* slot_mapping, const PagedKvLayout& layout, KvCacheBuffer k_cache,
                  KvCacheBuffer v_cache) {
  const int64_t hd = layout.head_dim;
  const int64_t row_bytes = hd * KvCacheDTypeElemBytes(layout.dtype);
  const bool scaled = KvCacheDTypeHasScales(layout.dtype);
  auto* k_data = static_cast<uint8_t*>(k_cache.data);
  auto* v_data = static_cast<uint8_t*>(v_cache.data);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    const int64_t block = slot / layout.block_size;
    const int64_t offset = slot % layout.block_size;
    for (int64_t h = 0; h < layout.num_kv_heads; ++h) {
      const int64_t row = (block * layout.num_kv_heads + h) * layout.block_size + offset;
      EncodeKvVector(layout.dtype, k + i * k_stride + h * hd, hd, k_data + row * row_bytes,
                     scaled ? k_cache.scales + row : nullptr);
      if (v == nullptr) continue;  // MLA: the cache holds K rows only
      EncodeKvVector(layout.dtype, v + i * v_stride + h * hd, hd, v_data + row * row_bytes,
                     scaled ? v_cache.scales + row : nullptr);
    }
  }
}

void PagedAttention(const PagedAttentionArgs& args, ThreadPool* pool) {
  std::vector<QueryToken> tokens;
  int64_t total_macs = 0;
  for (int64_t s = 0; s < args.num_seqs; ++s) {
    for (int32_t j = 0; j < args.q_len[s]; ++j) {
      tokens.push_back({static_cast<int32_t>(s), j});
      total_macs += 2 * (args.context_len[s] - args.q_len[s] + j + 1) * args.layout.head_dim;
    }
  }
  // Work items: (query token, kv head), kv head fastest.
  const int64_t kv_heads = args.layout.num_kv_heads;
  const int64_t items = static_cast<int64_t>(tokens.size()) * kv_heads;
  if (items == 0) return;
  total_macs *= args.num_heads;
  const internal::AttentionKernels kernels = SelectKernels(ActiveCpuIsa(), args.layout.dtype);
  const auto run = [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    ItemRuns(args, tokens[begin / kv_heads], begin % kv_heads, &scratch.runs);
    for (int64_t item = begin; item < end; ++item) {
      const bool has_next = item + 1 < end;
      if (has_next) {
        ItemRuns(args, tokens[(item + 1) / kv_heads], (item + 1) % kv_heads, &scratch.next_runs);
      }
      AttendGroup(args, kernels, tokens[item / kv_heads], item % kv_heads,
                  /*started=*/item > begin, has_next ? &scratch.next_runs : nullptr, scratch);
      std::swap(scratch.runs, scratch.next_runs);
    }
  };
  const int64_t min_chunk =
      std::max<int64_t>(1, items * kMinMacsPerChunk / std::max<int64_t>(total_macs, 1));
  if (pool == nullptr || items < 2 * min_chunk) {
    run(0, items);
  } else {
    // Items differ in cost (context lengths vary across the batch) and each is computed whole by
    // one thread, so hand them out dynamically: no thread idles while another has a long tail.
    const int64_t pieces = int64_t{pool->num_threads()} * 4;
    pool->ParallelForDynamic(items, std::max(min_chunk, (items + pieces - 1) / pieces), run);
  }
}

}  // namespace kvserve::cpu
