#ifndef KVSERVE_KERNELS_CUDA_PTX_CUH_
#define KVSERVE_KERNELS_CUDA_PTX_CUH_

// The one place kvserve's kernels use inline PTX. Each function here has two bodies: the PTX
// nvcc compiles, and the simulator's twin (KVSERVE_CUDA_SIM, kernels/cuda/sim), which follows
// the PTX ISA's semantics closely enough that a kernel wrong on the GPU is wrong in CI too:
//
//   - cp.async: the twin performs each copy at the latest moment the program may rely on it (the
//     cp.async.wait_group that covers it), so a kernel that reads its shared-memory tile before
//     waiting reads stale bytes and fails its test; the copy's shared-memory write enters the race
//     check at that moment, so a missing __syncthreads after the wait is reported too.
//
// Kernels include this header and never write asm() themselves.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace kvserve::cuda {

// ---- Asynchronous global -> shared copies (cp.async, sm_80+) ----------------------------------

/// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned) asynchronously,
/// bypassing L1 (cp.async.cg). With `valid` false, writes 16 zero bytes and reads nothing (the
/// src-size 0 form), so out-of-range rows of a tile need no branch around the copy.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid = true) {
#ifdef KVSERVE_CUDA_SIM
  ::kvsim::AsyncCopy(dst, src, 16, valid ? 16 : 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  if (valid) {
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  } else {
    *static_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
#endif
}

/// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() {
#ifdef KVSERVE_CUDA_SIM
  ::kvsim::AsyncCommit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most `N` of this thread's committed groups are still in flight. Other threads'
/// copies become visible only after a __syncthreads that follows their own wait.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#ifdef KVSERVE_CUDA_SIM
  ::kvsim::AsyncWait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// ---- Conversions --------------------------------------------------------------------------------

/// Two OCP FP8 E4M3 codes (low byte first) -> the bits of two f16 values (low half first), with
/// sm_89+'s cvt.rn.f16x2.e4m3x2 (every e4m3 value is exact in f16). Elsewhere, and in the
/// simulator, the same values in software.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2Bits(uint16_t codes) {
#if !defined(KVSERVE_CUDA_SIM) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(codes));
  return h2;
#else
  const uint32_t lo = __half_as_ushort(__float2half_rn(Fp8ToFloat(static_cast<uint8_t>(codes))));
  const uint32_t hi =
      __half_as_ushort(__float2half_rn(Fp8ToFloat(static_cast<uint8_t>(codes >> 8))));
  return lo | (hi << 16);
#endif
}

/// Two OCP FP8 E4M3 codes (low byte first) -> two floats (Fp8x2ToHalf2Bits on sm_89+).
__device__ __forceinline__ float2 Fp8x2ToFloat2(uint16_t codes) {
#if !defined(KVSERVE_CUDA_SIM) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const uint32_t h2 = Fp8x2ToHalf2Bits(codes);
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(h2 >> 16))));
#else
  return make_float2(Fp8ToFloat(static_cast<uint8_t>(codes & 0xffu)),
                     Fp8ToFloat(static_cast<uint8_t>(codes >> 8)));
#endif
}

/// Four OCP FP8 E4M3 codes (a 32-bit word, first code in the low byte) -> four floats.
__device__ __forceinline__ void Fp8x4ToFloats(uint32_t codes, float* out) {
  const float2 lo = Fp8x2ToFloat2(static_cast<uint16_t>(codes & 0xffffu));
  const float2 hi = Fp8x2ToFloat2(static_cast<uint16_t>(codes >> 16));
  out[0] = lo.x;
  out[1] = lo.y;
  out[2] = hi.x;
  out[3] = hi.y;
}

/// One 16-byte chunk of elements of type DT (a K or V row's, or an f32 / f16 / bf16 row's), as
/// floats: 4 (f32), 8 (f16, bf16) or 16 (int8, fp8 codes, not scaled).
template <KvCacheDType DT>
__device__ __forceinline__ void DecodeChunk(const uint4& c, float* f) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (DT == KvCacheDType::kF32) {
      f[i] = __uint_as_float(w[i]);
    } else if constexpr (DT == KvCacheDType::kBF16) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else if constexpr (DT == KvCacheDType::kF16) {
      f[2 * i] = HalfBitsToFloat(static_cast<uint16_t>(w[i] & 0xffffu));
      f[2 * i + 1] = HalfBitsToFloat(static_cast<uint16_t>(w[i] >> 16));
    } else if constexpr (DT == KvCacheDType::kInt8) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        f[4 * i + b] = static_cast<float>(static_cast<int8_t>((w[i] >> (8 * b)) & 0xffu));
      }
    } else {
      Fp8x4ToFloats(w[i], f + 4 * i);
    }
  }
}

// ---- Tensor cores (mma.sync, ldmatrix) ---------------------------------------------------------
//
// Fragments are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "ldmatrix"). With lane = 4 * g + t (g = lane / 4, t = lane % 4) and b16 pairs packed low
// element first:
//   A (16 x 16, row-major):  a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                            a[2] = A[g][2t+8, 2t+9]  a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, k x n):       b0 = B[2t, 2t+1][g]      b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, f32):      c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
//   ldmatrix .x4: lane 8 * i + r gives the shared address of row r of 8 x 8 matrix i (16
//   bytes, 16-byte aligned); lane receives r[i] = M_i[g][2t, 2t+1], or with .trans
//   r[i] = (M_i[2t][g], M_i[2t+1][g]).
// So an ldmatrix .x4 of a row-major 16 x 16 tile (matrix i at rows 8 * (i % 2), columns
// 8 * (i / 2)) is an A fragment; of 16 keys x 16 dims stored [key][dim] (matrix i at keys
// 8 * (i / 2), dims 8 * (i % 2)) it is the B fragments {r[0], r[1]} and {r[2], r[3]} of S = Q K^T
// for keys 0-7 and 8-15; and .trans of 16 keys x 16 dims (matrix i at keys 8 * (i % 2), dims
// 8 * (i / 2)) gives the B fragments of O = P V for dims 0-7 and 8-15.
//
// The simulator's twins exchange the lanes' registers (operands, row addresses) through a
// per-warp buffer between two __syncwarp()s, so every lane of the warp must call them together,
// at the same place, as .sync.aligned requires of the instructions (the simulator checks it),
// and the race check sees each lane's shared-memory reads. The mma twin rounds nothing on the way
// in (its operands already are bf16 / f16); each product of two such values is exact in f32,
// and it adds the 16 products to c in k order, rounding to nearest f32 after each addition. The
// tensor cores add them in an unspecified order and internal precision, so a kernel's results
// agree with the twin's to within a few f32 ulps of the sum's magnitude, not bit for bit: tests
// use tolerances. nvcc compiles the instructions for sm_80 and newer (the architectures kvserve
// builds), and a trap for older ones.

/// The element types of mma.m16n8k16's A and B operands.
enum class MmaType { kBf16, kF16 };

/// Two floats rounded to nearest in T, `lo` in the low half: one register of a fragment.
template <MmaType T>
__device__ __forceinline__ uint32_t PackMmaPair(float lo, float hi) {
  if constexpr (T == MmaType::kBf16) {
    return FloatToBf16Bits(lo) | (static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16);
  } else {
    return __half_as_ushort(__float2half_rn(lo)) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
  }
}

#ifdef KVSERVE_CUDA_SIM
namespace ptx_detail {

inline constexpr int kTwinWords = 6;  // a lane's slot: A (4 words) and B (2), or an address

// This thread's lane, and its slot in its warp's exchange buffer. The buffer is thread-local
// storage, which is the running block's own (as static __shared__ memory is in the simulator).
__device__ __forceinline__ uint32_t* TwinWarpSlots(int* lane) {
  static thread_local uint32_t slots[32 * 32 * kTwinWords];
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  *lane = static_cast<int>(linear % 32u);
  return slots + (linear / 32u) * 32u * kTwinWords;
}

template <MmaType T>
__device__ __forceinline__ float B16ToFloat(uint32_t bits) {
  if constexpr (T == MmaType::kBf16) {
    return __uint_as_float((bits & 0xffffu) << 16);
  } else {  // IEEE binary16: every value is exact in f32
    return HalfBitsToFloat(static_cast<uint16_t>(bits & 0xffffu));
  }
}

// D = A B + C for one m16n8k16 operation of the warp, from the fragments of every lane.
template <MmaType T>
__device__ __forceinline__ void MmaTwin(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  int lane = 0;
  uint32_t* slots = TwinWarpSlots(&lane);
  uint32_t* mine = slots + lane * kTwinWords;
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b0;
  mine[5] = b1;
  __syncwarp();
  const int g = lane / 4;
  const int t = lane % 4;
  // rows[r][p]: row g + 8r of A, columns 2p and 2p + 1: register (p < 4 ? 0 : 2) + r of lane
  // 4g + p % 4. cols[h][p]: column 2t + h of B, rows 2p and 2p + 1: b0 (p < 4) or b1 of lane
  // 4 (2t + h) + p % 4.
  uint32_t rows[2][8];
  uint32_t cols[2][8];
  for (int p = 0; p < 8; ++p) {
    for (int r = 0; r < 2; ++r) rows[r][p] = slots[(4 * g + p % 4) * kTwinWords + p / 4 * 2 + r];
    for (int h = 0; h < 2; ++h) {
      cols[h][p] = slots[(4 * (2 * t + h) + p % 4) * kTwinWords + 4 + p / 4];
    }
  }
  __syncwarp();  // every lane has read the buffer before any lane's next twin writes it
  for (int r = 0; r < 2; ++r) {
    for (int h = 0; h < 2; ++h) {
      float acc = d[2 * r + h];
      for (int p = 0; p < 8; ++p) {
        acc += B16ToFloat<T>(rows[r][p]) * B16ToFloat<T>(cols[h][p]);
        acc += B16ToFloat<T>(rows[r][p] >> 16) * B16ToFloat<T>(cols[h][p] >> 16);
      }
      d[2 * r + h] = acc;
    }
  }
}

// ldmatrix .x4 (.trans): the lanes publish their row addresses, then each reads its elements.
template <bool kTrans>
__device__ __forceinline__ void LdMatrixTwin(uint32_t (&r)[4], const void* row) {
  int lane = 0;
  uint32_t* slots = TwinWarpSlots(&lane);
  const auto address = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(row));
  slots[lane * kTwinWords] = static_cast<uint32_t>(address);
  slots[lane * kTwinWords + 1] = static_cast<uint32_t>(address >> 32);
  __syncwarp();
  auto row_of = [&](int src) {
    const uint64_t lo = slots[src * kTwinWords];
    const uint64_t hi = slots[src * kTwinWords + 1];
    return reinterpret_cast<const uint16_t*>(static_cast<uintptr_t>(lo | (hi << 32)));
  };
  const int g = lane / 4;
  const int t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    if constexpr (kTrans) {  // (M_i[2t][g], M_i[2t + 1][g])
      const uint16_t* r0 = row_of(8 * i + 2 * t);
      const uint16_t* r1 = row_of(8 * i + 2 * t + 1);
      r[i] = static_cast<uint32_t>(r0[g]) | (static_cast<uint32_t>(r1[g]) << 16);
    } else {  // (M_i[g][2t], M_i[g][2t + 1])
      const uint16_t* src = row_of(8 * i + g);
      r[i] = static_cast<uint32_t>(src[2 * t]) | (static_cast<uint32_t>(src[2 * t + 1]) << 16);
    }
  }
  __syncwarp();
}

}  // namespace ptx_detail
#endif  // KVSERVE_CUDA_SIM

/// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8 x 8 b16 matrices from shared
/// memory, each transposed with kTrans; `row` is this lane's row address (see the layout above).
/// Every lane of the warp calls it together.
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4Of(uint32_t (&r)[4], const void* row) {
#ifdef KVSERVE_CUDA_SIM
  ptx_detail::LdMatrixTwin<kTrans>(r, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
  }
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

/// ldmatrix .x4 (A fragments, and B fragments of S = Q K^T).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  LdMatrixX4Of<false>(r, row);
}

/// ldmatrix .x4.trans (B fragments of O = P V).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  LdMatrixX4Of<true>(r, row);
}

/// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 in place: d = A B + d, A and
/// B fragments of type T (see the layout above). Every lane of the warp calls it together.
template <MmaType T>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#ifdef KVSERVE_CUDA_SIM
  ptx_detail::MmaTwin<T>(d, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (T == MmaType::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)d, (void)a, (void)b0, (void)b1;
  __trap();
#endif
}

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_PTX_CUH_
