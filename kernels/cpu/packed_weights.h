#ifndef KVSERVE_KERNELS_CPU_PACKED_WEIGHTS_H_
#define KVSERVE_KERNELS_CPU_PACKED_WEIGHTS_H_

// Quantized weight matrices (and bf16 ones on the vdpbf16ps or AMX path, f32 ones on the avx512
// path) regrouped once at load for the CPU matmul ("packed"), so that a SIMD lane holds one weight
// row: sixteen rows side by side, block by block.
//
// Why: a decode GEMV over rows in the file's layout spends most of its instructions per weight
// row and block — the fp16 scale converted alone, one int32-to-float conversion, FMA and
// horizontal sum per row — and ran compute-bound at about the memory bandwidth (in L2, one
// thread: q4_0 22-24 GB/s against a 25-30 GB/s triad). Packed, one vector conversion serves
// sixteen rows' scales, the integer sums of sixteen rows fill one vector's lanes, and one FMA
// scales them all: in L2 q4_0 runs 1.7x (AVX2) to 1.8x (AVX-512 VNNI) as fast, q8_0 1.5-2x, q4_k
// 1.7-1.9x, q5_k 1.75x and q6_k 2x, the last two with their quants re-coded so that whole bytes
// come out of a few logic operations (docs/benchmarks.md, "Packed weights", "K-quants
// re-coded").
//
// Layout, for a matrix of `rows` x `cols` (cols a multiple of the dtype's block) with nb blocks
// per row: rows are taken in groups of kPackedGroupRows (the last group padded with zero rows),
// group g being rows 16g .. 16g + 15; a group is nb group-blocks in block order, group-block b
// holding block b of each of its sixteen rows, and the whole matrix is one ascending stream of
// group-blocks, group after group. A "chunk line" is 64 bytes: 4 bytes of each of the sixteen
// rows, row i at bytes 4i .. 4i + 3.
//   q4_0 / q8_0 (32 + 16 Q bytes: 288 / 544): bytes 0 .. 31 the rows' fp16 scales d (row i at
//     2i), then chunk line j (bytes 4j .. 4j + 3 of each row's Q quant bytes, the block's bytes
//     after d: Q = 16 nibble bytes for q4_0, 32 int8 for q8_0) at 32 + 64j.
//   q4_k / q5_k (one 256-element super-block; 2368 / 2880 bytes), in the order the kernel reads
//     it: d[16] and dmin[16] (fp16, bytes 0 and 32), the sub-block mins as bytes (m_j of row i at
//     64 + 32 (j / 2) + 2i + j % 2), the sub-block scales as bytes (sc_j at 192 + 16j + i), then
//     chunk lines from 320: q4_k's qs chunk c at line c. q5_k re-codes its quants: sub-block j
//     at 320 + 320j, as two halves of 160 bytes (rows 0..7, then 8..15), each five 32-byte
//     pieces k = 0..4 of eight rows' 4-byte chunks (row 8h + l at 320 + 320j + 160h + 32k + 4l):
//     for k < 4 byte p of a row's chunk holds element 32j + 4k + p's five bits in bits 0..4 and
//     the low three bits of element 32j + 16 + 4k + p in bits 5..7; chunk 4's byte p holds the
//     top two bits of element 32j + 16 + 4k + p in bits 2k, 2k + 1 (the 256-bit tile reads each
//     half's 160 bytes in order).
//   q6_k (one super-block; 3392 bytes, 1 % more than stored, so that lines stay 64-byte aligned):
//     d[16] (fp16) at 0, 32 zero bytes, the sub-block scales (int8 sc_j of row i at 64 + 16j + i),
//     then three chunk lines a, b, c per sub-block j (k = 0, 1, 2 at 320 + 192j + 64k): byte p of
//     a row's chunk holds the 6-bit quant of element 16j + 4k + p in bits 0..5 and bits 2k, 2k + 1
//     of element 16j + 12 + p's quant in bits 6, 7 — four elements' quants in three bytes, which
//     decode with one AND each and, for the fourth, three shifts, ANDs and two ORs.
//   bf16 (packed only where the matmul runs vdpbf16ps, PackedLayoutSupported; cols even): a
//     group-block is one chunk line, line p holding elements 2p and 2p + 1 of each row (row i's
//     at bytes 4i .. 4i + 3, element 2p first): one 512-bit load is the weight operand of a
//     vdpbf16ps whose lane i accumulates row i's output (matmul_avx512_bf16.cc), so batched
//     tiles need no horizontal sums.
//   f32 (packed only on the avx512 path, PackedLayoutSupported): the same with one element per
//     row per line (line p holds element p of each row, row i's at bytes 4i .. 4i + 3): a
//     512-bit load is the weight operand of a vfmadd231ps against x element p broadcast
//     (matmul_avx512.cc).

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"

namespace kvserve::cpu {

/// Weight rows per packed group (one 512-bit vector of f32 lanes).
inline constexpr int64_t kPackedGroupRows = 16;

/// Whether weights of `dtype` have a packed layout on the active matmul path: q4_0, q8_0, q4_k,
/// q5_k and q6_k everywhere, bf16 where Matmul() runs it as vdpbf16ps or AMX (AVX-512 with
/// AVX512_BF16), f32 on the avx512 path (elsewhere a packed bf16 or f32 matrix still multiplies,
/// but by unpacking each row).
bool PackedLayoutSupported(DType dtype);

/// Elements of a row per group-block: DTypeBlockElems(dtype), except 2 for bf16 (one pair) and 1
/// for f32.
int64_t PackedBlockElems(DType dtype);

/// Bytes of a packed [rows, cols] matrix (rows rounded up to whole groups).
int64_t PackedBytes(DType dtype, int64_t rows, int64_t cols);

/// Bytes of one packed group-block (sixteen rows' block or super-block).
int64_t PackedGroupBlockBytes(DType dtype);

/// Packs `rows` rows of `cols` elements (row-major, the stored dtype layout) into `dst`
/// (PackedBytes(dtype, rows, cols) bytes). A dtype with a packed layout, cols a multiple of
/// PackedBlockElems(dtype). With a `pool`, groups of rows are packed on its threads (the same
/// bytes).
void PackRows(const void* src, DType dtype, int64_t rows, int64_t cols, void* dst,
              ThreadPool* pool = nullptr);

/// Row `row` of a packed matrix back in the stored layout (DTypeRowBytes(dtype, cols) bytes).
void UnpackRow(const void* packed, DType dtype, int64_t cols, int64_t row, void* dst);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_PACKED_WEIGHTS_H_
