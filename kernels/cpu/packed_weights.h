#ifndef KVSERVE_KERNELS_CPU_PACKED_WEIGHTS_H_
#define KVSERVE_KERNELS_CPU_PACKED_WEIGHTS_H_

// Quantized weight matrices regrouped once at load for the CPU matmul ("packed"), so that a
// SIMD lane holds one weight row: sixteen rows side by side, block by block.
//
// Why: a decode GEMV over q4_0 / q8_0 rows in the file's layout spends most of its instructions
// per weight row and block — the fp16 scale converted alone, one int32-to-float conversion, FMA
// and horizontal sum per row — and ran compute-bound at about the memory bandwidth (in L2, one
// thread: q4_0 22-24 GB/s against a 25-30 GB/s triad). Packed, one vector conversion serves
// sixteen rows' scales, the integer sums of sixteen rows fill one vector's lanes, and one FMA
// scales them all: the same GEMV runs 1.7x (AVX2) to 2.3x (AVX-512 VNNI) as fast in L2.
//
// Layout, for a matrix of `rows` x `cols` (cols % 32 == 0) with nb = cols / 32 blocks per row:
// rows are taken in groups of kPackedGroupRows (the last group padded with zero rows), group g
// being rows 16g .. 16g + 15; a group is nb group-blocks in block order, group-block b holding
// block b of each of its sixteen rows:
//   bytes 0 .. 31:             the sixteen rows' fp16 scales d, row i at bytes 2i, 2i + 1;
//   bytes 32 + 64j + 4i + t:   byte 4j + t of row i's quant bytes (j < Q / 4, t < 4),
// where the quant bytes are the block's bytes after d: Q = 16 for q4_0 (nibbles, as kernels/
// dtype.h), 32 for q8_0 (int8). A group-block is 32 + 16 Q bytes (q4_0: 288, q8_0: 544), and the
// whole matrix is one ascending stream of group-blocks, group after group.

#include <cstdint>

#include "kernels/dtype.h"

namespace kvserve::cpu {

/// Weight rows per packed group (one 512-bit vector of f32 lanes).
inline constexpr int64_t kPackedGroupRows = 16;

/// Whether weights of `dtype` have a packed layout (q4_0, q8_0).
bool PackedLayoutSupported(DType dtype);

/// Bytes of a packed [rows, cols] matrix (rows rounded up to whole groups).
int64_t PackedBytes(DType dtype, int64_t rows, int64_t cols);

/// Bytes of one packed group-block (32 + 16 quant bytes per row).
int64_t PackedGroupBlockBytes(DType dtype);

/// Packs `rows` rows of `cols` elements (row-major, the stored dtype layout) into `dst`
/// (PackedBytes(dtype, rows, cols) bytes). PackedLayoutSupported(dtype), cols % 32 == 0.
void PackRows(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst);

/// Row `row` of a packed matrix back in the stored layout (DTypeRowBytes(dtype, cols) bytes).
void UnpackRow(const void* packed, DType dtype, int64_t cols, int64_t row, void* dst);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_PACKED_WEIGHTS_H_
