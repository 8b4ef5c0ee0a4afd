#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTile = 64;  // keys per tile
// Key values each lane holds: 8 for head_dim <= 256, 18 for MLA's latent rows (<= 576).
constexpr int kDimsPerLaneSmall = 8;
constexpr int kDimsPerLaneLarge = 18;
// Shared memory one block may use: a group too large for it (MLA's many query heads on one
// latent row) is cut into several blocks of heads_per_block heads.
constexpr size_t kSharedBudget = 96 * 1024;

struct DecodeParams {
  cpu::PagedAttentionArgs a;
  int64_t group;            // query heads per kv head
  int64_t heads_per_block;  // of the group, per thread block (the last block may have fewer)
  int64_t head_chunks;      // blocks per kv head: ceil(group / heads_per_block)
  int32_t num_splits;
  int64_t split_len;   // keys per split (0: this sequence's keys / num_splits)
  float* partial_out;  // [num_seqs][num_heads][num_splits][head_dim]
  float* partial_lse;  // [num_seqs][num_heads][num_splits]
  // PagedDecodeKernel's partition (see there).
  int32_t lanes = 0;           // L: lanes per key row, D / (elements per 16 bytes)
  int32_t tile = 0;            // T: keys per pipeline stage
  int32_t head_warps = 0;      // NH: warps side by side over the block's heads
  int32_t key_warps = 0;       // NK: warps side by side over each tile's keys
  int32_t heads_per_warp = 0;  // ceil(heads_per_block / NH)
};

// ---- The bandwidth kernel ----------------------------------------------------------------------

constexpr int kStages = 3;  // tiles in flight per block: the one computed and two being copied

template <KvCacheDType DT>
__host__ __device__ constexpr int KvBytes() {
  return DT == KvCacheDType::kF32 ? 4 : (DT == KvCacheDType::kF16 || DT == KvCacheDType::kBF16 ? 2 : 1);
}

// Elements of a KV row in one 16-byte chunk.
template <KvCacheDType DT>
__host__ __device__ constexpr int KvVec() {
  return 16 / KvBytes<DT>();
}

// Folds (m2, l2, acc2) into a running softmax state (m, l, acc); m in log2 units.
template <int kVec>
__device__ __forceinline__ void MergeState(float& m, float& l, float* acc, float m2, float l2,
                                           const float* acc2) {
  const float mn = fmaxf(m, m2);
  const float a1 = m == -INFINITY ? 0.0f : exp2f(m - mn);
  const float a2 = m2 == -INFINITY ? 0.0f : exp2f(m2 - mn);
  l = l * a1 + l2 * a2;
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = acc[e] * a1 + acc2[e] * a2;
  m = mn;
}

// The part of the work a decode block has (both kernels): grid x is kv head × chunk of its
// query heads, y the sequence, z the split; the block serves query heads [head0, head0 + G) and
// keys [k0, k1) of the sequence (the split's share of the window).
struct DecodeBlock {
  int64_t kvh;    // KV head
  int64_t g0;     // first of the block's heads within the group
  int64_t G;      // heads in this block
  int64_t head0;  // first query head
  int64_t s;      // sequence
  int32_t split;
  int64_t k0, k1;
};

__device__ __forceinline__ DecodeBlock LocateDecodeBlock(const DecodeParams& p) {
  const cpu::PagedAttentionArgs& a = p.a;
  DecodeBlock b;
  b.kvh = blockIdx.x / p.head_chunks;
  b.g0 = (blockIdx.x % p.head_chunks) * p.heads_per_block;
  b.G = min(p.heads_per_block, p.group - b.g0);
  b.head0 = b.kvh * p.group + b.g0;
  b.s = blockIdx.y;
  b.split = blockIdx.z;
  const int64_t ctx = a.context_len[b.s];
  const int64_t start = a.sliding_window > 0 ? max(int64_t{0}, ctx - a.sliding_window) : 0;
  const int64_t chunk =
      p.split_len > 0 ? p.split_len : (ctx - start + p.num_splits - 1) / p.num_splits;
  b.k0 = start + b.split * chunk;
  b.k1 = min(ctx, b.k0 + chunk);
  return b;
}

// Paged decode attention at the memory bandwidth. Grid (kv head × head chunk, sequence, split),
// 128 threads. Each block streams its split of the sequence's K and V rows through shared memory
// once, in tiles of T keys, kStages tiles in flight: 16-byte cp.async copies, consecutive threads
// on consecutive chunks of (contiguous) rows. Every query head of the block's GQA group reads the
// tile there, so each K/V byte leaves HBM once per block.
//
// Warps: NH warps over the heads (warp hg owns heads hg, hg + NH, ...; at most kHpw each) times NK
// over the keys. In a warp, L = D / kVec lanes hold one key row (one 16-byte chunk each) and the
// warp takes 32 / L keys per step. A lane keeps its chunk's dims of q (pre-scaled by
// scale·log2 e) and of the output accumulators in registers, with a running max m and sum l per
// head in log2 units (exp2). Lane groups and key warps merge their states at the end; the block
// writes the normalised output (one split) or the partial output and its log-sum-exp.
//
// Shared memory (16-byte aligned parts): q[G][D] f32 | rows[kStages + 1][T] int64 | kscale,
// vscale[kStages + 1][T] f32 | K, V tiles [kStages][2][T][L] uint4. One more row slot than tile
// slots, so the rows of the next tile are written while slow warps still read a tile's scales.
template <KvCacheDType DT, int kHpw>
__global__ void __launch_bounds__(kThreads, 1) PagedDecodeKernel(DecodeParams p) {
  constexpr int kVec = KvVec<DT>();
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const cpu::PagedAttentionArgs& a = p.a;
  const int64_t D = a.layout.head_dim;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int64_t bs = a.layout.block_size;
  const int L = p.lanes;
  const int KW = kWarp / L;
  const int T = p.tile;
  const int NH = p.head_warps;
  const int NK = p.key_warps;
  const DecodeBlock blk = LocateDecodeBlock(p);
  const int64_t kvh = blk.kvh, G = blk.G, head0 = blk.head0, s = blk.s;
  const int32_t split = blk.split;
  const int64_t k0 = blk.k0, k1 = blk.k1;
  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;

  float* q_s = smem;
  const size_t q_bytes = (static_cast<size_t>(p.heads_per_block * D) * sizeof(float) + 15) & ~size_t{15};
  int64_t* rows_s = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(smem) + q_bytes);
  float* kscale_s = reinterpret_cast<float*>(rows_s + (kStages + 1) * T);
  float* vscale_s = kscale_s + (kStages + 1) * T;
  uint4* data = reinterpret_cast<uint4*>(vscale_s + (kStages + 1) * T);  // 16-byte aligned: T % 4 == 0

  const int64_t n_tiles = k1 > k0 ? (k1 - k0 + T - 1) / T : 0;
  const int64_t qrow = a.q_start[s];
  const bool out_bf16 = a.act_dtype == DType::kBF16;
  const int32_t* table = a.block_tables + s * a.block_table_stride;
  const uint8_t* k_data = static_cast<const uint8_t*>(a.k_cache.data);
  const uint8_t* v_data = static_cast<const uint8_t*>(a.v_cache.data);
  const int64_t row_bytes = D * KvBytes<DT>();

  // Rows and scales of tile `t`, by the first T threads (one block-table read per key).
  auto write_rows = [&](int64_t t) {
    const int slot = static_cast<int>(t % (kStages + 1));
    for (int j = tid; j < T; j += kThreads) {
      const int64_t pos = k0 + t * T + j;
      int64_t row = 0;
      float ks = 1.0f, vs = 1.0f;
      if (pos < k1) {
        row = PagedRow(table, pos, bs, kv_heads, kvh);
        ks = KvScale<DT>(a.k_cache.scales, row);
        vs = KvScale<DT>(a.v_cache.scales, row);
      }
      rows_s[slot * T + j] = row;
      kscale_s[slot * T + j] = ks;
      vscale_s[slot * T + j] = vs;
    }
  };
  // The copies of tile `t` into its slot; keys past k1 are zero-filled without a read.
  auto issue = [&](int64_t t) {
    const int rslot = static_cast<int>(t % (kStages + 1));
    uint4* dst = data + static_cast<int64_t>(t % kStages) * 2 * T * L;
    const int per_kv = T * L;
    for (int c = tid; c < 2 * per_kv; c += kThreads) {
      const int which = c / per_kv;
      const int r = c % per_kv;
      const int j = r / L;
      const bool valid = k0 + t * T + j < k1;
      const uint8_t* src = (which == 0 ? k_data : v_data) + rows_s[rslot * T + j] * row_bytes +
                           static_cast<int64_t>(r % L) * 16;
      CpAsync16(dst + c, src, valid);
    }
  };

  const float q_scale = a.scale * 1.4426950408889634f;  // log2(e): scores in log2 units
  if (a.act_dtype == DType::kBF16) {
    // Two bf16 a load (PlanBandwidthKernel checked the 4-byte alignment): no 16-bit loads.
    const uint32_t* q2 = reinterpret_cast<const uint32_t*>(
        static_cast<const uint16_t*>(static_cast<const void*>(a.q)) + qrow * a.q_stride +
        head0 * D);
    for (int64_t i = tid; i < G * D / 2; i += kThreads) {
      const uint32_t two = q2[i];
      q_s[2 * i] = __uint_as_float(two << 16) * q_scale;
      q_s[2 * i + 1] = __uint_as_float(two & 0xffff0000u) * q_scale;
    }
  } else {
    for (int64_t i = tid; i < G * D; i += kThreads) {
      q_s[i] = a.q[qrow * a.q_stride + head0 * D + i] * q_scale;
    }
  }
  for (int64_t t = 0; t < kStages - 1 && t < n_tiles; ++t) write_rows(t);
  __syncthreads();
  for (int64_t t = 0; t < kStages - 1; ++t) {
    if (t < n_tiles) issue(t);
    CpAsyncCommit();
  }

  const int hg = warp % NH;
  const int kg = warp / NH;
  const int part = lane % L;  // this lane's 16-byte chunk of a row
  const int hpw = p.heads_per_warp;
  float q[kHpw][kVec];
  float acc[kHpw][kVec];
  float m[kHpw];
  float l[kHpw];
#pragma unroll
  for (int i = 0; i < kHpw; ++i) {
    const int64_t h = hg + static_cast<int64_t>(i) * NH;
    const bool mine = i < hpw && h < G;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      q[i][e] = mine ? q_s[h * D + part * kVec + e] : 0.0f;
      acc[i][e] = 0.0f;
    }
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }

  for (int64_t t = 0; t < n_tiles; ++t) {
    if (t + kStages - 1 < n_tiles) write_rows(t + kStages - 1);
    __syncthreads();  // those rows are visible; every warp is done with tile t - 1's slot
    if (t + kStages - 1 < n_tiles) issue(t + kStages - 1);
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncthreads();  // tile t has landed, for every thread's copies
    if (kg >= NK) continue;
    const int rslot = static_cast<int>(t % (kStages + 1));
    const uint4* kt = data + (t % kStages) * 2 * T * L;
    const uint4* vt = kt + T * L;
    const int64_t n = min(static_cast<int64_t>(T), k1 - (k0 + t * T));
    for (int jb = kg * KW; jb < n; jb += NK * KW) {  // the same jb in every lane
      const int j = jb + lane / L;
      const bool valid = j < n;
      float kf[kVec];
      DecodeChunk<DT>(kt[j * L + part], kf);
      const float ks = kscale_s[rslot * T + j];
      float score[kHpw];
#pragma unroll
      for (int i = 0; i < kHpw; ++i) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot += q[i][e] * kf[e];
        for (int o = 1; o < L; o *= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        score[i] = valid ? dot * ks : -INFINITY;
      }
      float vf[kVec];
      DecodeChunk<DT>(vt[j * L + part], vf);
      const float vs = vscale_s[rslot * T + j];
#pragma unroll
      for (int i = 0; i < kHpw; ++i) {
        const float mn = fmaxf(m[i], score[i]);
        if (mn == -INFINITY) continue;  // no valid key yet in this lane group
        const float alpha = exp2f(m[i] - mn);
        const float pr = exp2f(score[i] - mn);
        l[i] = l[i] * alpha + pr;
        const float pv = pr * vs;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[i][e] = acc[i][e] * alpha + pv * vf[e];
        m[i] = mn;
      }
    }
  }

  // Lane groups of a warp hold the same dims for different keys: fold them together.
  for (int o = L; o < kWarp; o *= 2) {
#pragma unroll
    for (int i = 0; i < kHpw; ++i) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[i], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[i], o);
      float acc2[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc2[e] = __shfl_xor_sync(0xffffffffu, acc[i][e], o);
      MergeState<kVec>(m[i], l[i], acc[i], m2, l2, acc2);
    }
  }
  // Key warps: warps 1.. of each head group leave their state in shared memory for warp 0.
  if (NK > 1) {
    __syncthreads();  // the tiles are free
    float* scratch = reinterpret_cast<float*>(data);  // [NK][G][D + 2]
    if (kg > 0 && kg < NK && lane < L) {
#pragma unroll
      for (int i = 0; i < kHpw; ++i) {
        const int64_t h = hg + static_cast<int64_t>(i) * NH;
        if (i >= hpw || h >= G) continue;
        float* st = scratch + (kg * G + h) * (D + 2);
#pragma unroll
        for (int e = 0; e < kVec; ++e) st[part * kVec + e] = acc[i][e];
        if (lane == 0) {
          st[D] = m[i];
          st[D + 1] = l[i];
        }
      }
    }
    __syncthreads();
    if (kg == 0) {
      for (int k2 = 1; k2 < NK; ++k2) {
#pragma unroll
        for (int i = 0; i < kHpw; ++i) {
          const int64_t h = hg + static_cast<int64_t>(i) * NH;
          if (i >= hpw || h >= G) continue;
          const float* st = scratch + (k2 * G + h) * (D + 2);
          float acc2[kVec];
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc2[e] = st[part * kVec + e];
          MergeState<kVec>(m[i], l[i], acc[i], st[D], st[D + 1], acc2);
        }
      }
    }
  }
  if (kg != 0 || lane >= L) return;
#pragma unroll
  for (int i = 0; i < kHpw; ++i) {
    const int64_t h = hg + static_cast<int64_t>(i) * NH;
    if (i >= hpw || h >= G) continue;
    const int64_t head = head0 + h;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    if (p.num_splits == 1) {
      const int64_t at = qrow * a.out_stride + head * D + part * kVec;
#pragma unroll
      for (int e = 0; e < kVec; ++e) StoreAct(a.out, at + e, acc[i][e] * inv, out_bf16);
      continue;
    }
    const int64_t slot = (s * a.num_heads + head) * p.num_splits + split;
    float* dst = p.partial_out + slot * D;
    if (lane == 0) {
      p.partial_lse[slot] =
          l[i] > 0.0f ? (m[i] + log2f(l[i])) * 0.6931471805599453f : -INFINITY;  // ln 2
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) dst[part * kVec + e] = acc[i][e] * inv;
  }
}

// ---- The tensor-core kernel (16-bit and 8-bit KV, head dims 64, 128, 256, GQA groups) -------
//
// The bandwidth kernel above decodes and dots every K/V chunk once per query head of the group,
// and rescales its accumulators on every key: on an H200 it issued instructions at 68 % of the SM
// throughput while the DRAM ran at 22 % (docs/gpu.md). Here a warp attends up to 8 heads of the
// group with mma.sync m16n8k16, so a K/V byte costs about the same instructions whatever the
// group, and the accumulators are rescaled once per 16 keys (and not at all when no running max
// moved):
//   S = Q K^T    M = 16 query heads (8 used), N = 8 keys, K = 16 dims: Q's A fragments sit in
//                registers for the whole call (rows 8-15 zero), K's B fragments come from the
//                shared tile by ldmatrix.
//   O^T += V^T P^T  M = 16 dims, N = 8 heads, K = 16 keys: V^T's A fragments by ldmatrix.trans of
//                the same tile; P^T's B fragment is exactly the C fragment of S that the lane
//                already holds (head g, keys 2t, 2t + 1 and 2t + 8, 2t + 9), rounded to the mma's
//                type, so P never leaves registers. O^T is D / 16 C fragments, no padding.
// Block: 4 warps, each attending its own 16 keys of every 64-key tile; the K/V pipeline is the
// bandwidth kernel's (kStages tiles in flight, 16-byte cp.async). The warps' states merge through
// shared memory at the end.
//
// Types: f16 / bf16 rows are multiplied as stored, straight from the copied tile (rows padded by
// 16 bytes so an ldmatrix's eight rows fall in distinct banks). int8 and fp8 e4m3 codes are exact
// in f16: each warp widens its own 16 keys of the copied codes into a per-warp f16 tile (fp8 with
// the hardware's cvt.rn.f16x2.e4m3x2), multiplies in f16, and applies the rows' scales to S (K)
// and to P after its sum (V), as the CPU kernel does. Q and P are rounded to the mma's type (bf16
// for bf16 KV, f16 otherwise), as the tensor-core prefill kernel rounds them.

constexpr int kMmaWarpKeys = 16;                 // keys a warp attends per tile
constexpr int kMmaTile = kWarps * kMmaWarpKeys;  // keys per pipeline stage
constexpr int kMmaHeads = 8;                     // query heads per block (N of O^T)
constexpr int kMmaRowPad = 8;                    // b16 elements after every mma tile row
static_assert(kMmaTile == kTile, "PlanDecodeSplits cuts splits at whole tiles");

template <KvCacheDType DT>
struct MmaDecodeKv {
  static constexpr bool kWide = KvBytes<DT>() == 2;  // f16 / bf16: multiplied from the copy
  static constexpr MmaType kType = DT == KvCacheDType::kBF16 ? MmaType::kBf16 : MmaType::kF16;
};

// Shared memory: rows [kStages + 1][T] int64 | (8-bit) kscale, vscale [kStages + 1][T] f32 |
// q [kMmaHeads][D] in the mma's type | copied K, V [kStages][2][T] rows (16-bit: D + pad elements;
// 8-bit: D codes) | (8-bit) the warps' widened K, V [kWarps][2][16][D + pad] f16. The merge's
// scratch ([warps][heads][D] f32 and m, l [warps][heads]) reuses the copied tiles.
template <KvCacheDType DT, int D>
struct MmaDecodeLayout {
  static constexpr bool kWide = MmaDecodeKv<DT>::kWide;
  static constexpr int kS = D + kMmaRowPad;             // mma tile row, b16 elements
  static constexpr int kRowBytes = kWide ? 2 * kS : D;  // copied row
  static constexpr size_t kRows = sizeof(int64_t) * (kStages + 1) * kMmaTile;
  static constexpr size_t kScales = kWide ? 0 : 2 * sizeof(float) * (kStages + 1) * kMmaTile;
  static constexpr size_t kQ = sizeof(uint16_t) * kMmaHeads * D;
  static constexpr size_t kCopied = size_t{kStages} * 2 * kMmaTile * kRowBytes;
  static constexpr size_t kWidened = kWide ? 0 : sizeof(uint16_t) * kWarps * 2 * kMmaWarpKeys * kS;
  static constexpr size_t kBytes = kRows + kScales + kQ + kCopied + kWidened;
  static_assert((kRows + kScales + kQ) % 16 == 0 && kCopied % 16 == 0, "16-byte aligned parts");
  static_assert(sizeof(float) * kWarps * kMmaHeads * (D + 2) <= kCopied,
                "the merge scratch fits in the copied tiles");
};

// Sixteen int8 / fp8 codes -> sixteen f16 (exact), low code first.
template <KvCacheDType DT>
__device__ __forceinline__ void WidenCodes(const uint4& c, uint4* out) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (DT == KvCacheDType::kFp8E4M3) {
      h[2 * i] = Fp8x2ToHalf2Bits(static_cast<uint16_t>(w[i] & 0xffffu));
      h[2 * i + 1] = Fp8x2ToHalf2Bits(static_cast<uint16_t>(w[i] >> 16));
    } else {
      float f[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) f[b] = static_cast<float>(static_cast<int8_t>(w[i] >> (8 * b)));
      h[2 * i] = PackMmaPair<MmaType::kF16>(f[0], f[1]);
      h[2 * i + 1] = PackMmaPair<MmaType::kF16>(f[2], f[3]);
    }
  }
  out[0] = make_uint4(h[0], h[1], h[2], h[3]);
  out[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

template <KvCacheDType DT, int D>
__global__ void __launch_bounds__(kThreads) DecodeMmaKernel(DecodeParams p) {
  using Kv = MmaDecodeKv<DT>;
  using Layout = MmaDecodeLayout<DT, D>;
  constexpr MmaType MT = Kv::kType;
  constexpr bool kWide = Kv::kWide;
  constexpr int kS = Layout::kS;
  constexpr int kRowBytes = Layout::kRowBytes;
  constexpr int kChunks = D * KvBytes<DT>() / 16;  // 16-byte chunks of a stored row
  constexpr int T = kMmaTile;
  KVSERVE_DYNAMIC_SHARED(uint4, mma_smem);  // 16-byte aligned for cp.async and ldmatrix
  const cpu::PagedAttentionArgs& a = p.a;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int32_t bs = static_cast<int32_t>(a.layout.block_size);
  const DecodeBlock blk = LocateDecodeBlock(p);
  const int64_t kvh = blk.kvh, G = blk.G, head0 = blk.head0, s = blk.s;
  const int64_t k0 = blk.k0, k1 = blk.k1;
  const int tid = threadIdx.x;
  const int warp = tid / kWarp;
  const int lane = tid % kWarp;
  const int g = lane / 4;  // fragment row group
  const int t = lane % 4;  // fragment column pair

  char* base = reinterpret_cast<char*>(mma_smem);
  int64_t* rows_s = reinterpret_cast<int64_t*>(base);
  float* kscale_s = reinterpret_cast<float*>(base + Layout::kRows);
  float* vscale_s = kscale_s + (kStages + 1) * T;
  uint32_t* q_s = reinterpret_cast<uint32_t*>(base + Layout::kRows + Layout::kScales);
  char* copied = base + Layout::kRows + Layout::kScales + Layout::kQ;
  uint16_t* widened = reinterpret_cast<uint16_t*>(copied + Layout::kCopied) +
                      warp * 2 * kMmaWarpKeys * kS;  // this warp's (8-bit)
  const int64_t n_tiles = k1 > k0 ? (k1 - k0 + T - 1) / T : 0;
  const int32_t* table = a.block_tables + s * a.block_table_stride;
  const auto* k_data = static_cast<const char*>(a.k_cache.data);
  const auto* v_data = static_cast<const char*>(a.v_cache.data);

  // Byte offsets (and 8-bit scales) of tile `tile`'s rows, by the first T threads.
  auto write_rows = [&](int64_t tile) {
    const int slot = static_cast<int>(tile % (kStages + 1));
    for (int j = tid; j < T; j += kThreads) {
      const int64_t pos = k0 + tile * T + j;
      int64_t row = 0;
      if (pos < k1) {
        row = PagedRow(table, pos, bs, kv_heads, kvh);
        if constexpr (!kWide) {
          kscale_s[slot * T + j] = a.k_cache.scales[row];
          vscale_s[slot * T + j] = a.v_cache.scales[row];
        }
      } else if constexpr (!kWide) {
        kscale_s[slot * T + j] = 0.0f;
        vscale_s[slot * T + j] = 0.0f;
      }
      rows_s[slot * T + j] = row * (D * KvBytes<DT>());
    }
  };
  // The copies of tile `tile` into its stage; keys past k1 are zero-filled without a read.
  auto issue = [&](int64_t tile) {
    const int rslot = static_cast<int>(tile % (kStages + 1));
    char* kt = copied + static_cast<int64_t>(tile % kStages) * 2 * T * kRowBytes;
    const int64_t n = k1 - (k0 + tile * T);
    for (int c = tid; c < T * kChunks; c += kThreads) {
      const int j = c / kChunks;
      const int off = c % kChunks * 16;
      const bool valid = j < n;
      const int64_t at = rows_s[rslot * T + j] + off;
      CpAsync16(kt + j * kRowBytes + off, k_data + at, valid);
      CpAsync16(kt + (T + j) * kRowBytes + off, v_data + at, valid);
    }
  };

  // The block's queries, read once (two a load), times scale * log2 e, rounded to the mma's type
  // in pairs: [kMmaHeads][D / 2], zeros past G.
  {
    const float q_scale = a.scale * 1.4426950408889634f;
    const bool bf16 = a.act_dtype == DType::kBF16;
    const int64_t q0 = a.q_start[s] * a.q_stride + head0 * D;
    for (int i = tid; i < kMmaHeads * D / 2; i += kThreads) {
      const int h = i / (D / 2);
      const int64_t at = q0 + h * D + 2 * (i % (D / 2));
      float x0 = 0.0f, x1 = 0.0f;
      if (h < G && bf16) {  // PlanMmaKernel checked the 4-byte alignment
        const uint32_t two = *reinterpret_cast<const uint32_t*>(
            static_cast<const uint16_t*>(static_cast<const void*>(a.q)) + at);
        x0 = __uint_as_float(two << 16);
        x1 = __uint_as_float(two & 0xffff0000u);
      } else if (h < G) {
        x0 = a.q[at];
        x1 = a.q[at + 1];
      }
      q_s[i] = PackMmaPair<MT>(x0 * q_scale, x1 * q_scale);
    }
  }
  for (int64_t tile = 0; tile < kStages - 1 && tile < n_tiles; ++tile) write_rows(tile);
  __syncthreads();
  // Q's A fragments: rows g (head g of the block) at columns 2t, 2t + 1 and 2t + 8, 2t + 9 of
  // every 16-dim step; rows 8-15 zero.
  uint32_t qa[D / 16][2];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qa[kk][0] = q_s[g * (D / 2) + kk * 8 + t];
    qa[kk][1] = q_s[g * (D / 2) + kk * 8 + 4 + t];
  }
  for (int64_t tile = 0; tile < kStages - 1; ++tile) {
    if (tile < n_tiles) issue(tile);
    CpAsyncCommit();
  }

  // The warp's state: O^T fragments (dims 16 mt + g, + 8; heads 2t, 2t + 1), and for head g the
  // running max m (log2 units; the same in the group's four lanes) and this lane's part of l.
  float o[D / 16][4];
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  // ldmatrix row addresses within a warp's 16 keys: key 8 (lane / 16) + lane % 8, dims
  // 8 (lane / 8 % 2): K's B fragments for keys 0-7 and 8-15 (non-transposed), V^T's A fragment
  // (transposed) -- see ptx.cuh.
  const int lm_off = ((lane / 16) * 8 + lane % 8) * kS + (lane / 8) % 2 * 8;

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    if (tile + kStages - 1 < n_tiles) write_rows(tile + kStages - 1);
    __syncthreads();  // those rows are visible; every warp is done with tile - 1's slot
    if (tile + kStages - 1 < n_tiles) issue(tile + kStages - 1);
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncthreads();  // this tile has landed, for every thread's copies
    const int64_t n = min(static_cast<int64_t>(T), k1 - (k0 + tile * T)) - warp * kMmaWarpKeys;
    if (n <= 0) continue;  // the same in the whole warp
    const char* kc =
        copied + (tile % kStages) * 2 * T * kRowBytes + warp * kMmaWarpKeys * kRowBytes;
    const uint16_t* ks;
    const uint16_t* vs;
    if constexpr (kWide) {
      ks = reinterpret_cast<const uint16_t*>(kc);
      vs = reinterpret_cast<const uint16_t*>(kc + T * kRowBytes);
    } else {
      // Widen the warp's 16 K and V rows; the warp's ldmatrix reads of the previous tile are done.
      __syncwarp();
      for (int c = lane; c < 2 * kMmaWarpKeys * kChunks; c += kWarp) {
        const int which = c / (kMmaWarpKeys * kChunks);  // 0: K, 1: V
        const int j = c / kChunks % kMmaWarpKeys;
        const int chunk = c % kChunks;
        const uint4 codes = *reinterpret_cast<const uint4*>(kc + which * T * kRowBytes +
                                                            j * kRowBytes + chunk * 16);
        uint4* dst =
            reinterpret_cast<uint4*>(widened + (which * kMmaWarpKeys + j) * kS + chunk * 16);
        WidenCodes<DT>(codes, dst);
      }
      __syncwarp();
      ks = widened;
      vs = widened + kMmaWarpKeys * kS;
    }
    float sc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t kb[4];
      LdMatrixX4(kb, ks + lm_off + kk * 16);
      const uint32_t qf[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
      Mma<MT>(sc[0], qf, kb[0], kb[1]);
      Mma<MT>(sc[1], qf, kb[2], kb[3]);
    }
    // Head g's scores for keys 8j + 2t + e (rows 8-15, sc[j][2..3], are the zero rows of Q).
    const int rslot = static_cast<int>(tile % (kStages + 1));
    const int key0 = rslot * T + warp * kMmaWarpKeys;  // this warp's first key in the scales
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * j + 2 * t + e;
        if constexpr (!kWide) sc[j][e] *= kscale_s[key0 + key];
        if (key >= n) sc[j][e] = -INFINITY;
        mx = fmaxf(mx, sc[j][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);  // finite: every warp with keys has key 0 valid
    const float alpha = exp2f(m - m_new);
    m = m_new;
    float pr[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) pr[j][e] = exp2f(sc[j][e] - m_new);
    }
    l = l * alpha + ((pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]));
    if constexpr (!kWide) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) pr[j][e] *= vscale_s[key0 + 8 * j + 2 * t + e];
      }
    }
    if (__any_sync(0xffffffffu, alpha != 1.0f)) {
      // This lane's output columns are heads 2t and 2t + 1, whose alphas lanes 8t and 8t + 4
      // hold.
      const float a_lo = __shfl_sync(0xffffffffu, alpha, 8 * t);
      const float a_hi = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        o[mt][0] *= a_lo;
        o[mt][1] *= a_hi;
        o[mt][2] *= a_lo;
        o[mt][3] *= a_hi;
      }
    }
    const uint32_t pb0 = PackMmaPair<MT>(pr[0][0], pr[0][1]);
    const uint32_t pb1 = PackMmaPair<MT>(pr[1][0], pr[1][1]);
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      uint32_t va[4];
      LdMatrixX4Trans(va, vs + lm_off + mt * 16);
      Mma<MT>(o[mt], va, pb0, pb1);
    }
  }

  // Head g's l over the four lanes of its group.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  // Merge the warps: each leaves O^T (as O [head][dim]), m and l in shared memory, in the tiles
  // (free once every warp is past this barrier).
  __syncthreads();
  float* o_s = reinterpret_cast<float*>(copied);  // [warps][kMmaHeads][D]
  float* m_s = o_s + kWarps * kMmaHeads * D;      // [warps][kMmaHeads]
  float* l_s = m_s + kWarps * kMmaHeads;
  float* mine = o_s + warp * kMmaHeads * D;
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    mine[(2 * t) * D + 16 * mt + g] = o[mt][0];
    mine[(2 * t + 1) * D + 16 * mt + g] = o[mt][1];
    mine[(2 * t) * D + 16 * mt + g + 8] = o[mt][2];
    mine[(2 * t + 1) * D + 16 * mt + g + 8] = o[mt][3];
  }
  if (t == 0) {
    m_s[warp * kMmaHeads + g] = m;
    l_s[warp * kMmaHeads + g] = l;
  }
  __syncthreads();
  const bool out_bf16 = a.act_dtype == DType::kBF16;
  for (int64_t i = tid; i < G * D; i += kThreads) {
    const int h = static_cast<int>(i / D);
    const int64_t d = i % D;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w * kMmaHeads + h]);
    float num = 0.0f, den = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float mw = m_s[w * kMmaHeads + h];
        if (mw == -INFINITY) continue;  // a warp without keys
        const float f = exp2f(mw - mx);
        num += f * o_s[(w * kMmaHeads + h) * D + d];
        den += f * l_s[w * kMmaHeads + h];
      }
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    const int64_t head = head0 + h;
    if (p.num_splits == 1) {
      StoreAct(a.out, a.q_start[s] * a.out_stride + head * D + d, num * inv, out_bf16);
      continue;
    }
    const int64_t slot = (s * a.num_heads + head) * p.num_splits + blk.split;
    p.partial_out[slot * D + d] = num * inv;
    if (d == 0) {
      p.partial_lse[slot] = den > 0.0f ? (mx + log2f(den)) * 0.6931471805599453f : -INFINITY;
    }
  }
}

// The general kernel, for rows the bandwidth kernel below does not take (MLA's 576-wide latent
// rows, head dims that are no power-of-two number of 16-byte chunks, unaligned caches): one warp
// per key with scalar loads, P·V accumulators in shared memory.
// Shared memory: q[G][D] | acc[G][D] | p[G][kTile] | m[G] | l[G] | alpha[G] | kscale, vscale
// [kTile] | rows[kTile] (int64).
template <KvCacheDType DT, int kMaxDimPerLane>
__global__ void DecodeGeneralKernel(DecodeParams p) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const cpu::PagedAttentionArgs& a = p.a;
  const int64_t D = a.layout.head_dim;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int64_t bs = a.layout.block_size;
  const DecodeBlock blk = LocateDecodeBlock(p);
  const int64_t kvh = blk.kvh, G = blk.G, head0 = blk.head0, s = blk.s;
  const int32_t split = blk.split;
  const int64_t k0 = blk.k0, k1 = blk.k1;
  float* q_s = smem;
  float* acc = q_s + G * D;
  float* prob = acc + G * D;
  float* m_s = prob + G * kTile;
  float* l_s = m_s + G;
  float* alpha_s = l_s + G;
  float* kscale = alpha_s + G;
  float* vscale = kscale + kTile;
  int64_t* rows =
      reinterpret_cast<int64_t*>((reinterpret_cast<uintptr_t>(vscale + kTile) + 7) & ~uintptr_t{7});

  const int64_t qrow = a.q_start[s];
  const bool bf16 = a.act_dtype == DType::kBF16;  // q and out
  for (int64_t i = threadIdx.x; i < G * D; i += blockDim.x) {
    q_s[i] = LoadAct(a.q, qrow * a.q_stride + head0 * D + i, bf16);
    acc[i] = 0.0f;
  }
  for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
    m_s[g] = -INFINITY;
    l_s[g] = 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int32_t* table = a.block_tables + s * a.block_table_stride;
  for (int64_t t0 = k0; t0 < k1; t0 += kTile) {
    const int64_t n = min(int64_t{kTile}, k1 - t0);
    // Scores: one warp per key; the key row is read once into registers for all G heads.
    for (int64_t j = warp; j < n; j += kWarps) {
      const int64_t pos = t0 + j;
      const int64_t row = PagedRow(table, pos, bs, kv_heads, kvh);
      float kr[kMaxDimPerLane];
#pragma unroll
      for (int e = 0; e < kMaxDimPerLane; ++e) {
        const int64_t d = lane + e * kWarp;
        kr[e] = d < D ? LoadKv<DT>(a.k_cache.data, row * D + d) : 0.0f;
      }
      const float ks = KvScale<DT>(a.k_cache.scales, row);
      for (int64_t g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kMaxDimPerLane; ++e) {
          const int64_t d = lane + e * kWarp;
          if (d < D) dot += q_s[g * D + d] * kr[e];
        }
        dot = WarpSum(dot);
        if (lane == 0) prob[g * kTile + j] = dot * ks * a.scale;
      }
      if (lane == 0) {
        rows[j] = row;
        kscale[j] = ks;
        vscale[j] = KvScale<DT>(a.v_cache.scales, row);
      }
    }
    __syncthreads();
    // Online softmax, one thread per query head.
    for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
      float mt = m_s[g];
      for (int64_t j = 0; j < n; ++j) mt = fmaxf(mt, prob[g * kTile + j]);
      const float alpha = m_s[g] == -INFINITY ? 0.0f : expf(m_s[g] - mt);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float e = expf(prob[g * kTile + j] - mt);
        prob[g * kTile + j] = e;
        sum += e;
      }
      l_s[g] = l_s[g] * alpha + sum;
      m_s[g] = mt;
      alpha_s[g] = alpha;
    }
    __syncthreads();
    // Values: each thread owns dims d of every head in the group; a V element is read once.
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      for (int64_t g = 0; g < G; ++g) acc[g * D + d] *= alpha_s[g];
      for (int64_t j = 0; j < n; ++j) {
        const float v = LoadKv<DT>(a.v_cache.data, rows[j] * D + d);
        for (int64_t g = 0; g < G; ++g) acc[g * D + d] += (prob[g * kTile + j] * vscale[j]) * v;
      }
    }
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int64_t g = i / D;
    const int64_t h = head0 + g;
    const float l = l_s[g];
    const float o = l > 0.0f ? acc[i] / l : 0.0f;
    if (p.num_splits == 1) {
      StoreAct(a.out, qrow * a.out_stride + h * D + i % D, o, bf16);
    } else {
      const int64_t slot = (s * a.num_heads + h) * p.num_splits + split;
      p.partial_out[slot * D + i % D] = o;
      if (i % D == 0) p.partial_lse[slot] = l > 0.0f ? m_s[g] + logf(l) : -INFINITY;
    }
  }
}

// Combines the splits of one (sequence, head): weights exp(lse_s - max lse).
__global__ void MergeKernel(DecodeParams p) {
  const cpu::PagedAttentionArgs& a = p.a;
  const int64_t h = blockIdx.x;
  const int64_t s = blockIdx.y;
  const int64_t D = a.layout.head_dim;
  const int64_t base = (s * a.num_heads + h) * p.num_splits;
  float mx = -INFINITY;
  for (int32_t i = 0; i < p.num_splits; ++i) mx = fmaxf(mx, p.partial_lse[base + i]);
  const int64_t out0 = static_cast<int64_t>(a.q_start[s]) * a.out_stride + h * D;
  const bool bf16 = a.act_dtype == DType::kBF16;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f;
    float den = 0.0f;
    for (int32_t i = 0; i < p.num_splits; ++i) {
      const float lse = p.partial_lse[base + i];
      if (lse == -INFINITY) continue;
      const float w = expf(lse - mx);
      num += w * p.partial_out[(base + i) * D + d];
      den += w;
    }
    StoreAct(a.out, out0 + d, den > 0.0f ? num / den : 0.0f, bf16);
  }
}

}  // namespace

DecodeSplits PlanDecodeSplits(const AttentionShape& shape, int num_sms) {
  constexpr int64_t kMaxSplits = 64;
  DecodeSplits d;
  const int64_t longest = std::max<int64_t>(1, shape.max_context_len);
  if (shape.context_capacity > 0) {
    int64_t len = std::max<int64_t>(256, CeilDiv(shape.context_capacity, kMaxSplits));
    len = CeilDiv(len, kTile) * kTile;
    const int64_t splits = CeilDiv(longest, len);
    if (splits <= kMaxSplits) {
      d.num_splits = static_cast<int32_t>(splits);
      d.split_len = len;
      return d;
    }
    // A context past the capacity: correct, but no longer cut where other plans cut it.
  }
  const int64_t blocks = std::max<int64_t>(1, shape.num_seqs * shape.layout.num_kv_heads);
  const int64_t want = CeilDiv(2 * int64_t{num_sms}, blocks);
  const int64_t by_len = std::max<int64_t>(1, CeilDiv(longest, 128));
  d.num_splits = static_cast<int32_t>(std::clamp<int64_t>(std::min(want, by_len), 1, kMaxSplits));
  return d;
}

namespace {

// Shared bytes of a block of g query heads of width D (the layout DecodeKernel documents).
size_t DecodeSharedBytes(int64_t g, int64_t D) {
  return sizeof(float) * (2 * g * D + g * kTile + 3 * g + 2 * kTile) + sizeof(int64_t) * kTile +
         8;  // + 8: int64 alignment of rows
}

template <KvCacheDType DT, int kLanes>
cudaError_t LaunchDecode(const DecodeParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  return LaunchWithSharedMemory<DecodeGeneralKernel<DT, kLanes>>(grid, kThreads, smem, stream, p);
}

// PagedDecodeKernel's partition of a block of `per_block` heads of width D, or false when the
// rows do not suit it (then DecodeGeneralKernel runs).
bool PlanBandwidthKernel(const cpu::PagedAttentionArgs& args, int64_t group, DecodeParams* p,
                         size_t* smem) {
  const KvCacheDType dtype = args.layout.dtype;
  const int vec = static_cast<int>(16 / KvCacheDTypeElemBytes(dtype));
  const int64_t D = args.layout.head_dim;
  if (D % vec != 0) return false;
  const int64_t lanes = D / vec;
  if (lanes > kWarp || (lanes & (lanes - 1)) != 0) return false;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (!aligned(args.k_cache.data) || !aligned(args.v_cache.data)) return false;
  // bf16 q is read two elements (4 bytes) at a time.
  if (args.act_dtype == DType::kBF16 &&
      (reinterpret_cast<uintptr_t>(args.q) % 4 != 0 || args.q_stride % 2 != 0 || D % 2 != 0)) {
    return false;
  }
  // q and the accumulators take 2 · heads_per_warp · vec registers a lane: at most 128.
  const int64_t max_hpw = std::min<int64_t>(8, 64 / vec);
  const int64_t per_block = std::min(group, 4 * max_hpw);
  p->heads_per_block = per_block;
  p->head_chunks = CeilDiv(group, per_block);
  p->lanes = static_cast<int32_t>(lanes);
  p->tile = static_cast<int32_t>(std::clamp<int64_t>(512 / lanes, 16, 64));
  p->head_warps = static_cast<int32_t>(std::min<int64_t>(per_block, kWarps));
  p->key_warps = kWarps / p->head_warps;
  p->heads_per_warp = static_cast<int32_t>(CeilDiv(per_block, p->head_warps));
  const size_t q_bytes = (static_cast<size_t>(per_block * D) * sizeof(float) + 15) & ~size_t{15};
  const size_t rows = static_cast<size_t>(kStages + 1) * p->tile;
  const size_t tiles = static_cast<size_t>(kStages) * 2 * p->tile * lanes * 16;
  *smem = q_bytes + rows * (sizeof(int64_t) + 2 * sizeof(float)) + tiles;
  return true;
}

// The tensor-core kernel takes f16, bf16, int8 and fp8 rows of 64, 128 or 256 dims in 16-byte
// aligned caches, for groups of two or more query heads (one head gains nothing from sharing a K/V
// byte, and wastes 7 of the mma's 8 head columns). Blocks of up to kMmaHeads heads.
bool PlanMmaKernel(const cpu::PagedAttentionArgs& args, int64_t group, DecodeParams* p) {
  const int64_t D = args.layout.head_dim;
  if (args.layout.dtype == KvCacheDType::kF32) return false;
  if ((D != 64 && D != 128 && D != 256) || group < 2) return false;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (!aligned(args.k_cache.data) || !aligned(args.v_cache.data)) return false;
  // bf16 q is read two elements (4 bytes) at a time.
  if (args.act_dtype == DType::kBF16 &&
      (reinterpret_cast<uintptr_t>(args.q) % 4 != 0 || args.q_stride % 2 != 0)) {
    return false;
  }
  p->heads_per_block = std::min<int64_t>(group, kMmaHeads);
  p->head_chunks = CeilDiv(group, p->heads_per_block);
  return true;
}

template <KvCacheDType DT, int D>
cudaError_t LaunchMma(const DecodeParams& p, dim3 grid, cudaStream_t stream) {
  return LaunchWithSharedMemory<DecodeMmaKernel<DT, D>>(grid, kThreads,
                                                        MmaDecodeLayout<DT, D>::kBytes, stream, p);
}

cudaError_t DispatchMma(const DecodeParams& p, cudaStream_t stream) {
  const cpu::PagedAttentionArgs& args = p.a;
  const dim3 grid(static_cast<unsigned>(args.layout.num_kv_heads * p.head_chunks),
                  static_cast<unsigned>(args.num_seqs), static_cast<unsigned>(p.num_splits));
  cudaError_t err = cudaErrorInvalidValue;
  DispatchTensorCoreKv(args.layout.dtype, args.layout.head_dim, [&](auto tag, auto dim) {
    err = LaunchMma<decltype(tag)::value, decltype(dim)::value>(p, grid, stream);
  });
  return err;
}

template <KvCacheDType DT, int kHpw>
cudaError_t LaunchBandwidth(const DecodeParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  return LaunchWithSharedMemory<PagedDecodeKernel<DT, kHpw>>(grid, kThreads, smem, stream, p);
}

// The instance with the fewest register slots for p.heads_per_warp (8-bit rows stop at 4).
template <KvCacheDType DT>
cudaError_t DispatchBandwidth(const DecodeParams& p, dim3 grid, size_t smem,
                              cudaStream_t stream) {
  if (p.heads_per_warp <= 1) return LaunchBandwidth<DT, 1>(p, grid, smem, stream);
  if (p.heads_per_warp <= 2) return LaunchBandwidth<DT, 2>(p, grid, smem, stream);
  if constexpr (KvVec<DT>() <= 8) {
    if (p.heads_per_warp > 4) return LaunchBandwidth<DT, 8>(p, grid, smem, stream);
  }
  return LaunchBandwidth<DT, 4>(p, grid, smem, stream);
}

cudaError_t LaunchGeneral(DecodeParams p, cudaStream_t stream) {
  const cpu::PagedAttentionArgs& args = p.a;
  const int64_t D = args.layout.head_dim;
  const int64_t group = p.group;
  int64_t per_block = group;
  while (per_block > 1 && DecodeSharedBytes(per_block, D) > kSharedBudget) {
    per_block = CeilDiv(per_block, int64_t{2});
  }
  p.heads_per_block = per_block;
  p.head_chunks = CeilDiv(group, per_block);
  const size_t smem = DecodeSharedBytes(per_block, D);
  const dim3 grid(static_cast<unsigned>(args.layout.num_kv_heads * p.head_chunks),
                  static_cast<unsigned>(args.num_seqs), static_cast<unsigned>(p.num_splits));
  cudaError_t err = cudaSuccess;
  DispatchKvDType(args.layout.dtype, [&](auto tag) {
    constexpr KvCacheDType DT = decltype(tag)::value;
    err = D <= kDimsPerLaneSmall * kWarp
              ? LaunchDecode<DT, kDimsPerLaneSmall>(p, grid, smem, stream)
              : LaunchDecode<DT, kDimsPerLaneLarge>(p, grid, smem, stream);
  });
  return err;
}

}  // namespace

size_t DecodeWorkspaceBytes(const AttentionPlan& plan) {
  if (plan.num_splits <= 1) return 0;
  const int64_t slots = plan.shape.num_seqs * plan.shape.num_heads * plan.num_splits;
  return sizeof(float) * slots * (plan.shape.layout.head_dim + 1);
}

cudaError_t DecodeAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                            void* workspace, cudaStream_t stream) {
  if (args.num_seqs <= 0) return cudaSuccess;
  const int64_t D = args.layout.head_dim;
  if (D > kDimsPerLaneLarge * kWarp || args.num_heads % args.layout.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = args.num_heads / args.layout.num_kv_heads;
  DecodeParams p{args, group, group, 1, plan.num_splits, plan.split_len, nullptr, nullptr};
  if (plan.num_splits > 1) {
    const int64_t slots = args.num_seqs * args.num_heads * plan.num_splits;
    p.partial_out = static_cast<float*>(workspace);
    p.partial_lse = p.partial_out + slots * D;
  }
  size_t smem = 0;
  cudaError_t err = cudaSuccess;
  if (plan.decode_kernel == DecodeKernel::kAuto && PlanMmaKernel(args, group, &p)) {
    err = DispatchMma(p, stream);
  } else if (PlanBandwidthKernel(args, group, &p, &smem)) {
    const dim3 grid(static_cast<unsigned>(args.layout.num_kv_heads * p.head_chunks),
                    static_cast<unsigned>(args.num_seqs), static_cast<unsigned>(plan.num_splits));
    DispatchKvDType(args.layout.dtype, [&](auto tag) {
      err = DispatchBandwidth<decltype(tag)::value>(p, grid, smem, stream);
    });
  } else {
    err = LaunchGeneral(p, stream);
  }
  if (err != cudaSuccess || plan.num_splits == 1) return err;
  const dim3 merge_grid(static_cast<unsigned>(args.num_heads),
                        static_cast<unsigned>(args.num_seqs));
  KVSERVE_LAUNCH(MergeKernel, merge_grid, 128, 0, stream, p);
  return cudaGetLastError();
}


}  // namespace kvserve::cuda
