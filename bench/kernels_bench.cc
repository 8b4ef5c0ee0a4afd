// CPU kernel benchmarks: matmul per weight dtype (decode m = 1 and prefill m = 32), paged vs
// contiguous decode attention, and the machine's triad bandwidth to compare them against.
//
//   build-*/bench/kernels_bench --benchmark_counters_tabular=true
// KVSERVE_BENCH_THREADS=N sets the thread count (default: all), KVSERVE_CPU_ISA the matmul path.
// Counters (printed with SI prefixes, e.g. 41.2G/s = 41.2 GB/s): weight_bytes (matmul) and
// kv_bytes (attention) streamed per second, flops = 2 m n k per second; BM_TriadBandwidth's
// triad_bytes/s is the memory ceiling they compare against.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "bench/peak_fma.h"
#include "common/io/anonymous_memory.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/membw.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kvserve::cpu {
namespace {

// All threads by default; KVSERVE_BENCH_THREADS=N to pin the count.
ThreadPool& Pool() {
  static ThreadPool pool([] {
    const char* env = std::getenv("KVSERVE_BENCH_THREADS");
    return env != nullptr ? std::atoi(env) : 0;
  }());
  return pool;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Memory mapped as the engine maps weights and KV (common/io/anonymous_memory.h: huge pages where
// the kernel offers them), so that the kernels pay for the TLB what they pay in the engine.
class Mapped {
 public:
  explicit Mapped(size_t bytes) {
    if (!m_.Map(bytes)) std::abort();
  }
  uint8_t* data() const { return m_.data(); }
  size_t size() const { return m_.size(); }
  uint8_t& operator[](size_t i) { return m_.data()[i]; }

 private:
  AnonymousMemory m_;
};

// Random bytes are a valid weight matrix for every dtype once the scales are sane: fp16 scales
// of quantized blocks (d, and dmin of q4_k/q5_k; q6_k keeps d at byte 208) are overwritten with
// 0.01; f16/bf16/f32 elements are written from floats.
Mapped RandomWeights(DType dtype, int64_t n, int64_t k) {
  const int64_t row_bytes = DTypeRowBytes(dtype, k);
  Mapped w(static_cast<size_t>(n * row_bytes));
  std::mt19937 rng(7);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(rng());
  const std::vector<float> f =
      RandomFloats(static_cast<size_t>(std::min<int64_t>(n * k, 1 << 20)), 8);
  const int64_t elems = n * k;
  for (int64_t i = 0; i < elems; ++i) {
    const float v = f[static_cast<size_t>(i) % f.size()];
    if (dtype == DType::kF32) std::memcpy(&w[4 * i], &v, 4);
    if (dtype == DType::kF16 || dtype == DType::kBF16) {
      const uint16_t h = dtype == DType::kF16 ? FloatToHalf(v) : FloatToBF16(v);
      std::memcpy(&w[2 * i], &h, 2);
    }
  }
  if (DTypeBlockElems(dtype) > 1) {
    const uint16_t scale = FloatToHalf(0.01f);
    for (size_t off = 0; off < w.size(); off += DTypeBlockBytes(dtype)) {
      if (dtype == DType::kQ6_K) {
        std::memcpy(&w[off + 208], &scale, 2);
        continue;
      }
      std::memcpy(&w[off], &scale, 2);
      if (dtype == DType::kQ4_K || dtype == DType::kQ5_K) std::memcpy(&w[off + 2], &scale, 2);
    }
  }
  return w;
}

// Args: dtype, m [, n, k]. Weights are n x k, by default 4096 x 4096 (a Llama-7B attention
// projection, streamed from memory); BM_MatmulInCache uses 256 x 1024 (1 MiB of f32, resident in
// L2), the kernel's arithmetic ceiling.
void BM_Matmul(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const int64_t m = state.range(1);
  const int64_t n = state.range(2) > 0 ? state.range(2) : 4096;
  const int64_t k = state.range(3) > 0 ? state.range(3) : 4096;
  const Mapped w = RandomWeights(dtype, n, k);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 1);
  std::vector<float> y(static_cast<size_t>(m * n));
  const MatmulArgs args{x.data(), k, w.data(), dtype, nullptr, y.data(), n, m, n, k};
  for (auto _ : state) {
    Matmul(args, &Pool());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(DTypeName(dtype)));
  state.counters["weight_bytes"] = benchmark::Counter(
      static_cast<double>(w.size()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["flops"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)
    ->ArgNames({"dtype", "m", "n", "k"})
    ->ArgsProduct({{static_cast<int>(DType::kF32), static_cast<int>(DType::kF16),
                    static_cast<int>(DType::kBF16), static_cast<int>(DType::kQ8_0),
                    static_cast<int>(DType::kQ4_0)},
                   {1, 32},
                   {0},
                   {0}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
// Decode (m = 1) over 32M weights (64M for q8_0: twice a 32 MiB L3) with short (k = 1024: 2 KiB
// bf16 rows, two per 4 KiB page) and long rows: the page-stride tiling of matmul_walk.inc should
// make the two stream alike.
void BM_MatmulRowLength(benchmark::State& state) { BM_Matmul(state); }
BENCHMARK(BM_MatmulRowLength)
    ->ArgNames({"dtype", "m", "n", "k"})
    ->Args({static_cast<int>(DType::kF32), 1, 32768, 1024})
    ->Args({static_cast<int>(DType::kF32), 1, 8192, 4096})
    ->Args({static_cast<int>(DType::kBF16), 1, 32768, 1024})
    ->Args({static_cast<int>(DType::kBF16), 1, 8192, 4096})
    ->Args({static_cast<int>(DType::kQ8_0), 1, 65536, 1024})
    ->Args({static_cast<int>(DType::kQ8_0), 1, 16384, 4096})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The matmuls of one decode step of decode_bench's synthetic model (8 layers, hidden 1024, FFN
// 2816, vocab 32000), m = 1, each matrix its own allocation, run in the engine's order: how fast
// the decode tiles stream a step's weights without attention between them. Args: dtype.
void BM_MatmulDecodeStep(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  struct Shape {
    int64_t n, k;
  };
  std::vector<Shape> shapes;
  for (int layer = 0; layer < 8; ++layer) {
    for (const Shape s :
         {Shape{1024, 1024}, Shape{1024, 1024}, Shape{1024, 1024}, Shape{1024, 1024},
          Shape{2816, 1024}, Shape{2816, 1024}, Shape{1024, 2816}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({32000, 1024});
  std::vector<Mapped> w;
  int64_t bytes = 0;
  for (const Shape& s : shapes) {
    w.push_back(RandomWeights(dtype, s.n, s.k));
    bytes += static_cast<int64_t>(w.back().size());
  }
  const std::vector<float> x = RandomFloats(4096, 1);
  std::vector<float> y(32000);
  for (auto _ : state) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const MatmulArgs args{x.data(), shapes[i].k, w[i].data(), dtype,       nullptr,
                            y.data(), shapes[i].n, 1,           shapes[i].n, shapes[i].k};
      Matmul(args, &Pool());
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(DTypeName(dtype)));
  state.counters["weight_bytes"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MatmulDecodeStep)
    ->ArgName("dtype")
    ->Arg(static_cast<int>(DType::kF32))
    ->Arg(static_cast<int>(DType::kBF16))
    ->Arg(static_cast<int>(DType::kQ8_0))
    ->Arg(static_cast<int>(DType::kQ4_K))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_MatmulInCache(benchmark::State& state) { BM_Matmul(state); }
BENCHMARK(BM_MatmulInCache)
    ->ArgNames({"dtype", "m", "n", "k"})
    ->ArgsProduct({{static_cast<int>(DType::kF32), static_cast<int>(DType::kBF16),
                    static_cast<int>(DType::kQ8_0), static_cast<int>(DType::kQ4_0),
                    static_cast<int>(DType::kQ4_K), static_cast<int>(DType::kQ5_K),
                    static_cast<int>(DType::kQ6_K)},
                   {1, 32, 128},
                   {256},
                   {1024}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// `n` random floats, mapped as the engine's KV pool maps its blocks.
Mapped RandomMappedFloats(size_t n, uint32_t seed) {
  Mapped m(n * sizeof(float));
  const std::vector<float> v = RandomFloats(n, seed);
  std::memcpy(m.data(), v.data(), n * sizeof(float));
  return m;
}

// Decode attention (q_len = 1) for a batch of sequences. Args: block_size (0 = contiguous:
// one block per sequence holding its whole context), context length.
void BM_DecodeAttention(benchmark::State& state) {
  const int64_t num_seqs = 8, num_heads = 32, num_kv_heads = 8, head_dim = 128;
  const int64_t context = state.range(1);
  const int64_t block_size = state.range(0) == 0 ? context : state.range(0);
  const int64_t blocks_per_seq = (context + block_size - 1) / block_size;
  const int64_t num_blocks = num_seqs * blocks_per_seq;
  const PagedKvLayout layout{num_kv_heads, head_dim, block_size};
  const size_t cache = static_cast<size_t>(num_blocks * num_kv_heads * block_size * head_dim);
  const Mapped k_cache = RandomMappedFloats(cache, 2);
  const Mapped v_cache = RandomMappedFloats(cache, 3);
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937(4));  // paged: scattered blocks
  std::vector<int32_t> q_start(num_seqs), q_len(num_seqs, 1), ctx(num_seqs, context);
  std::iota(q_start.begin(), q_start.end(), 0);
  const std::vector<float> q =
      RandomFloats(static_cast<size_t>(num_seqs * num_heads * head_dim), 5);
  std::vector<float> out(q.size());
  const PagedAttentionArgs args{q.data(),
                                num_heads * head_dim,
                                out.data(),
                                num_heads * head_dim,
                                num_seqs,
                                num_heads,
                                q_start.data(),
                                q_len.data(),
                                ctx.data(),
                                tables.data(),
                                blocks_per_seq,
                                reinterpret_cast<const float*>(k_cache.data()),
                                reinterpret_cast<const float*>(v_cache.data()),
                                layout,
                                1.0f / std::sqrt(static_cast<float>(head_dim)),
                                0};
  for (auto _ : state) {
    PagedAttention(args, &Pool());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(state.range(0) == 0 ? "contiguous" : "paged");
  const double kv_bytes = 2.0 * num_seqs * context * num_kv_heads * head_dim * sizeof(float);
  state.counters["kv_bytes"] =
      benchmark::Counter(kv_bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"block", "ctx"})
    ->ArgsProduct({{0, 16}, {512, 2048}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Fixed cost of one ParallelFor / ParallelForDynamic over all pool threads with an empty body
// (the per-call overhead a decode step pays ~57 times for a 8-layer model). Arg: dynamic (1).
void BM_ParallelForOverhead(benchmark::State& state) {
  const int64_t n = 4096;
  std::atomic<int64_t> sink{0};
  const auto fn = [&](int64_t b, int64_t e) { sink.fetch_add(e - b, std::memory_order_relaxed); };
  for (auto _ : state) {
    if (state.range(0) != 0) {
      Pool().ParallelForDynamic(n, n / (4 * Pool().num_threads()), fn);
    } else {
      Pool().ParallelFor(n, 1, fn);
    }
  }
  state.SetLabel(state.range(0) != 0 ? "dynamic" : "static");
}
BENCHMARK(BM_ParallelForOverhead)->ArgName("dynamic")->Arg(0)->Arg(1)->UseRealTime();

// The machine's memory bandwidth (STREAM triad, 64 MiB arrays on huge pages) in the same run.
void BM_TriadBandwidth(benchmark::State& state) {
  double best = 0;
  for (auto _ : state) {
    best = std::max(best, MeasureTriadBandwidth(&Pool(), size_t{64} << 20, 5));
  }
  state.counters["triad_bytes/s"] = best;
  state.counters["threads"] = Pool().num_threads();
}
BENCHMARK(BM_TriadBandwidth)->Iterations(1)->Unit(benchmark::kMillisecond);

// Args: threads: 1, or 0 = the whole pool. flops = 2 * lanes * 16 chains * iterations per thread.
void BM_PeakFma(benchmark::State& state) {
  if (ActiveCpuIsa() == CpuIsa::kScalar) {
    state.SkipWithError("no SIMD FMA path on this CPU");
    return;
  }
  const int threads = state.range(0) == 0 ? Pool().num_threads() : 1;
  double flops = 0;
  for (auto _ : state) flops += bench::RunPeakFma(threads == 1 ? nullptr : &Pool());
  state.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_PeakFma)->ArgName("threads")->Arg(1)->Arg(0)->UseRealTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve::cpu

BENCHMARK_MAIN();
