// Portable matmul path: converts each weight row to fp32 once and reuses it for all x rows.

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/matmul_impl.h"

namespace kvserve::cpu::internal {
namespace {

constexpr int kLanes = 8;

// 8 lane sums in the order documented in matmul_impl.h.
float Dot(const float* x, const float* w, int64_t k) {
  float lane[kLanes] = {};
  int64_t kk = 0;
  for (; kk + kLanes <= k; kk += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += x[kk + l] * w[kk + l];
  }
  for (int l = 0; kk + l < k; ++l) lane[l] += x[kk + l] * w[kk + l];
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// Weight row j as fp32 in `out` (k elements), by the shared block decoders; a packed row
// (packed_weights.h) is unpacked first: the same bits as the stored one.
void DecodeWeightRow(const MatmulArgs& args, const MatmulPlan& plan, int64_t j, float* out) {
  thread_local std::vector<uint8_t> unpacked;
  const uint8_t* stored = static_cast<const uint8_t*>(args.w) + j * plan.w_row_bytes;
  if (args.w_packed) {
    unpacked.resize(static_cast<size_t>(plan.w_row_bytes));
    UnpackRow(args.w, args.w_dtype, args.k, j, unpacked.data());
    stored = unpacked.data();
  }
  ConvertRowToF32(stored, args.w_dtype, args.k, out);
}

// Int8 activations (matmul_impl.h): each weight row decoded to fp32 by the shared block
// decoders (ConvertRowToF32: the values every path uses), then per 32 elements d_x * sum(w * q_x),
// added in order.
void Int8Columns(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  thread_local std::vector<float> w_row;
  w_row.resize(static_cast<size_t>(args.k));
  const int64_t blocks_per_scale = ActivationScaleBlock(args.w_dtype) / kActBlock;
  for (int64_t j = n_begin; j < n_end; ++j) {
    DecodeWeightRow(args, plan, j, w_row.data());
    for (int64_t i = 0; i < args.m; ++i) {
      const int8_t* xq = plan.xq + i * plan.xq_stride;
      const float* xd = plan.xd + i * plan.xd_stride;
      float s = 0.0f;
      for (int64_t b = 0; b < args.k / kActBlock; ++b) {
        float block = 0.0f;
        for (int e = 0; e < kActBlock; ++e) {
          block += w_row[b * kActBlock + e] * static_cast<float>(xq[b * kActBlock + e]);
        }
        s += block * xd[b / blocks_per_scale];
      }
      if (args.bias != nullptr) s += args.bias[j];
      args.y[i * args.y_stride + j] = s;
    }
  }
}

// Packed q4_0 / q8_0 (packed_weights.h), in matmul_packed.inc's arithmetic so that every path
// gives the same bits: per block the exact integer sum S_b = sum(q_w q_x), then
// acc = fma(float(S_b), d_w * d_x, acc) in block order, then + bias.
void PackedColumns(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin, int64_t n_end) {
  thread_local std::vector<uint8_t> row;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  const int64_t blocks = args.k / kActBlock;
  const int64_t block_bytes = DTypeRowBytes(args.w_dtype, kActBlock);
  row.resize(static_cast<size_t>(blocks * block_bytes));
  q.resize(static_cast<size_t>(args.k));
  d.resize(static_cast<size_t>(blocks));
  for (int64_t j = n_begin; j < n_end; ++j) {
    UnpackRow(args.w, args.w_dtype, args.k, j, row.data());
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = row.data() + b * block_bytes;
      uint16_t half;
      std::memcpy(&half, block, sizeof(half));
      d[b] = HalfToFloat(half);
      int8_t* qb = q.data() + b * kActBlock;
      if (args.w_dtype == DType::kQ4_0) {
        for (int e = 0; e < 16; ++e) {
          qb[e] = static_cast<int8_t>((block[2 + e] & 15) - 8);
          qb[e + 16] = static_cast<int8_t>((block[2 + e] >> 4) - 8);
        }
      } else {
        std::memcpy(qb, block + 2, kActBlock);
      }
    }
    for (int64_t i = 0; i < args.m; ++i) {
      const int8_t* xq = plan.xq + i * plan.xq_stride;
      const float* xd = plan.xd + i * plan.xd_stride;
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t s = 0;
        for (int64_t e = b * kActBlock; e < (b + 1) * kActBlock; ++e) {
          s += int32_t{q[e]} * int32_t{xq[e]};
        }
        acc = std::fma(static_cast<float>(s), d[b] * xd[b], acc);
      }
      if (args.bias != nullptr) acc += args.bias[j];
      args.y[i * args.y_stride + j] = acc;
    }
  }
}

}  // namespace

void MatmulColumnsScalar(const MatmulArgs& args, const MatmulPlan& plan, int64_t n_begin,
                         int64_t n_end) {
  if (args.w_packed && DTypeBlockElems(args.w_dtype) == kActBlock) {
    PackedColumns(args, plan, n_begin, n_end);
    return;
  }
  if (UsesInt8Activations(args.w_dtype)) {
    Int8Columns(args, plan, n_begin, n_end);
    return;
  }
  // Float weights (packed bf16 too, off the vdpbf16ps path: Matmul()).
  thread_local std::vector<float> w_row;
  w_row.resize(static_cast<size_t>(args.k));
  for (int64_t j = n_begin; j < n_end; ++j) {
    DecodeWeightRow(args, plan, j, w_row.data());
    const float bias = args.bias != nullptr ? args.bias[j] : 0.0f;
    for (int64_t i = 0; i < args.m; ++i) {
      float s = Dot(args.x + i * args.x_stride, w_row.data(), args.k);
      if (args.bias != nullptr) s += bias;
      args.y[i * args.y_stride + j] = s;
    }
  }
}

}  // namespace kvserve::cpu::internal
