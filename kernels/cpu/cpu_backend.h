#ifndef KVSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define KVSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {

/// The Backend on the CPU kernels: every op calls its kernel in kernels/cpu with the same
/// arguments the model used to pass directly, so results are bit-for-bit those kernels'.
/// Memory is host memory; weights are used in place in their stored dtype.
class CpuBackend final : public Backend {
 public:
  /// `pool` (may be null: single-threaded) must outlive the backend.
  explicit CpuBackend(ThreadPool* pool) : pool_(pool) {}

  std::string_view name() const override { return "cpu"; }
  std::string description() const override;
  bool host_memory() const override { return true; }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Memset(void* dst, int value, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() const override;

  absl::StatusOr<PreparedMatrix> PrepareMatrix(const void* host, DType dtype, int64_t rows,
                                               int64_t cols) override;
  absl::StatusOr<PreparedVector> PrepareVector(const float* host, int64_t n) override;

  void Embedding(const EmbeddingArgs& args) override;
  void RmsNorm(const RmsNormArgs& args) override;
  void Matmul(const MatmulArgs& args) override;
  void RopeKvWrite(const RopeKvWriteArgs& args) override;
  AttentionPlan PlanAttention(const AttentionShape& shape) const override;
  void RunAttention(const AttentionPlan& plan, const PagedAttentionArgs& args) override;
  void SiluMul(const SiluMulArgs& args) override;
  void ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
              int32_t* out) override;
  void SampleTopKTopP(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t k,
                      float top_p, float temperature, const float* uniforms, int32_t* out) override;

 private:
  ThreadPool* pool_;
};

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_CPU_BACKEND_H_
