#ifndef KVSERVE_KERNELS_CPU_BLOCK_QUANT_H_
#define KVSERVE_KERNELS_CPU_BLOCK_QUANT_H_

// Decoders and quantisers of the GGUF block formats (layouts in kernels/dtype.h): q8_0, q4_0,
// q4_1, q5_0, q5_1 and the K-quants q4_k, q5_k, q6_k.
//
// Decoding order is fixed so that every path (this one, the CUDA LoadWeight, the SIMD kernels)
// gets the same floats: the products d * sc, (d * sc) * q and dmin * m are exact in fp32 (an fp16
// mantissa times at most 8 + 6 bits of integers), so the only rounding is the final add or
// subtract of the min, and fused multiply-adds give the same result.

#include <cstdint>

#include "kernels/dtype.h"

namespace kvserve::cpu {

/// dst[i] = element i of a row of `n` elements stored in the block-quantized `dtype`
/// (DTypeIsQuantized(dtype); n a multiple of DTypeBlockElems(dtype)).
void DequantizeRow(const void* src, DType dtype, int64_t n, float* dst);

/// Quantizes a row of `n` floats (a multiple of DTypeBlockElems(dtype)) into
/// DTypeRowBytes(dtype, n) bytes of the block-quantized `dtype`. Each block gets its own scales
/// from a small least-squares search (K-quants: per sub-block scale and min, then 6- or 8-bit
/// sub-block scales against fp16 super-block scales); finite inputs give finite, valid blocks.
void QuantizeRow(const float* x, DType dtype, int64_t n, void* dst);

/// A q4_k / q5_k block's eight 6-bit sub-block scales sc[j] and mins m[j] from its scales[12]
/// (packing in kernels/dtype.h), and back: PackScalesMinsK4 is the exact inverse.
void UnpackScalesMinsK4(const uint8_t* scales, uint8_t* sc, uint8_t* m);
void PackScalesMinsK4(const uint8_t* sc, const uint8_t* m, uint8_t* scales);

/// A q4_k block's 256 4-bit quants q[e] (0..15), or with `fifth` a q5_k block's 5-bit ones
/// (0..31), from its qs (and qh) bytes; the weight is d sc_j q - dmin m_j for e in sub-block j =
/// e / 32. PackQuantsQ45K writes exactly those bytes back (the rest of the block untouched).
void UnpackQuantsQ45K(const uint8_t* block, bool fifth, uint8_t* q);
void PackQuantsQ45K(const uint8_t* q, bool fifth, uint8_t* block);

/// A q6_k block's 256 6-bit quants q[e] (0..63; the weight is d sc (q - 32)) from its ql and qh
/// bytes (0 .. 191), and back: PackQuantsQ6K writes exactly those bytes.
void UnpackQuantsQ6K(const uint8_t* block, uint8_t* q);
void PackQuantsQ6K(const uint8_t* q, uint8_t* block);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_BLOCK_QUANT_H_
