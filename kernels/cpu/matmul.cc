#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul_impl.h"

namespace kvserve::cpu {
namespace {

// Below this many multiply-adds per chunk, another thread costs more than it saves.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 16;
// Pieces handed out per thread: enough that a thread slowed by the rest of the machine (or a
// short last piece) leaves little idle time on the others, few enough that claiming one (an
// atomic add) stays negligible.
constexpr int64_t kPiecesPerThread = 4;
// Piece sizes are a multiple of this many columns so every register tile / weight panel of the
// ISA paths stays whole (matmul_avx512.cc: 8-column decode tiles and weight panels).
constexpr int64_t kColumnGrain = 8;

int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

internal::MatmulColumnsFn SelectPath(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return &internal::MatmulColumnsAvx512;
    case CpuIsa::kAvx2:
      return &internal::MatmulColumnsAvx2;
    case CpuIsa::kScalar:
      break;
  }
  return &internal::MatmulColumnsScalar;
}

}  // namespace

void Matmul(const MatmulArgs& args, ThreadPool* pool) {
  if (args.m <= 0 || args.n <= 0) return;
  internal::MatmulPlan plan;
  plan.w_row_bytes = DTypeRowBytes(args.w_dtype, args.k);
  const int64_t row_block = (int64_t{256} << 10) / (args.k * 4 + 64);
  plan.row_block = std::max<int64_t>(4, row_block & ~int64_t{3});
  const internal::MatmulColumnsFn columns = SelectPath(ActiveCpuIsa());

  const int64_t macs_per_column = std::max<int64_t>(1, args.m * args.k);
  const int64_t min_chunk =
      RoundUp((kMinMacsPerChunk + macs_per_column - 1) / macs_per_column, kColumnGrain);
  if (pool == nullptr || pool->num_threads() == 1 || min_chunk * 2 > args.n) {
    columns(args, plan, 0, args.n);
    return;
  }
  // Every output element is computed whole by one thread in an order fixed by k, so which
  // thread takes which piece cannot change the result: balance the load dynamically.
  const int64_t grain = std::max(
      min_chunk, RoundUp((args.n + pool->num_threads() * kPiecesPerThread - 1) /
                             (pool->num_threads() * kPiecesPerThread),
                         kColumnGrain));
  pool->ParallelForDynamic(args.n, grain,
                           [&](int64_t begin, int64_t end) { columns(args, plan, begin, end); });
}

}  // namespace kvserve::cpu
