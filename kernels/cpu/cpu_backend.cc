#include "kernels/cpu/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/logits.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_fp8.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"

namespace kvserve::cpu {
namespace {

constexpr size_t kAlignment = 256;
constexpr size_t kPackedArenaBytes = size_t{32} << 20;

// Whether Matmul weights get the packed layout: on unless KVSERVE_CPU_PACK_WEIGHTS=0.
bool PackWeightsEnabled() {
  const char* v = std::getenv("KVSERVE_CPU_PACK_WEIGHTS");
  return v == nullptr || std::string_view(v) != "0";
}

// Asks the kernel to reclaim the whole pages of [p, p + bytes) now. The contents stay what they
// were (file pages are read again, anonymous ones come back from swap, or stay if there is none):
// advice only, and a kernel without MADV_PAGEOUT ignores it.
void ReleasePages(const void* p, size_t bytes) {
#if defined(MADV_PAGEOUT)
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGE_SIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)p;
  (void)bytes;
#endif
}

// Whether a is ranked before b: larger value first, the lower index on ties; NaN ranks last.
bool RanksBefore(float va, int64_t a, float vb, int64_t b) {
  if (std::isnan(vb)) return !std::isnan(va) || a < b;
  if (std::isnan(va)) return false;
  return va > vb || (va == vb && a < b);
}

}  // namespace

std::string CpuBackend::description() const {
  return absl::StrCat("cpu (", pool_ != nullptr ? pool_->num_threads() : 1, " threads)");
}

absl::StatusOr<void*> CpuBackend::Alloc(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return p;
}

void CpuBackend::Free(void* ptr) { std::free(ptr); }

absl::Status CpuBackend::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (capturing_) return NotWhileCapturing("CopyToDevice");
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (capturing_) return NotWhileCapturing("CopyToHost");
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) Queue([=] { std::memmove(dst, src, bytes); });
  return absl::OkStatus();
}

absl::Status CpuBackend::Memset(void* dst, int value, size_t bytes) {
  if (bytes > 0) Queue([=] { std::memset(dst, value, bytes); });
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, int64_t>> CpuBackend::MemoryInfo() const {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long avail = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return absl::UnavailableError("cannot read the memory size");
  return std::make_pair(int64_t{avail > 0 ? avail : 0} * page, int64_t{pages} * page);
}

absl::StatusOr<PreparedMatrix> CpuBackend::PrepareMatrix(const void* host, DType dtype,
                                                         int64_t rows, int64_t cols,
                                                         MatrixUse use) {
  PreparedMatrix m;
  m.data = host;  // the kernels read every stored dtype in place
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  if (fp8_weights_ && use == MatrixUse::kMatmul && rows > 0 && cols > 0 &&
      (dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16)) {
    // FP8 weights: the codes, then one f32 scale per row, in the packing arenas.
    const size_t codes_bytes =
        (static_cast<size_t>(rows * cols) + kAlignment - 1) / kAlignment * kAlignment;
    absl::StatusOr<uint8_t*> p = PackedSpace(codes_bytes + sizeof(float) * rows);
    if (!p.ok()) return p.status();
    auto* scales = reinterpret_cast<float*>(*p + codes_bytes);
    QuantizeRowsFp8(host, dtype, rows, cols, *p, scales, pool_);
    m.data = *p;
    m.dtype = DType::kF8E4M3;
    m.scales = scales;
    return m;
  }
  if (use == MatrixUse::kEmbedding || !PackedLayoutSupported(dtype) || rows <= 0 || cols <= 0 ||
      cols % PackedBlockElems(dtype) != 0 || !PackWeightsEnabled()) {
    return m;
  }
  // Matmul weights with a packed layout: packed once (packed_weights.h) into the arenas, and the
  // source's pages handed back to the kernel (read again, from the file, only if something
  // gathers rows from them: a tied embedding).
  absl::StatusOr<uint8_t*> p = PackedSpace(static_cast<size_t>(PackedBytes(dtype, rows, cols)));
  if (!p.ok()) return p.status();
  PackRows(host, dtype, rows, cols, *p, pool_);
  m.data = *p;
  m.packed = true;
  ReleasePages(host, static_cast<size_t>(DTypeRowBytes(dtype, cols) * rows));
  return m;
}

absl::StatusOr<uint8_t*> CpuBackend::PackedSpace(size_t bytes) {
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (packed_arenas_.empty() || packed_used_ + bytes > packed_arenas_.back().size()) {
    AnonymousMemory arena;
    if (!arena.Map(std::max(bytes, kPackedArenaBytes))) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", bytes, " bytes for packed weights"));
    }
    packed_arenas_.push_back(std::move(arena));
    packed_used_ = 0;
  }
  uint8_t* p = packed_arenas_.back().data() + packed_used_;
  packed_used_ += bytes;
  return p;
}

absl::StatusOr<PreparedVector> CpuBackend::PrepareVector(const float* host, int64_t n) {
  PreparedVector v;
  v.data = host;
  v.n = n;
  return v;
}

bool CpuBackend::F32Only(const char* op, std::initializer_list<DType> dtypes) {
  for (DType d : dtypes) {
    if (d == DType::kF32) continue;
    if (error_.empty()) {
      error_ = absl::StrCat(op, ": the CPU backend keeps activations in f32, not ",
                            std::string(DTypeName(d)), " (Backend::activation_dtype)");
    }
    return false;
  }
  return true;
}

void CpuBackend::Embedding(const EmbeddingArgs& a) {
  if (!F32Only("embedding", {a.out_dtype})) return;
  Queue([a] { EmbeddingGather(a.table, a.dtype, a.dim, a.ids, a.n, a.out); });
}

void CpuBackend::RmsNorm(const RmsNormArgs& args) {
  if (!F32Only("rms_norm", {args.x_dtype, args.y_dtype})) return;
  Queue([args, pool = pool_] { cpu::RmsNorm(args, pool); });
}

void CpuBackend::Matmul(const MatmulArgs& args) {
  if (!F32Only("matmul", {args.x_dtype, args.y_dtype})) return;
  Queue([args, pool = pool_] { cpu::Matmul(args, pool); });
}

void CpuBackend::RopeKvWrite(const RopeKvWriteArgs& args) {
  if (!F32Only("rope_kv_write", {args.dtype})) return;
  Queue([args] { RopeKvWriteNow(args); });
}

void CpuBackend::RopeKvWriteNow(const RopeKvWriteArgs& a) {
  const int64_t head_dim = a.layout.head_dim;
  const int64_t kv_dim = a.layout.num_kv_heads * head_dim;
  // Biases first, in place on q and k (RoPE rotates them there anyway); v's into a copy.
  auto add_bias = [&](float* x, int64_t stride, const float* bias, int64_t width) {
    for (int64_t t = 0; bias != nullptr && t < a.num_tokens; ++t) {
      for (int64_t i = 0; i < width; ++i) x[t * stride + i] += bias[i];
    }
  };
  add_bias(a.q, a.q_stride, a.q_bias, a.num_heads * head_dim);
  add_bias(a.k, a.k_stride, a.k_bias, kv_dim);
  const float* v = a.v;
  int64_t v_stride = a.v_stride;
  std::vector<float> biased_v;
  if (a.v != nullptr && a.v_bias != nullptr) {
    biased_v.resize(static_cast<size_t>(a.num_tokens * kv_dim));
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      std::copy_n(a.v + t * a.v_stride, kv_dim, biased_v.data() + t * kv_dim);
    }
    add_bias(biased_v.data(), kv_dim, a.v_bias, kv_dim);
    v = biased_v.data();
    v_stride = kv_dim;
  }
  ApplyRope({a.q, a.num_tokens, a.num_heads, head_dim, a.q_stride, a.positions, a.inv_freq,
             a.rope_layout, a.rotary_dim});
  ApplyRope({a.k, a.num_tokens, a.layout.num_kv_heads, head_dim, a.k_stride, a.positions,
             a.inv_freq, a.rope_layout, a.rotary_dim});
  WriteKvCache(a.k, v, a.num_tokens, a.k_stride, v_stride, a.slot_mapping, a.layout, a.k_cache,
               a.v_cache);
}

AttentionPlan CpuBackend::PlanAttention(const AttentionShape& shape) const {
  AttentionPlan plan;
  plan.shape = shape;
  plan.decode = shape.max_q_len == 1;
  return plan;
}

void CpuBackend::RunAttention(const AttentionPlan& /*plan*/, const PagedAttentionArgs& args) {
  if (!F32Only("attention", {args.act_dtype})) return;
  Queue([args, pool = pool_] { PagedAttention(args, pool); });
}

void CpuBackend::SiluMul(const SiluMulArgs& a) {
  if (!F32Only("silu_mul", {a.dtype})) return;
  Queue([a, pool = pool_] {
    cpu::SiluMul(a.gate, a.up, a.out, a.rows, a.dim, a.gate_stride, a.up_stride, a.out_stride,
                 pool);
  });
}

void CpuBackend::ArgMax(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                        int32_t* out) {
  Queue([=] { ArgMaxNow(logits, rows, vocab, stride, out); });
}

void CpuBackend::MoeCombine(const MoeCombineArgs& a) {
  Queue([a, pool = pool_] { MoeCombineNow(a, pool); });
}

void CpuBackend::MoeCombineNow(const MoeCombineArgs& a, ThreadPool* pool) {
  auto token = [&a](int64_t t) {
    float* out = a.out + t * a.dim;
    std::fill(out, out + a.dim, 0.0f);
    for (int64_t j = 0; j < a.k; ++j) {
      const int32_t slot = a.slots[t * a.k + j];
      if (slot < 0) continue;
      const float w = a.weights[t * a.k + j];
      const float* row = a.rows + int64_t{slot} * a.dim;
      for (int64_t d = 0; d < a.dim; ++d) out[d] += w * row[d];
    }
  };
  if (pool == nullptr || a.tokens < 2) {
    for (int64_t t = 0; t < a.tokens; ++t) token(t);
    return;
  }
  pool->ParallelFor(a.tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) token(t);
  });
}

void CpuBackend::ArgMaxNow(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                           int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * stride;
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i) {
      if (RanksBefore(row[i], i, row[best], best)) best = i;
    }
    out[r] = static_cast<int32_t>(best);
  }
}

void CpuBackend::SampleTopKTopP(const SampleTopKTopPArgs& args) {
  Queue([=] { SampleTopKTopPNow(args); });
}

namespace {

// The host Sampler's draw over `n` candidates already in rank order (values after its
// temperature step): TopPStep, then Sampler::Draw's weights and cpu::PickExpWeighted, with the
// same float and double operations. The CUDA kernel repeats it operation for operation.
int64_t PickCandidate(const float* v, int64_t n, float top_p, double uniform) {
  if (top_p < 1.0f) n = cpu::NucleusSize(n, top_p, [v](int64_t i) { return v[i]; });
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_logit = std::max(max_logit, v[i]);
  float w[kMaxSampleTopK];
  for (int64_t i = 0; i < n; ++i) w[i] = v[i] - max_logit;
  float block_sums[kMaxSampleTopK / cpu::kExpBlock];
  return cpu::PickExpWeighted(w, n, 0.0f, 1.0f, uniform, block_sums);
}

}  // namespace

void CpuBackend::SampleTopKTopPNow(const SampleTopKTopPArgs& a) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<int64_t> ids(static_cast<size_t>(a.vocab));
  std::vector<float> scaled;
  float cand[kMaxSampleTopK];
  for (int64_t r = 0; r < a.rows; ++r) {
    const SampleRowParams& p = a.params[r];
    const float* row = a.logits + p.row * a.stride;
    a.out[r] = -1;
    if (a.vocab <= 0 || std::any_of(row, row + a.vocab, [](float x) { return !(x < kInf); })) {
      continue;  // NaN or +inf: the host sampler refuses the row
    }
    const float* keys = row;
    if (p.temperature != 1.0f) {
      // TemperatureStep: (logit - max) * (1 / temperature), in float.
      const float max_logit = *std::max_element(row, row + a.vocab);
      const float scale = 1.0f / p.temperature;
      scaled.resize(static_cast<size_t>(a.vocab));
      for (int64_t i = 0; i < a.vocab; ++i) scaled[i] = (row[i] - max_logit) * scale;
      keys = scaled.data();
    }
    const int64_t k = std::min<int64_t>(std::clamp(p.top_k, 1, kMaxSampleTopK), a.vocab);
    for (int64_t i = 0; i < a.vocab; ++i) ids[i] = i;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [keys](int64_t x, int64_t y) { return RanksBefore(keys[x], x, keys[y], y); });
    if (!(keys[ids[0]] > -kInf)) continue;  // every logit -inf (NaN after the temperature step)
    for (int64_t i = 0; i < k; ++i) cand[i] = keys[ids[i]];
    a.out[r] = static_cast<int32_t>(ids[PickCandidate(cand, k, p.top_p, p.uniform)]);
  }
}

absl::Status CpuBackend::Synchronize() {
  if (capturing_) return NotWhileCapturing("Synchronize");
  if (!error_.empty()) return absl::FailedPreconditionError(std::exchange(error_, std::string()));
  return absl::OkStatus();
}

absl::Status CpuBackend::NotWhileCapturing(const char* call) const {
  return absl::FailedPreconditionError(
      absl::StrCat(call, " cannot be recorded: the backend is capturing a graph"));
}

absl::Status CpuBackend::BeginCapture() {
  if (!enable_graphs_) return absl::FailedPreconditionError("graphs are disabled");
  if (capturing_) return absl::FailedPreconditionError("already capturing a graph");
  capturing_ = true;
  recording_.clear();
  return absl::OkStatus();
}

absl::StatusOr<int> CpuBackend::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("EndCapture without BeginCapture");
  capturing_ = false;
  graphs_.push_back(std::move(recording_));
  recording_.clear();
  return static_cast<int>(graphs_.size()) - 1;
}

absl::Status CpuBackend::LaunchGraph(int graph) {
  if (capturing_) return NotWhileCapturing("LaunchGraph");
  if (graph < 0 || graph >= static_cast<int>(graphs_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no graph ", graph));
  }
  for (const Op& op : graphs_[graph]) op();
  return absl::OkStatus();
}

void CpuBackend::DestroyGraph(int graph) {
  if (graph >= 0 && graph < static_cast<int>(graphs_.size())) {
    graphs_[graph].clear();
    graphs_[graph].shrink_to_fit();
  }
}

}  // namespace kvserve::cpu
