#include "kernels/cpu/matmul_fp8.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/kv_quant.h"

namespace kvserve::cpu {
namespace {

// Weight rows per parallel piece (each piece decodes its rows once for every x row).
constexpr int64_t kRowsPerPiece = 16;

// sum_c a[c] * b[c] in eight interleaved partial sums, added pairwise at the end.
float Dot(const float* a, const float* b, int64_t k) {
  float part[8] = {};
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    for (int l = 0; l < 8; ++l) part[l] += a[c + l] * b[c + l];
  }
  for (; c < k; ++c) part[c % 8] += a[c] * b[c];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

}  // namespace

void QuantizeRowsFp8(const void* src, DType src_dtype, int64_t rows, int64_t cols, uint8_t* codes,
                     float* scales, ThreadPool* pool) {
  const int64_t row_bytes = DTypeRowBytes(src_dtype, cols);
  auto quantize = [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      ConvertRowToF32(static_cast<const uint8_t*>(src) + r * row_bytes, src_dtype, cols,
                      row.data());
      EncodeKvVector(KvCacheDType::kFp8E4M3, row.data(), cols, codes + r * cols, scales + r);
    }
  };
  if (pool == nullptr || pool->num_threads() == 1) {
    quantize(0, rows);
  } else {
    pool->ParallelForDynamic(
        rows, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1)), quantize);
  }
}

void MatmulFp8(const MatmulArgs& a, ThreadPool* pool) {
  if (a.m <= 0 || a.n <= 0) return;
  const float* table = Fp8E4M3DecodeTable();
  // The x rows' FP8 values (exact as floats) and scales.
  std::vector<float> xq(static_cast<size_t>(a.m * a.k));
  std::vector<float> xs(static_cast<size_t>(a.m));
  {
    std::vector<uint8_t> codes(static_cast<size_t>(a.k));
    for (int64_t i = 0; i < a.m; ++i) {
      EncodeKvVector(KvCacheDType::kFp8E4M3, a.x + i * a.x_stride, a.k, codes.data(), &xs[i]);
      for (int64_t c = 0; c < a.k; ++c) xq[i * a.k + c] = table[codes[c]];
    }
  }
  const auto* w = static_cast<const uint8_t*>(a.w);
  auto columns = [&](int64_t begin, int64_t end) {
    std::vector<float> wf(static_cast<size_t>(a.k));
    for (int64_t j = begin; j < end; ++j) {
      const uint8_t* row = w + j * a.k;
      for (int64_t c = 0; c < a.k; ++c) wf[c] = table[row[c]];
      for (int64_t i = 0; i < a.m; ++i) {
        const float dot = Dot(xq.data() + i * a.k, wf.data(), a.k);
        a.y[i * a.y_stride + j] =
            dot * (xs[i] * a.w_scale[j]) + (a.bias != nullptr ? a.bias[j] : 0.0f);
      }
    }
  };
  if (pool == nullptr || pool->num_threads() == 1) {
    columns(0, a.n);
  } else {
    pool->ParallelForDynamic(a.n, kRowsPerPiece, columns);
  }
}

}  // namespace kvserve::cpu
