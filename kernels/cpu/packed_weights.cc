#include "kernels/cpu/packed_weights.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/matmul_impl.h"

namespace kvserve::cpu {
namespace {

constexpr int64_t kScaleBytes = 2;
// bf16 and f32: a row's 4-byte word per group-block (two bf16 elements or one f32; row i at 4i of
// a 64-byte line).
constexpr int64_t kWordBytes = 4;
bool WordPacked(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kF32; }

// Quant bytes per row and block of q4_0 / q8_0 (the block's bytes after its fp16 d).
int64_t QuantBytes(DType dtype) { return DTypeRowBytes(dtype, 32) - kScaleBytes; }

// Where byte `q` of row `i`'s 4-byte chunks sits, counted from the chunks' start.
int64_t ChunkOffset(int64_t i, int64_t q) { return 64 * (q / 4) + 4 * i + q % 4; }

// q4_k / q5_k group-block, in the order the kernel reads it: d[16], dmin[16] (fp16), m[4][16][2],
// sc[8][16] (bytes), then 64-byte lines of sixteen rows' 4-byte chunks: q4_k's qs chunk 8c + t
// (c, t < 8: elements 64c + 4t .. and 64c + 32 + 4t ..) at line 8c + t; q5_k's sub-block j at
// 320 + 320j, rows 8h .. 8h + 7 at + 160h, their chunks k = 0..4 at + 32k (row 8h + l's 4 bytes
// at + 4l): for k < 4 byte p holds element 32j + 4k + p's five bits and the low three bits of
// element 32j + 16 + 4k + p as bits 5..7; chunk 4's byte p the top two bits of element
// 32j + 16 + 4k + p as bits 2k, 2k + 1.
constexpr int64_t kKDmin = 32, kKMin = 64, kKSc = 192, kKLines = 320;
bool IsQ45K(DType dtype) { return dtype == DType::kQ4_K || dtype == DType::kQ5_K; }
int64_t Q5LineByte(int64_t i, int j, int k, int p) {
  return kKLines + 320 * j + 160 * (i / 8) + 32 * k + 4 * (i % 8) + p;
}

// q6_k group-block: d[16] (fp16), 32 zero bytes, sc[16][16] (sc_j of row i at 64 + 16j + i),
// then from 320 sub-block j's lines a, b, c (k = 0, 1, 2) at 320 + 192j + 64k: byte p of row i
// holds element 16j + 4k + p's six bits, and bits 2k, 2k + 1 of element 16j + 12 + p as bits 6, 7.
constexpr int64_t kQ6Sc = 64, kQ6Lines = 320, kQ6GroupBlock = kQ6Lines + 16 * 192;
constexpr int64_t kQ6StoredD = 208, kQ6StoredSc = 192;
int64_t Q6LineByte(int64_t i, int j, int k, int p) {
  return kQ6Lines + 192 * j + 64 * k + 4 * i + p;
}

// Calls field(stored_offset, packed_offset, bytes) for every byte range that moves as it is
// between a stored block and row slot i of a group-block (all but the K-quants' re-coded scales,
// mins and q5_k's / q6_k's quants).
template <class Field>
void ForEachField(DType dtype, int64_t i, Field&& field) {
  if (dtype == DType::kQ6_K) {
    field(kQ6StoredD, kScaleBytes * i, kScaleBytes);
    for (int j = 0; j < 16; ++j) field(kQ6StoredSc + j, kQ6Sc + 16 * j + i, 1);
    return;
  }
  field(0, kScaleBytes * i, kScaleBytes);  // d
  if (IsQ45K(dtype)) {
    field(2, kKDmin + kScaleBytes * i, kScaleBytes);
    if (dtype == DType::kQ4_K) {
      for (int64_t q = 0; q < 128; q += 4) field(16 + q, kKLines + 16 * q + 4 * i, 4);
    }
    return;
  }
  for (int64_t q = 0; q < QuantBytes(dtype); q += 4) {
    field(kScaleBytes + q, kPackedGroupRows * kScaleBytes + ChunkOffset(i, q), 4);
  }
}

// Where q4_k's / q5_k's sub-block j scale and min of row slot i sit in a group-block.
int64_t Q4KScaleAt(int64_t i, int j) { return kKSc + 16 * j + i; }
int64_t Q4KMinAt(int64_t i, int j) { return kKMin + 32 * (j / 2) + 2 * i + j % 2; }

void PackBlock(DType dtype, int64_t i, const uint8_t* block, uint8_t* gb) {
  ForEachField(dtype, i, [&](int64_t from, int64_t to, int64_t n) {
    std::memcpy(gb + to, block + from, static_cast<size_t>(n));
  });
  if (dtype == DType::kQ5_K) {
    uint8_t q[256];
    UnpackQuantsQ45K(block, /*fifth=*/true, q);
    for (int j = 0; j < 8; ++j) {
      for (int p = 0; p < 4; ++p) {
        int top = 0;
        for (int k = 0; k < 4; ++k) {
          const int second = q[32 * j + 16 + 4 * k + p];
          gb[Q5LineByte(i, j, k, p)] =
              static_cast<uint8_t>(q[32 * j + 4 * k + p] | (second & 7) << 5);
          top |= (second >> 3) << (2 * k);
        }
        gb[Q5LineByte(i, j, 4, p)] = static_cast<uint8_t>(top);
      }
    }
  }
  if (dtype == DType::kQ6_K) {
    uint8_t q[256];
    UnpackQuantsQ6K(block, q);
    for (int j = 0; j < 16; ++j) {
      for (int k = 0; k < 3; ++k) {
        for (int p = 0; p < 4; ++p) {
          const int top = (q[16 * j + 12 + p] >> (2 * k)) & 3;
          gb[Q6LineByte(i, j, k, p)] = static_cast<uint8_t>(q[16 * j + 4 * k + p] | top << 6);
        }
      }
    }
  }
  if (IsQ45K(dtype)) {
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(block + 4, sc, m);
    for (int j = 0; j < 8; ++j) {
      gb[Q4KScaleAt(i, j)] = sc[j];
      gb[Q4KMinAt(i, j)] = m[j];
    }
  }
}

void UnpackBlock(DType dtype, int64_t i, const uint8_t* gb, uint8_t* block) {
  if (WordPacked(dtype)) {
    std::memcpy(block, gb + kWordBytes * i, kWordBytes);
    return;
  }
  ForEachField(dtype, i, [&](int64_t to, int64_t from, int64_t n) {
    std::memcpy(block + to, gb + from, static_cast<size_t>(n));
  });
  if (dtype == DType::kQ5_K) {
    uint8_t q[256];
    for (int j = 0; j < 8; ++j) {
      for (int p = 0; p < 4; ++p) {
        const uint8_t top = gb[Q5LineByte(i, j, 4, p)];
        for (int k = 0; k < 4; ++k) {
          const uint8_t v = gb[Q5LineByte(i, j, k, p)];
          q[32 * j + 4 * k + p] = v & 31;
          q[32 * j + 16 + 4 * k + p] = static_cast<uint8_t>(v >> 5 | ((top >> (2 * k)) & 3) << 3);
        }
      }
    }
    PackQuantsQ45K(q, /*fifth=*/true, block);
  }
  if (dtype == DType::kQ6_K) {
    uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      for (int p = 0; p < 4; ++p) {
        int top = 0;
        for (int k = 0; k < 3; ++k) {
          const uint8_t v = gb[Q6LineByte(i, j, k, p)];
          q[16 * j + 4 * k + p] = v & 63;
          top |= (v >> 6) << (2 * k);
        }
        q[16 * j + 12 + p] = static_cast<uint8_t>(top);
      }
    }
    PackQuantsQ6K(q, block);
  }
  if (IsQ45K(dtype)) {
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = gb[Q4KScaleAt(i, j)];
      m[j] = gb[Q4KMinAt(i, j)];
    }
    PackScalesMinsK4(sc, m, block + 4);
  }
}

// Blocks per row, stored bytes per block, and the first group-block of `row`'s group.
struct RowPlace {
  int64_t blocks, block_bytes, group_block, group_offset;
  RowPlace(DType dtype, int64_t cols, int64_t row)
      : blocks(cols / PackedBlockElems(dtype)),
        block_bytes(DTypeRowBytes(dtype, PackedBlockElems(dtype))),
        group_block(PackedGroupBlockBytes(dtype)),
        group_offset(row / kPackedGroupRows * blocks * group_block) {}
};

}  // namespace

bool PackedLayoutSupported(DType dtype) {
  if (dtype == DType::kBF16 || dtype == DType::kF32) return internal::RunsPackedFloat(dtype);
  return dtype == DType::kQ4_0 || dtype == DType::kQ8_0 || IsQ45K(dtype) || dtype == DType::kQ6_K;
}

int64_t PackedBlockElems(DType dtype) {
  if (WordPacked(dtype)) return kWordBytes / DTypeRowBytes(dtype, 1);
  return DTypeBlockElems(dtype);
}

int64_t PackedGroupBlockBytes(DType dtype) {
  if (WordPacked(dtype)) return kPackedGroupRows * kWordBytes;
  if (dtype == DType::kQ6_K) return kQ6GroupBlock;
  if (IsQ45K(dtype)) return kKLines + 64 * (dtype == DType::kQ5_K ? 40 : 32);
  return kPackedGroupRows * (kScaleBytes + QuantBytes(dtype));
}

int64_t PackedBytes(DType dtype, int64_t rows, int64_t cols) {
  const int64_t groups = (rows + kPackedGroupRows - 1) / kPackedGroupRows;
  return groups * (cols / PackedBlockElems(dtype)) * PackedGroupBlockBytes(dtype);
}

void PackRows(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst,
              ThreadPool* pool) {
  const int64_t row_bytes = DTypeRowBytes(dtype, cols);
  const int64_t group_bytes = (cols / PackedBlockElems(dtype)) * PackedGroupBlockBytes(dtype);
  // Groups [begin, end): each group's bytes are its own, so groups pack in any order, on any
  // thread, to the same bytes.
  const auto pack_groups = [&](int64_t begin, int64_t end) {
    std::memset(static_cast<uint8_t*>(dst) + begin * group_bytes, 0,
                static_cast<size_t>((end - begin) * group_bytes));
    const int64_t row_end = std::min(rows, end * kPackedGroupRows);
    if (WordPacked(dtype)) {  // a 4-byte move per word: no per-block call
      for (int64_t row = begin * kPackedGroupRows; row < row_end; ++row) {
        const uint8_t* in = static_cast<const uint8_t*>(src) + row * row_bytes;
        uint8_t* out = static_cast<uint8_t*>(dst) + row / kPackedGroupRows * group_bytes +
                       row % kPackedGroupRows * kWordBytes;
        for (int64_t p = 0; p < row_bytes / kWordBytes; ++p) {
          std::memcpy(out + p * kPackedGroupRows * kWordBytes, in + p * kWordBytes, kWordBytes);
        }
      }
      return;
    }
    for (int64_t row = begin * kPackedGroupRows; row < row_end; ++row) {
      const RowPlace at(dtype, cols, row);
      const uint8_t* in = static_cast<const uint8_t*>(src) + row * row_bytes;
      uint8_t* group = static_cast<uint8_t*>(dst) + at.group_offset;
      for (int64_t b = 0; b < at.blocks; ++b) {
        PackBlock(dtype, row % kPackedGroupRows, in + b * at.block_bytes,
                  group + b * at.group_block);
      }
    }
  };
  const int64_t groups = (rows + kPackedGroupRows - 1) / kPackedGroupRows;
  if (pool == nullptr) {
    pack_groups(0, groups);
  } else {
    // At least 1 MiB of packed bytes per piece, so that small matrices stay on the caller.
    const int64_t min_groups =
        std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, group_bytes));
    pool->ParallelFor(groups, min_groups, pack_groups);
  }
}

void UnpackRow(const void* packed, DType dtype, int64_t cols, int64_t row, void* dst) {
  const RowPlace at(dtype, cols, row);
  const uint8_t* group = static_cast<const uint8_t*>(packed) + at.group_offset;
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < at.blocks; ++b) {
    UnpackBlock(dtype, row % kPackedGroupRows, group + b * at.group_block,
                out + b * at.block_bytes);
  }
}

}  // namespace kvserve::cpu
