// CUDA kernel benchmark (built only with CUDA; run by scripts/gpu-check.sh): the benchmark grid
// of docs/gpu.md, on a Llama-3-8B-like shape (32 heads over 8 KV heads, head_dim 128, hidden
// 4096, FFN 14336, vocabulary 128256, 32 layers, 16-token KV blocks).
//
// Each case prints the bytes it must move and the FLOPs it must do (the algorithmic minimum of
// the op's interface, formulas in docs/gpu.md), its time, and the fraction of the device peak that
// binds it (the roofline: whichever of bytes / bandwidth and FLOPs / tensor peak is longer):
//   - the bandwidth peak is measured in the same run: the faster of a device-to-device copy
//     (read + write) and a bf16 GEMV streaming 1 GiB of weights (m = 1: cuBLAS reading HBM). On
//     an H200 the copy (a memcpy node of a graph) moved 2.8 TB/s, the GEMV read 4.2 TB/s;
//   - the bf16 tensor-core peak is the device's dense spec (989 TFLOP/s for H100/H200 SXM, read
//     from the device name; --peak-tflops sets it), since cuBLAS itself is under test here.
// Cases with a target (docs/gpu.md) say whether they met it; a miss is reported, not an error.
// Kernel times come from a CUDA graph of back-to-back calls (no host launch gaps), rotating over
// enough copies of the inputs that every call reads from HBM, not from L2; decode steps are timed
// eager (one launch per op) and replayed from a graph.
//
// Usage: cuda_kernels_bench [--grid] [--quick] [--filter TEXT] [--peak-tflops X] [--simulator]
//   (default)   the target points of docs/gpu.md (the one-shot GPU check; about a minute)
//   --grid      the whole grid: decode batch 1-256 x context 1k-128k, prefill 512-16k, GEMMs at
//               m = 1-4096, eager vs graph steps at four batch sizes
//   --quick     fewer repetitions
//   --filter    only the cases whose name contains TEXT
//   --simulator the CUDA simulator's backend on a tiny shape: a smoke run of every code path
//               (its times mean nothing)
// Exits 1 with the reason when there is no CUDA device or an op fails.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/backend.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

/// The model the cases are sized for.
struct ModelShape {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab, block_size;
};
constexpr ModelShape kLlama3_8B{"Llama-3-8B-like", 32, 4096, 32, 8, 128, 14336, 128256, 16};
constexpr ModelShape kTiny{"tiny (simulator smoke run)", 2, 64, 4, 2, 16, 96, 256, 16};

/// The points measured (docs/gpu.md, "The benchmark grid").
struct Grid {
  std::vector<int64_t> decode_batches, decode_contexts, prefill_tokens, gemm_m, small_rows;
  std::vector<std::pair<int64_t, int64_t>> decode_points;  // (batch, context) pairs, default run
  std::vector<std::pair<int64_t, int64_t>> steps;          // (batch, context) of decode steps
};

Grid DefaultGrid() {
  Grid g;
  g.decode_points = {{64, 4096}, {1, 32768}};
  g.prefill_tokens = {4096};
  g.gemm_m = {1, 64, 4096};
  g.small_rows = {64, 4096};
  g.steps = {{1, 4096}, {64, 4096}};
  return g;
}

Grid FullGrid() {
  Grid g;
  g.decode_batches = {1, 4, 16, 64, 256};
  g.decode_contexts = {1024, 4096, 16384, 32768, 131072};
  g.prefill_tokens = {512, 1024, 2048, 4096, 8192, 16384};
  g.gemm_m = {1, 16, 64, 256, 1024, 4096};
  g.small_rows = {1, 64, 256, 4096};
  g.steps = {{1, 4096}, {16, 4096}, {64, 4096}, {256, 1024}};
  return g;
}

Grid TinyGrid() {
  Grid g;
  g.decode_points = {{3, 97}, {1, 40}};
  g.prefill_tokens = {33};
  g.gemm_m = {1, 5, 17};  // 17: past the quantized and FP8 GEMVs
  g.small_rows = {5};
  g.steps = {{3, 40}};
  return g;
}

/// What a case is held to: a fraction of the bandwidth or tensor peak, or of its roofline.
struct Target {
  enum Kind { kNone, kBandwidth, kFlops, kRoofline } kind = kNone;
  double fraction = 0.0;
};

struct Options {
  bool grid = false, quick = false, simulator = false;
  std::string filter;
  double peak_tflops = 0.0;  // 0: from the device name
};

/// Runs the cases and prints one table row each.
class Bench {
 public:
  Bench(Backend& b, const Options& o, const ModelShape& m) : b_(b), o_(o), m_(m) {}

  const ModelShape& model() const { return m_; }
  bool Wanted(const std::string& name) const {
    return o_.filter.empty() || name.find(o_.filter) != std::string::npos;
  }
  int reps() const { return o_.simulator ? 1 : o_.quick ? 3 : 10; }

  /// Device memory, or nullopt (the case is skipped) when it would not fit.
  std::optional<DeviceBuffer> Alloc(size_t bytes, int fill) {
    absl::StatusOr<DeviceBuffer> buf = b_.AllocBuffer(std::max<size_t>(bytes, 256));
    if (!buf.ok()) return std::nullopt;
    (void)b_.Memset(buf->get(), fill, bytes);
    return std::move(*buf);
  }
  /// Free device memory in bytes (0 when unknown).
  double FreeBytes() const {
    absl::StatusOr<std::pair<int64_t, int64_t>> info = b_.MemoryInfo();
    return info.ok() ? static_cast<double>(info->first) : 0.0;
  }

  /// Copies of a case's inputs that make `calls` back-to-back calls read HBM, not L2: enough to
  /// cycle through 256 MiB (H100/H200 L2: 50 MiB), at most 32.
  static int Rotations(double bytes_per_copy) {
    return static_cast<int>(std::clamp(std::ceil((256.0 * (1 << 20)) / bytes_per_copy), 1.0, 32.0));
  }

  /// Seconds per call of fn(i), i = call number: `calls` calls captured into one graph (queued
  /// back to back where graphs are unavailable), best of reps() after a warm-up. -1 on error.
  template <typename F>
  double TimePerCall(int calls, F&& fn) {
    fn(0);
    if (!Check()) return -1.0;
    int graph = -1;
    if (b_.supports_graphs() && b_.BeginCapture().ok()) {
      for (int i = 0; i < calls; ++i) fn(i);
      absl::StatusOr<int> g = b_.EndCapture();
      if (!g.ok()) return Fail(g.status());
      graph = *g;
    }
    auto run = [&] {
      if (graph >= 0) return b_.LaunchGraph(graph);
      for (int i = 0; i < calls; ++i) fn(i);
      return absl::OkStatus();
    };
    double best = 1e30;
    for (int r = -1; r < reps(); ++r) {  // r = -1: warm-up of the graph
      const Clock::time_point t0 = Clock::now();
      if (absl::Status s = run(); !s.ok()) return Fail(s);
      if (!Check()) return -1.0;
      if (r >= 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (graph >= 0) b_.DestroyGraph(graph);
    return best / calls;
  }

  /// Calls per timed graph for a case whose roofline time is `roofline_s`: about 2 ms of work,
  /// at least `rotations`, at most 64.
  int CallsFor(double roofline_s, int rotations) const {
    if (o_.simulator) return 1;
    const double want = std::ceil(2e-3 / std::max(roofline_s, 1e-7));
    return static_cast<int>(std::clamp<double>(std::max<double>(want, rotations), 1, 64));
  }

  bool Check() {
    if (absl::Status s = b_.Synchronize(); !s.ok()) {
      Fail(s);
      return false;
    }
    return true;
  }
  double Fail(const absl::Status& s) {
    if (error_.empty()) error_ = std::string(s.message());
    return -1.0;
  }
  const std::string& error() const { return error_; }

  void MeasurePeaks() {
    const size_t bytes = o_.simulator ? (size_t{1} << 20) : (size_t{2} << 30);
    std::optional<DeviceBuffer> src = Alloc(bytes, 1), dst = Alloc(bytes, 0);
    if (!src || !dst) {
      error_ = "cannot allocate the copy buffers";
      return;
    }
    const double s = TimePerCall(
        o_.simulator ? 1 : 4, [&](int) { (void)b_.CopyOnDevice(dst->get(), src->get(), bytes); });
    if (s <= 0) {
      if (error_.empty()) error_ = "the device copy failed";
      return;
    }
    const double copy_bandwidth = 2.0 * bytes / s;
    // A read stream: y[1, n] = x W^T over bf16 W of `bytes` / 2 bytes (one copy: 1 GiB is far
    // past L2).
    const int64_t k = o_.simulator ? 256 : 8192;
    const int64_t n = static_cast<int64_t>(bytes / 2) / (2 * k);
    std::optional<DeviceBuffer> x = Alloc(k * 4, 0), y = Alloc(n * 4, 0);
    if (!x || !y) {
      error_ = "cannot allocate the GEMV vectors";
      return;
    }
    const double read_s = TimePerCall(o_.simulator ? 1 : 8, [&](int) {
      b_.Matmul({x->as<float>(), k, src->get(), DType::kBF16, nullptr, y->as<float>(), n, 1, n, k});
    });
    if (read_s <= 0) {
      if (error_.empty()) error_ = "the streaming GEMV failed";
      return;
    }
    const double read_bytes = 2.0 * n * k + 4.0 * k + 4.0 * n;
    bandwidth_ = std::max(copy_bandwidth, read_bytes / read_s);
    const std::string device = b_.description();
    if (o_.peak_tflops > 0) {
      tensor_ = o_.peak_tflops * 1e12;
      tensor_source_ = "--peak-tflops";
    } else if (device.find("H100") != std::string::npos ||
               device.find("H200") != std::string::npos ||
               device.find("GH200") != std::string::npos) {
      tensor_ = 989.4e12;
      tensor_source_ = "H100/H200 SXM dense bf16 spec";
    } else if (device.find("A100") != std::string::npos) {
      tensor_ = 312e12;
      tensor_source_ = "A100 dense bf16 spec";
    } else {
      tensor_ = 989.4e12;
      tensor_source_ = "unknown device: H100/H200's value assumed, set --peak-tflops";
    }
    std::printf(
        "Peaks: bandwidth %.0f GB/s (measured: the faster of a device-to-device copy of %zu MiB, "
        "read + write, %.0f GB/s, and a bf16 GEMV reading %.4g MiB of weights, %.0f GB/s); bf16 "
        "tensor %.0f TFLOP/s (%s)\n\n",
        bandwidth_ / 1e9, bytes >> 20, copy_bandwidth / 1e9, 2.0 * n * k / (1 << 20),
        read_bytes / read_s / 1e9, tensor_ / 1e12, tensor_source_.c_str());
    std::printf("| case | time | achieved | of peak | bound | target | verdict |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    Row("device copy (bandwidth reference)", s, 2.0 * bytes, 0, Target{});
    Row("bf16 GEMV read stream (bandwidth reference)", read_s, read_bytes, 2.0 * n * k, Target{});
  }

  /// Prints a case's row; `seconds` < 0 prints the error instead.
  /// `tensor_factor`: the case's tensor peak over the dense bf16 one (2 for FP8).
  void Row(const std::string& name, double seconds, double bytes, double flops, Target target,
           const std::string& note = "", double tensor_factor = 1.0) {
    if (seconds < 0) {
      std::printf("| %s | error | %s | - | - | - | - |\n", name.c_str(), error_.c_str());
      error_.clear();
      ++errors_;
      return;
    }
    const double t_mem = bytes / bandwidth_, t_flop = flops / (tensor_ * tensor_factor);
    const bool memory = t_mem >= t_flop;
    const double of_peak = std::max(t_mem, t_flop) / seconds;
    std::string achieved = absl::StrFormat("%.0f GB/s", bytes / seconds / 1e9);
    if (flops > 0) absl::StrAppendFormat(&achieved, ", %.1f TFLOP/s", flops / seconds / 1e12);
    if (!note.empty()) absl::StrAppend(&achieved, "; ", note);
    std::string want = "-", verdict = "-";
    if (target.kind != Target::kNone) {
      double got = of_peak;
      const char* what = memory ? "roofline (memory)" : "roofline (tensor)";
      if (target.kind == Target::kBandwidth) got = t_mem / seconds, what = "bandwidth peak";
      if (target.kind == Target::kFlops) got = t_flop / seconds, what = "tensor peak";
      want = absl::StrFormat(">= %.0f%% of %s", 100 * target.fraction, what);
      if (o_.simulator) {
        verdict = "- (simulator)";
      } else if (got >= target.fraction) {
        verdict = "met";
        ++met_;
      } else {
        verdict = absl::StrFormat("MISSED (%.0f%%)", 100 * got);
        ++missed_;
      }
    }
    std::printf("| %s | %.3f ms | %s | %.0f%% of peak (%s) | %s | %s | %s |\n", name.c_str(),
                seconds * 1e3, achieved.c_str(), 100 * of_peak, memory ? "bandwidth" : "tensor",
                memory ? "memory" : "compute", want.c_str(), verdict.c_str());
    std::fflush(stdout);
  }
  void Skip(const std::string& name, const std::string& why) {
    std::printf("| %s | skipped | %s | - | - | - | - |\n", name.c_str(), why.c_str());
  }

  int met() const { return met_; }
  int missed() const { return missed_; }
  int errors() const { return errors_; }
  Backend& backend() { return b_; }
  bool simulator() const { return o_.simulator; }

 private:
  Backend& b_;
  const Options& o_;
  const ModelShape& m_;
  double bandwidth_ = 1.0, tensor_ = 1.0;
  std::string tensor_source_, error_;
  int met_ = 0, missed_ = 0, errors_ = 0;
};

std::string Tokens(int64_t n) {
  return n >= 1024 && n % 1024 == 0 ? absl::StrCat(n / 1024, "k") : absl::StrCat(n);
}

/// A paged KV cache of `copies` identical pools (K and V, scales for int8/fp8) and block tables
/// that scatter each sequence's blocks over its pool in a random order, as a long-running pool
/// would.
struct PagedKv {
  cpu::PagedKvLayout layout;
  int64_t blocks_per_seq = 0, pool_bytes = 0, rows = 0;
  int copies = 1;
  DeviceBuffer k, v, k_scales, v_scales, tables, context_len, q_start, q_len;

  bool Make(Bench& bench, int64_t seqs, int64_t ctx, int64_t q_len_each, KvCacheDType dt,
            int want_copies) {
    const ModelShape& m = bench.model();
    Backend& b = bench.backend();
    layout = {m.kv_heads, m.head_dim, m.block_size, dt};
    blocks_per_seq = (ctx + m.block_size - 1) / m.block_size;
    const int64_t blocks = seqs * blocks_per_seq;
    rows = blocks * m.kv_heads * m.block_size;
    pool_bytes = rows * m.head_dim * KvCacheDTypeElemBytes(dt);
    const bool scaled = KvCacheDTypeHasScales(dt);
    copies = want_copies;
    auto alloc = [&](DeviceBuffer* out, size_t bytes, int fill) {
      std::optional<DeviceBuffer> buf = bench.Alloc(bytes, fill);
      if (buf) *out = std::move(*buf);
      return buf.has_value();
    };
    if (!alloc(&k, pool_bytes * copies, 0x11) || !alloc(&v, pool_bytes * copies, 0x11))
      return false;
    if (scaled &&
        (!alloc(&k_scales, rows * 4 * copies, 0) || !alloc(&v_scales, rows * 4 * copies, 0))) {
      return false;
    }
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    std::vector<int32_t> ctx_h(seqs, static_cast<int32_t>(ctx)), qs(seqs), ql(seqs, q_len_each);
    for (int64_t s = 0; s < seqs; ++s) qs[s] = static_cast<int32_t>(s * q_len_each);
    if (!alloc(&tables, blocks * 4, 0) || !alloc(&context_len, seqs * 4, 0) ||
        !alloc(&q_start, seqs * 4, 0) || !alloc(&q_len, seqs * 4, 0)) {
      return false;
    }
    (void)b.CopyToDevice(tables.get(), table.data(), blocks * 4);
    (void)b.CopyToDevice(context_len.get(), ctx_h.data(), seqs * 4);
    (void)b.CopyToDevice(q_start.get(), qs.data(), seqs * 4);
    (void)b.CopyToDevice(q_len.get(), ql.data(), seqs * 4);
    return true;
  }
  cpu::ConstKvCacheBuffer KCopy(int i) const { return Copy(k, k_scales, i); }
  cpu::ConstKvCacheBuffer VCopy(int i) const { return Copy(v, v_scales, i); }
  cpu::KvCacheBuffer KWrite(int i) const { return Mutable(KCopy(i)); }
  cpu::KvCacheBuffer VWrite(int i) const { return Mutable(VCopy(i)); }
  /// Bytes one full read of K and V (with scales) moves.
  double ReadBytes() const {
    return 2.0 * (pool_bytes + (KvCacheDTypeHasScales(layout.dtype) ? rows * 4.0 : 0.0));
  }

 private:
  cpu::ConstKvCacheBuffer Copy(const DeviceBuffer& data, const DeviceBuffer& scales, int i) const {
    cpu::ConstKvCacheBuffer out;
    out.data = data.as<uint8_t>() + (i % copies) * pool_bytes;
    out.scales = scales.get() == nullptr ? nullptr : scales.as<float>() + (i % copies) * rows;
    return out;
  }
  static cpu::KvCacheBuffer Mutable(const cpu::ConstKvCacheBuffer& c) {
    cpu::KvCacheBuffer out;
    out.data = const_cast<void*>(c.data);
    out.scales = const_cast<float*>(c.scales);
    return out;
  }
};

cpu::PagedAttentionArgs AttentionArgs(const ModelShape& m, const PagedKv& kv, int64_t seqs,
                                      const float* q, float* out, int copy) {
  cpu::PagedAttentionArgs a{};
  a.q = q;
  a.q_stride = m.heads * m.head_dim;
  a.out = out;
  a.out_stride = m.heads * m.head_dim;
  a.num_seqs = seqs;
  a.num_heads = m.heads;
  a.q_start = kv.q_start.as<int32_t>();
  a.q_len = kv.q_len.as<int32_t>();
  a.context_len = kv.context_len.as<int32_t>();
  a.block_tables = kv.tables.as<int32_t>();
  a.block_table_stride = kv.blocks_per_seq;
  a.k_cache = kv.KCopy(copy);
  a.v_cache = kv.VCopy(copy);
  a.layout = kv.layout;
  a.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  return a;
}

// ---- Attention ----------------------------------------------------------------------------------

/// Decode attention: `batch` sequences of `ctx` tokens, one query token each. Bytes: K and V
/// (scales included) + q and out (f32) + block tables; FLOPs: 4 * batch * heads * head_dim * ctx.
/// `kernel` kCudaCores runs the CUDA-core kernel where the backend would pick tensor cores (a
/// comparison row, named so).
void DecodeCase(Bench& bench, int64_t batch, int64_t ctx, KvCacheDType dt, Target target,
                DecodeKernel kernel = DecodeKernel::kAuto) {
  const ModelShape& m = bench.model();
  const std::string name =
      absl::StrCat("decode attention ", std::string(KvCacheDTypeName(dt)), " b", batch, " x ",
                   Tokens(ctx), kernel == DecodeKernel::kCudaCores ? " (CUDA cores)" : "");
  if (!bench.Wanted(name)) return;
  const int64_t qd = m.heads * m.head_dim;
  const double kv_bytes = 2.0 * batch * ctx * m.kv_heads * KvCacheDTypeVectorBytes(dt, m.head_dim);
  int copies = Bench::Rotations(kv_bytes);
  const double free = bench.FreeBytes();
  if (free > 0 && kv_bytes > 0.85 * free) {
    bench.Skip(name,
               absl::StrFormat("needs %.0f GB of KV, %.0f GB free", kv_bytes / 1e9, free / 1e9));
    return;
  }
  while (copies > 1 && free > 0 && copies * kv_bytes > 0.5 * free) --copies;
  PagedKv kv;
  std::optional<DeviceBuffer> q = bench.Alloc(batch * qd * 4, 0),
                              out = bench.Alloc(batch * qd * 4, 0);
  if (!q || !out || !kv.Make(bench, batch, ctx, 1, dt, copies)) {
    bench.Skip(name, "out of device memory");
    return;
  }
  Backend& b = bench.backend();
  AttentionPlan plan = b.PlanAttention({batch, m.heads, 1, ctx, kv.layout, ctx});
  plan.decode_kernel = kernel;
  const double bytes = kv.ReadBytes() + 2.0 * batch * qd * 4 + batch * kv.blocks_per_seq * 4.0;
  const double flops = 4.0 * batch * m.heads * m.head_dim * ctx;
  const double s = bench.TimePerCall(bench.CallsFor(bytes / 4.8e12, copies), [&](int i) {
    b.RunAttention(plan, AttentionArgs(m, kv, batch, q->as<float>(), out->as<float>(), i));
  });
  bench.Row(name, s, bytes, flops, target, absl::StrCat(plan.num_splits, " splits"));
}

/// Prefill attention, one sequence of `len` prompt tokens (causal). Bytes: K, V, q, out once;
/// FLOPs: 2 * heads * head_dim * len * (len + 1) (QK^T and PV over the causal triangle).
void PrefillCase(Bench& bench, int64_t len, KvCacheDType dt, Target target) {
  const ModelShape& m = bench.model();
  const std::string name = absl::StrCat("prefill attention ", std::string(KvCacheDTypeName(dt)),
                                        " ", Tokens(len), " tokens");
  if (!bench.Wanted(name)) return;
  const int64_t qd = m.heads * m.head_dim;
  PagedKv kv;
  std::optional<DeviceBuffer> q = bench.Alloc(len * qd * 4, 0), out = bench.Alloc(len * qd * 4, 0);
  if (!q || !out || !kv.Make(bench, 1, len, len, dt, 1)) {
    bench.Skip(name, "out of device memory");
    return;
  }
  Backend& b = bench.backend();
  const AttentionPlan plan = b.PlanAttention({1, m.heads, len, len, kv.layout, len});
  const double bytes = kv.ReadBytes() + 2.0 * len * qd * 4 + kv.blocks_per_seq * 4.0;
  const double flops = 2.0 * m.heads * m.head_dim * len * (len + 1);
  const double s = bench.TimePerCall(bench.CallsFor(flops / 989e12, 1), [&](int) {
    b.RunAttention(plan, AttentionArgs(m, kv, 1, q->as<float>(), out->as<float>(), 0));
  });
  bench.Row(name, s, bytes, flops, target);
}

// ---- GEMMs and the small ops --------------------------------------------------------------------

/// `rows` sampling rows as a serving engine sends them: row r samples logits row r with
/// top-k 64, top-p 0.9 at temperature 1, its uniform climbing through [0, 1).
std::vector<SampleRowParams> SampleParams(int64_t rows) {
  std::vector<SampleRowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r] = {.row = r, .uniform = (r + 0.5) / rows, .top_p = 0.9f, .top_k = 64};
  }
  return params;
}

/// y[m, n] = x[m, k] W[n, k]^T through the backend. bf16 weights: f32 x converted to bf16
/// inside, f32 y; bytes W (bf16) + x + y (f32). `fp8`: FP8 E4M3 weights with row scales
/// (DType::kF8E4M3), bf16 x and y as the model passes them (x quantized per row, then the FP8
/// GEMV at m <= 8 or cuBLASLt's FP8 GEMM); bytes W (1 a weight) + its scales + x + y (bf16), and
/// the FLOPs against the FP8 tensor peak (twice the bf16 one). FLOPs: 2 m n k.
void GemmCase(Bench& bench, const char* what, int64_t m, int64_t n, int64_t k, Target target,
              bool fp8 = false) {
  const std::string name =
      absl::StrCat("GEMM ", fp8 ? "fp8 " : "", what, " m", m, " n", n, " k", k);
  if (!bench.Wanted(name)) return;
  const double w_bytes = (fp8 ? 1.0 : 2.0) * n * k;
  const int64_t act = fp8 ? 2 : 4;  // bytes of an x or y element
  const int copies = Bench::Rotations(w_bytes);
  // bf16 weights 0x3c3c; FP8 codes 0x38 (1.0) with scales of bytes 0x39 (1.8e-4 each); x zero.
  std::optional<DeviceBuffer> x = bench.Alloc(m * k * act, 0), y = bench.Alloc(m * n * act, 0),
                              w = bench.Alloc(static_cast<size_t>(w_bytes) * copies,
                                              fp8 ? 0x38 : 0x3c),
                              scales = bench.Alloc(n * 4, 0x39);
  if (!x || !y || !w || !scales) {
    bench.Skip(name, "out of device memory");
    return;
  }
  const double bytes = w_bytes + (fp8 ? 4.0 * n : 0.0) + act * (m * k + m * n);
  const double flops = 2.0 * m * n * k;
  Backend& b = bench.backend();
  const double s = bench.TimePerCall(
      bench.CallsFor(std::max(bytes / 4.8e12, flops / (fp8 ? 1979e12 : 989e12)), copies),
      [&](int i) {
        const uint8_t* wi = w->as<uint8_t>() + static_cast<size_t>(w_bytes) * (i % copies);
        const DType wt = fp8 ? DType::kF8E4M3 : DType::kBF16;
        cpu::MatmulArgs a{x->as<float>(), k, wi, wt, nullptr, y->as<float>(), n, m, n, k};
        if (fp8) {
          a.w_scale = scales->as<float>();
          a.x_dtype = DType::kBF16;
          a.y_dtype = DType::kBF16;
        }
        b.Matmul(a);
      });
  bench.Row(name, s, bytes, flops, target, "", fp8 ? 2.0 : 1.0);
}

/// The serving GEMMs of one layer and the LM head (the model runs q, k, v, gate and up as
/// separate GEMMs).
void GemmCases(Bench& bench, int64_t m) {
  const ModelShape& s = bench.model();
  const int64_t qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  const Target t{Target::kRoofline, 0.70};
  struct Part {
    const char* what;
    int64_t n, k;
  };
  const Part parts[] = {{"q", qd, s.hidden},       {"k/v", kvd, s.hidden},
                        {"o", s.hidden, qd},       {"gate/up", s.ffn, s.hidden},
                        {"down", s.hidden, s.ffn}, {"lm_head", s.vocab, s.hidden}};
  // FP8 weights (--quantization fp8) take the same shapes but the LM head, which stays bf16.
  for (bool fp8 : {false, true}) {
    for (const Part& p : parts) {
      if (!fp8 || std::string_view(p.what) != "lm_head")
        GemmCase(bench, p.what, m, p.n, p.k, t, fp8);
    }
  }
}

/// RMSNorm with the residual add, SiLU-mul, RoPE + KV write and sampling at `rows` tokens.
void SmallOpCases(Bench& bench, int64_t rows) {
  const ModelShape& m = bench.model();
  Backend& b = bench.backend();
  const int64_t qd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
  const Target none{};
  std::string name = absl::StrCat("rmsnorm + residual ", rows, " x ", m.hidden);
  if (bench.Wanted(name)) {
    const int copies = Bench::Rotations(16.0 * rows * m.hidden);
    std::optional<DeviceBuffer> x = bench.Alloc(rows * m.hidden * 4 * copies, 0),
                                r = bench.Alloc(rows * m.hidden * 4 * copies, 0),
                                y = bench.Alloc(rows * m.hidden * 4 * copies, 0),
                                w = bench.Alloc(m.hidden * 4, 0);
    if (x && r && y && w) {
      const double bytes = 16.0 * rows * m.hidden + 4.0 * m.hidden;  // x, r read; x, y written
      const double s = bench.TimePerCall(bench.CallsFor(bytes / 4.8e12, copies), [&](int i) {
        const int64_t o = (i % copies) * rows * m.hidden;
        b.RmsNorm({x->as<float>() + o, r->as<float>() + o, w->as<float>(), y->as<float>() + o, rows,
                   m.hidden, 1e-5f, m.hidden, m.hidden, m.hidden});
      });
      bench.Row(name, s, bytes, 4.0 * rows * m.hidden, none);
    }
  }
  name = absl::StrCat("silu*mul ", rows, " x ", m.ffn);
  if (bench.Wanted(name)) {
    const int copies = Bench::Rotations(12.0 * rows * m.ffn);
    std::optional<DeviceBuffer> gate = bench.Alloc(rows * m.ffn * 4 * copies, 0),
                                up = bench.Alloc(rows * m.ffn * 4 * copies, 0);
    if (gate && up) {
      const double bytes = 12.0 * rows * m.ffn;  // gate, up read; out (over gate) written
      const double s = bench.TimePerCall(bench.CallsFor(bytes / 4.8e12, copies), [&](int i) {
        const int64_t o = (i % copies) * rows * m.ffn;
        float* g = gate->as<float>() + o;
        b.SiluMul({g, up->as<float>() + o, g, rows, m.ffn, m.ffn, m.ffn, m.ffn});
      });
      bench.Row(name, s, bytes, 4.0 * rows * m.ffn, none);
    }
  }
  name = absl::StrCat("rope + kv write bf16 ", rows, " tokens");
  if (bench.Wanted(name)) {
    PagedKv kv;
    std::optional<DeviceBuffer> q = bench.Alloc(rows * qd * 4, 0),
                                k = bench.Alloc(rows * kvd * 4, 0),
                                v = bench.Alloc(rows * kvd * 4, 0), pos = bench.Alloc(rows * 4, 0),
                                slots = bench.Alloc(rows * 8, 0),
                                freq = bench.Alloc(m.head_dim * 2, 0);
    if (q && k && v && pos && slots && freq && kv.Make(bench, rows, 1, 1, KvCacheDType::kBF16, 1)) {
      std::vector<int64_t> slot(rows);
      for (int64_t t = 0; t < rows; ++t) slot[t] = t * m.block_size;  // one block per token
      (void)b.CopyToDevice(slots->get(), slot.data(), rows * 8);
      RopeKvWriteArgs a{};
      a.q = q->as<float>(), a.k = k->as<float>(), a.v = v->as<float>();
      a.num_tokens = rows, a.num_heads = m.heads;
      a.q_stride = qd, a.k_stride = kvd, a.v_stride = kvd;
      a.positions = pos->as<int32_t>(), a.inv_freq = freq->as<float>();
      a.rope_layout = cpu::RopeLayout::kHalfSplit;
      a.slot_mapping = slots->as<int64_t>();
      a.layout = kv.layout, a.k_cache = kv.KWrite(0), a.v_cache = kv.VWrite(0);
      // q and k read and written, v read (f32); k and v written to the cache (bf16).
      const double bytes = 4.0 * rows * (2 * qd + 3 * kvd) + 2.0 * 2 * rows * kvd + 12.0 * rows;
      const double s =
          bench.TimePerCall(bench.CallsFor(bytes / 4.8e12, 1), [&](int) { b.RopeKvWrite(a); });
      bench.Row(name, s, bytes, 0, none);
    }
  }
  name = absl::StrCat("top-k/top-p sampling ", rows, " x ", m.vocab);
  if (bench.Wanted(name)) {
    // One read of the logits counted; the radix selection reads them twice (the second read
    // may come from L2), a fully masked row four times.
    std::vector<float> logits_h(rows * m.vocab);
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    for (float& l : logits_h) l = dist(rng);
    const std::vector<SampleRowParams> params = SampleParams(rows);
    const int64_t params_bytes = rows * static_cast<int64_t>(sizeof(SampleRowParams));
    std::optional<DeviceBuffer> logits = bench.Alloc(rows * m.vocab * 4, 0),
                                dp = bench.Alloc(params_bytes, 0), ids = bench.Alloc(rows * 4, 0);
    if (logits && dp && ids) {
      (void)b.CopyToDevice(logits->get(), logits_h.data(), rows * m.vocab * 4);
      (void)b.CopyToDevice(dp->get(), params.data(), params_bytes);
      const double bytes = 4.0 * rows * m.vocab;
      const double s = bench.TimePerCall(bench.CallsFor(bytes / 4.8e12, 1), [&](int) {
        b.SampleTopKTopP({logits->as<float>(), m.vocab, m.vocab, dp->as<SampleRowParams>(), rows,
                          ids->as<int32_t>()});
      });
      bench.Row(name, s, bytes, 0, none);
    }
  }
}

// ---- Decode steps: eager vs graph ---------------------------------------------------------------

/// The weights of the model, one copy per layer (bf16), and the LM head.
struct StepWeights {
  struct Layer {
    DeviceBuffer wq, wk, wv, wo, gate, up, down;
  };
  std::vector<Layer> layers;
  DeviceBuffer lm_head, norm, inv_freq;
  double bytes = 0, params = 0;

  bool Make(Bench& bench) {
    const ModelShape& m = bench.model();
    const int64_t qd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
    auto matrix = [&](DeviceBuffer* out, int64_t rows, int64_t cols) {
      std::optional<DeviceBuffer> buf = bench.Alloc(rows * cols * 2, 0x3c);
      if (buf) *out = std::move(*buf);
      bytes += 2.0 * rows * cols;
      params += static_cast<double>(rows) * cols;
      return buf.has_value();
    };
    layers.resize(m.layers);
    for (Layer& l : layers) {
      if (!matrix(&l.wq, qd, m.hidden) || !matrix(&l.wk, kvd, m.hidden) ||
          !matrix(&l.wv, kvd, m.hidden) || !matrix(&l.wo, m.hidden, qd) ||
          !matrix(&l.gate, m.ffn, m.hidden) || !matrix(&l.up, m.ffn, m.hidden) ||
          !matrix(&l.down, m.hidden, m.ffn)) {
        return false;
      }
    }
    std::optional<DeviceBuffer> n = bench.Alloc(m.hidden * 4, 0),
                                f = bench.Alloc(m.head_dim * 2, 0);
    if (!n || !f || !matrix(&lm_head, m.vocab, m.hidden)) return false;
    norm = std::move(*n);
    inv_freq = std::move(*f);
    return true;
  }
};

/// One decode step of `batch` sequences at context `ctx`, through the backend's ops as the model
/// queues them: per layer RMSNorm, q/k/v GEMMs, RoPE + KV write, attention, o GEMM, RMSNorm with
/// the residual, gate/up GEMMs, SiLU-mul, down GEMM; then the final norm, the LM head and
/// top-k/top-p sampling.
class DecodeStep {
 public:
  DecodeStep(Bench& bench, const StepWeights& w) : bench_(bench), w_(w), m_(bench.model()) {}

  /// false: did not fit (the reason in *why).
  bool Make(int64_t batch, int64_t ctx, std::string* why) {
    batch_ = batch;
    ctx_ = ctx;
    const double layer_kv = 2.0 * batch * ctx * m_.kv_heads * m_.head_dim * 2;
    const double free = bench_.FreeBytes();
    // Every layer its own KV when it fits (as served); else one pool that all layers read.
    int copies = static_cast<int>(m_.layers);
    if (free > 0 && layer_kv * copies > 0.6 * free) copies = 1;
    shared_kv_ = copies == 1 && m_.layers > 1;
    if (free > 0 && layer_kv > 0.6 * free) {
      *why = absl::StrFormat("needs %.0f GB of KV per layer", layer_kv / 1e9);
      return false;
    }
    const int64_t qd = m_.heads * m_.head_dim, kvd = m_.kv_heads * m_.head_dim;
    auto alloc = [&](DeviceBuffer* out, size_t bytes) {
      std::optional<DeviceBuffer> buf = bench_.Alloc(bytes, 0);
      if (buf) *out = std::move(*buf);
      return buf.has_value();
    };
    if (!kv_.Make(bench_, batch, ctx, 1, KvCacheDType::kBF16, copies) ||
        !alloc(&hidden_, batch * m_.hidden * 4) || !alloc(&delta_, batch * m_.hidden * 4) ||
        !alloc(&normed_, batch * m_.hidden * 4) || !alloc(&q_, batch * qd * 4) ||
        !alloc(&k_, batch * kvd * 4) || !alloc(&v_, batch * kvd * 4) ||
        !alloc(&attn_, batch * qd * 4) || !alloc(&gate_, batch * m_.ffn * 4) ||
        !alloc(&up_, batch * m_.ffn * 4) || !alloc(&logits_, batch * m_.vocab * 4) ||
        !alloc(&uniforms_, batch * static_cast<int64_t>(sizeof(SampleRowParams))) ||
        !alloc(&ids_, batch * 4) || !alloc(&positions_, batch * 4) || !alloc(&slots_, batch * 8)) {
      *why = "out of device memory";
      return false;
    }
    // The new token of each sequence is its last (position ctx - 1), in its last block.
    std::vector<int32_t> table(batch * kv_.blocks_per_seq),
        pos(batch, static_cast<int32_t>(ctx - 1));
    Backend& b = bench_.backend();
    (void)b.CopyToHost(table.data(), kv_.tables.get(), table.size() * 4);
    std::vector<int64_t> slot(batch);
    for (int64_t s = 0; s < batch; ++s) {
      slot[s] = int64_t{table[s * kv_.blocks_per_seq + (ctx - 1) / m_.block_size]} * m_.block_size +
                (ctx - 1) % m_.block_size;
    }
    (void)b.CopyToDevice(positions_.get(), pos.data(), batch * 4);
    (void)b.CopyToDevice(slots_.get(), slot.data(), batch * 8);
    const std::vector<SampleRowParams> params = SampleParams(batch);
    (void)b.CopyToDevice(uniforms_.get(), params.data(), params.size() * sizeof(SampleRowParams));
    plan_ = b.PlanAttention({batch, m_.heads, 1, ctx, kv_.layout, ctx});
    return true;
  }

  /// Queues one step.
  void Run() {
    Backend& b = bench_.backend();
    const int64_t B = batch_, h = m_.hidden, qd = m_.heads * m_.head_dim;
    const int64_t kvd = m_.kv_heads * m_.head_dim;
    auto gemm = [&](const float* x, const DeviceBuffer& w, float* y, int64_t n, int64_t k) {
      b.Matmul({x, k, w.get(), DType::kBF16, nullptr, y, n, B, n, k});
    };
    auto norm = [&](const float* residual) {
      b.RmsNorm({hidden_.as<float>(), residual, w_.norm.as<float>(), normed_.as<float>(), B, h,
                 1e-5f, h, h, h});
    };
    for (int64_t l = 0; l < m_.layers; ++l) {
      const StepWeights::Layer& w = w_.layers[l];
      norm(l == 0 ? nullptr : delta_.as<float>());
      gemm(normed_.as<float>(), w.wq, q_.as<float>(), qd, h);
      gemm(normed_.as<float>(), w.wk, k_.as<float>(), kvd, h);
      gemm(normed_.as<float>(), w.wv, v_.as<float>(), kvd, h);
      RopeKvWriteArgs r{};
      r.q = q_.as<float>(), r.k = k_.as<float>(), r.v = v_.as<float>();
      r.num_tokens = B, r.num_heads = m_.heads;
      r.q_stride = qd, r.k_stride = kvd, r.v_stride = kvd;
      r.positions = positions_.as<int32_t>(), r.inv_freq = w_.inv_freq.as<float>();
      r.rope_layout = cpu::RopeLayout::kHalfSplit;
      r.slot_mapping = slots_.as<int64_t>();
      r.layout = kv_.layout;
      r.k_cache = kv_.KWrite(static_cast<int>(l)), r.v_cache = kv_.VWrite(static_cast<int>(l));
      b.RopeKvWrite(r);
      b.RunAttention(
          plan_, AttentionArgs(m_, kv_, B, q_.as<float>(), attn_.as<float>(), static_cast<int>(l)));
      gemm(attn_.as<float>(), w.wo, delta_.as<float>(), h, qd);
      norm(delta_.as<float>());
      gemm(normed_.as<float>(), w.gate, gate_.as<float>(), m_.ffn, h);
      gemm(normed_.as<float>(), w.up, up_.as<float>(), m_.ffn, h);
      b.SiluMul({gate_.as<float>(), up_.as<float>(), gate_.as<float>(), B, m_.ffn, m_.ffn, m_.ffn,
                 m_.ffn});
      gemm(gate_.as<float>(), w.down, delta_.as<float>(), h, m_.ffn);
    }
    norm(delta_.as<float>());
    gemm(normed_.as<float>(), w_.lm_head, logits_.as<float>(), m_.vocab, h);
    b.SampleTopKTopP({logits_.as<float>(), m_.vocab, m_.vocab, uniforms_.as<SampleRowParams>(), B,
                      ids_.as<int32_t>()});
  }

  /// Bytes a step must move: every weight once, every layer's KV, the logits written and read.
  double Bytes() const {
    return w_.bytes + m_.layers * 2.0 * batch_ * ctx_ * m_.kv_heads * m_.head_dim * 2 +
           2.0 * 4 * batch_ * m_.vocab;
  }
  double Flops() const {
    return 2.0 * batch_ * w_.params + 4.0 * m_.layers * batch_ * m_.heads * m_.head_dim * ctx_;
  }
  bool shared_kv() const { return shared_kv_; }

 private:
  Bench& bench_;
  const StepWeights& w_;
  const ModelShape& m_;
  int64_t batch_ = 0, ctx_ = 0;
  bool shared_kv_ = false;
  PagedKv kv_;
  AttentionPlan plan_;
  DeviceBuffer hidden_, delta_, normed_, q_, k_, v_, attn_, gate_, up_, logits_, uniforms_, ids_,
      positions_, slots_;
};

/// Seconds per step: eager (every op launched from the host, then a sync) and replayed from a
/// graph captured after a warm-up step. {-1, -1} on error.
std::pair<double, double> TimeStep(Bench& bench, DecodeStep& step) {
  Backend& b = bench.backend();
  const int reps = bench.reps();
  step.Run();  // warm-up: scratch buffers are sized here, before the capture
  if (!bench.Check()) return {-1, -1};
  double eager = 1e30, graph = -1;
  for (int r = 0; r < reps; ++r) {
    const Clock::time_point t0 = Clock::now();
    step.Run();
    if (!bench.Check()) return {-1, -1};
    eager = std::min(eager, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (!b.supports_graphs() || !b.BeginCapture().ok()) return {eager, -1};
  step.Run();
  absl::StatusOr<int> g = b.EndCapture();
  if (!g.ok()) return {eager, bench.Fail(g.status())};
  graph = 1e30;
  for (int r = -1; r < reps; ++r) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = b.LaunchGraph(*g); !s.ok()) return {eager, bench.Fail(s)};
    if (!bench.Check()) return {eager, -1};
    if (r >= 0) graph = std::min(graph, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  b.DestroyGraph(*g);
  return {eager, graph};
}

void StepCases(Bench& bench, const std::vector<std::pair<int64_t, int64_t>>& points) {
  const ModelShape& m = bench.model();
  std::vector<std::pair<int64_t, int64_t>> wanted;
  for (const auto& [batch, ctx] : points) {
    if (bench.Wanted(absl::StrCat("decode step b", batch, " x ", Tokens(ctx)))) {
      wanted.push_back({batch, ctx});
    }
  }
  if (wanted.empty()) return;
  StepWeights weights;
  if (!weights.Make(bench)) {
    bench.Skip(absl::StrCat("decode step (", m.layers, " layers)"), "weights do not fit");
    return;
  }
  for (const auto& [batch, ctx] : wanted) {
    const std::string name = absl::StrCat("decode step b", batch, " x ", Tokens(ctx));
    DecodeStep step(bench, weights);
    std::string why;
    if (!step.Make(batch, ctx, &why)) {
      bench.Skip(name, why);
      continue;
    }
    const auto [eager, graph] = TimeStep(bench, step);
    const std::string layers =
        absl::StrCat(m.layers, " layers", step.shared_kv() ? ", one KV pool for all layers" : "");
    bench.Row(absl::StrCat(name, " eager (", layers, ")"), eager, step.Bytes(), step.Flops(),
              Target{});
    const std::string graph_name = absl::StrCat(name, " graph (", layers, ")");
    if (graph < 0 && bench.error().empty()) {
      bench.Skip(graph_name, eager < 0 ? "the eager step failed" : "the backend has no graphs");
      continue;
    }
    const Target target = batch <= 64 ? Target{Target::kRoofline, 0.60} : Target{};
    bench.Row(graph_name, graph, step.Bytes(), step.Flops(), target,
              graph > 0 && eager > 0 ? absl::StrFormat("%.2fx eager's speed", eager / graph) : "");
  }
}

// ---- The run ------------------------------------------------------------------------------------

bool IsTargetPoint(int64_t batch, int64_t ctx) {
  return (batch == 64 && ctx == 4096) || (batch == 1 && ctx == 32768);
}

int Main(const Options& o) {
  BackendOptions options;
  options.enable_graphs = true;
  options.simulator = o.simulator;
  absl::StatusOr<std::unique_ptr<Backend>> loaded = LoadCudaBackend(options);
  if (!loaded.ok()) {
    std::printf("no CUDA device: %s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const ModelShape& m = o.simulator ? kTiny : kLlama3_8B;
  const Grid grid = o.simulator ? TinyGrid() : o.grid ? FullGrid() : DefaultGrid();
  Bench bench(**loaded, o, m);
  std::printf("# CUDA kernel benchmark\n\nDevice: %s\n", (*loaded)->description().c_str());
  std::printf(
      "Shape: %s (%lld layers, hidden %lld, %lld heads / %lld KV heads, head_dim %lld, "
      "FFN %lld, vocabulary %lld, %lld-token KV blocks); %s run%s\n",
      m.name, static_cast<long long>(m.layers), static_cast<long long>(m.hidden),
      static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads),
      static_cast<long long>(m.head_dim), static_cast<long long>(m.ffn),
      static_cast<long long>(m.vocab), static_cast<long long>(m.block_size),
      o.grid ? "full grid" : "default", o.simulator ? " on the CUDA simulator" : "");
  bench.MeasurePeaks();
  if (!bench.error().empty()) {
    std::printf("CUDA error: %s\n", bench.error().c_str());
    return 1;
  }
  const Target decode_target{Target::kBandwidth, 0.85};
  std::vector<std::pair<int64_t, int64_t>> decode = grid.decode_points;
  for (int64_t batch : grid.decode_batches) {
    for (int64_t ctx : grid.decode_contexts) decode.push_back({batch, ctx});
  }
  for (KvCacheDType dt : {KvCacheDType::kBF16, KvCacheDType::kFp8E4M3, KvCacheDType::kInt8}) {
    for (const auto& [batch, ctx] : decode) {
      const bool target = IsTargetPoint(batch, ctx);
      // int8 only at the target points: the grid is bf16 and fp8.
      if (dt == KvCacheDType::kInt8 && !target && !o.simulator) continue;
      DecodeCase(bench, batch, ctx, dt, target ? decode_target : Target{});
      // At the target points (and every point of the simulator's smoke run), the CUDA-core kernel
      // the tensor-core one replaced, for comparison.
      if (target || o.simulator)
        DecodeCase(bench, batch, ctx, dt, Target{}, DecodeKernel::kCudaCores);
    }
  }
  for (int64_t len : grid.prefill_tokens) {
    PrefillCase(bench, len, KvCacheDType::kBF16,
                len == 4096 ? Target{Target::kFlops, 0.50} : Target{});
  }
  for (int64_t rows : grid.gemm_m) GemmCases(bench, rows);
  for (int64_t rows : grid.small_rows) SmallOpCases(bench, rows);
  StepCases(bench, grid.steps);
  std::printf("\ntargets: %d met, %d missed%s; %d error(s)\n", bench.met(), bench.missed(),
              o.simulator ? " (not judged on the simulator)" : "", bench.errors());
  return bench.errors() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--grid") {
      o.grid = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--simulator") {
      o.simulator = true;
    } else if (a == "--filter" && i + 1 < argc) {
      o.filter = argv[++i];
    } else if (a == "--peak-tflops" && i + 1 < argc) {
      o.peak_tflops = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: cuda_kernels_bench [--grid] [--quick] [--filter TEXT] "
                   "[--peak-tflops X] [--simulator]\n");
      return 2;
    }
  }
  return kvserve::Main(o);
}
