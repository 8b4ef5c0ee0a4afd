#include "kernels/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"

namespace kvserve::cpu {
namespace {

constexpr size_t kAlignment = 256;

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
                                                         int64_t rows, int64_t cols) {
  PreparedMatrix m;
  m.data = host;  // the kernels read every stored dtype in place
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  return m;
}

absl::StatusOr<PreparedVector> CpuBackend::PrepareVector(const float* host, int64_t n) {
  PreparedVector v;
  v.data = host;
  v.n = n;
  return v;
}

void CpuBackend::Embedding(const EmbeddingArgs& a) {
  Queue([a] { EmbeddingGather(a.table, a.dtype, a.dim, a.ids, a.n, a.out); });
}

void CpuBackend::RmsNorm(const RmsNormArgs& args) {
  Queue([args, pool = pool_] { cpu::RmsNorm(args, pool); });
}

void CpuBackend::Matmul(const MatmulArgs& args) {
  Queue([args, pool = pool_] { cpu::Matmul(args, pool); });
}

void CpuBackend::RopeKvWrite(const RopeKvWriteArgs& args) {
  Queue([args] { RopeKvWriteNow(args); });
}

void CpuBackend::RopeKvWriteNow(const RopeKvWriteArgs& a) {
  const int64_t head_dim = a.layout.head_dim;
  ApplyRope({a.q, a.num_tokens, a.num_heads, head_dim, a.q_stride, a.positions, a.inv_freq,
             a.rope_layout, a.rotary_dim});
  ApplyRope({a.k, a.num_tokens, a.layout.num_kv_heads, head_dim, a.k_stride, a.positions,
             a.inv_freq, a.rope_layout, a.rotary_dim});
  WriteKvCache(a.k, a.v, a.num_tokens, a.k_stride, a.v_stride, a.slot_mapping, a.layout, a.k_cache,
               a.v_cache);
}

AttentionPlan CpuBackend::PlanAttention(const AttentionShape& shape) const {
  AttentionPlan plan;
  plan.shape = shape;
  plan.decode = shape.max_q_len == 1;
  return plan;
}

void CpuBackend::RunAttention(const AttentionPlan& /*plan*/, const PagedAttentionArgs& args) {
  Queue([args, pool = pool_] { PagedAttention(args, pool); });
}

void CpuBackend::SiluMul(const SiluMulArgs& a) {
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

void CpuBackend::SampleTopKTopP(const float* logits, int64_t rows, int64_t vocab, int64_t stride,
                                int32_t k, float top_p, float temperature, const float* uniforms,
                                int32_t* out) {
  Queue([=] {
    SampleTopKTopPNow(logits, rows, vocab, stride, k, top_p, temperature, uniforms, out);
  });
}

void CpuBackend::SampleTopKTopPNow(const float* logits, int64_t rows, int64_t vocab,
                                   int64_t stride, int32_t k, float top_p, float temperature,
                                   const float* uniforms, int32_t* out) {
  const int64_t kk = std::min<int64_t>(std::max(k, 1), vocab);
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  std::vector<float> e(static_cast<size_t>(kk));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * stride;
    for (int64_t i = 0; i < vocab; ++i) ids[i] = i;
    std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(),
                      [row](int64_t a, int64_t b) { return RanksBefore(row[a], a, row[b], b); });
    // Softmax over the candidates, accumulated in rank order (the CUDA twin does the same).
    const float top = row[ids[0]];
    float sum = 0.0f;
    for (int64_t i = 0; i < kk; ++i) {
      e[i] = std::exp((row[ids[i]] - top) / temperature);
      sum += e[i];
    }
    // Nucleus: the smallest prefix whose share reaches top_p.
    int64_t n = kk;
    float cum = 0.0f;
    for (int64_t i = 0; i < kk; ++i) {
      cum += e[i];
      if (cum / sum >= top_p) {
        n = i + 1;
        break;
      }
    }
    float kept = 0.0f;
    for (int64_t i = 0; i < n; ++i) kept += e[i];
    const float target = uniforms[r] * kept;
    int64_t pick = n - 1;
    float walk = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      walk += e[i];
      if (walk > target) {
        pick = i;
        break;
      }
    }
    out[r] = static_cast<int32_t>(ids[pick]);
  }
}

absl::Status CpuBackend::Synchronize() {
  if (capturing_) return NotWhileCapturing("Synchronize");
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
