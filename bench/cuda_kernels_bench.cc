// CUDA kernel benchmark (built only with CUDA; run by scripts/gpu-check.sh): the device's copy
// bandwidth (the peak the attention numbers are compared to), flash-decoding attention's
// achieved KV bandwidth for several KV dtypes, bf16 GEMM TFLOP/s and top-k / top-p sampling over
// a 128k vocabulary. Prints a markdown table; exits 1 with the reason when there is no CUDA
// device.
//
// Usage: cuda_kernels_bench [--quick]

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of `fn`, best of `reps` timed calls after one warm-up.
template <typename F>
double Time(Backend& b, int reps, F&& fn) {
  fn();
  if (!b.Synchronize().ok()) return -1.0;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const Clock::time_point t0 = Clock::now();
    fn();
    if (!b.Synchronize().ok()) return -1.0;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

DeviceBuffer Alloc(Backend& b, size_t bytes, int fill) {
  absl::StatusOr<DeviceBuffer> buf = b.AllocBuffer(bytes);
  if (!buf.ok()) {
    std::fprintf(stderr, "%s\n", std::string(buf.status().message()).c_str());
    std::exit(1);
  }
  (void)b.Memset(buf->get(), fill, bytes);
  return std::move(*buf);
}

int Main(bool quick) {
  BackendOptions options;
  absl::StatusOr<std::unique_ptr<Backend>> loaded = LoadCudaBackend(options);
  if (!loaded.ok()) {
    std::printf("no CUDA device: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  Backend& b = **loaded;
  const int reps = quick ? 3 : 10;
  std::printf("# CUDA kernel benchmark\n\nDevice: %s\n\n", b.description().c_str());

  // Peak: device-to-device copy (read + write bytes).
  const size_t copy_bytes = size_t{2} << 30;
  DeviceBuffer src = Alloc(b, copy_bytes, 1), dst = Alloc(b, copy_bytes, 0);
  const double copy_s =
      Time(b, reps, [&] { (void)b.CopyOnDevice(dst.get(), src.get(), copy_bytes); });
  const double peak = 2.0 * copy_bytes / copy_s;
  std::printf("| measurement | value |\n|---|---|\n");
  std::printf("| device memcpy bandwidth (peak reference) | %.0f GB/s |\n", peak / 1e9);
  src.reset();
  dst.reset();

  // Decode attention: 64 sequences x 4096 tokens, 32 query heads over 8 kv heads, head_dim 128.
  const int64_t seqs = 64, ctx = 4096, heads = 32, kv_heads = 8, d = 128, bs = 16;
  const int64_t blocks = seqs * ctx / bs;
  std::vector<int32_t> ctx_h(seqs, static_cast<int32_t>(ctx)), qstart(seqs), qlen(seqs, 1);
  std::vector<int32_t> tables(blocks);
  for (int64_t i = 0; i < seqs; ++i) qstart[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < blocks; ++i) tables[i] = static_cast<int32_t>(i);
  DeviceBuffer dctx = Alloc(b, seqs * 4, 0), dqs = Alloc(b, seqs * 4, 0),
               dql = Alloc(b, seqs * 4, 0);
  DeviceBuffer dt = Alloc(b, blocks * 4, 0);
  (void)b.CopyToDevice(dctx.get(), ctx_h.data(), seqs * 4);
  (void)b.CopyToDevice(dqs.get(), qstart.data(), seqs * 4);
  (void)b.CopyToDevice(dql.get(), qlen.data(), seqs * 4);
  (void)b.CopyToDevice(dt.get(), tables.data(), blocks * 4);
  DeviceBuffer q = Alloc(b, seqs * heads * d * 4, 0), out = Alloc(b, seqs * heads * d * 4, 0);
  for (KvCacheDType dtype : {KvCacheDType::kBF16, KvCacheDType::kFp8E4M3, KvCacheDType::kInt8}) {
    const int64_t rows = blocks * kv_heads * bs;
    const size_t bytes = static_cast<size_t>(rows * d * KvCacheDTypeElemBytes(dtype));
    DeviceBuffer k = Alloc(b, bytes, 0x11), v = Alloc(b, bytes, 0x11);
    DeviceBuffer ks = Alloc(b, rows * 4, 0), vs = Alloc(b, rows * 4, 0);
    cpu::PagedAttentionArgs a{};
    a.q = q.as<float>();
    a.q_stride = heads * d;
    a.out = out.as<float>();
    a.out_stride = heads * d;
    a.num_seqs = seqs;
    a.num_heads = heads;
    a.q_start = dqs.as<int32_t>();
    a.q_len = dql.as<int32_t>();
    a.context_len = dctx.as<int32_t>();
    a.block_tables = dt.as<int32_t>();
    a.block_table_stride = ctx / bs;
    a.k_cache = {k.get(), ks.as<float>()};
    a.v_cache = {v.get(), vs.as<float>()};
    a.layout = {kv_heads, d, bs, dtype};
    a.scale = 0.088f;
    AttentionShape shape{seqs, heads, 1, ctx, a.layout};
    const AttentionPlan plan = b.PlanAttention(shape);
    const double s = Time(b, reps, [&] { b.RunAttention(plan, a); });
    const double moved = 2.0 * bytes + (KvCacheDTypeHasScales(dtype) ? 2.0 * rows * 4 : 0.0);
    std::printf(
        "| decode attention %s (64 seqs x 4096, GQA 32/8, d 128, %d splits) | %.0f GB/s "
        "(%.0f%% of peak), %.3f ms |\n",
        std::string(KvCacheDTypeName(dtype)).c_str(), plan.num_splits, moved / s / 1e9,
        100.0 * moved / s / peak, s * 1e3);
  }

  // GEMM: bf16 weights, fp32 accumulation (activations converted to bf16 inside).
  for (int64_t m : {int64_t{16}, int64_t{4096}}) {
    const int64_t n = 4096, k = 4096;
    DeviceBuffer x = Alloc(b, m * k * 4, 0), w = Alloc(b, n * k * 2, 0), y = Alloc(b, m * n * 4, 0);
    cpu::MatmulArgs g{x.as<float>(), k, w.get(), DType::kBF16, nullptr, y.as<float>(), n, m, n, k};
    const double s = Time(b, reps, [&] { b.Matmul(g); });
    std::printf("| GEMM bf16 %lldx%lldx%lld | %.1f TFLOP/s, %.3f ms |\n", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), 2.0 * m * n * k / s / 1e12,
                s * 1e3);
  }
  // Sampling: a decode step of 64 sequences over a 128k vocabulary, k 64. The bandwidth counts
  // one read of the logits, though the radix selection reads them twice (the second read may
  // come from L2): model-like (normal) logits take that two-pass path, a vocabulary masked to
  // -inf but for 10 logits the slowest one (four passes).
  {
    const int64_t rows = 64, vocab = 128256;
    std::vector<float> normal(rows * vocab), masked(rows * vocab, -INFINITY), uniforms(rows);
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (float& x : normal) x = dist(rng);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < 10; ++j) masked[r * vocab + (j * 7919 + r) % vocab] = dist(rng);
      uniforms[r] = (static_cast<float>(r) + 0.5f) / rows;
    }
    const size_t bytes = sizeof(float) * rows * vocab;
    DeviceBuffer logits = Alloc(b, bytes, 0), u = Alloc(b, rows * 4, 0),
                 ids = Alloc(b, rows * 4, 0);
    (void)b.CopyToDevice(u.get(), uniforms.data(), rows * 4);
    for (const auto& [what, host] :
         {std::pair{"normal logits", &normal}, {"masked to -inf", &masked}}) {
      (void)b.CopyToDevice(logits.get(), host->data(), bytes);
      const double s = Time(b, reps, [&] {
        b.SampleTopKTopP(logits.as<float>(), rows, vocab, vocab, 64, 0.9f, 1.0f, u.as<float>(),
                         ids.as<int32_t>());
      });
      std::printf(
          "| top-k/top-p sampling %s (64 rows x 128256, k 64) | %.0f GB/s (%.0f%% of peak), "
          "%.3f ms |\n",
          what, bytes / s / 1e9, 100.0 * bytes / s / peak, s * 1e3);
    }
  }
  if (absl::Status st = b.Synchronize(); !st.ok()) {
    std::printf("CUDA error: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return kvserve::Main(quick);
}
