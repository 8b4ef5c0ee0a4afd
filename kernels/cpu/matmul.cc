#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul_impl.h"

namespace kvserve::cpu {
namespace {

// Below this many multiply-adds per chunk, another thread costs more than it saves.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 16;

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
  // Chunks are a multiple of 4 columns so the register tiles stay full.
  int64_t min_chunk = (kMinMacsPerChunk + macs_per_column - 1) / macs_per_column;
  min_chunk = (min_chunk + 3) & ~int64_t{3};
  if (pool == nullptr || pool->num_threads() == 1 || min_chunk * 2 > args.n) {
    columns(args, plan, 0, args.n);
    return;
  }
  pool->ParallelFor(args.n, min_chunk,
                    [&](int64_t begin, int64_t end) { columns(args, plan, begin, end); });
}

}  // namespace kvserve::cpu
