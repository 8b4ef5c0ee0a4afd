#include "kernels/cpu/block_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvserve::cpu {
namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

float LoadHalf(const uint8_t* p) { return HalfToFloat(LoadU16(p)); }

// Stores `f` as fp16 at p and returns the value stored.
float StoreHalf(float f, uint8_t* p) {
  const uint16_t h = FloatToHalf(f);
  std::memcpy(p, &h, sizeof(h));
  return HalfToFloat(h);
}

// ---------------------------------------------------------------------------------------------
// Decoders, one block each.

void DecodeQ8_0(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d;
}

void DecodeQ4_0(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b[2 + j] & 15) - 8) * d;
    y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
  }
}

void DecodeQ4_1(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const float m = LoadHalf(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(b[4 + j] & 15) + m;
    y[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
  }
}

// 5-bit values of a q5_0 / q5_1 block: nibbles at `qs`, 5th bits in `qh`.
void Unpack5(uint32_t qh, const uint8_t* qs, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
    q[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
  }
}

void DecodeQ5_0(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  int q[32];
  Unpack5(LoadU32(b + 2), b + 6, q);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j] - 16);
}

void DecodeQ5_1(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const float m = LoadHalf(b + 2);
  int q[32];
  Unpack5(LoadU32(b + 4), b + 8, q);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]) + m;
}

// The 6-bit scale and min of sub-block j (0..7) of a q4_k / q5_k block from its scales[12].
void ScaleMinK4(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// q4_k, or q5_k when `fifth`.
void DecodeQ45K(const uint8_t* b, bool fifth, float* y) {
  const float d = LoadHalf(b);
  const float dmin = LoadHalf(b + 2);
  uint8_t sc[8], m[8], q[256];
  UnpackScalesMinsK4(b + 4, sc, m);
  UnpackQuantsQ45K(b, fifth, q);
  for (int j = 0; j < 8; ++j) {
    const float ds = d * static_cast<float>(sc[j]);
    const float dm = dmin * static_cast<float>(m[j]);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = ds * static_cast<float>(q[32 * j + l]) - dm;
  }
}

void DecodeQ4_K(const uint8_t* b, float* y) { DecodeQ45K(b, false, y); }

void DecodeQ5_K(const uint8_t* b, float* y) { DecodeQ45K(b, true, y); }

void DecodeQ6_K(const uint8_t* b, float* y) {
  const float d = LoadHalf(b + 208);
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  uint8_t q[256];
  UnpackQuantsQ6K(b, q);
  for (int e = 0; e < 256; ++e) {
    const float ds = d * static_cast<float>(scales[e / 16]);
    y[e] = ds * static_cast<float>(int{q[e]} - 32);
  }
}

// ---------------------------------------------------------------------------------------------
// Quantisers.

int Clamp(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// Nearest integer, ties away from zero; magnitudes beyond any level are clamped first so the
// conversion is defined for every finite input.
int RoundToInt(double v) { return static_cast<int>(std::lround(std::clamp(v, -1e6, 1e6))); }

// Scale a and offset b with x ≈ a * q + b, q in [0, nmax], chosen among a few grid spacings
// near (max - min) / nmax by least squares (each candidate's q refitted to a and b). With
// `min_at_most_zero` the offset is kept <= 0 (the K-quants store -b as an unsigned min).
void FitAffine(const float* x, int n, int nmax, bool min_at_most_zero, float* a_out, float* b_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (min_at_most_zero) lo = std::min(lo, 0.0f);
  *a_out = (hi - lo) / static_cast<float>(nmax);
  *b_out = lo;
  if (!(hi > lo)) return;
  float best = INFINITY;
  for (int step = -5; step <= 5; ++step) {
    const float inv = (static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      const double q = Clamp(RoundToInt((x[i] - lo) * inv), 0, nmax);
      sq += q;
      sqq += q * q;
      sx += x[i];
      sqx += q * x[i];
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    double a = (n * sqx - sq * sx) / det;
    double b = (sqq * sx - sq * sqx) / det;
    if (min_at_most_zero && b > 0) {
      b = 0;
      a = sqx / sqq;
    }
    if (a <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int q = Clamp(RoundToInt((x[i] - b) / a), 0, nmax);
      const double e = a * q + b - x[i];
      err += e * e;
    }
    if (err < best) {
      best = static_cast<float>(err);
      *a_out = static_cast<float>(a);
      *b_out = static_cast<float>(b);
    }
  }
}

// Signed scale a with x ≈ a * q, q in [-qmax - 1, qmax]: the element of largest magnitude maps
// near -qmax - 1 (using the extra negative level), refined by least squares over a few spacings.
float FitSymmetric(const float* x, int n, int qmax) {
  float v = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(v)) v = x[i];
  }
  if (v == 0.0f) return 0.0f;
  const float top = static_cast<float>(qmax + 1);
  float best_a = v / -top;
  float best = INFINITY;
  for (int step = -5; step <= 5; ++step) {
    const float inv = -(top + 0.1f * static_cast<float>(step)) / v;
    double sqq = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      const double q = Clamp(RoundToInt(x[i] * inv), -qmax - 1, qmax);
      sqq += q * q;
      sqx += q * x[i];
    }
    if (sqq <= 0) continue;
    const double a = sqx / sqq;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int q = Clamp(RoundToInt(x[i] / a), -qmax - 1, qmax);
      const double e = a * q - x[i];
      err += e * e;
    }
    if (err < best) {
      best = static_cast<float>(err);
      best_a = static_cast<float>(a);
    }
  }
  return best_a;
}

void QuantizeQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(d, b);
  for (int j = 0; j < 32; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * inv)));
  }
}

void QuantizeQ4_0(const float* x, uint8_t* b) {
  float max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > std::fabs(max)) max = x[j];
  }
  const float d = max / -8.0f;
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(d, b);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(x[j] * inv + 8.5f));
    const int hi = std::min(15, static_cast<int>(x[j + 16] * inv + 8.5f));
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// q4_1 (nmax 15) and q5_1 (nmax 31): fp16 d and m, then (q5_1 only) qh, then the nibbles.
void QuantizeQx_1(const float* x, int nmax, uint8_t* b) {
  float a, m;
  FitAffine(x, 32, nmax, /*min_at_most_zero=*/false, &a, &m);
  const float d = StoreHalf(a, b);
  const float mh = StoreHalf(m, b + 2);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = d > 0 ? Clamp(RoundToInt((x[j] - mh) / d), 0, nmax) : 0;
  uint8_t* qs = b + (nmax == 15 ? 4 : 8);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
    qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  if (nmax == 31) std::memcpy(b + 4, &qh, sizeof(qh));
}

void QuantizeQ5_0(const float* x, uint8_t* b) {
  const float d = StoreHalf(FitSymmetric(x, 32, 15), b);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = d != 0.0f ? Clamp(RoundToInt(x[j] / d), -16, 15) + 16 : 16;
    const int hi = d != 0.0f ? Clamp(RoundToInt(x[j + 16] / d), -16, 15) + 16 : 16;
    b[6 + j] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
  }
  std::memcpy(b + 2, &qh, sizeof(qh));
}

// q4_k (nmax 15) and q5_k (nmax 31).
void QuantizeQ45K(const float* x, int nmax, uint8_t* b) {
  float a[8], m[8];  // per sub-block: scale and min (x ≈ a * q - m, m >= 0)
  float amax = 0.0f, mmax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float off;
    FitAffine(x + 32 * j, 32, nmax, /*min_at_most_zero=*/true, &a[j], &off);
    m[j] = -off;
    amax = std::max(amax, a[j]);
    mmax = std::max(mmax, m[j]);
  }
  const float d = StoreHalf(amax / 63.0f, b);
  const float dmin = StoreHalf(mmax / 63.0f, b + 2);
  int sc[8], mq[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0 ? Clamp(RoundToInt(a[j] / d), 0, 63) : 0;
    mq[j] = dmin > 0 ? Clamp(RoundToInt(m[j] / dmin), 0, 63) : 0;
  }
  uint8_t sc6[8], m6[8];
  for (int j = 0; j < 8; ++j) {
    sc6[j] = static_cast<uint8_t>(sc[j]);
    m6[j] = static_cast<uint8_t>(mq[j]);
  }
  PackScalesMinsK4(sc6, m6, b + 4);
  uint8_t q[256];
  for (int j = 0; j < 8; ++j) {
    const float ds = d * static_cast<float>(sc[j]);
    const float dm = dmin * static_cast<float>(mq[j]);
    for (int l = 0; l < 32; ++l) {
      q[32 * j + l] =
          static_cast<uint8_t>(ds > 0 ? Clamp(RoundToInt((x[32 * j + l] + dm) / ds), 0, nmax) : 0);
    }
  }
  PackQuantsQ45K(q, nmax == 31, b);
}

void QuantizeQ6_K(const float* x, uint8_t* b) {
  float a[16];
  float amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    a[j] = FitSymmetric(x + 16 * j, 16, 31);
    amax = std::max(amax, std::fabs(a[j]));
  }
  const float d = StoreHalf(amax / 127.0f, b + 208);
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  uint8_t q[256];
  for (int j = 0; j < 16; ++j) {
    const int sc = d > 0 ? Clamp(RoundToInt(a[j] / d), -128, 127) : 0;
    scales[j] = static_cast<int8_t>(sc);
    const float ds = d * static_cast<float>(sc);
    for (int l = 0; l < 16; ++l) {
      const int e = 16 * j + l;
      q[e] = static_cast<uint8_t>((ds != 0.0f ? Clamp(RoundToInt(x[e] / ds), -32, 31) : 0) + 32);
    }
  }
  PackQuantsQ6K(q, b);
}

}  // namespace

void DequantizeRow(const void* src, DType dtype, int64_t n, float* dst) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const int64_t elems = DTypeBlockElems(dtype);
  const int64_t block_bytes = DTypeBlockBytes(dtype);
  void (*decode)(const uint8_t*, float*) = nullptr;
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
      return;  // not block-quantized: ConvertRowToF32 handles them
    case DType::kQ8_0:
      decode = DecodeQ8_0;
      break;
    case DType::kQ4_0:
      decode = DecodeQ4_0;
      break;
    case DType::kQ4_1:
      decode = DecodeQ4_1;
      break;
    case DType::kQ5_0:
      decode = DecodeQ5_0;
      break;
    case DType::kQ5_1:
      decode = DecodeQ5_1;
      break;
    case DType::kQ4_K:
      decode = DecodeQ4_K;
      break;
    case DType::kQ5_K:
      decode = DecodeQ5_K;
      break;
    case DType::kQ6_K:
      decode = DecodeQ6_K;
      break;
  }
  for (int64_t blk = 0; blk < n / elems; ++blk)
    decode(bytes + blk * block_bytes, dst + blk * elems);
}

void QuantizeRow(const float* x, DType dtype, int64_t n, void* dst) {
  auto* bytes = static_cast<uint8_t*>(dst);
  const int64_t elems = DTypeBlockElems(dtype);
  const int64_t block_bytes = DTypeBlockBytes(dtype);
  for (int64_t blk = 0; blk < n / elems; ++blk) {
    const float* v = x + blk * elems;
    uint8_t* b = bytes + blk * block_bytes;
    switch (dtype) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
      case DType::kF8E4M3:
        return;  // not block-quantized
      case DType::kQ8_0:
        QuantizeQ8_0(v, b);
        break;
      case DType::kQ4_0:
        QuantizeQ4_0(v, b);
        break;
      case DType::kQ4_1:
        QuantizeQx_1(v, 15, b);
        break;
      case DType::kQ5_0:
        QuantizeQ5_0(v, b);
        break;
      case DType::kQ5_1:
        QuantizeQx_1(v, 31, b);
        break;
      case DType::kQ4_K:
        QuantizeQ45K(v, 15, b);
        break;
      case DType::kQ5_K:
        QuantizeQ45K(v, 31, b);
        break;
      case DType::kQ6_K:
        QuantizeQ6_K(v, b);
        break;
    }
  }
}

void UnpackScalesMinsK4(const uint8_t* scales, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 8; ++j) {
    int s6, m6;
    ScaleMinK4(scales, j, &s6, &m6);
    sc[j] = static_cast<uint8_t>(s6);
    m[j] = static_cast<uint8_t>(m6);
  }
}

void PackScalesMinsK4(const uint8_t* sc, const uint8_t* m, uint8_t* scales) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// q6_k element e = 128 h + 32 g + l (l < 32): the low nibble (g < 2) or high nibble of
// ql[64 h + 32 (g & 1) + l], and bits 2g, 2g + 1 of qh[32 h + l] as bits 4, 5.
void UnpackQuantsQ6K(const uint8_t* block, uint8_t* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = block + 64 * h;
    const uint8_t* qh = block + 128 + 32 * h;
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t low = ql[32 * (g & 1) + l];
        const int nibble = g < 2 ? (low & 15) : (low >> 4);
        q[128 * h + 32 * g + l] = static_cast<uint8_t>(nibble | ((qh[l] >> (2 * g)) & 3) << 4);
      }
    }
  }
}

void PackQuantsQ6K(const uint8_t* q, uint8_t* block) {
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = block + 64 * h;
    uint8_t* qh = block + 128 + 32 * h;
    const uint8_t* v = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<uint8_t>((v[l] & 15) | (v[l + 64] & 15) << 4);
      ql[l + 32] = static_cast<uint8_t>((v[l + 32] & 15) | (v[l + 96] & 15) << 4);
      qh[l] = static_cast<uint8_t>((v[l] >> 4) | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 |
                                   (v[l + 96] >> 4) << 6);
    }
  }
}

// q4_k / q5_k element 64 c + 32 half + l (l < 32): nibble `half` of qs[32 c + l] (qs at byte 16 of
// a q4_k block, 48 of a q5_k one), and for q5_k bit 2 c + half of qh[l] (byte 16 + l) as bit 4.
void UnpackQuantsQ45K(const uint8_t* block, bool fifth, uint8_t* q) {
  const uint8_t* qs = block + (fifth ? 48 : 16);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, half = e % 64 / 32, l = e % 32;
    const int nibble = (qs[32 * c + l] >> (4 * half)) & 15;
    const int top = fifth ? ((block[16 + l] >> (2 * c + half)) & 1) << 4 : 0;
    q[e] = static_cast<uint8_t>(nibble | top);
  }
}

void PackQuantsQ45K(const uint8_t* q, bool fifth, uint8_t* block) {
  uint8_t* qs = block + (fifth ? 48 : 16);
  std::memset(qs, 0, 128);
  if (fifth) std::memset(block + 16, 0, 32);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, half = e % 64 / 32, l = e % 32;
    qs[32 * c + l] |= static_cast<uint8_t>((q[e] & 15) << (4 * half));
    if (fifth) block[16 + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * c + half));
  }
}

}  // namespace kvserve::cpu
