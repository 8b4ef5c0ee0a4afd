// cuBLAS on the simulator: the handle calls and cublasGemmEx (column-major, op N or T, inputs in
// f32 / f16 / bf16, f32 accumulation, output in f32 / f16 / bf16 rounded to nearest even). The
// GEMM is queued on the handle's stream like any kernel, so graph capture records it. Operands
// outside device memory fault the device, as an out-of-bounds GEMM would on a GPU.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "internal.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  int device = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

namespace {

size_t ElementBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

bool Supported(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

float Load(const void* base, cudaDataType_t t, size_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  }
}

void Store(void* base, cudaDataType_t t, size_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(base)[i] = v;
      break;
    case CUDA_R_16F:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      break;
  }
}

/// Bytes spanned by a column-major matrix of `rows` x `cols` with leading dimension ld.
size_t Span(int rows, int cols, int ld, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) *
         ElementBytes(t);
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (kvsim::DeviceCount() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto* h = new cublasContext();
  h->device = kvsim::CurrentDevice();
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && !kvsim::IsDeviceRange(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t /*algo*/) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
      (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!Supported(Atype) || !Supported(Btype) || !Supported(Ctype) || Atype != Btype ||
      (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_16F &&
       computeType != CUBLAS_COMPUTE_32F_FAST_16BF &&
       computeType != CUBLAS_COMPUTE_32F_FAST_TF32)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // op(A) is m x k: A is stored m x k (N) or k x m (T); likewise op(B) k x n.
  const int a_rows = transa == CUBLAS_OP_N ? m : k;
  const int a_cols = transa == CUBLAS_OP_N ? k : m;
  const int b_rows = transb == CUBLAS_OP_N ? k : n;
  const int b_cols = transb == CUBLAS_OP_N ? n : k;
  if (lda < (a_rows > 0 ? a_rows : 1) || ldb < (b_rows > 0 ? b_rows : 1) || ldc < (m > 0 ? m : 1)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha);  // host pointer mode, f32 compute
  const float be = *static_cast<const float*>(beta);
  const int device = handle->device;
  auto gemm = [=] {
    const size_t a_span = Span(a_rows, a_cols, lda, Atype);
    const size_t b_span = Span(b_rows, b_cols, ldb, Btype);
    const size_t c_span = Span(m, n, ldc, Ctype);
    const char* bad = (a_span > 0 && !kvsim::IsDeviceRange(A, a_span))   ? "A"
                      : (b_span > 0 && !kvsim::IsDeviceRange(B, b_span)) ? "B"
                      : !kvsim::IsDeviceRange(C, c_span)                 ? "C"
                                                                         : nullptr;
    if (bad != nullptr) {
      kvsim::RaiseFault(device, cudaErrorIllegalAddress,
                        std::string("cublasGemmEx: operand ") + bad + " of m=" + std::to_string(m) +
                            " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                            " reaches outside its device allocation");
      return;
    }
    // Tiles of 64 rows of one output column spread over the executor's threads.
    constexpr int kRows = 64;
    const int64_t row_tiles = (m + kRows - 1) / kRows;
    kvsim::ParallelFor(int64_t{n} * row_tiles, [&](int64_t tile) {
      const int64_t j = tile / row_tiles;
      const int i0 = static_cast<int>(tile % row_tiles) * kRows;
      const int i1 = i0 + kRows < m ? i0 + kRows : m;
      std::vector<float> bcol(static_cast<size_t>(k));
      for (int p = 0; p < k; ++p) {
        const size_t bi = transb == CUBLAS_OP_N ? static_cast<size_t>(j) * ldb + p
                                                : static_cast<size_t>(p) * ldb + j;
        bcol[static_cast<size_t>(p)] = Load(B, Btype, bi);
      }
      for (int i = i0; i < i1; ++i) {
        float acc = 0.0f;
        for (int p = 0; p < k; ++p) {
          const size_t ai = transa == CUBLAS_OP_N ? static_cast<size_t>(p) * lda + i
                                                  : static_cast<size_t>(i) * lda + p;
          acc = fmaf(Load(A, Atype, ai), bcol[static_cast<size_t>(p)], acc);
        }
        const size_t ci = static_cast<size_t>(j) * ldc + i;
        // beta == 0: C is not read (it may hold NaN garbage), as in cuBLAS.
        const float out = be == 0.0f ? al * acc : al * acc + be * Load(C, Ctype, ci);
        Store(C, Ctype, ci, out);
      }
    });
  };
  const cudaError_t e = kvsim::Enqueue(handle->stream, gemm);
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
