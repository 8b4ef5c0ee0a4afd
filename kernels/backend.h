#ifndef KVSERVE_KERNELS_BACKEND_H_
#define KVSERVE_KERNELS_BACKEND_H_

// The one interface the model calls its ops through. The CPU backend (kernels/cpu/cpu_backend.h)
// wraps the CPU kernels; the CUDA backend (kernels/cuda/cuda_backend.h) lives in the shared
// library libkvserve_cuda.so, loaded with dlopen by CreateBackend, so nothing else links CUDA.
//
// Pointers passed to ops are "device pointers": memory from Alloc (or PrepareMatrix /
// PrepareVector). For the CPU backend they are plain host pointers (host_memory() is true) and
// callers may pass any host memory. Ops are queued on the backend's one stream and may return
// before they finish; Synchronize() waits, and the Copy*ToHost calls wait for their own result.
//
// The class is header-only (every member is inline or pure) so the dlopen'ed library needs no
// symbol of the program that loads it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/dtype.h"
#include "kernels/kv_dtype.h"
#include "kernels/op_args.h"
#include "kernels/sampling_args.h"

namespace kvserve {

class Backend;

/// Which device `--device` asks for: kAuto takes CUDA when a usable GPU is present. kCudaSim is a
/// test device, not a product one: the CUDA backend's sources built against the CUDA simulator
/// (libkvserve_cuda_sim.so, kernels/cuda/sim), running every kernel on the CPU with checks.
enum class DeviceChoice : uint8_t { kCpu, kCuda, kAuto, kCudaSim };

/// Parses "cpu", "cuda", "auto" or "cuda-sim" (ASCII case-insensitive); nullopt otherwise.
std::optional<DeviceChoice> DeviceChoiceFromName(std::string_view name);
/// "cpu", "cuda", "auto" or "cuda-sim".
std::string_view DeviceChoiceName(DeviceChoice choice);

/// Options of a backend; the CPU backend ignores everything but the pool.
struct BackendOptions {
  /// CUDA device ordinal.
  int device_index = 0;
  /// Keep f32 weights in f32 on the GPU (fp32 GEMMs) instead of converting them to bf16 at load:
  /// slower and twice the memory, but numerically next to the CPU path (tests use it).
  bool keep_f32_weights = false;
  /// Allow CUDA-graph capture of decode steps (LlamaModel captures one graph per batch size).
  bool enable_graphs = false;
  /// Load the simulated CUDA backend (libkvserve_cuda_sim.so) instead of the real one.
  bool simulator = false;
  /// Keep activations in f32 between ops (the escape hatch: CUDA's default is bf16, see
  /// Backend::activation_dtype). The environment variable KVSERVE_CUDA_F32_ACTIVATIONS=1 does the
  /// same for every CUDA backend of the process.
  bool f32_activations = false;
  /// Quantize f32 / f16 / bf16 Matmul weights (MatrixUse::kMatmul) to FP8 E4M3 at load, one f32
  /// scale per row (DType::kF8E4M3): half the memory and decode traffic of bf16. Matmul then
  /// quantizes each activation row to FP8 E4M3 with a scale of its own and multiplies on FP8
  /// tensor cores through cuBLASLt (CUDA; `--quantization fp8`). Block-quantized GGUF weights
  /// stay as stored. The CPU backend takes the same option (its reference twin, not fast).
  bool fp8_weights = false;
};

/// Device memory owned by a backend; freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Takes ownership of `ptr` (from backend->Alloc) of `bytes` bytes.
  DeviceBuffer(Backend* backend, void* ptr, size_t bytes)
      : backend_(backend), ptr_(ptr), bytes_(bytes) {}
  inline ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  inline DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The memory (nullptr when empty).
  void* get() const { return ptr_; }
  /// Typed view of the memory.
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  /// Size in bytes.
  size_t bytes() const { return bytes_; }
  /// Frees the memory now.
  inline void reset();

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// What a prepared weight matrix is for: rows gathered by Embedding, or the weights of Matmul
/// (which a backend may lay out for its kernels). kMatmulKeepPrecision is a Matmul weight that
/// stays in its stored type when the backend quantizes the others (BackendOptions::fp8_weights):
/// the vocabulary projection and mixture-of-experts routers, as vLLM's fp8 leaves them.
enum class MatrixUse { kEmbedding, kMatmul, kMatmulKeepPrecision };

/// A weight matrix [rows, cols] as the backend's matmul and embedding ops want it: for the CPU
/// the file's own bytes (stored dtype, no copy), except q4_0 / q8_0 / K-quant Matmul weights,
/// packed once at load (kernels/cpu/packed_weights.h); for CUDA a device copy as stored (f16, bf16 and
/// quantized blocks) or in bf16 (f32 weights converted at load).
struct PreparedMatrix {
  const void* data = nullptr;  // [rows, cols] row-major in `dtype`, or packed (below)
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  bool packed = false;   // data in the CPU's packed layout (cpu::MatmulArgs::w_packed): Matmul only
  const float* scales = nullptr;  // kF8E4M3: [rows] f32 row scales (cpu::MatmulArgs::w_scale)
  DeviceBuffer storage;           // owns `data` (and `scales`) when the backend made a copy
};

/// An f32 vector (norm weight, bias, RoPE frequencies) in backend memory.
struct PreparedVector {
  const float* data = nullptr;
  int64_t n = 0;
  DeviceBuffer storage;  // owns `data` when the backend made a copy
};

/// The ops of a model forward pass. Not thread-safe: one thread drives a backend.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu" or "cuda".
  virtual std::string_view name() const = 0;
  /// A line describing the device (for logs and reports).
  virtual std::string description() const = 0;
  /// Whether device memory is host memory (ops take host pointers directly).
  virtual bool host_memory() const = 0;
  /// The dtype a model keeps its activations in between ops (GEMM inputs and outputs, q/k/v,
  /// attention output, SiLU·mul): kF32 on the CPU; kBF16 on CUDA (unless
  /// BackendOptions::f32_activations), where GEMMs and norms still accumulate in f32. The
  /// residual stream, the attention-output and MLP-down projections that add into it, router
  /// logits and the logits stay f32 on every backend (docs/gpu.md, "Activations in bf16"). Ops
  /// take the dtype in their args (default kF32); a backend rejects one it cannot serve.
  virtual DType activation_dtype() const { return DType::kF32; }

  // ---- Memory ---------------------------------------------------------------------------------
  /// Allocates `bytes` (contents undefined, 256-byte aligned). RESOURCE_EXHAUSTED when full.
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  /// Frees memory from Alloc (nullptr is ignored).
  virtual void Free(void* ptr) = 0;
  /// Copies host -> device (blocking for the host buffer: it may be reused on return).
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) = 0;
  /// Copies device -> host; returns when the bytes are on the host.
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  /// Host memory the device copies to and from without staging (CUDA: page-locked), for
  /// buffers that take part in the *Async copies below. UNIMPLEMENTED where plain host memory
  /// is as good (the CPU). Free it with FreeHost.
  virtual absl::StatusOr<void*> AllocHost(size_t /*bytes*/) {
    return absl::UnimplementedError("no special host memory");
  }
  virtual void FreeHost(void* /*ptr*/) {}
  /// Queues a host -> device copy in stream order; `src` must stay unchanged until the copy has
  /// run (Synchronize). Defaults to the blocking CopyToDevice.
  virtual absl::Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes) {
    return CopyToDevice(dst, src, bytes);
  }
  /// Queues a device -> host copy in stream order; the bytes are on the host after Synchronize.
  /// Defaults to the blocking CopyToHost.
  virtual absl::Status CopyToHostAsync(void* dst, const void* src, size_t bytes) {
    return CopyToHost(dst, src, bytes);
  }
  /// Copies device -> device (queued).
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  /// Sets `bytes` bytes to `value` (queued).
  virtual absl::Status Memset(void* dst, int value, size_t bytes) = 0;
  /// Waits for every queued op; reports an asynchronous error of any of them.
  virtual absl::Status Synchronize() = 0;
  /// Free and total device memory in bytes.
  virtual absl::StatusOr<std::pair<int64_t, int64_t>> MemoryInfo() const = 0;

  /// Allocates an owning buffer.
  absl::StatusOr<DeviceBuffer> AllocBuffer(size_t bytes) {
    absl::StatusOr<void*> p = Alloc(bytes);
    if (!p.ok()) return p.status();
    return DeviceBuffer(this, *p, bytes);
  }

  // ---- Weights --------------------------------------------------------------------------------
  /// Makes a host weight matrix usable by Matmul or Embedding, as `use` says (see
  /// PreparedMatrix).
  virtual absl::StatusOr<PreparedMatrix> PrepareMatrix(const void* host, DType dtype, int64_t rows,
                                                       int64_t cols, MatrixUse use) = 0;
  /// Makes a host f32 vector usable by the ops.
  virtual absl::StatusOr<PreparedVector> PrepareVector(const float* host, int64_t n) = 0;

  // ---- Ops (pointers are device pointers; shapes and strides are host values) -----------------
  /// Embedding gather (cpu::EmbeddingGather).
  virtual void Embedding(const EmbeddingArgs& args) = 0;
  /// (Residual add +) RMSNorm (cpu::RmsNorm).
  virtual void RmsNorm(const cpu::RmsNormArgs& args) = 0;
  /// y = x W^T (+ bias), W a PreparedMatrix's data and dtype (cpu::Matmul).
  virtual void Matmul(const cpu::MatmulArgs& args) = 0;
  /// RoPE fused with the KV-cache write and quantization.
  virtual void RopeKvWrite(const RopeKvWriteArgs& args) = 0;
  /// Plans paged attention for a batch shape (host only, cheap).
  virtual AttentionPlan PlanAttention(const AttentionShape& shape) const = 0;
  /// Runs paged attention (cpu::PagedAttention semantics); `args` arrays are device pointers.
  virtual void RunAttention(const AttentionPlan& plan, const cpu::PagedAttentionArgs& args) = 0;
  /// SiLU-and-mul (cpu::SiluMul).
  virtual void SiluMul(const SiluMulArgs& args) = 0;
  /// Mixture-of-experts weighted gather-sum (MoeCombineArgs).
  virtual void MoeCombine(const MoeCombineArgs& args) = 0;
  /// out[r] = the first index of the largest of logits[r, 0 .. vocab) (NaN never wins).
  virtual void ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                      int32_t* out) = 0;
  /// Sampling on the device: for each SampleRowParams r, out[r] is the token the host Sampler
  /// (worker/engine/sampler.cc) draws from logits row params[r].row with uniform
  /// params[r].uniform: the top_k best under (temperature-scaled logit, lower index), TopPStep's
  /// nucleus cut, then Sampler::Pick's inverse CDF, with the same arithmetic (SampleRowParams).
  /// -1 for a row the host sampler refuses (NaN, +inf, or every logit -inf).
  virtual void SampleTopKTopP(const SampleTopKTopPArgs& args) = 0;

  // ---- Graphs: record a sequence of queued ops once, replay it many times --------------------
  // CUDA captures the stream into a CUDA graph; the CPU backend (its twin) records the op calls
  // and replays them. Ops queued between BeginCapture and EndCapture are recorded, not run;
  // their pointers and shapes are fixed at capture, so a replay reads whatever those device
  // buffers hold at launch. Blocking calls (CopyToDevice, CopyToHost, Synchronize) are not
  // allowed while capturing.
  /// Whether BeginCapture can work here.
  virtual bool supports_graphs() const { return false; }
  /// The device stream every op is queued on (a cudaStream_t), for collectives that must run in
  /// the ops' order (Communicator::EnqueueAllReduceSum); null for the CPU backend.
  virtual void* native_stream() { return nullptr; }
  /// Starts recording the ops that follow into a graph instead of running them.
  virtual absl::Status BeginCapture() { return absl::UnimplementedError("no graph support"); }
  /// Ends the recording; returns a handle for LaunchGraph.
  virtual absl::StatusOr<int> EndCapture() { return absl::UnimplementedError("no graph support"); }
  /// Replays a captured graph on the stream.
  virtual absl::Status LaunchGraph(int /*graph*/) {
    return absl::UnimplementedError("no graph support");
  }
  /// Releases a captured graph; its handle is not reused for another graph.
  virtual void DestroyGraph(int /*graph*/) {}
  /// Changes whenever the backend reallocates scratch memory of its own (e.g. GEMM or attention
  /// workspaces) that ops read through pointers fixed at capture: a graph captured under another
  /// epoch may replay into freed memory and must be captured again.
  virtual uint64_t memory_epoch() const { return 0; }
};

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::exchange(other.backend_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (backend_ != nullptr && ptr_ != nullptr) backend_->Free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

/// Loads the CUDA backend from libkvserve_cuda.so (KVSERVE_CUDA_BACKEND names another path), or
/// with options.simulator from libkvserve_cuda_sim.so (KVSERVE_CUDA_SIM_BACKEND). UNAVAILABLE
/// with the reason (library missing, no driver, no device) when it cannot be used.
absl::StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(const BackendOptions& options);

/// A symbol of libkvserve_cuda.so, or of libkvserve_cuda_sim.so with `simulator` (loading it on
/// first use), e.g. "kvserve_create_nccl_group" (worker/tp/nccl_communicator.h). UNAVAILABLE
/// when the library or the symbol is missing.
absl::StatusOr<void*> CudaLibrarySymbol(const char* name, bool simulator = false);

/// The backend for a --device choice. kAuto falls back to the CPU when CUDA is unusable and then
/// says why, once per process, on stderr. `pool` is the CPU backend's thread pool (may be null).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceChoice choice,
                                                       const BackendOptions& options,
                                                       cpu::ThreadPool* pool);

/// Name of the C entry point of libkvserve_cuda.so:
///   extern "C" kvserve::Backend* kvserve_create_cuda_backend(const BackendOptions*, char* error,
///                                                            size_t error_size);
/// It returns a new backend (the caller owns it), or null with a reason in `error`.
inline constexpr char kCudaBackendEntryPoint[] = "kvserve_create_cuda_backend";

}  // namespace kvserve

#endif  // KVSERVE_KERNELS_BACKEND_H_
