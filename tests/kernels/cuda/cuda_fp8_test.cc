// FP8 E4M3 weights on CUDA (BackendOptions::fp8_weights): the device quantizes a float weight to
// the bytes the CPU's QuantizeRowsFp8 makes, and cuda::Matmul's FP8 paths -- the GEMV up to 8 x
// rows, cuBLASLt's GEMM with outer-vector scales writing y, the staged GEMM for a bias and for a
// cuBLASLt without outer-vector scales, the GEMV chunks where k % 16 != 0 -- give the CPU twin's
// result (cpu::MatmulFp8) up to f32 summation order. Skips without a CUDA device.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_fp8.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kvserve {
namespace {

using testing_cuda::Download;
using testing_cuda::Random;
using testing_cuda::Upload;

// A backend of the device under test with fp8_weights (f32 activations with `f32`), loaded once
// per kind; null with `reason` set when there is none. `no_outer_vector` loads it as if cuBLASLt
// had no outer-vector FP8 scales (the simulator's KVSIM_CUBLASLT_NO_OUTER_VEC).
Backend* Fp8Backend(bool f32, bool no_outer_vector, std::string* reason) {
  static std::unique_ptr<Backend> backends[2][2];
  static std::string why[2][2];
  static bool tried[2][2] = {};
  if (!tried[f32][no_outer_vector]) {
    tried[f32][no_outer_vector] = true;
    BackendOptions options = testing_cuda::DeviceOptions();
    options.fp8_weights = true;
    options.f32_activations = f32;
    if (no_outer_vector) setenv("KVSIM_CUBLASLT_NO_OUTER_VEC", "1", 1);
    absl::StatusOr<std::unique_ptr<Backend>> b = LoadCudaBackend(options);
    if (no_outer_vector) unsetenv("KVSIM_CUBLASLT_NO_OUTER_VEC");
    if (b.ok()) {
      backends[f32][no_outer_vector] = std::move(*b);
    } else {
      why[f32][no_outer_vector] = std::string(b.status().message());
    }
  }
  *reason = why[f32][no_outer_vector];
  return backends[f32][no_outer_vector].get();
}

#define KVSERVE_REQUIRE_FP8(var, f32, no_outer)            \
  std::string var##_reason;                                \
  Backend* var = Fp8Backend(f32, no_outer, &var##_reason); \
  if (var == nullptr) KVSERVE_SKIP_NO_DEVICE(var##_reason)

// Activation conversion / scaling passes the CUDA library has queued so far.
int64_t ActivationConversions() {
  absl::StatusOr<void*> fn =
      CudaLibrarySymbol("kvserve_cuda_activation_conversions", testing_cuda::UseSimulator());
  EXPECT_TRUE(fn.ok()) << fn.status();
  return fn.ok() ? reinterpret_cast<long long (*)()>(*fn)() : -1;
}

// `n` x `k` weights stored as `dtype` (rounded from uniform floats in [-0.2, 0.2)).
std::vector<uint8_t> StoredWeights(DType dtype, int64_t n, int64_t k, uint32_t seed) {
  const std::vector<float> f = Random(n * k, seed, -0.2f, 0.2f);
  std::vector<uint8_t> out(static_cast<size_t>(n * DTypeRowBytes(dtype, k)));
  for (int64_t r = 0; r < n; ++r) {
    cpu::ConvertRowFromF32(&f[r * k], k, dtype, &out[r * DTypeRowBytes(dtype, k)]);
  }
  return out;
}

TEST(CudaFp8Test, WeightsQuantizeToTheCpuBytes) {
  KVSERVE_REQUIRE_FP8(gpu, false, false);
  const int64_t n = 67;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    // 96: whole 16-byte vectors; 100: not for f16 / bf16; 4104: three vectors a thread for
    // f16 / bf16, over the 16 KiB a thread block keeps in registers for f32.
    for (int64_t k : {96, 100, 4104}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " k=" + std::to_string(k));
      std::vector<uint8_t> w = StoredWeights(dtype, n, k, 3);
      // An all-zero row and one large weight.
      std::memset(&w[5 * DTypeRowBytes(dtype, k)], 0, static_cast<size_t>(DTypeRowBytes(dtype, k)));
      const float big = 30.0f;
      cpu::ConvertRowFromF32(&big, 1, dtype, &w[7 * DTypeRowBytes(dtype, k)]);
      std::vector<uint8_t> codes(static_cast<size_t>(n * k));
      std::vector<float> scales(static_cast<size_t>(n));
      cpu::QuantizeRowsFp8(w.data(), dtype, n, k, codes.data(), scales.data(), nullptr);
      absl::StatusOr<PreparedMatrix> m =
          gpu->PrepareMatrix(w.data(), dtype, n, k, MatrixUse::kMatmul);
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_EQ(m->dtype, DType::kF8E4M3);
      ASSERT_NE(m->scales, nullptr);
      EXPECT_EQ(Download<uint8_t>(gpu, m->data, codes.size()), codes);
      EXPECT_EQ(Download<float>(gpu, m->scales, scales.size()), scales);
      absl::StatusOr<PreparedMatrix> kept =
          gpu->PrepareMatrix(w.data(), dtype, n, k, MatrixUse::kMatmulKeepPrecision);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_NE(kept->dtype, DType::kF8E4M3);
      EXPECT_EQ(kept->scales, nullptr);
    }
  }
}

struct Case {
  int64_t m, n, k;
  bool bias;
  DType y_dtype;
  int64_t y_offset = 0;  // bytes from the start of a 256-byte aligned allocation
};

// Runs `c` on `gpu` (bf16 x unless the backend keeps f32 activations; the CPU gets the same
// values in f32) and compares with cpu::Matmul on the same FP8 weights. Returns the largest
// difference over the largest |y|.
float RunAgainstCpu(Backend* gpu, const Case& c, uint32_t seed) {
  const bool x_bf16 = gpu->activation_dtype() == DType::kBF16;
  const std::vector<uint8_t> w = StoredWeights(DType::kBF16, c.n, c.k, seed);
  std::vector<float> x = Random(c.m * c.k, seed + 1, -3.0f, 3.0f);
  std::vector<uint16_t> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x16[i] = FloatToBF16(x[i]);
    if (x_bf16) x[i] = BF16ToFloat(x16[i]);
  }
  const std::vector<float> bias = Random(c.n, seed + 2);
  absl::StatusOr<PreparedMatrix> pw =
      gpu->PrepareMatrix(w.data(), DType::kBF16, c.n, c.k, MatrixUse::kMatmul);
  EXPECT_TRUE(pw.ok()) << pw.status();
  if (!pw.ok()) return INFINITY;
  // The CPU twin on the same codes and scales.
  std::vector<uint8_t> codes(static_cast<size_t>(c.n * c.k));
  std::vector<float> scales(static_cast<size_t>(c.n));
  cpu::QuantizeRowsFp8(w.data(), DType::kBF16, c.n, c.k, codes.data(), scales.data(), nullptr);
  std::vector<float> want(static_cast<size_t>(c.m * c.n));
  cpu::MatmulArgs ca{
      x.data(), c.k, codes.data(), DType::kF8E4M3, c.bias ? bias.data() : nullptr, want.data(), c.n,
      c.m,      c.n, c.k};
  ca.w_scale = scales.data();
  cpu::Matmul(ca, nullptr);

  DeviceBuffer dx = x_bf16 ? Upload(gpu, x16) : Upload(gpu, x);
  DeviceBuffer db = Upload(gpu, bias);
  const size_t y_bytes = c.y_dtype == DType::kF32 ? 4 : 2;
  absl::StatusOr<DeviceBuffer> dy = gpu->AllocBuffer(c.m * c.n * y_bytes + c.y_offset);
  EXPECT_TRUE(dy.ok());
  float* y = reinterpret_cast<float*>(dy->as<uint8_t>() + c.y_offset);
  const float* bias_at = c.bias ? db.as<float>() : nullptr;
  cpu::MatmulArgs ga{static_cast<const float*>(dx.get()),
                     c.k,
                     pw->data,
                     pw->dtype,
                     bias_at,
                     y,
                     c.n,
                     c.m,
                     c.n,
                     c.k};
  ga.w_scale = pw->scales;
  ga.x_dtype = x_bf16 ? DType::kBF16 : DType::kF32;
  ga.y_dtype = c.y_dtype;
  gpu->Matmul(ga);
  std::vector<float> got(want.size());
  if (c.y_dtype == DType::kF32) {
    got = Download<float>(gpu, y, got.size());
  } else {
    const std::vector<uint16_t> g16 = Download<uint16_t>(gpu, y, got.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = BF16ToFloat(g16[i]);
  }
  float scale = 0.0f, err = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    err = std::max(err, std::fabs(got[i] - want[i]));
  }
  return err / std::max(scale, 1e-30f);
}

// Every path against the twin: m <= 8 (GEMV; k 1040 gives lanes one or two loads per step),
// m > 8 with k % 16 == 0 (cuBLASLt, writing y directly without a bias, staged with one),
// k % 16 != 0 (GEMV chunks); f32 and bf16 y.
TEST(CudaFp8Test, MatmulMatchesTheCpuTwinOnEveryPath) {
  for (bool f32 : {true, false}) {
    KVSERVE_REQUIRE_FP8(gpu, f32, false);
    for (const Case& c :
         {Case{1, 67, 96, true, DType::kF32}, Case{8, 67, 512, false, DType::kF32},
          Case{9, 67, 96, false, DType::kF32}, Case{17, 64, 96, true, DType::kF32},
          Case{33, 48, 160, false, DType::kBF16}, Case{12, 40, 160, true, DType::kBF16},
          Case{20, 67, 100, true, DType::kF32}, Case{3, 67, 100, false, DType::kBF16},
          Case{2, 40, 1040, true, DType::kF32}}) {
      SCOPED_TRACE(std::string(f32 ? "f32" : "bf16") + " x, m=" + std::to_string(c.m) +
                   " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                   (c.bias ? " bias" : "") + " y " + std::string(DTypeName(c.y_dtype)));
      // f32 y: summation order only; bf16 y: one rounding to 8 bits.
      EXPECT_LT(RunAgainstCpu(gpu, c, 40), c.y_dtype == DType::kF32 ? 1e-5f : 8e-3f);
    }
  }
}

// Without a bias, an aligned y and more than 8 rows, cuBLASLt applies both row scales and writes
// y itself: the quantization of x is the only pass besides the GEMM -- also into a y only
// 16-byte aligned (cuBLASLt is told so: an algorithm for 256-byte aligned operands would refuse
// it). A bias takes one scaling pass per 8 MiB chunk of the f32 result.
TEST(CudaFp8Test, CublasLtWritesYWithoutAPassOfItsOwn) {
  KVSERVE_REQUIRE_FP8(gpu, false, false);
  const int64_t before = ActivationConversions();
  EXPECT_LT(RunAgainstCpu(gpu, Case{24, 64, 128, false, DType::kBF16}, 7), 8e-3f);
  EXPECT_LT(RunAgainstCpu(gpu, Case{24, 64, 128, false, DType::kBF16, 16}, 8), 8e-3f);
  EXPECT_EQ(ActivationConversions(), before);
  EXPECT_LT(RunAgainstCpu(gpu, Case{24, 64, 128, true, DType::kBF16}, 7), 8e-3f);
  EXPECT_EQ(ActivationConversions(), before + 1);
}

// A cuBLASLt without outer-vector scales (before CUDA 12.9): the GEMM's unscaled f32 result is
// scaled by Fp8ScaleRows, in 8 MiB chunks of rows (70000 columns: 16 rows a chunk, a multiple
// of 16 under 29, so 40 rows take three).
TEST(CudaFp8Test, UnscaledCublasLtGemmIsScaledAfterwards) {
  KVSERVE_SIMULATOR_ONLY();
  KVSERVE_REQUIRE_FP8(gpu, true, true);
  EXPECT_LT(RunAgainstCpu(gpu, Case{17, 64, 96, false, DType::kF32}, 9), 1e-5f);
  EXPECT_LT(RunAgainstCpu(gpu, Case{40, 70000, 32, true, DType::kF32}, 9), 1e-5f);
}

TEST(CudaFp8Test, MissingRowScalesAreAnError) {
  KVSERVE_REQUIRE_FP8(gpu, true, false);
  const std::vector<uint8_t> w(32 * 32, 0x38);
  DeviceBuffer dw = Upload(gpu, w);
  DeviceBuffer dx = Upload(gpu, std::vector<float>(32, 1.0f));
  DeviceBuffer dy = Upload(gpu, std::vector<float>(32));
  ASSERT_TRUE(gpu->Synchronize().ok());
  gpu->Matmul(
      {dx.as<float>(), 32, dw.get(), DType::kF8E4M3, nullptr, dy.as<float>(), 32, 1, 32, 32});
  const absl::Status s = gpu->Synchronize();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row scales"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace kvserve
