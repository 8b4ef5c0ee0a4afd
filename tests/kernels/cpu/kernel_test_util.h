#ifndef KVSERVE_TESTS_KERNELS_CPU_KERNEL_TEST_UTIL_H_
#define KVSERVE_TESTS_KERNELS_CPU_KERNEL_TEST_UTIL_H_

// Test-only helpers: deterministic random data, a simple quantizer for building weights, an
// independent decoder of the dtype layouts (kernels/dtype.h) into doubles, and ISA iteration.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/dtype.h"
#include "tests/kernels/cpu/block_quant_reference.h"

namespace kvserve::cpu::testing {

/// Uniform floats in [lo, hi) from a fixed-seed generator.
inline std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

/// An fp32 value rounded to bf16 (the nearest, ties to the even one; the inputs here are finite
/// and normal), as the avx512 path's bf16 dot product takes x rows (internal::RoundsXToBf16).
/// Written from that description.
inline float RoundToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t rest = bits & 0xffffu;
  uint32_t top = bits >> 16;
  if (rest > 0x8000u || (rest == 0x8000u && (top & 1u) != 0)) ++top;
  bits = top << 16;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

/// Encodes a row-major [rows, k] float matrix in `dtype` (round to nearest; Q8_0 and Q4_0 use
/// one scale per 32-element block: Q8_0 d = amax/127, Q4_0 d = amax/7; the other quantized
/// types go through cpu::QuantizeRow).
inline std::vector<uint8_t> EncodeRows(DType dtype, const std::vector<float>& v, int64_t rows,
                                       int64_t k) {
  const int64_t row_bytes = DTypeRowBytes(dtype, k);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = v.data() + r * k;
    uint8_t* dst = out.data() + r * row_bytes;
    for (int64_t b = 0; b < k / DTypeBlockElems(dtype); ++b) {
      if (dtype == DType::kF32) {
        std::memcpy(dst + 4 * b, src + b, 4);
      } else if (dtype == DType::kF16 || dtype == DType::kBF16) {
        const uint16_t h = dtype == DType::kF16 ? FloatToHalf(src[b]) : FloatToBF16(src[b]);
        std::memcpy(dst + 2 * b, &h, 2);
      } else if (dtype != DType::kQ8_0 && dtype != DType::kQ4_0) {
        QuantizeRow(src, dtype, k, dst);  // the other block formats: kernels/cpu/block_quant.h
        break;
      } else {
        const float* x = src + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const bool q8 = dtype == DType::kQ8_0;
        const uint16_t dh = FloatToHalf(amax / (q8 ? 127.0f : 7.0f));
        const float d = HalfToFloat(dh);
        uint8_t* block = dst + b * DTypeBlockBytes(dtype);
        std::memcpy(block, &dh, 2);
        for (int j = 0; j < 32; ++j) {
          const int q = d == 0.0f ? 0 : static_cast<int>(std::lround(x[j] / d));
          if (q8) {
            block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127, 127)));
          } else {
            const uint8_t nib = static_cast<uint8_t>(std::clamp(q, -8, 7) + 8);
            uint8_t& byte = block[2 + j % 16];
            byte = j < 16 ? static_cast<uint8_t>((byte & 0xf0) | nib)
                          : static_cast<uint8_t>((byte & 0x0f) | (nib << 4));
          }
        }
      }
    }
  }
  return out;
}

/// Decodes `rows` rows of `k` elements from the dtype layout into doubles (the reference).
inline std::vector<double> DecodeRows(DType dtype, const std::vector<uint8_t>& bytes, int64_t rows,
                                      int64_t k) {
  const int64_t row_bytes = DTypeRowBytes(dtype, k);
  std::vector<double> out(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = bytes.data() + r * row_bytes;
    for (int64_t e = 0; e < k; ++e) {
      uint16_t h;
      double value = 0.0;
      switch (dtype) {
        case DType::kF32: {
          float f;
          std::memcpy(&f, row + 4 * e, 4);
          value = f;
          break;
        }
        case DType::kF16:
          std::memcpy(&h, row + 2 * e, 2);
          value = HalfToFloat(h);
          break;
        case DType::kBF16:
          std::memcpy(&h, row + 2 * e, 2);
          value = BF16ToFloat(h);
          break;
        case DType::kQ8_0: {
          const uint8_t* block = row + e / 32 * 34;
          std::memcpy(&h, block, 2);
          value = HalfToFloat(h) * static_cast<double>(static_cast<int8_t>(block[2 + e % 32]));
          break;
        }
        case DType::kQ4_0: {
          const uint8_t* block = row + e / 32 * 18;
          std::memcpy(&h, block, 2);
          const int j = static_cast<int>(e % 32);
          const int nib = j < 16 ? (block[2 + j] & 15) : (block[2 + j - 16] >> 4);
          value = HalfToFloat(h) * static_cast<double>(nib - 8);
          break;
        }
        case DType::kQ4_1:
        case DType::kQ5_0:
        case DType::kQ5_1:
        case DType::kQ4_K:
        case DType::kQ5_K:
        case DType::kQ6_K:
          value = RefDecodeElement(dtype, row, e);
          break;
        case DType::kF8E4M3:  // unscaled code values (the row scale lives elsewhere)
          value = Fp8E4M3ToFloat(row[e]);
          break;
      }
      out[r * k + e] = value;
    }
  }
  return out;
}

/// OCP FP8 E4M3FN code -> double, from the format's definition (independent of kv_quant.cc):
/// sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m / 8 * 2^-6);
/// s.1111.111 is NaN; no infinities.
inline double RefFp8E4M3Decode(int code) {
  const int s = (code >> 7) & 1, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

/// The ISA paths this machine can run (always includes scalar).
inline std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupportsIsa(isa)) isas.push_back(isa);
  }
  return isas;
}

/// Prints, once per test binary, which ISA paths its tests exercise (SupportedIsas(): on an
/// AVX-512 machine the AVX2 and scalar paths are forced too) and which this CPU cannot run, so a
/// CI log says what was covered. scripts/test.sh collects these lines after ctest.
class IsaReport : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string ran, skipped;
    for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      std::string& list = CpuSupportsIsa(isa) ? ran : skipped;
      list += (list.empty() ? "" : ", ") + std::string(CpuIsaName(isa));
    }
    std::printf(
        "[ISA paths] exercised: %s; skipped (not on this CPU): %s; avx512 int8 VNNI: %s; "
        "avx512 bf16 dot: %s; avx512 bf16 AMX: %s\n",
        ran.c_str(), skipped.empty() ? "none" : skipped.c_str(),
        CpuAvx512VnniEnabled() ? "on" : "off or absent",
        CpuAvx512Bf16Enabled() ? "on" : "off or absent",
        CpuAmxBf16Enabled() ? "on" : "off or absent");
  }
};
inline ::testing::Environment* const kIsaReport =
    ::testing::AddGlobalTestEnvironment(new IsaReport);

/// Forces an ISA for the scope.
class ScopedIsa {
 public:
  explicit ScopedIsa(CpuIsa isa) { SetCpuIsaOverride(isa); }
  ~ScopedIsa() { SetCpuIsaOverride(std::nullopt); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;
};

/// One matmul path: an ISA and, on avx512, its optional features (VNNI for the int8 formats, the
/// bf16 dot product for bf16 weights, and with it AMX for packed bf16) forced on or off; each has
/// its own summation order.
struct MatmulPath {
  CpuIsa isa;
  std::optional<bool> features;  // nullopt: the default
  std::optional<bool> amx;       // nullopt: the default
  /// While selected (ScopedPath): "avx512 vnni bf16dot amx" when all features run.
  std::string Name() const {
    std::string name(CpuIsaName(isa));
    if (isa == CpuIsa::kAvx512 && CpuAvx512VnniEnabled()) name += " vnni";
    if (isa == CpuIsa::kAvx512 && CpuAvx512Bf16Enabled()) name += " bf16dot";
    if (isa == CpuIsa::kAvx512 && CpuAvx512Bf16Enabled() && CpuAmxBf16Enabled()) name += " amx";
    return name;
  }
};

/// Every matmul path this CPU can run: each supported ISA, the AVX-512 one with its features
/// (where the CPU has them: asked for elsewhere, it is the path without) and without, and where
/// AMX runs by default, the features on with AMX off too.
inline std::vector<MatmulPath> MatmulPaths() {
  std::vector<MatmulPath> paths;
  for (CpuIsa isa : SupportedIsas()) {
    if (isa == CpuIsa::kAvx512) {
      paths.push_back({isa, true, std::nullopt});
      if (CpuAmxBf16Enabled()) paths.push_back({isa, true, false});
      paths.push_back({isa, false, std::nullopt});
    } else {
      paths.push_back({isa, std::nullopt, std::nullopt});
    }
  }
  return paths;
}

/// Selects a path for its lifetime.
class ScopedPath {
 public:
  explicit ScopedPath(const MatmulPath& path) : isa_(path.isa) {
    SetAvx512VnniOverride(path.features);
    SetAvx512Bf16Override(path.features);
    SetAmxBf16Override(path.amx);
  }
  ~ScopedPath() {
    SetAvx512VnniOverride(std::nullopt);
    SetAvx512Bf16Override(std::nullopt);
    SetAmxBf16Override(std::nullopt);
  }
  ScopedPath(const ScopedPath&) = delete;
  ScopedPath& operator=(const ScopedPath&) = delete;

 private:
  ScopedIsa isa_;
};

}  // namespace kvserve::cpu::testing

#endif  // KVSERVE_TESTS_KERNELS_CPU_KERNEL_TEST_UTIL_H_
