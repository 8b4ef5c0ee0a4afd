#include "kernels/cpu/packed_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::EncodeRows;
using testing::MatmulPath;
using testing::MatmulPaths;
using testing::RandomFloats;
using testing::RoundToBf16;
using testing::ScopedPath;

constexpr DType kPackedDTypes[] = {DType::kQ4_0, DType::kQ8_0};  // 32-element blocks
constexpr DType kAllPackedDTypes[] = {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                                      DType::kQ6_K, DType::kBF16, DType::kF32};

std::string Name(DType dtype) { return std::string(DTypeName(dtype)); }

// Random bytes for every quant byte and a finite fp16 scale per block: the layout test needs
// every byte distinguishable, not meaningful weights.
std::vector<uint8_t> RandomBlocks(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int64_t block_bytes = DTypeRowBytes(dtype, DTypeBlockElems(dtype));
  std::vector<uint8_t> w(static_cast<size_t>(rows * DTypeRowBytes(dtype, cols)));
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  for (size_t at = 0; at < w.size(); at += block_bytes) {
    const uint16_t d = FloatToHalf(std::ldexp(1.0f + (rng() % 64) / 64.0f, -8));
    std::memcpy(&w[at], &d, sizeof(d));
  }
  return w;
}

// The byte layout packed_weights.h describes, checked byte by byte: a group-block of sixteen
// rows holds their fp16 scales, then 4-byte chunk j of row i at 32 + 64 j + 4 i; the last group
// is padded with zero rows.
TEST(PackedWeightsTest, LayoutFollowsTheDescription) {
  std::mt19937 rng(1);
  for (DType dtype : kPackedDTypes) {
    SCOPED_TRACE(Name(dtype));
    const int64_t rows = 19, cols = 64, blocks = 2;
    const int64_t quant_bytes = dtype == DType::kQ4_0 ? 16 : 32;
    const int64_t group_block = 16 * (2 + quant_bytes);
    ASSERT_EQ(PackedGroupBlockBytes(dtype), group_block);
    ASSERT_EQ(PackedBytes(dtype, rows, cols), 2 * blocks * group_block);
    const std::vector<uint8_t> w = RandomBlocks(dtype, rows, cols, rng);
    std::vector<uint8_t> packed(static_cast<size_t>(PackedBytes(dtype, rows, cols)), 0xAB);
    PackRows(w.data(), dtype, rows, cols, packed.data());
    const int64_t row_bytes = DTypeRowBytes(dtype, cols);
    for (int64_t row = 0; row < 32; ++row) {
      const int64_t g = row / 16, i = row % 16;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* gb = packed.data() + (g * blocks + b) * group_block;
        const uint8_t* src =
            row < rows ? w.data() + row * row_bytes + b * (2 + quant_bytes) : nullptr;
        for (int t = 0; t < 2; ++t) {
          ASSERT_EQ(gb[2 * i + t], src != nullptr ? src[t] : 0) << "row " << row << " scale";
        }
        for (int64_t q = 0; q < quant_bytes; ++q) {
          ASSERT_EQ(gb[32 + 64 * (q / 4) + 4 * i + q % 4], src != nullptr ? src[2 + q] : 0)
              << "row " << row << " block " << b << " quant byte " << q;
        }
      }
    }
  }
}

// q6_k's 6-bit quant of element e (0..63) of a stored block, read from the format's description
// (kernels/dtype.h): element 128h + 32g + l takes the low (g < 2) or high nibble of
// ql[64h + 32 (g % 2) + l] and bits 2g, 2g + 1 of qh[32h + l] as bits 4 and 5.
int Q6Quant(const uint8_t* block, int e) {
  const int h = e / 128, g = e % 128 / 32, l = e % 32;
  const uint8_t ql = block[64 * h + 32 * (g % 2) + l];
  const int nibble = g < 2 ? ql & 15 : ql >> 4;
  return nibble | ((block[128 + 32 * h + l] >> (2 * g)) & 3) << 4;
}

// A K-quant block's quant of element e, from kernels/dtype.h: q4_k/q5_k element 64c + l (l < 32)
// the low nibble of qs[32c + l], 64c + 32 + l its high nibble, q5_k's fifth bit bit 2c (+ 1)
// of qh[l]; q6_k as Q6Quant.
int KQuant(DType dtype, const uint8_t* block, int e) {
  if (dtype == DType::kQ6_K) return Q6Quant(block, e);
  const int c = e / 64, l = e % 32, high = e % 64 / 32;
  const uint8_t* qs = block + (dtype == DType::kQ5_K ? 48 : 16);
  int q = high ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 15;
  if (dtype == DType::kQ5_K) q |= ((block[16 + l] >> (2 * c + high)) & 1) << 4;
  return q;
}

// q4_k / q5_k: d, dmin, the sub-block mins and scales decoded to bytes (m_j at
// 64 + 32 (j / 2) + 2 i + j % 2, sc_j at 192 + 16 j + i, from the 6-bit packing kernels/dtype.h
// describes), then 64-byte lines from byte 320: q4_k's qs chunk c (4 bytes of each row) at line
// c; q5_k's sub-block j at 320 + 320j, row i's chunk k at + 160 (i / 8) + 32k + 4 (i % 8): for
// k < 4 its byte p holds element 32j + 4k + p's quant | (element 32j + 16 + 4k + p's & 7) << 5,
// chunk 4's byte p the top two bits of element 32j + 16 + 4k + p at bits 2k, 2k + 1.
TEST(PackedWeightsTest, KQuantLayoutFollowsTheDescription) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kQ4_K, DType::kQ5_K}) {
    SCOPED_TRACE(Name(dtype));
    const bool q5 = dtype == DType::kQ5_K;
    const int64_t rows = 21, cols = 512, blocks = 2, block_bytes = q5 ? 176 : 144;
    const int64_t group_block = q5 ? 2880 : 2368;
    ASSERT_EQ(PackedGroupBlockBytes(dtype), group_block);
    const std::vector<uint8_t> w = RandomBlocks(dtype, rows, cols, rng);
    std::vector<uint8_t> packed(static_cast<size_t>(PackedBytes(dtype, rows, cols)));
    ASSERT_EQ(packed.size(), static_cast<size_t>(2 * blocks * group_block));
    PackRows(w.data(), dtype, rows, cols, packed.data());
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t i = row % 16;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* src = w.data() + row * blocks * block_bytes + b * block_bytes;
        const uint8_t* gb = packed.data() + (row / 16 * blocks + b) * group_block;
        const uint8_t* s = src + 4;
        for (int t = 0; t < 2; ++t) {
          ASSERT_EQ(gb[2 * i + t], src[t]);
          ASSERT_EQ(gb[32 + 2 * i + t], src[2 + t]);
        }
        for (int j = 0; j < 8; ++j) {
          const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
          const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
          ASSERT_EQ(gb[192 + 16 * j + i], sc) << "row " << row << " sub-block " << j;
          ASSERT_EQ(gb[64 + 32 * (j / 2) + 2 * i + j % 2], m)
              << "row " << row << " sub-block " << j;
        }
        if (!q5) {
          for (int q = 0; q < 128; ++q) {
            ASSERT_EQ(gb[320 + 64 * (q / 4) + 4 * i + q % 4], src[16 + q]) << "row " << row;
          }
          continue;
        }
        for (int j = 0; j < 8; ++j) {
          const int64_t at = 320 + 320 * j + 160 * (i / 8) + 4 * (i % 8);
          for (int p = 0; p < 4; ++p) {
            int top = 0;
            for (int k = 0; k < 4; ++k) {
              const int first = KQuant(dtype, src, 32 * j + 4 * k + p);
              const int second = KQuant(dtype, src, 32 * j + 16 + 4 * k + p);
              ASSERT_EQ(gb[at + 32 * k + p], first | (second & 7) << 5)
                  << "row " << row << " sub-block " << j << " line " << k << " byte " << p;
              top |= (second >> 3) << (2 * k);
            }
            ASSERT_EQ(gb[at + 128 + p], top)
                << "row " << row << " sub-block " << j << " byte " << p;
          }
        }
      }
    }
  }
}

// q6_k: d (fp16) at 2i, 32 zero bytes, sc_j at 64 + 16j + i, then sub-block j's lines k = 0..2
// at 320 + 192j + 64k, byte p of row i at 4i + p: element 16j + 4k + p's quant in bits 0..5 and
// bits 2k, 2k + 1 of element 16j + 12 + p's in bits 6, 7. The last group's rows past the matrix
// are zero.
TEST(PackedWeightsTest, Q6KLayoutFollowsTheDescription) {
  std::mt19937 rng(7);
  const DType dtype = DType::kQ6_K;
  const int64_t rows = 18, cols = 512, blocks = 2, block_bytes = 210, group_block = 3392;
  ASSERT_EQ(PackedGroupBlockBytes(dtype), group_block);
  const std::vector<uint8_t> w = RandomBlocks(dtype, rows, cols, rng);
  std::vector<uint8_t> packed(static_cast<size_t>(PackedBytes(dtype, rows, cols)), 0xAB);
  ASSERT_EQ(packed.size(), static_cast<size_t>(2 * blocks * group_block));
  PackRows(w.data(), dtype, rows, cols, packed.data());
  for (int64_t row = 0; row < 32; ++row) {
    const int64_t i = row % 16;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* src = row < rows ? w.data() + (row * blocks + b) * block_bytes : nullptr;
      const uint8_t* gb = packed.data() + (row / 16 * blocks + b) * group_block;
      for (int t = 0; t < 2; ++t) ASSERT_EQ(gb[2 * i + t], src ? src[208 + t] : 0) << row;
      for (int z = 32; z < 64; ++z) ASSERT_EQ(gb[z], 0);
      for (int j = 0; j < 16; ++j) {
        ASSERT_EQ(gb[64 + 16 * j + i], src ? src[192 + j] : 0) << "row " << row << " sc " << j;
        for (int k = 0; k < 3; ++k) {
          for (int p = 0; p < 4; ++p) {
            const int expect = src ? Q6Quant(src, 16 * j + 4 * k + p) |
                                         ((Q6Quant(src, 16 * j + 12 + p) >> (2 * k)) & 3) << 6
                                   : 0;
            ASSERT_EQ(gb[320 + 192 * j + 64 * k + 4 * i + p], expect)
                << "row " << row << " sub-block " << j << " line " << k << " byte " << p;
          }
        }
      }
    }
  }
}

TEST(PackedWeightsTest, UnpackRowRestoresEveryRow) {
  std::mt19937 rng(2);
  for (DType dtype : kAllPackedDTypes) {
    for (int64_t rows : {1, 16, 37}) {
      SCOPED_TRACE(Name(dtype) + " rows=" + std::to_string(rows));
      const int64_t cols = PackedBlockElems(dtype) * 3, row_bytes = DTypeRowBytes(dtype, cols);
      const std::vector<uint8_t> w = RandomBlocks(dtype, rows, cols, rng);
      std::vector<uint8_t> packed(static_cast<size_t>(PackedBytes(dtype, rows, cols)));
      PackRows(w.data(), dtype, rows, cols, packed.data());
      std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
      for (int64_t r = 0; r < rows; ++r) {
        UnpackRow(packed.data(), dtype, cols, r, row.data());
        ASSERT_EQ(0, std::memcmp(row.data(), w.data() + r * row_bytes, row.size())) << r;
      }
    }
  }
}

// Packing on a pool's threads (groups split over them, the last one partial) writes the bytes
// of packing on the caller alone, over a buffer that starts out dirty.
TEST(PackedWeightsTest, PackingOnThreadsGivesTheSameBytes) {
  std::mt19937 rng(3);
  ThreadPool pool(3);
  for (DType dtype : kAllPackedDTypes) {
    SCOPED_TRACE(Name(dtype));
    const int64_t cols = 2048, rows = 16 * 200 + 5;  // several 1 MiB pieces for every format
    ASSERT_GT(PackedBytes(dtype, rows, cols), int64_t{3} << 20);
    const std::vector<uint8_t> w = RandomBlocks(dtype, rows, cols, rng);
    const size_t bytes = static_cast<size_t>(PackedBytes(dtype, rows, cols));
    std::vector<uint8_t> alone(bytes, 0xAB), threaded(bytes, 0xCD);
    PackRows(w.data(), dtype, rows, cols, alone.data());
    PackRows(w.data(), dtype, rows, cols, threaded.data(), &pool);
    ASSERT_EQ(0, std::memcmp(alone.data(), threaded.data(), bytes));
  }
}

// The int8 form of one activation row as matmul_impl.h specifies it (one scale per 32
// elements, q = x * (127 / max|x|) rounded to nearest, ties to even), written from that text.
struct Int8Row {
  std::vector<int32_t> q;
  std::vector<float> d;
};
Int8Row QuantizeRow32(const float* x, int64_t k) {
  Int8Row out;
  out.q.resize(static_cast<size_t>(k));
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0.0f;
    for (int64_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[b * 32 + e]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t e = 0; e < 32; ++e) {
      out.q[b * 32 + e] = static_cast<int32_t>(std::nearbyint(x[b * 32 + e] * inv));
    }
    out.d.push_back(amax / 127.0f);
  }
  return out;
}

// Block b's stored quants of a row as signed integers (q4_0: nibble - 8, q8_0: int8).
std::vector<int32_t> WeightQuants(DType dtype, const uint8_t* row, int64_t k) {
  std::vector<int32_t> q(static_cast<size_t>(k));
  const int64_t block_bytes = DTypeRowBytes(dtype, 32);
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* block = row + b * block_bytes + 2;
    for (int e = 0; e < 32; ++e) {
      if (dtype == DType::kQ4_0) {
        const int nibble = e < 16 ? block[e] & 15 : block[e - 16] >> 4;
        q[b * 32 + e] = nibble - 8;
      } else {
        q[b * 32 + e] = static_cast<int8_t>(block[e]);
      }
    }
  }
  return q;
}

// y[i, j] by the arithmetic matmul_packed.inc fixes for every path: per block the exact
// integer dot product S_b, acc = fma(float(S_b), d_w * d_x, acc) in block order, then + bias.
std::vector<float> PackedReference(DType dtype, const std::vector<uint8_t>& w, const float* x,
                                   int64_t x_stride, const float* bias, int64_t m, int64_t n,
                                   int64_t k) {
  std::vector<float> y(static_cast<size_t>(m * n));
  const int64_t row_bytes = DTypeRowBytes(dtype, k), block_bytes = DTypeRowBytes(dtype, 32);
  for (int64_t i = 0; i < m; ++i) {
    const Int8Row xq = QuantizeRow32(x + i * x_stride, k);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* row = w.data() + j * row_bytes;
      const std::vector<int32_t> wq = WeightQuants(dtype, row, k);
      float acc = 0.0f;
      for (int64_t b = 0; b < k / 32; ++b) {
        int32_t s = 0;
        for (int64_t e = b * 32; e < b * 32 + 32; ++e) s += wq[e] * xq.q[e];
        uint16_t half;
        std::memcpy(&half, row + b * block_bytes, sizeof(half));
        acc = std::fma(static_cast<float>(s), HalfToFloat(half) * xq.d[b], acc);
      }
      y[i * n + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
  return y;
}

// Random activations [m, k] at stride k + 3, a bias and weights [n, k], stored and packed.
struct RandomProblem {
  int64_t x_stride;
  std::vector<float> x, bias;
  std::vector<uint8_t> w, packed;
  RandomProblem(DType dtype, int64_t m, int64_t n, int64_t k, std::mt19937& rng)
      : x_stride(k + 3),
        x(RandomFloats(static_cast<size_t>(m * x_stride), rng)),
        bias(RandomFloats(static_cast<size_t>(n), rng)),
        w(EncodeRows(dtype, RandomFloats(static_cast<size_t>(n * k), rng), n, k)),
        packed(static_cast<size_t>(PackedBytes(dtype, n, k))) {
    PackRows(w.data(), dtype, n, k, packed.data());
  }
};

// Every ISA path (the AVX-512 one with and without VNNI, where the CPU has it) gives the
// reference's bits for every batch size, thread count, a row alone and a matrix whose last group
// is partial; and the packed result stays within fp32 rounding of the stored layout's.
TEST(PackedWeightsTest, MatmulGivesTheSameBitsOnEveryPathAndBatch) {
  ThreadPool pool2(2), pool3(3);
  std::mt19937 rng(3);
  for (DType dtype : kPackedDTypes) {
    for (int64_t k : {32, 96, 1024}) {
      for (int64_t n : {16, 37, 301}) {
        const int64_t m = 17;
        const RandomProblem p(dtype, m, n, k, rng);
        const std::vector<float> ref =
            PackedReference(dtype, p.w, p.x.data(), p.x_stride, p.bias.data(), m, n, k);
        auto run = [&](const void* weights, bool is_packed, int64_t rows, const float* xs,
                       ThreadPool* pool) {
          std::vector<float> y(static_cast<size_t>(rows * n));
          MatmulArgs args{xs, p.x_stride, weights, dtype, p.bias.data(), y.data(), n, rows, n, k};
          args.w_packed = is_packed;
          Matmul(args, pool);
          return y;
        };
        for (const MatmulPath& path : MatmulPaths()) {
          const ScopedPath scoped(path);
          SCOPED_TRACE(Name(dtype) + " " + path.Name() + " k=" + std::to_string(k) +
                       " n=" + std::to_string(n));
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
            const std::vector<float> y = run(p.packed.data(), true, m, p.x.data(), pool);
            ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
                << (pool != nullptr ? pool->num_threads() : 1) << " threads";
          }
          for (int64_t i : {int64_t{0}, m - 1}) {
            const std::vector<float> y =
                run(p.packed.data(), true, 1, &p.x[i * p.x_stride], nullptr);
            ASSERT_EQ(0, std::memcmp(y.data(), &ref[i * n], n * sizeof(float))) << "row " << i;
          }
          const std::vector<float> stored = run(p.w.data(), false, m, p.x.data(), nullptr);
          for (size_t e = 0; e < stored.size(); ++e) {
            ASSERT_NEAR(stored[e], ref[e], 1e-5 * (1.0 + std::fabs(ref[e]))) << e;
          }
        }
      }
    }
  }
}

// Packed K-quants follow the stored layout's arithmetic (KQuantTile): the same bits on each path,
// for every batch size and thread count.
TEST(PackedWeightsTest, KQuantsGiveTheStoredLayoutsBits) {
  ThreadPool pool2(2), pool3(3);
  std::mt19937 rng(6);
  for (DType dtype : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t k : {256, 1024}) {
      // 1, 3 and 7 groups: decode reads them as one stream, two of one and a tail, two of three
      // and a tail (PackedDecode).
      for (int64_t n : {16, 37, 100}) {
        for (int64_t m : {1, 2, 3, 5, 17}) {
          const RandomProblem p(dtype, m, n, k, rng);
          for (const MatmulPath& path : MatmulPaths()) {
            const ScopedPath scoped(path);
            SCOPED_TRACE(Name(dtype) + " " + path.Name() + " k=" + std::to_string(k) +
                         " n=" + std::to_string(n) + " m=" + std::to_string(m));
            std::vector<float> stored(static_cast<size_t>(m * n));
            MatmulArgs args{p.x.data(),    p.x_stride, p.w.data(), dtype, p.bias.data(),
                            stored.data(), n,          m,          n,     k};
            Matmul(args, nullptr);
            args.w = p.packed.data();
            args.w_packed = true;
            for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
              std::vector<float> y(stored.size(), -7.0f);
              args.y = y.data();
              Matmul(args, pool);
              ASSERT_EQ(0, std::memcmp(y.data(), stored.data(), y.size() * sizeof(float)));
            }
          }
        }
      }
    }
  }
}

// Stored K-quant rows with every quant and scale at the ends of their ranges (row % 8 picks the
// pattern: all 0, all the top value, alternating by sub-block, random ends, random values).
std::vector<uint8_t> ExtremeKQuantRows(DType dtype, int64_t n, int64_t k, std::mt19937& rng) {
  const int64_t block_bytes = DTypeRowBytes(dtype, 256), blocks = k / 256;
  const int top = dtype == DType::kQ6_K ? 63 : dtype == DType::kQ5_K ? 31 : 15;
  std::vector<uint8_t> w(static_cast<size_t>(n * blocks * block_bytes));
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = w.data() + (row * blocks + b) * block_bytes;
      uint8_t q[256];
      const int pattern = static_cast<int>(row % 8);
      for (int e = 0; e < 256; ++e) {
        const int end = pattern == 0   ? 0
                        : pattern == 1 ? top
                        : pattern == 2 ? top * (e / 16 % 2)
                                       : top * (rng() % 2);
        q[e] = static_cast<uint8_t>(pattern < 6 ? end : rng() % (top + 1));
      }
      const uint16_t d = FloatToHalf(std::ldexp(1.0f + (rng() % 64) / 64.0f, -10));
      if (dtype == DType::kQ6_K) {
        PackQuantsQ6K(q, block);
        for (int j = 0; j < 16; ++j) {
          const int sc = row % 3 == 0   ? 127
                         : row % 3 == 1 ? -128
                                        : static_cast<int>(rng() % 256) - 128;
          block[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc));
        }
        std::memcpy(block + 208, &d, sizeof(d));
        continue;
      }
      const bool q5 = dtype == DType::kQ5_K;
      uint8_t* qs = block + (q5 ? 48 : 16);
      if (q5) std::memset(block + 16, 0, 32);
      for (int e = 0; e < 256; ++e) {
        const int c = e / 64, l = e % 32, high = e % 64 / 32;
        uint8_t& byte = qs[32 * c + l];
        byte = static_cast<uint8_t>(high ? (byte & 15) | (q[e] & 15) << 4 : (q[e] & 15));
        if (q5) block[16 + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * c + high));
      }
      uint8_t sc[8], m[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = static_cast<uint8_t>(row % 3 == 2 ? rng() % 64 : 63);
        m[j] = static_cast<uint8_t>(row % 2 ? 63 : rng() % 64);
      }
      PackScalesMinsK4(sc, m, block + 4);
      std::memcpy(block, &d, sizeof(d));
      const uint16_t dmin = FloatToHalf(std::ldexp(1.0f + (rng() % 64) / 64.0f, -11));
      std::memcpy(block + 2, &dmin, sizeof(dmin));
    }
  }
  return w;
}

// Packed and stored K-quants against a reference written from matmul_int8.inc's rule (per
// super-block the exact integers S = sum_j sc_j sum_i q'_i x_i, q' = q - 32 for q6_k, and for
// q4_k/q5_k M = sum_j m_j sum(x_j); acc = fma(float(S), d d_x, acc), then
// acc = fma(-(dmin d_x), float(M), acc); + bias; activations with one scale per 256), with
// weights and activations at the ends of their ranges, where the kernels' int16 partial sums
// come closest to their bounds (q6_k's sub-block pair sums reach +-32512). The SIMD paths must
// stay exact.
TEST(PackedWeightsTest, KQuantSumsStayExactAtTheLimits) {
  ThreadPool pool2(2);
  std::mt19937 rng(8);
  for (DType dtype : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(Name(dtype));
    const int64_t n = 37, k = 512, m = 5, blocks = k / 256;
    const int64_t block_bytes = DTypeRowBytes(dtype, 256);
    const std::vector<uint8_t> w = ExtremeKQuantRows(dtype, n, k, rng);
    // Activation rows: all +1, all -1, +-1 by element, +-1 by sub-block, random.
    std::vector<float> x(static_cast<size_t>(m * k));
    for (int64_t e = 0; e < k; ++e) {
      x[e] = 1.0f;
      x[k + e] = -1.0f;
      x[2 * k + e] = e % 2 ? -1.0f : 1.0f;
      x[3 * k + e] = (e / 16) % 2 ? -1.0f : 1.0f;
    }
    const std::vector<float> noise = RandomFloats(static_cast<size_t>(k), rng);
    std::copy(noise.begin(), noise.end(), x.begin() + 4 * k);
    const std::vector<float> bias = RandomFloats(static_cast<size_t>(n), rng);
    std::vector<uint8_t> packed(static_cast<size_t>(PackedBytes(dtype, n, k)));
    PackRows(w.data(), dtype, n, k, packed.data());

    std::vector<float> ref(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      std::vector<int32_t> xq(static_cast<size_t>(k));
      std::vector<float> xd;
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = &x[i * k + 256 * b];
        float amax = 0.0f;
        for (int64_t e = 0; e < 256; ++e) amax = std::max(amax, std::fabs(xb[e]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int64_t e = 0; e < 256; ++e) {
          xq[256 * b + e] = static_cast<int32_t>(std::nearbyint(xb[e] * inv));
        }
        xd.push_back(amax / 127.0f);
      }
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* block = w.data() + (j * blocks + b) * block_bytes;
          const int32_t* xb = &xq[256 * b];
          int64_t s = 0, mins = 0;
          uint16_t half;
          if (dtype == DType::kQ6_K) {
            for (int e = 0; e < 256; ++e) {
              s += int64_t{static_cast<int8_t>(block[192 + e / 16])} *
                   (KQuant(dtype, block, e) - 32) * xb[e];
            }
            std::memcpy(&half, block + 208, sizeof(half));
            acc = std::fma(static_cast<float>(s), HalfToFloat(half) * xd[b], acc);
            continue;
          }
          uint8_t sc[8], mn[8];
          UnpackScalesMinsK4(block + 4, sc, mn);
          for (int e = 0; e < 256; ++e) {
            s += int64_t{sc[e / 32]} * KQuant(dtype, block, e) * xb[e];
            mins += int64_t{mn[e / 32]} * xb[e];
          }
          uint16_t dmin;
          std::memcpy(&half, block, sizeof(half));
          std::memcpy(&dmin, block + 2, sizeof(dmin));
          acc = std::fma(static_cast<float>(s), HalfToFloat(half) * xd[b], acc);
          acc = std::fma(-(HalfToFloat(dmin) * xd[b]), static_cast<float>(mins), acc);
        }
        ref[i * n + j] = acc + bias[j];
      }
    }
    for (const MatmulPath& path : MatmulPaths()) {
      if (path.isa == CpuIsa::kScalar) continue;  // decodes to fp32 (matmul_impl.h): not this rule
      const ScopedPath scoped(path);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        for (bool is_packed : {true, false}) {
          std::vector<float> y(ref.size(), -7.0f);
          MatmulArgs args{
              x.data(), k, is_packed ? packed.data() : w.data(), dtype, bias.data(), y.data(), n, m,
              n,        k};
          args.w_packed = is_packed;
          Matmul(args, pool);
          for (size_t e = 0; e < y.size(); ++e) {
            ASSERT_EQ(y[e], ref[e]) << path.Name() << (is_packed ? " packed" : " stored") << " row "
                                    << e / n << " col " << e % n;
          }
        }
      }
    }
  }
}

// bf16: a group-block is one 64-byte line, line p holding elements 2p and 2p + 1 of each of the
// sixteen rows (row i at bytes 4i .. 4i + 3, element 2p first); the last group's missing rows
// are zero.
// bf16: line p of a group holds elements 2p and 2p + 1 of its rows; f32: element p. Either way
// row i's 4 bytes of line p are at 4i, and the last group's missing rows are zeros.
TEST(PackedWeightsTest, Bf16AndF32LayoutsFollowTheDescription) {
  std::mt19937 rng(8);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(Name(dtype));
    const int64_t elem_bytes = DTypeRowBytes(dtype, 1), elems_per_line = 4 / elem_bytes;
    const int64_t rows = 19, lines = 3, cols = lines * elems_per_line;
    ASSERT_EQ(PackedBlockElems(dtype), elems_per_line);
    ASSERT_EQ(PackedGroupBlockBytes(dtype), 64);
    ASSERT_EQ(PackedBytes(dtype, rows, cols), 2 * lines * 64);
    std::vector<uint8_t> w(static_cast<size_t>(rows * cols * elem_bytes));
    for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> packed(static_cast<size_t>(PackedBytes(dtype, rows, cols)), 0xAB);
    PackRows(w.data(), dtype, rows, cols, packed.data());
    for (int64_t row = 0; row < 32; ++row) {
      for (int64_t p = 0; p < lines; ++p) {
        for (int t = 0; t < 4; ++t) {
          const uint8_t want =
              row < rows ? w[static_cast<size_t>(row * cols * elem_bytes + 4 * p + t)] : 0;
          ASSERT_EQ(packed[static_cast<size_t>((row / 16 * lines + p) * 64 + 4 * (row % 16) + t)],
                    want)
              << "row " << row << " line " << p << " byte " << t;
        }
      }
    }
  }
}

// Packed bf16 and f32 on every path: where Matmul() runs the packed kernels
// (PackedLayoutSupported: vdpbf16ps or AMX for bf16, the avx512 FMAs for f32), each output is one
// chain over k whatever the batch, row tile, k slice (k = 8200 crosses two), piece or thread
// count, so a row alone, rows in twos and threes (the decode tiles) and whole batches give the
// same bits, within fp32 rounding of the exact sums (of x rounded to bf16, for bf16). Elsewhere
// the rows are unpacked: the scalar path's bits for the stored rows.
TEST(PackedWeightsTest, Bf16AndF32KeepTheirBitsOnEveryBatchAndPath) {
  ThreadPool pool2(2), pool3(3);
  std::mt19937 rng(9);
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t k : {2, 62, 1024, 8200}) {
      for (int64_t n : {16, 37, 100}) {
        const int64_t m = k > 1024 ? 11 : 35;  // 8-row tiles and a tail (3 or 11 rows over)
        const RandomProblem p(dtype, m, n, k, rng);
        std::vector<float> scalar_stored(static_cast<size_t>(m * n));
        {
          const ScopedPath scoped({CpuIsa::kScalar, std::nullopt, std::nullopt});
          Matmul(MatmulArgs{p.x.data(), p.x_stride, p.w.data(), dtype, p.bias.data(),
                            scalar_stored.data(), n, m, n, k},
                 nullptr);
        }
        for (const MatmulPath& path : MatmulPaths()) {
          const ScopedPath scoped(path);
          SCOPED_TRACE(path.Name() + " " + Name(dtype) + " k=" + std::to_string(k) +
                       " n=" + std::to_string(n));
          const bool bf16 = dtype == DType::kBF16;
          const bool packed_kernels = PackedLayoutSupported(dtype);
          // bf16 packs for the path that rounds x to bf16, f32 for the avx512 path.
          ASSERT_EQ(packed_kernels,
                    bf16 ? internal::RoundsXToBf16(dtype) : ActiveCpuIsa() == CpuIsa::kAvx512);
          auto run = [&](int64_t row0, int64_t rows, ThreadPool* pool) {
            std::vector<float> y(static_cast<size_t>(rows * n), -7.0f);
            MatmulArgs args{&p.x[row0 * p.x_stride],
                            p.x_stride,
                            p.packed.data(),
                            dtype,
                            p.bias.data(),
                            y.data(),
                            n,
                            rows,
                            n,
                            k};
            args.w_packed = true;
            Matmul(args, pool);
            return y;
          };
          const std::vector<float> y = run(0, m, nullptr);
          for (ThreadPool* pool : {&pool2, &pool3}) {
            ASSERT_EQ(0, std::memcmp(run(0, m, pool).data(), y.data(), y.size() * sizeof(float)))
                << pool->num_threads() << " threads";
          }
          // Up to 5 rows: the decode tiles; 16, 17, 32 and 33 the AMX tiles' block shapes (one A
          // tile, two, and blocks of 17 and 16 rows with the tiles configured for each).
          for (int64_t rows : {1, 2, 3, 5, 16, 17, 32, 33}) {
            for (int64_t row0 = 0; row0 + rows <= m; row0 += rows + 2) {
              const std::vector<float> part = run(row0, rows, nullptr);
              ASSERT_EQ(0, std::memcmp(part.data(), &y[row0 * n], part.size() * sizeof(float)))
                  << rows << " rows from " << row0;
            }
          }
          if (!packed_kernels) {
            ASSERT_EQ(0, std::memcmp(y.data(), scalar_stored.data(), y.size() * sizeof(float)));
            continue;
          }
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = p.bias[j], sum_abs = std::fabs(p.bias[j]);
              for (int64_t e = 0; e < k; ++e) {
                float wv;
                if (bf16) {
                  uint16_t bits;
                  std::memcpy(&bits, &p.w[static_cast<size_t>(2 * (j * k + e))], sizeof(bits));
                  const uint32_t wide = uint32_t{bits} << 16;
                  std::memcpy(&wv, &wide, sizeof(wv));
                } else {
                  std::memcpy(&wv, &p.w[static_cast<size_t>(4 * (j * k + e))], sizeof(wv));
                }
                const float xv = p.x[i * p.x_stride + e];
                const double prod = double{bf16 ? RoundToBf16(xv) : xv} * wv;
                ref += prod;
                sum_abs += std::fabs(prod);
              }
              ASSERT_NEAR(y[i * n + j], ref, 2e-5 * sum_abs + 1e-30) << "row " << i << " col " << j;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::cpu
