#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/logits.h"

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
  std::vector<KeyRun> runs;
  std::vector<float> probs;    // [group][keys]
  std::vector<float> acc;      // [group][head_dim]
  std::vector<float> inv_sum;  // [group]
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

// Runs are a cache block's rows of one head: a few KiB in a block placed anywhere in the pool. The
// hardware prefetchers stay within a page and need a stream to train on, so without help each
// run's lines are demand misses, a few at a time: one thread read 4-7 GB/s of K/V. Each pass
// over the runs therefore has the kernels request the run kRunsAhead further on into L2 while
// they compute (RowPrefetch: spread over the loop, not one burst per run); the first runs of a
// pass are requested in one burst before it starts.
constexpr int64_t kRunsAhead = 2;
// Bytes of a run requested in one burst; the kernels spread the requests for larger runs. Measured
// on Zen 4, one thread, f32 K/V from memory: 4 KiB runs (head_dim 64) read 17 GB/s with bursts and
// 15 spread, 8 KiB runs (head_dim 128) 12 GB/s with bursts and 19 spread at a GQA group of 4, 15
// and 17 at 2 (a burst of more lines than the core tracks misses for stalls it).
constexpr int64_t kBurstBytes = 4096;

// Requests a run's rows (and their scales, when the dtype has them) into L2.
void PrefetchRun(const uint8_t* data, const float* scales, const KeyRun& run, int64_t row_bytes) {
  constexpr int64_t kLine = 64;
  const uint8_t* begin = data + run.row * row_bytes;
  const uint8_t* end = begin + run.count * row_bytes;
  for (const uint8_t* p = begin; p < end; p += kLine) __builtin_prefetch(p, 0, 2);
  if (scales != nullptr) __builtin_prefetch(scales + run.row, 0, 2);
}

// Requests `run` for the kernel about to be called: returns its rows for the kernel to request
// (RowPrefetch; the scales, one line, are requested here) when `spread`, else requests them all.
internal::RowPrefetch RunPrefetch(const uint8_t* data, const float* scales, const KeyRun& run,
                                  int64_t row_bytes, bool spread) {
  if (!spread) {
    PrefetchRun(data, scales, run, row_bytes);
    return {};
  }
  if (scales != nullptr) __builtin_prefetch(scales + run.row, 0, 2);
  return {data + run.row * row_bytes, run.count};
}

// Eight independent lanes, so that the baseline build vectorizes both loops: a one-accumulator
// loop is one dependent add (or max) per key and query head, a third of a short context's time.
constexpr int kSumLanes = 8;

// The maximum of p[0, n), n >= 1 (exact in any order).
float MaxOf(const float* p, int64_t n) {
  float lane[kSumLanes];
  std::fill_n(lane, kSumLanes, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) lane[l] = std::max(lane[l], p[i + l]);
  }
  for (; i < n; ++i) lane[0] = std::max(lane[0], p[i]);
  return *std::max_element(lane, lane + kSumLanes);
}

// The sum of p[0, n): lane l adds p[i] for i = l mod 8 in order, then a fixed combine.
float LaneSum(const float* p, int64_t n) {
  float lane[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) lane[l] += p[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) lane[l] += p[i];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// All query heads of one kv head for one query token: K and V rows are read once per group.
void AttendGroup(const PagedAttentionArgs& a, const internal::AttentionKernels& kernels,
                 const QueryToken& token, int64_t kv_head, Scratch& scratch) {
  const int64_t hd = a.layout.head_dim;
  const int64_t group = a.num_heads / a.layout.num_kv_heads;
  const int64_t seq = token.seq;
  const int64_t row = a.q_start[seq] + token.index;
  const int64_t pos = a.context_len[seq] - a.q_len[seq] + token.index;
  const int64_t first = a.sliding_window > 0 ? std::max<int64_t>(0, pos - a.sliding_window + 1) : 0;
  const int64_t keys = pos - first + 1;
  const float* q = a.q + row * a.q_stride + kv_head * group * hd;
  const int64_t row_bytes = hd * KvCacheDTypeElemBytes(a.layout.dtype);
  const bool scaled = KvCacheDTypeHasScales(a.layout.dtype);
  const auto* k_data = static_cast<const uint8_t*>(a.k_cache.data);
  const auto* v_data = static_cast<const uint8_t*>(a.v_cache.data);
  // Runs larger than one burst's worth have the kernels spread the requests over their loops.
  const bool spread = a.layout.block_size * row_bytes > kBurstBytes;

  KeyRuns(a, seq, kv_head, first, pos, &scratch.runs);
  const std::vector<KeyRun>& runs = scratch.runs;
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  scratch.probs.resize(static_cast<size_t>(group * keys));
  float* probs = scratch.probs.data();
  const float* k_scale_data = scaled ? a.k_cache.scales : nullptr;
  const float* v_scale_data = scaled ? a.v_cache.scales : nullptr;
  for (int64_t r = 0; r < std::min(kRunsAhead, num_runs); ++r) {
    PrefetchRun(k_data, k_scale_data, runs[r], row_bytes);
  }
  for (int64_t r = 0; r < num_runs; ++r) {
    // The V pass's first runs follow the K pass's last.
    const int64_t ahead = r + kRunsAhead;
    internal::RowPrefetch prefetch;
    if (ahead < num_runs) {
      prefetch = RunPrefetch(k_data, k_scale_data, runs[ahead], row_bytes, spread);
    } else if (ahead - num_runs < num_runs) {
      prefetch = RunPrefetch(v_data, v_scale_data, runs[ahead - num_runs], row_bytes, spread);
    }
    const KeyRun& run = runs[r];
    const void* k = k_data + run.row * row_bytes;
    const float* k_scales = scaled ? a.k_cache.scales + run.row : nullptr;
    kernels.scores(q, group, k, k_scales, run.count, hd, a.scale, probs + run.key, keys, prefetch);
  }
  scratch.inv_sum.resize(static_cast<size_t>(group));
  float* inv_sum = scratch.inv_sum.data();
  for (int64_t g = 0; g < group; ++g) {
    float* p = probs + g * keys;
    ExpShifted(p, keys, MaxOf(p, keys), 1.0f, p);  // exp(p[i] - max), vectorized
    inv_sum[g] = 1.0f / LaneSum(p, keys);
  }
  scratch.acc.assign(static_cast<size_t>(group * hd), 0.0f);
  float* acc = scratch.acc.data();
  for (int64_t r = 0; r < num_runs; ++r) {
    internal::RowPrefetch prefetch;
    if (r + kRunsAhead < num_runs) {
      prefetch = RunPrefetch(v_data, v_scale_data, runs[r + kRunsAhead], row_bytes, spread);
    }
    const KeyRun& run = runs[r];
    const void* v = v_data + run.row * row_bytes;
    const float* v_scales = scaled ? a.v_cache.scales + run.row : nullptr;
    kernels.accumulate(probs + run.key, keys, group, v, v_scales, run.count, hd, acc, prefetch);
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
    for (int64_t item = begin; item < end; ++item) {
      AttendGroup(args, kernels, tokens[item / kv_heads], item % kv_heads, scratch);
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
