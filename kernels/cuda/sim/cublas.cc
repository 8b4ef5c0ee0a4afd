// cuBLAS on the simulator: the handle calls and cublasGemmEx (column-major, op N or T, inputs in
// f32 / f16 / bf16, f32 accumulation, output in f32 / f16 / bf16 rounded to nearest even), and
// the part of cuBLASLt kvserve calls (include/cublasLt.h): the same GEMMs plus FP8 E4M3 inputs
// with scalar or outer-vector scales, held to the FP8 kernels' layout rules. A GEMM is queued on
// the stream like any kernel, so graph capture records it. Operands outside device memory fault
// the device, as an out-of-bounds GEMM would on a GPU.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cublasLt.h"
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

size_t ElementBytes(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : (t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2 ? 1 : 2);
}

bool Supported(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

// OCP FP8 E4M3FN (bias 7, 3 mantissa bits, subnormals m * 2^-9, S.1111.111 NaN, no infinities).
float E4M3ToFloat(uint8_t code) {
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(static_cast<float>(8 + m), e - 10);
  return (code & 0x80) != 0 ? -mag : mag;
}

float Load(const void* base, cudaDataType_t t, size_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    case CUDA_R_8F_E4M3:
      return E4M3ToFloat(static_cast<const uint8_t*>(base)[i]);
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

// One column-major GEMM C = alpha * (sa ⊗ sb) * op(A) op(B) + beta * C, f32 accumulation in p
// order. sa / sb: null (1), one scalar, or per-row / per-column vectors (outer-vector scales).
struct Gemm {
  cublasOperation_t transa, transb;
  int m, n, k;
  float alpha;
  const void* A;
  cudaDataType_t a_type;
  int64_t lda;
  const void* B;
  cudaDataType_t b_type;
  int64_t ldb;
  float beta;
  void* C;
  cudaDataType_t c_type;
  int64_t ldc;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool a_vector = false;  // a_scale has m entries (else one)
  bool b_vector = false;  // b_scale has n entries (else one)
};

/// Bytes spanned by a column-major matrix of `rows` x `cols` with leading dimension ld.
size_t Span(int rows, int cols, int64_t ld, cudaDataType_t t) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) *
         ElementBytes(t);
}

// Runs `g` now (on the stream, from Enqueue); `api` names the call in a fault.
void RunGemm(const Gemm& g, int device, const char* api) {
  const int a_rows = g.transa == CUBLAS_OP_N ? g.m : g.k;
  const int a_cols = g.transa == CUBLAS_OP_N ? g.k : g.m;
  const int b_rows = g.transb == CUBLAS_OP_N ? g.k : g.n;
  const int b_cols = g.transb == CUBLAS_OP_N ? g.n : g.k;
  const size_t a_span = Span(a_rows, a_cols, g.lda, g.a_type);
  const size_t b_span = Span(b_rows, b_cols, g.ldb, g.b_type);
  const size_t c_span = Span(g.m, g.n, g.ldc, g.c_type);
  const size_t sa_bytes = g.a_scale == nullptr ? 0 : sizeof(float) * (g.a_vector ? g.m : 1);
  const size_t sb_bytes = g.b_scale == nullptr ? 0 : sizeof(float) * (g.b_vector ? g.n : 1);
  const char* bad = (a_span > 0 && !kvsim::IsDeviceRange(g.A, a_span))             ? "A"
                    : (b_span > 0 && !kvsim::IsDeviceRange(g.B, b_span))           ? "B"
                    : !kvsim::IsDeviceRange(g.C, c_span)                           ? "C"
                    : (sa_bytes > 0 && !kvsim::IsDeviceRange(g.a_scale, sa_bytes)) ? "A's scale"
                    : (sb_bytes > 0 && !kvsim::IsDeviceRange(g.b_scale, sb_bytes)) ? "B's scale"
                                                                                   : nullptr;
  if (bad != nullptr) {
    kvsim::RaiseFault(device, cudaErrorIllegalAddress,
                      std::string(api) + ": operand " + bad + " of m=" + std::to_string(g.m) +
                          " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                          " reaches outside its device allocation");
    return;
  }
  // Tiles of 64 rows of one output column spread over the executor's threads.
  constexpr int kRows = 64;
  const int64_t row_tiles = (g.m + kRows - 1) / kRows;
  kvsim::ParallelFor(int64_t{g.n} * row_tiles, [&](int64_t tile) {
    const int64_t j = tile / row_tiles;
    const int i0 = static_cast<int>(tile % row_tiles) * kRows;
    const int i1 = i0 + kRows < g.m ? i0 + kRows : g.m;
    std::vector<float> bcol(static_cast<size_t>(g.k));
    for (int p = 0; p < g.k; ++p) {
      const size_t bi = g.transb == CUBLAS_OP_N ? static_cast<size_t>(j) * g.ldb + p
                                                : static_cast<size_t>(p) * g.ldb + j;
      bcol[static_cast<size_t>(p)] = Load(g.B, g.b_type, bi);
    }
    const float sb = g.b_scale == nullptr ? 1.0f : g.b_scale[g.b_vector ? j : 0];
    for (int i = i0; i < i1; ++i) {
      float acc = 0.0f;
      for (int p = 0; p < g.k; ++p) {
        const size_t ai = g.transa == CUBLAS_OP_N ? static_cast<size_t>(p) * g.lda + i
                                                  : static_cast<size_t>(i) * g.lda + p;
        acc = fmaf(Load(g.A, g.a_type, ai), bcol[static_cast<size_t>(p)], acc);
      }
      if (g.a_scale != nullptr || g.b_scale != nullptr) {
        acc *= (g.a_scale == nullptr ? 1.0f : g.a_scale[g.a_vector ? i : 0]) * sb;
      }
      const size_t ci = static_cast<size_t>(j) * g.ldc + i;
      // beta == 0: C is not read (it may hold NaN garbage), as in cuBLAS.
      const float out =
          g.beta == 0.0f ? g.alpha * acc : g.alpha * acc + g.beta * Load(g.C, g.c_type, ci);
      Store(g.C, g.c_type, ci, out);
    }
  });
}

}  // namespace

struct cublasLtContext {
  int device = 0;
};

struct kvsimLtMatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale_type;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int32_t a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  int32_t b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

struct kvsimLtMatrixLayout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

struct kvsimLtMatmulPreference {
  uint64_t max_workspace = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace {

// KVSIM_CUBLASLT_NO_OUTER_VEC=1 plays a cuBLASLt without outer-vector FP8 scales (before 12.9),
// so the callers' other path runs too.
bool OuterVectorScales() {
  const char* v = std::getenv("KVSIM_CUBLASLT_NO_OUTER_VEC");
  return v == nullptr || std::strcmp(v, "1") != 0;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether cuBLASLt runs this problem: SUCCESS, NOT_SUPPORTED (no kernel for it) or
// INVALID_VALUE (inconsistent shapes). Fills `g`'s shape, types and scales.
cublasStatus_t LtProblem(const kvsimLtMatmulDesc* desc, const kvsimLtMatrixLayout* a,
                         const kvsimLtMatrixLayout* b, const kvsimLtMatrixLayout* c,
                         const kvsimLtMatrixLayout* d, Gemm* g) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale_type != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  g->transa = static_cast<cublasOperation_t>(desc->transa);
  g->transb = static_cast<cublasOperation_t>(desc->transb);
  const bool ta = desc->transa == CUBLAS_OP_T;
  const bool tb = desc->transb == CUBLAS_OP_T;
  const uint64_t m = ta ? a->cols : a->rows;
  const uint64_t k = ta ? a->rows : a->cols;
  const uint64_t n = tb ? b->rows : b->cols;
  if ((tb ? b->cols : b->rows) != k || c->rows != m || c->cols != n || d->rows != m ||
      d->cols != n || c->type != d->type || c->ld != d->ld || m > INT32_MAX || n > INT32_MAX ||
      k > INT32_MAX) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (const kvsimLtMatrixLayout* l : {a, b, d}) {
    if (l->ld < static_cast<int64_t>(l->rows > 0 ? l->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool fp8 = a->type == CUDA_R_8F_E4M3 && b->type == CUDA_R_8F_E4M3;
  const bool outer_a = desc->a_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const bool outer_b = desc->b_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (fp8) {
    // cuBLASLt's FP8 rules: "TN", k and the leading dimensions multiples of 16, an f32 / f16 /
    // bf16 result; outer-vector scales on both inputs or neither.
    if (!ta || tb || k % 16 != 0 || a->ld % 16 != 0 || b->ld % 16 != 0 || !Supported(d->type) ||
        outer_a != outer_b || (outer_a && !OuterVectorScales())) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((desc->a_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && !outer_a) ||
        (desc->b_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && !outer_b)) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  } else if (!Supported(a->type) || a->type != b->type || !Supported(d->type) ||
             desc->a_scale != nullptr || desc->b_scale != nullptr || outer_a || outer_b) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  g->m = static_cast<int>(m);
  g->n = static_cast<int>(n);
  g->k = static_cast<int>(k);
  g->a_type = a->type;
  g->b_type = b->type;
  g->c_type = d->type;
  g->lda = a->ld;
  g->ldb = b->ld;
  g->ldc = d->ld;
  g->a_scale = desc->a_scale;
  g->b_scale = desc->b_scale;
  g->a_vector = outer_a;
  g->b_vector = outer_b;
  return CUBLAS_STATUS_SUCCESS;
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
  const int b_rows = transb == CUBLAS_OP_N ? k : n;
  if (lda < (a_rows > 0 ? a_rows : 1) || ldb < (b_rows > 0 ? b_rows : 1) || ldc < (m > 0 ? m : 1)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const float al = *static_cast<const float*>(alpha);  // host pointer mode, f32 compute
  const float be = *static_cast<const float*>(beta);
  Gemm g{transa, transb, m, n, k, al, A, Atype, lda, B, Btype, ldb, be, C, Ctype, ldc};
  const int device = handle->device;
  auto gemm = [g, device] { RunGemm(g, device, "cublasGemmEx"); };
  const cudaError_t e = kvsim::Enqueue(handle->stream, gemm);
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (kvsim::DeviceCount() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto* h = new cublasLtContext();
  h->device = kvsim::CurrentDevice();
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new kvsimLtMatmulDesc{compute, scale_type};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (desc == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto int32 = [&](int32_t* out) {
    if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(out, buf, sizeof(int32_t));
    return CUBLAS_STATUS_SUCCESS;
  };
  auto pointer = [&](const float** out) {
    if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(out, buf, sizeof(void*));
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return int32(&desc->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return int32(&desc->transb);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return pointer(&desc->a_scale);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return pointer(&desc->b_scale);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
      return int32(&desc->a_scale_mode);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
      return int32(&desc->b_scale_mode);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;  // pointer modes, epilogues, ...: not simulated
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new kvsimLtMatrixLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new kvsimLtMatmulPreference();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&pref->max_workspace, buf, sizeof(uint64_t));
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&pref->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf,
                  sizeof(uint32_t));
      return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (pref == nullptr || requested < 1 || results == nullptr || returned == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returned = 0;
  Gemm g{};
  const cublasStatus_t st = LtProblem(desc, a, b, c, d, &g);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  // FP8 kernels need 16-byte aligned operands: a preference promising less finds none.
  if (g.a_type == CUDA_R_8F_E4M3) {
    for (uint32_t a : pref->min_alignment) {
      if (a < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  // One algorithm: the reference loop, needing no workspace, and (like cuBLASLt's) valid only for
  // operands as aligned as the preference promised (data[1..4]).
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = 1;
  for (int i = 0; i < 4; ++i) results[0].algo.data[1 + i] = pref->min_alignment[i];
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_layout, const void* B,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_layout, void* D,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha == nullptr || beta == nullptr || (algo != nullptr && algo->data[0] != 1) ||
      (workspace_bytes > 0 && !kvsim::IsDeviceRange(workspace, workspace_bytes))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  Gemm g{};
  const cublasStatus_t st = LtProblem(desc, a_layout, b_layout, c_layout, d_layout, &g);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  g.alpha = *static_cast<const float*>(alpha);  // host pointer mode
  g.beta = *static_cast<const float*>(beta);
  // The simulated kernels write D over C: distinct C and D only where C is not read.
  if (C != D && g.beta != 0.0f) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (g.a_type == CUDA_R_8F_E4M3 && (!Aligned16(A) || !Aligned16(B) || !Aligned16(D))) {
    return CUBLAS_STATUS_NOT_SUPPORTED;  // FP8 kernels need 16-byte aligned operands
  }
  // An algorithm chosen for more aligned operands than these cannot run them.
  if (algo != nullptr) {
    const void* operands[4] = {A, B, C, D};
    for (int i = 0; i < 4; ++i) {
      const uint64_t need = algo->data[1 + i];
      if (need == 0 || reinterpret_cast<uintptr_t>(operands[i]) % need != 0) {
        return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
  }
  if ((g.a_vector || g.b_vector) && (g.a_scale == nullptr || g.b_scale == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  g.A = A;
  g.B = B;
  g.C = D;
  const int device = handle->device;
  auto gemm = [g, device] { RunGemm(g, device, "cublasLtMatmul"); };
  const cudaError_t e = kvsim::Enqueue(stream, gemm);
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
