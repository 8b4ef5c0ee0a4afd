#ifndef KVSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define KVSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/matmul.h"

namespace kvserve::cuda {

/// The Backend on one CUDA device: one stream, one cuBLAS handle, the kernels of kernels/cuda.
/// Lives in libkvserve_cuda.so; programs get it through LoadCudaBackend (kernels/backend.h).
///
/// Weights: f16 / bf16 and GGUF quantized matrices are copied as stored (quantized ones stay
/// packed: cuda::Matmul reads their blocks); f32 ones are converted to bf16 on the device at load
/// (kept as f32 with keep_f32_weights). With fp8_weights, f32 / f16 / bf16 Matmul weights are
/// quantized to FP8 E4M3 with row scales on the device at load instead (cuBLASLt's FP8 GEMMs
/// multiply them; cuda::Matmul). Activations are bf16 between ops (activation_dtype; f32
/// with BackendOptions::f32_activations or KVSERVE_CUDA_F32_ACTIVATIONS=1), each op reading and
/// writing the dtype its args name. Accumulation is fp32 (cuBLAS, or the quantized GEMV). The
/// first error of queued ops is reported by the next Synchronize / CopyToHost and then cleared: a
/// failure that leaves the device usable (a launch refused, an allocation or capture that failed)
/// breaks nothing after it, while a fault that breaks the device keeps coming back from CUDA
/// itself. A failed capture reports its own error.
class CudaBackend final : public Backend {
 public:
  /// Opens the device; UNAVAILABLE naming the reason (no driver, no device, bad index).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  std::string description() const override { return description_; }
  bool host_memory() const override { return false; }
  DType activation_dtype() const override { return activation_dtype_; }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::StatusOr<void*> AllocHost(size_t bytes) override;
  void FreeHost(void* ptr) override;
  absl::Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Memset(void* dst, int value, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() const override;

  absl::StatusOr<PreparedMatrix> PrepareMatrix(const void* host, DType dtype, int64_t rows,
                                               int64_t cols, MatrixUse use) override;
  absl::StatusOr<PreparedVector> PrepareVector(const float* host, int64_t n) override;

  void Embedding(const EmbeddingArgs& args) override;
  void RmsNorm(const cpu::RmsNormArgs& args) override;
  void Matmul(const cpu::MatmulArgs& args) override;
  void RopeKvWrite(const RopeKvWriteArgs& args) override;
  AttentionPlan PlanAttention(const AttentionShape& shape) const override;
  void RunAttention(const AttentionPlan& plan, const cpu::PagedAttentionArgs& args) override;
  void SiluMul(const SiluMulArgs& args) override;
  void MoeCombine(const MoeCombineArgs& args) override;
  void ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
              int32_t* out) override;
  void SampleTopKTopP(const SampleTopKTopPArgs& args) override;

  bool supports_graphs() const override { return options_.enable_graphs; }
  void* native_stream() override { return stream_; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int> EndCapture() override;
  absl::Status LaunchGraph(int graph) override;
  void DestroyGraph(int graph) override;
  uint64_t memory_epoch() const override { return memory_epoch_; }

  /// The stream every op is queued on.
  cudaStream_t stream() const { return stream_; }

 private:
  explicit CudaBackend(const BackendOptions& options) : options_(options) {}
  /// Makes this backend's device current on the calling thread (ops may come from any one
  /// thread at a time, e.g. an engine loop that did not create the backend).
  void Bind() const;
  /// PrepareMatrix of a float Matmul weight under fp8_weights: uploaded, quantized on the device.
  absl::StatusOr<PreparedMatrix> PrepareFp8Matrix(const void* host, DType dtype, int64_t rows,
                                                  int64_t cols);
  /// Records the first error of a queued op (sticky until reported).
  void Note(cudaError_t err, const char* op);
  void NoteText(const char* error, const char* op);
  /// Makes `*scratch` at least `bytes` long (grow-only); moving it bumps memory_epoch(), since
  /// graphs captured before point at the old buffer. While capturing it cannot allocate (CUDA
  /// forbids it): a scratch too small then fails the op, and with it the capture.
  bool Reserve(DeviceBuffer* scratch, size_t bytes, const char* op);
  /// The first error noted since the last report, cleared (empty when none).
  std::string TakeError();

  BackendOptions options_;
  DType activation_dtype_ = DType::kBF16;
  std::string description_;
  int num_sms_ = 1;
  cudaStream_t stream_ = nullptr;
  BlasHandles blas_;   // cuBLAS and cuBLASLt on stream_, their workspace, FP8 scaling support
  std::string error_;  // first asynchronous error, reported by Synchronize
  DeviceBuffer matmul_scratch_;
  DeviceBuffer attention_scratch_;
  std::vector<cudaGraphExec_t> graphs_;  // null once destroyed
  uint64_t memory_epoch_ = 0;             // bumped when a scratch buffer moves
  bool capturing_ = false;                // between BeginCapture and EndCapture
};

}  // namespace kvserve::cuda

#endif  // KVSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
