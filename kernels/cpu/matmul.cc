#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul_fp8.h"
#include "kernels/cpu/matmul_impl.h"

namespace kvserve::cpu {
namespace {

// Below this many multiply-adds per chunk, another thread costs more than it saves.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 16;
// Pieces handed out per thread: enough that a thread slowed by the rest of the machine (or a
// short last piece) leaves little idle time on the others, few enough that claiming one (an
// atomic add) stays negligible.
constexpr int64_t kPiecesPerThread = 4;
// Piece sizes are a multiple of this many columns so the int8 decode tiles stay whole
// (matmul_int8.inc: 8 columns; packed weights: whole groups of kPackedGroupRows). The float
// panels (matmul_panel.inc: 16 or 24 columns) take any width, ending in narrower tiles.
constexpr int64_t kColumnGrain = 8;
// Batched float matmuls (the panel path) with at least this many x rows per thread also split
// the rows into one group per thread (RowGroups).
constexpr int64_t kMinRowsPerGroup = 12;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Row groups for a multi-threaded call: one per thread for float weights (the panel path) with at
// least kMinRowsPerGroup rows per thread, else 1 (quantized weights keep whole-batch pieces: their
// int8 activations are made once per call for all rows).
int64_t RowGroups(const MatmulArgs& args, int threads) {
  const bool float_weights =
      args.w_dtype == DType::kF32 || args.w_dtype == DType::kF16 || args.w_dtype == DType::kBF16;
  const bool f32_rows = args.x_dtype == DType::kF32 && args.y_dtype == DType::kF32;
  if (!float_weights || !f32_rows || args.w_packed || args.m < kMinRowsPerGroup * threads) {
    return 1;
  }
  return threads;
}

internal::MatmulColumnsFn SelectIsaPath(CpuIsa isa, DType w_dtype) {
  switch (isa) {
    case CpuIsa::kAvx512:
      if (internal::UsesInt8Activations(w_dtype) && CpuAvx512VnniEnabled()) {
        return &internal::MatmulColumnsAvx512Vnni;
      }
      if (w_dtype == DType::kBF16 && CpuAvx512Bf16Enabled()) {
        return &internal::MatmulColumnsAvx512Bf16;
      }
      return &internal::MatmulColumnsAvx512;
    case CpuIsa::kAvx2:
      return &internal::MatmulColumnsAvx2;
    case CpuIsa::kScalar:
      break;
  }
  return &internal::MatmulColumnsScalar;
}

// The path a packed float matrix (packed_weights.h) is laid out for: packed bf16 for
// vdpbf16ps, packed f32 for the avx512 path's FMAs; null for the other dtypes, whose packed
// layouts every SIMD path reads.
internal::MatmulColumnsFn PackedFloatPath(DType w_dtype) {
  if (w_dtype == DType::kBF16) return &internal::MatmulColumnsAvx512Bf16;
  if (w_dtype == DType::kF32) return &internal::MatmulColumnsAvx512;
  return nullptr;
}

internal::MatmulColumnsFn SelectPath(CpuIsa isa, DType w_dtype, bool w_packed = false) {
  const internal::MatmulColumnsFn path = SelectIsaPath(isa, w_dtype);
  // A packed float matrix off the path it is laid out for goes to the scalar path, which
  // unpacks its rows.
  const internal::MatmulColumnsFn packed_for = PackedFloatPath(w_dtype);
  if (w_packed && packed_for != nullptr && path != packed_for) {
    return &internal::MatmulColumnsScalar;
  }
  return path;
}

// Per-thread buffers for the int8 activations (grown on demand, kept between calls).
struct ActivationBuffers {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sums;
  std::vector<int32_t> offsets;
};

}  // namespace

namespace internal {

void QuantizeActivationRow(const float* x, int64_t k, int64_t scale_block, int8_t* q, float* d,
                           int32_t* sums) {
  // Adding and subtracting 1.5 * 2^23 rounds |v| <= 127.5 to the nearest integer, ties to even,
  // in plain IEEE arithmetic (no dependence on the rounding-mode of lrint or its speed).
  constexpr float kRound = 12582912.0f;
  for (int64_t b = 0; b < k / scale_block; ++b) {
    const float* xb = x + b * scale_block;
    // Eight independent running maxima (max is exact, so any grouping gives the same amax),
    // which the compiler can keep in one vector register instead of a serial chain.
    float lane_max[8] = {};
    for (int64_t j = 0; j < scale_block; j += 8) {
      for (int l = 0; l < 8; ++l) lane_max[l] = std::max(lane_max[l], std::fabs(xb[j + l]));
    }
    float amax = 0.0f;
    for (float m : lane_max) amax = std::max(amax, m);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = 0; j < scale_block; ++j) {
      const float v = (xb[j] * inv + kRound) - kRound;
      q[b * scale_block + j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
    d[b] = amax / 127.0f;
  }
  for (int64_t s = 0; s < k / kActBlock; ++s) {
    int32_t sum = 0;
    for (int j = 0; j < kActBlock; ++j) sum += q[s * kActBlock + j];
    sums[s] = sum;
  }
}

void Q6OffsetRow(const int8_t* q, int64_t k, int32_t* offsets) {
  for (int64_t s = 0; s < k / 16; ++s) {
    int32_t word[2] = {0, 0};
    for (int e = 0; e < 16; ++e) word[e % 4 / 2] += q[16 * s + e];
    offsets[s] = static_cast<int32_t>((static_cast<uint32_t>(32 * word[0]) & 0xffff) |
                                      static_cast<uint32_t>(32 * word[1]) << 16);
  }
}

bool RoundsXToBf16(DType w_dtype) {
  return SelectPath(ActiveCpuIsa(), w_dtype) == &MatmulColumnsAvx512Bf16;
}

bool RunsPackedFloat(DType w_dtype) {
  const MatmulColumnsFn packed_for = PackedFloatPath(w_dtype);
  return packed_for != nullptr && SelectPath(ActiveCpuIsa(), w_dtype) == packed_for;
}

}  // namespace internal

void Matmul(const MatmulArgs& args, ThreadPool* pool) {
  if (args.m <= 0 || args.n <= 0) return;
  if (args.w_dtype == DType::kF8E4M3) {
    MatmulFp8(args, pool);
    return;
  }
  static std::atomic<uint64_t> calls{0};
  internal::MatmulPlan plan;
  plan.w_row_bytes = DTypeRowBytes(args.w_dtype, args.k);
  plan.call_id = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const internal::MatmulColumnsFn columns = SelectPath(ActiveCpuIsa(), args.w_dtype, args.w_packed);
  plan.amx = args.w_packed && columns == &internal::MatmulColumnsAvx512Bf16 && CpuAmxBf16Enabled();
  if (internal::UsesInt8Activations(args.w_dtype)) {
    thread_local ActivationBuffers act;
    const int64_t scale_block = internal::ActivationScaleBlock(args.w_dtype);
    plan.xq_stride = RoundUp(args.k, 64);
    plan.xd_stride = args.k / scale_block;
    plan.xs_stride = args.k / internal::kActBlock;
    act.q.resize(static_cast<size_t>(args.m * plan.xq_stride));
    act.d.resize(static_cast<size_t>(args.m * plan.xd_stride));
    act.sums.resize(static_cast<size_t>(args.m * plan.xs_stride));
    const auto quantize = ActiveCpuIsa() == CpuIsa::kScalar ? &internal::QuantizeActivationRow
                                                            : &internal::QuantizeActivationRowAvx2;
    for (int64_t i = 0; i < args.m; ++i) {
      quantize(args.x + i * args.x_stride, args.k, scale_block, act.q.data() + i * plan.xq_stride,
               act.d.data() + i * plan.xd_stride, act.sums.data() + i * plan.xs_stride);
    }
    plan.xq = act.q.data();
    plan.xd = act.d.data();
    plan.xs = act.sums.data();
    // The SIMD q6_k tiles' offsets (the scalar path subtracts 32 from each quant instead).
    if (args.w_packed && args.w_dtype == DType::kQ6_K &&
        columns != &internal::MatmulColumnsScalar) {
      plan.xo_stride = args.k / 16;
      act.offsets.resize(static_cast<size_t>(args.m * plan.xo_stride));
      for (int64_t i = 0; i < args.m; ++i) {
        internal::Q6OffsetRow(plan.xq + i * plan.xq_stride, args.k,
                              act.offsets.data() + i * plan.xo_stride);
      }
      plan.xo = act.offsets.data();
    }
  }

  const int64_t column_grain = args.w_packed ? kPackedGroupRows : kColumnGrain;
  const int64_t macs_per_column = std::max<int64_t>(1, args.m * args.k);
  const int64_t min_chunk =
      RoundUp((kMinMacsPerChunk + macs_per_column - 1) / macs_per_column, column_grain);
  if (pool == nullptr || pool->num_threads() == 1 || min_chunk * 2 > args.n) {
    plan.weight_streams = 2;
    columns(args, plan, 0, args.n);
    return;
  }
  // Every output element is computed whole by one thread in an order fixed by k, so which
  // thread takes which piece cannot change the result: balance the load dynamically.
  const int64_t grain =
      std::max(min_chunk, RoundUp((args.n + pool->num_threads() * kPiecesPerThread - 1) /
                                      (pool->num_threads() * kPiecesPerThread),
                                  column_grain));
  const int64_t groups = RowGroups(args, pool->num_threads());
  if (groups == 1) {
    pool->ParallelForDynamic(args.n, grain,
                             [&](int64_t begin, int64_t end) { columns(args, plan, begin, end); });
    return;
  }
  // Pieces of columns times groups of rows. Each thread starts on a group of its own and claims
  // that group's pieces in order, then helps with the other groups' remaining pieces: the threads
  // work on the same weight rows at about the same time, each for its own rows, so each weight
  // byte comes from memory about once per step instead of once per thread (the panel path is
  // bound by arithmetic at these batch sizes, but two threads each streaming their own weights
  // lost ~10 % of it); and a thread keeps its group's x rows converted in its panel buffer for
  // the whole call. (With one counter over (piece, group) pairs the threads alternated groups and
  // converted their rows again for most pieces: 27 MB of x per batch-32 step of the
  // decode_bench model on two threads, against 9 MB now.)
  const int64_t pieces = (args.n + grain - 1) / grain;
  struct alignas(64) Counter {
    std::atomic<int64_t> next{0};
  };
  std::vector<Counter> counters(static_cast<size_t>(groups));
  const auto run = [&](int64_t piece, int64_t group) {
    const int64_t row0 = args.m * group / groups, rows = args.m * (group + 1) / groups - row0;
    MatmulArgs part = args;
    part.x = args.x + row0 * args.x_stride;
    part.y = args.y + row0 * args.y_stride;
    part.m = rows;
    columns(part, plan, piece * grain, std::min(args.n, (piece + 1) * grain));
  };
  pool->ParallelFor(groups, 1, [&](int64_t first, int64_t end) {
    for (int64_t own = first; own < end; ++own) {
      for (int64_t i = 0; i < groups; ++i) {
        const int64_t group = (own + i) % groups;
        std::atomic<int64_t>& next = counters[static_cast<size_t>(group)].next;
        for (int64_t piece = next.fetch_add(1, std::memory_order_relaxed); piece < pieces;
             piece = next.fetch_add(1, std::memory_order_relaxed)) {
          run(piece, group);
        }
      }
    }
  });
}

}  // namespace kvserve::cpu
