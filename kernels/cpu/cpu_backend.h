#ifndef KVSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define KVSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/io/anonymous_memory.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {

/// The Backend on the CPU kernels: every op calls its kernel in kernels/cpu with the same
/// arguments the model used to pass directly, so results are bit-for-bit those kernels'.
/// Memory is host memory; weights are used in place in their stored dtype, but q4_0, q8_0, q4_k,
/// q5_k and q6_k Matmul weights, packed at PrepareMatrix (packed_weights.h). Activations are f32
/// only: an op asked for another activation dtype does nothing, and the next Synchronize
/// reports FAILED_PRECONDITION naming it.
///
/// Graphs (the twin of CUDA graphs, on when constructed with `enable_graphs`): between
/// BeginCapture and EndCapture each op is recorded with its arguments instead of run, and
/// LaunchGraph runs the recording. This lets the CPU test suite exercise the model's
/// capture-and-replay logic (fixed buffers, padding, invalidation) that CUDA runs for real.
class CpuBackend final : public Backend {
 public:
  /// `pool` (may be null: single-threaded) must outlive the backend.
  explicit CpuBackend(ThreadPool* pool, bool enable_graphs = false)
      : pool_(pool), enable_graphs_(enable_graphs) {}

  /// BackendOptions::fp8_weights: from now on PrepareMatrix quantizes f32 / f16 / bf16
  /// MatrixUse::kMatmul weights to FP8 E4M3 with row scales (QuantizeRowsFp8), the reference
  /// twin of the CUDA backend's FP8 weights.
  void set_fp8_weights(bool on) { fp8_weights_ = on; }

  std::string_view name() const override { return "cpu"; }
  std::string description() const override;
  bool host_memory() const override { return true; }

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Memset(void* dst, int value, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() const override;

  absl::StatusOr<PreparedMatrix> PrepareMatrix(const void* host, DType dtype, int64_t rows,
                                               int64_t cols, MatrixUse use) override;
  absl::StatusOr<PreparedVector> PrepareVector(const float* host, int64_t n) override;

  void Embedding(const EmbeddingArgs& args) override;
  void RmsNorm(const RmsNormArgs& args) override;
  void Matmul(const MatmulArgs& args) override;
  void RopeKvWrite(const RopeKvWriteArgs& args) override;
  AttentionPlan PlanAttention(const AttentionShape& shape) const override;
  void RunAttention(const AttentionPlan& plan, const PagedAttentionArgs& args) override;
  void SiluMul(const SiluMulArgs& args) override;
  void MoeCombine(const MoeCombineArgs& args) override;
  void ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
              int32_t* out) override;
  void SampleTopKTopP(const SampleTopKTopPArgs& args) override;

  bool supports_graphs() const override { return enable_graphs_; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int> EndCapture() override;
  absl::Status LaunchGraph(int graph) override;
  void DestroyGraph(int graph) override;

 private:
  using Op = std::function<void()>;
  static void RopeKvWriteNow(const RopeKvWriteArgs& args);
  static void MoeCombineNow(const MoeCombineArgs& args, ThreadPool* pool);
  static void ArgMaxNow(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                        int32_t* out);
  static void SampleTopKTopPNow(const SampleTopKTopPArgs& args);
  /// Runs `op` now, or records it while capturing (no std::function is made when running).
  template <class F>
  void Queue(F&& op) {
    if (capturing_) {
      recording_.emplace_back(std::forward<F>(op));
    } else {
      op();
    }
  }
  /// FAILED_PRECONDITION naming `call` while capturing (it cannot be recorded).
  absl::Status NotWhileCapturing(const char* call) const;
  /// Whether every dtype in `dtypes` is kF32; otherwise notes that `op` was refused (reported
  /// by the next Synchronize) and returns false.
  bool F32Only(const char* op, std::initializer_list<DType> dtypes);
  /// `bytes` of memory for packed weights (PrepareMatrix), from the packing arenas.
  absl::StatusOr<uint8_t*> PackedSpace(size_t bytes);

  std::string error_;  // first refused op since the last Synchronize

  ThreadPool* pool_;
  bool fp8_weights_ = false;
  bool enable_graphs_ = false;
  bool capturing_ = false;
  std::vector<Op> recording_;
  std::vector<std::vector<Op>> graphs_;  // emptied by DestroyGraph
  // Packed Matmul weights, one matrix after another in mappings of at least 32 MiB (on huge
  // pages, committed as written), so that matrices smaller than a huge page share them; they
  // live as long as the backend.
  std::vector<AnonymousMemory> packed_arenas_;
  size_t packed_used_ = 0;  // bytes taken of packed_arenas_.back()
};

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_CPU_BACKEND_H_
