#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/argmax.h"
#include "kernels/cuda/convert_weights.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe_combine.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope_kv_write.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/silu_mul.h"

namespace kvserve::cuda {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  int count = 0;  // not written when the driver is missing
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return CudaError(err, "cudaGetDeviceCount");
  if (count == 0) return absl::UnavailableError("no CUDA device found");
  if (options.device_index < 0 || options.device_index >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", options.device_index, " requested, ", count, " present"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(options));
  const char* f32_env = std::getenv("KVSERVE_CUDA_F32_ACTIVATIONS");
  const bool f32_activations =
      options.f32_activations || (f32_env != nullptr && std::strcmp(f32_env, "1") == 0);
  b->activation_dtype_ = f32_activations ? DType::kF32 : DType::kBF16;
  if ((err = cudaSetDevice(options.device_index)) != cudaSuccess) {
    return CudaError(err, "cudaSetDevice");
  }
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, options.device_index)) != cudaSuccess) {
    return CudaError(err, "cudaGetDeviceProperties");
  }
  if (prop.major < 8) {
    return absl::UnavailableError(absl::StrCat(prop.name, " is sm_", prop.major, prop.minor,
                                               "; kvserve is built for sm_80 and sm_90"));
  }
  if (options.fp8_weights && prop.major * 10 + prop.minor < 89) {
    return absl::UnavailableError(absl::StrCat(
        prop.name, " is sm_", prop.major, prop.minor,
        ": FP8 weights need FP8 tensor cores (sm_89 or newer); drop --quantization fp8"));
  }
  b->num_sms_ = prop.multiProcessorCount;
  int driver = 0;
  cudaDriverGetVersion(&driver);
  b->description_ = absl::StrCat(
      "cuda:", options.device_index, " ", prop.name, " (sm_", prop.major, prop.minor, ", ",
      prop.multiProcessorCount, " SMs, ", prop.totalGlobalMem >> 20, " MiB, driver CUDA ",
      driver / 1000, ".", driver % 1000 / 10, ", ", std::string(DTypeName(b->activation_dtype_)),
      " activations", options.fp8_weights ? ", fp8 weights" : "", ")");
  if ((err = cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking)) != cudaSuccess) {
    return CudaError(err, "cudaStreamCreate");
  }
  if (cublasCreate(&b->blas_.blas) != CUBLAS_STATUS_SUCCESS) {
    return absl::UnavailableError("cublasCreate failed");
  }
  cublasSetStream(b->blas_.blas, b->stream_);
  // A fixed workspace keeps cuBLAS from allocating during a graph capture.
  if ((err = cudaMalloc(&b->blas_.workspace, kCublasWorkspaceBytes)) != cudaSuccess) {
    return CudaError(err, "cudaMalloc(cuBLAS workspace)");
  }
  b->blas_.workspace_bytes = kCublasWorkspaceBytes;
  cublasSetWorkspace(b->blas_.blas, b->blas_.workspace, kCublasWorkspaceBytes);
  if (cublasLtCreate(&b->blas_.lt) != CUBLAS_STATUS_SUCCESS) {
    return absl::UnavailableError("cublasLtCreate failed");
  }
  b->blas_.fp8_outer_vector = Fp8OuterVectorScaling(b->blas_);
  return b;
}

CudaBackend::~CudaBackend() {
  Bind();
  // Scratch first: their destructors call Free, which must still be this class's.
  matmul_scratch_.reset();
  attention_scratch_.reset();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaGraphExec_t g : graphs_) {
    if (g != nullptr) cudaGraphExecDestroy(g);
  }
  if (blas_.lt != nullptr) cublasLtDestroy(blas_.lt);
  if (blas_.blas != nullptr) cublasDestroy(blas_.blas);
  if (blas_.workspace != nullptr) cudaFree(blas_.workspace);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaBackend::Bind() const { cudaSetDevice(options_.device_index); }

void CudaBackend::Note(cudaError_t err, const char* op) {
  if (err == cudaSuccess || !error_.empty()) return;
  error_ = absl::StrCat(op, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

void CudaBackend::NoteText(const char* error, const char* op) {
  if (error == nullptr || !error_.empty()) return;
  error_ = absl::StrCat(op, ": ", error);
}

std::string CudaBackend::TakeError() {
  std::string e = std::move(error_);
  error_.clear();
  return e;
}

bool CudaBackend::Reserve(DeviceBuffer* scratch, size_t bytes, const char* op) {
  if (scratch->bytes() >= bytes) return true;
  if (capturing_) {
    NoteText(absl::StrCat("needs ", bytes, " bytes of scratch, has ", scratch->bytes(),
                          ", and cannot allocate during a CUDA graph capture (run the op once "
                          "before capturing)")
                 .c_str(),
             op);
    return false;
  }
  scratch->reset();
  absl::StatusOr<DeviceBuffer> buf = AllocBuffer(std::max(bytes, scratch->bytes() * 2));
  if (!buf.ok()) {
    NoteText(std::string(buf.status().message()).c_str(), op);
    return false;
  }
  *scratch = std::move(*buf);
  ++memory_epoch_;
  return true;
}

absl::StatusOr<void*> CudaBackend::Alloc(size_t bytes) {
  Bind();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: an allocation failure is not sticky
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc(", bytes, " bytes): ", cudaGetErrorString(err)));
  }
  return p;
}

void CudaBackend::Free(void* ptr) {
  Bind();
  if (ptr != nullptr) cudaFree(ptr);
}

absl::Status CudaBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  Bind();
  if (bytes == 0) return absl::OkStatus();
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
  // Pageable host memory: wait so the caller may reuse its buffer at once.
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "copy to device");
}

absl::Status CudaBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  Bind();
  if (bytes == 0) return Synchronize();
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
  if (err != cudaSuccess) return CudaError(err, "copy to host");
  return Synchronize();
}

absl::StatusOr<void*> CudaBackend::AllocHost(size_t bytes) {
  Bind();
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) return CudaError(err, "page-locked host allocation");
  return p;
}

void CudaBackend::FreeHost(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

absl::Status CudaBackend::CopyToDeviceAsync(void* dst, const void* src, size_t bytes) {
  Bind();
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "copy to device");
}

absl::Status CudaBackend::CopyToHostAsync(void* dst, const void* src, size_t bytes) {
  Bind();
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "copy to host");
}

absl::Status CudaBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  Bind();
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "copy on device");
}

absl::Status CudaBackend::Memset(void* dst, int value, size_t bytes) {
  Bind();
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t err = cudaMemsetAsync(dst, value, bytes, stream_);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "memset");
}

absl::Status CudaBackend::Synchronize() {
  Bind();
  Note(cudaStreamSynchronize(stream_), "stream");
  const std::string error = TakeError();
  if (error.empty()) return absl::OkStatus();
  // The error is reported once. A fault that broke the device comes back from CUDA at the next
  // synchronisation anyway; anything else must not fail the ops after it.
  cudaGetLastError();
  return absl::InternalError(absl::StrCat("CUDA op failed: ", error));
}

absl::StatusOr<std::pair<int64_t, int64_t>> CudaBackend::MemoryInfo() const {
  Bind();
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (err != cudaSuccess) return CudaError(err, "cudaMemGetInfo");
  return std::make_pair(static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes));
}

absl::StatusOr<PreparedMatrix> CudaBackend::PrepareMatrix(const void* host, DType dtype,
                                                          int64_t rows, int64_t cols,
                                                          MatrixUse use) {
  Bind();
  PreparedMatrix m;
  m.rows = rows;
  m.cols = cols;
  const size_t src_bytes = static_cast<size_t>(DTypeRowBytes(dtype, cols) * rows);
  if (options_.fp8_weights && use == MatrixUse::kMatmul && rows > 0 && cols > 0 &&
      (dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16)) {
    return PrepareFp8Matrix(host, dtype, rows, cols);
  }
  // Quantized weights stay in their packed blocks (cuda::Matmul reads them as stored).
  const bool as_is = dtype == DType::kF16 || dtype == DType::kBF16 || DTypeIsQuantized(dtype) ||
                     (dtype == DType::kF32 && options_.keep_f32_weights);
  if (as_is) {
    absl::StatusOr<DeviceBuffer> buf = AllocBuffer(src_bytes);
    if (!buf.ok()) return buf.status();
    if (absl::Status s = CopyToDevice(buf->get(), host, src_bytes); !s.ok()) return s;
    m.dtype = dtype;
    m.data = buf->get();
    m.storage = std::move(*buf);
    return m;
  }
  // f32: upload the stored bytes, convert to bf16 on the device.
  absl::StatusOr<DeviceBuffer> raw = AllocBuffer(src_bytes);
  if (!raw.ok()) return raw.status();
  if (absl::Status s = CopyToDevice(raw->get(), host, src_bytes); !s.ok()) return s;
  absl::StatusOr<DeviceBuffer> out = AllocBuffer(sizeof(uint16_t) * rows * cols);
  if (!out.ok()) return out.status();
  const cudaError_t err =
      ConvertWeights(raw->get(), dtype, rows, cols, DType::kBF16, out->get(), stream_);
  if (err != cudaSuccess) return CudaError(err, "weight conversion");
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  m.dtype = DType::kBF16;
  m.data = out->get();
  m.storage = std::move(*out);
  return m;
}

absl::StatusOr<PreparedMatrix> CudaBackend::PrepareFp8Matrix(const void* host, DType dtype,
                                                             int64_t rows, int64_t cols) {
  const size_t src_bytes = static_cast<size_t>(DTypeRowBytes(dtype, cols) * rows);
  absl::StatusOr<DeviceBuffer> raw = AllocBuffer(src_bytes);
  if (!raw.ok()) return raw.status();
  if (absl::Status s = CopyToDevice(raw->get(), host, src_bytes); !s.ok()) return s;
  // The codes, then one f32 scale per row, in one buffer.
  const size_t codes_bytes = (static_cast<size_t>(rows * cols) + 255) / 256 * 256;
  absl::StatusOr<DeviceBuffer> out = AllocBuffer(codes_bytes + sizeof(float) * rows);
  if (!out.ok()) return out.status();
  auto* codes = out->as<uint8_t>();
  auto* scales = reinterpret_cast<float*>(codes + codes_bytes);
  const cudaError_t err =
      QuantizeRowsFp8(raw->get(), dtype, cols, rows, cols, codes, cols, scales, stream_);
  if (err != cudaSuccess) return CudaError(err, "FP8 weight quantization");
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  PreparedMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.dtype = DType::kF8E4M3;
  m.data = codes;
  m.scales = scales;
  m.storage = std::move(*out);
  return m;
}

absl::StatusOr<PreparedVector> CudaBackend::PrepareVector(const float* host, int64_t n) {
  Bind();
  PreparedVector v;
  absl::StatusOr<DeviceBuffer> buf = AllocBuffer(sizeof(float) * std::max<int64_t>(n, 1));
  if (!buf.ok()) return buf.status();
  if (absl::Status s = CopyToDevice(buf->get(), host, sizeof(float) * n); !s.ok()) return s;
  v.data = buf->as<float>();
  v.n = n;
  v.storage = std::move(*buf);
  return v;
}

void CudaBackend::Embedding(const EmbeddingArgs& args) {
  Bind();
  Note(EmbeddingGather(args, stream_), "embedding");
}

void CudaBackend::RmsNorm(const cpu::RmsNormArgs& args) {
  Bind();
  Note(cuda::RmsNorm(args, stream_), "rms_norm");
}

void CudaBackend::Matmul(const cpu::MatmulArgs& args) {
  Bind();
  if (!Reserve(&matmul_scratch_, MatmulScratchBytes(args, blas_), "matmul")) return;
  NoteText(cuda::Matmul(args, blas_, matmul_scratch_.get(), stream_), "matmul");
}

void CudaBackend::RopeKvWrite(const RopeKvWriteArgs& args) {
  Bind();
  Note(cuda::RopeKvWrite(args, stream_), "rope_kv_write");
}

AttentionPlan CudaBackend::PlanAttention(const AttentionShape& shape) const {
  AttentionPlan plan;
  plan.shape = shape;
  plan.decode = shape.max_q_len == 1;
  if (plan.decode) {
    const DecodeSplits splits = PlanDecodeSplits(shape, num_sms_);
    plan.num_splits = splits.num_splits;
    plan.split_len = splits.split_len;
  }
  return plan;
}

void CudaBackend::RunAttention(const AttentionPlan& plan, const cpu::PagedAttentionArgs& args) {
  Bind();
  if (plan.decode) {
    if (!Reserve(&attention_scratch_, DecodeWorkspaceBytes(plan), "attention")) return;
    Note(DecodeAttention(args, plan, attention_scratch_.get(), stream_), "decode_attention");
  } else {
    Note(PrefillAttention(args, plan, stream_), "prefill_attention");
  }
}

void CudaBackend::SiluMul(const SiluMulArgs& args) {
  Bind();
  Note(cuda::SiluMul(args, stream_), "silu_mul");
}

void CudaBackend::MoeCombine(const MoeCombineArgs& args) {
  Bind();
  Note(cuda::MoeCombine(args, stream_), "moe_combine");
}

void CudaBackend::ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                         int32_t* out) {
  Bind();
  Note(cuda::ArgMax(logits, rows, vocab, stride, out, stream_), "argmax");
}

void CudaBackend::SampleTopKTopP(const SampleTopKTopPArgs& args) {
  Bind();
  Note(cuda::SampleTopKTopP(args, stream_), "sample_top_k_top_p");
}

absl::Status CudaBackend::BeginCapture() {
  Bind();
  if (!options_.enable_graphs) return absl::FailedPreconditionError("CUDA graphs are disabled");
  // Errors of ops before the capture are not the capture's.
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  const cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamBeginCapture");
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int> CudaBackend::EndCapture() {
  Bind();
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  // An op that failed while capturing is the capture's error (its own words say more than
  // "capture invalidated"); either way the backend goes on eagerly, with nothing left noted.
  const std::string op_error = TakeError();
  if (err != cudaSuccess || !op_error.empty()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(
        "CUDA graph capture failed: ",
        !op_error.empty() ? op_error
                          : absl::StrCat("cudaStreamEndCapture: ", cudaGetErrorName(err), " (",
                                         cudaGetErrorString(err), ")")));
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaError(err, "cudaGraphInstantiate");
  }
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

absl::Status CudaBackend::LaunchGraph(int graph) {
  Bind();
  if (graph < 0 || graph >= static_cast<int>(graphs_.size()) || graphs_[graph] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no CUDA graph ", graph));
  }
  const cudaError_t err = cudaGraphLaunch(graphs_[graph], stream_);
  return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "cudaGraphLaunch");
}

void CudaBackend::DestroyGraph(int graph) {
  Bind();
  if (graph < 0 || graph >= static_cast<int>(graphs_.size()) || graphs_[graph] == nullptr) return;
  // A replay may still be queued: the stream must be done with the graph before it goes.
  cudaStreamSynchronize(stream_);
  cudaGraphExecDestroy(graphs_[graph]);
  graphs_[graph] = nullptr;
}

}  // namespace kvserve::cuda

// The entry point LoadCudaBackend looks up with dlsym.
extern "C" __attribute__((visibility("default"))) kvserve::Backend* kvserve_create_cuda_backend(
    const kvserve::BackendOptions* options, char* error, size_t error_size) {
  absl::StatusOr<std::unique_ptr<kvserve::cuda::CudaBackend>> b =
      kvserve::cuda::CudaBackend::Create(options != nullptr ? *options : kvserve::BackendOptions{});
  if (!b.ok()) {
    if (error != nullptr && error_size > 0) {
      std::snprintf(error, error_size, "%s", std::string(b.status().message()).c_str());
    }
    return nullptr;
  }
  return b->release();
}

// Matmul's activation conversion passes so far (cuda::ActivationConversions), for tests.
extern "C" __attribute__((visibility("default"))) long long kvserve_cuda_activation_conversions() {
  return static_cast<long long>(kvserve::cuda::ActivationConversions());
}
