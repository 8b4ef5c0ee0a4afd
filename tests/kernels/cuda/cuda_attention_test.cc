// CUDA paged attention (flash-decoding decode, tiled prefill) against the CPU kernel on the same
// cache bytes: batch 1/3/17, context 1/15/16/17/1000, head dims 64/128, GQA 1/4/8, every KV dtype;
// plus a CUDA-graph capture replayed at new context lengths. Skips without a CUDA device.
// On the CUDA simulator, and under KVSERVE_TEST_SMALL=1 (compute-sanitizer runs), a smaller grid
// of shapes keeps the odd ones (context 1, 15-17, batch 3) and every KV dtype.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kvserve {
namespace {

using testing_cuda::Download;
using testing_cuda::MaxAbsDiff;
using testing_cuda::Random;
using testing_cuda::Upload;

constexpr int64_t kBlockSize = 16;

bool SmallShapes() {
  const char* small = std::getenv("KVSERVE_TEST_SMALL");
  return testing_cuda::UseSimulator() || (small != nullptr && std::string(small) == "1");
}
constexpr int64_t kKvHeads = 2;

struct Case {
  int64_t batch, context, head_dim, gqa;
  KvCacheDType dtype;
  bool decode;
  int32_t window = 0;
  int64_t chunk = 0;  // prefill: query tokens per sequence (0: 37, or 3 at context >= 1000)
  DType act = DType::kF32;  // q and out: f32, or bf16 (the CPU reads the rounded q in f32)
  DecodeKernel kernel = DecodeKernel::kAuto;  // the plan's decode kernel
};

// One batch on host memory: the cache written by the CPU, queries, block tables.
struct HostBatch {
  cpu::PagedKvLayout layout;
  int64_t heads = 0, rows = 0, table_stride = 0;
  std::vector<int32_t> q_start, q_len, ctx, tables;
  std::vector<float> q, k_scales, v_scales;
  std::vector<uint8_t> k, v;
};

HostBatch Build(const Case& c, uint32_t seed) {
  HostBatch h;
  h.layout = {kKvHeads, c.head_dim, kBlockSize, c.dtype};
  h.heads = kKvHeads * c.gqa;
  int64_t total_blocks = 0;
  for (int64_t s = 0; s < c.batch; ++s) {
    const int32_t ctx = static_cast<int32_t>(std::max<int64_t>(1, c.context - s % 3));
    // Chunked prefill: a chunk at the end of a cached prefix (shorter for the largest batches
    // so the CPU reference stays fast).
    const int64_t chunk = c.chunk > 0 ? c.chunk : c.context >= 1000 && c.batch > 3 ? 3 : 37;
    const int32_t ql = c.decode ? 1 : static_cast<int32_t>(std::min<int64_t>(ctx, chunk));
    h.q_start.push_back(static_cast<int32_t>(h.rows));
    h.q_len.push_back(ql);
    h.ctx.push_back(ctx);
    h.rows += ql;
    h.table_stride = std::max<int64_t>(h.table_stride, (ctx + kBlockSize - 1) / kBlockSize);
    total_blocks += (ctx + kBlockSize - 1) / kBlockSize;
  }
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  h.tables.assign(c.batch * h.table_stride, 0);
  int64_t next = 0;
  for (int64_t s = 0; s < c.batch; ++s) {
    for (int64_t b = 0; b < (h.ctx[s] + kBlockSize - 1) / kBlockSize; ++b) {
      h.tables[s * h.table_stride + b] = ids[next++];
    }
  }
  const int64_t cache_rows = total_blocks * kKvHeads * kBlockSize;
  h.k.assign(cache_rows * c.head_dim * KvCacheDTypeElemBytes(c.dtype), 0);
  h.v = h.k;
  h.k_scales.assign(cache_rows, 0.0f);
  h.v_scales = h.k_scales;
  const int64_t kv_dim = kKvHeads * c.head_dim;
  for (int64_t s = 0; s < c.batch; ++s) {
    const std::vector<float> kk = Random(h.ctx[s] * kv_dim, seed + 100 + s, -2.0f, 2.0f);
    const std::vector<float> vv = Random(h.ctx[s] * kv_dim, seed + 200 + s);
    std::vector<int64_t> slots(h.ctx[s]);
    for (int64_t p = 0; p < h.ctx[s]; ++p) {
      slots[p] =
          int64_t{h.tables[s * h.table_stride + p / kBlockSize]} * kBlockSize + p % kBlockSize;
    }
    cpu::WriteKvCache(kk.data(), vv.data(), h.ctx[s], kv_dim, kv_dim, slots.data(), h.layout,
                      {h.k.data(), h.k_scales.data()}, {h.v.data(), h.v_scales.data()});
  }
  h.q = Random(h.rows * h.heads * c.head_dim, seed + 7);
  return h;
}

cpu::PagedAttentionArgs Args(const HostBatch& h, const Case& c, const float* q, float* out,
                             const int32_t* q_start, const int32_t* q_len, const int32_t* ctx,
                             const int32_t* tables, cpu::ConstKvCacheBuffer k,
                             cpu::ConstKvCacheBuffer v) {
  cpu::PagedAttentionArgs a{};
  a.q = q;
  a.q_stride = h.heads * c.head_dim;
  a.out = out;
  a.out_stride = a.q_stride;
  a.num_seqs = c.batch;
  a.num_heads = h.heads;
  a.q_start = q_start;
  a.q_len = q_len;
  a.context_len = ctx;
  a.block_tables = tables;
  a.block_table_stride = h.table_stride;
  a.k_cache = k;
  a.v_cache = v;
  a.layout = h.layout;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.sliding_window = c.window;
  return a;
}

AttentionShape ShapeOf(const HostBatch& h, const Case& c) {
  AttentionShape shape;
  shape.num_seqs = c.batch;
  shape.num_heads = h.heads;
  shape.max_q_len = *std::max_element(h.q_len.begin(), h.q_len.end());
  shape.max_context_len = *std::max_element(h.ctx.begin(), h.ctx.end());
  shape.layout = h.layout;
  return shape;
}

// Runs one case on both backends; returns the largest output difference.
float RunCase(Backend* gpu, cpu::ThreadPool* pool, const Case& c, uint32_t seed) {
  HostBatch h = Build(c, seed);
  const bool bf16 = c.act == DType::kBF16;
  std::vector<uint16_t> q_bf16(bf16 ? h.q.size() : 0);
  for (size_t i = 0; i < q_bf16.size(); ++i) {
    q_bf16[i] = FloatToBF16(h.q[i]);
    h.q[i] = BF16ToFloat(q_bf16[i]);
  }
  cpu::CpuBackend cpu(pool);
  const size_t out_n = h.q.size();
  std::vector<float> want(out_n);
  const AttentionShape shape = ShapeOf(h, c);
  cpu.RunAttention(
      cpu.PlanAttention(shape),
      Args(h, c, h.q.data(), want.data(), h.q_start.data(), h.q_len.data(), h.ctx.data(),
           h.tables.data(), {h.k.data(), h.k_scales.data()}, {h.v.data(), h.v_scales.data()}));
  DeviceBuffer dq = bf16 ? Upload(gpu, q_bf16) : Upload(gpu, h.q);
  DeviceBuffer dout = Upload(gpu, std::vector<float>(out_n));
  DeviceBuffer dqs = Upload(gpu, h.q_start), dql = Upload(gpu, h.q_len), dctx = Upload(gpu, h.ctx);
  DeviceBuffer dt = Upload(gpu, h.tables), dk = Upload(gpu, h.k), dv = Upload(gpu, h.v);
  DeviceBuffer dks = Upload(gpu, h.k_scales), dvs = Upload(gpu, h.v_scales);
  AttentionPlan plan = gpu->PlanAttention(shape);
  plan.decode_kernel = c.kernel;
  // A prefill batch whose every chunk is one token (context 1) is planned as decode.
  EXPECT_EQ(plan.decode, shape.max_q_len == 1);
  EXPECT_TRUE(!c.decode || plan.decode);
  cpu::PagedAttentionArgs args = Args(h, c, dq.as<float>(), dout.as<float>(), dqs.as<int32_t>(),
                                      dql.as<int32_t>(), dctx.as<int32_t>(), dt.as<int32_t>(),
                                      {dk.get(), dks.as<float>()}, {dv.get(), dvs.as<float>()});
  args.act_dtype = c.act;
  gpu->RunAttention(plan, args);
  if (!bf16) return MaxAbsDiff(Download<float>(gpu, dout.get(), out_n), want);
  const std::vector<uint16_t> got = Download<uint16_t>(gpu, dout.get(), out_n);
  std::vector<float> widened(out_n);
  for (size_t i = 0; i < out_n; ++i) widened[i] = BF16ToFloat(got[i]);
  return MaxAbsDiff(widened, want);
}

// Prefill of f16 / bf16 / int8 / fp8 KV at head dims 64, 128 and 256 runs on tensor cores, which
// multiply in bf16 (f16 for f16 KV): the queries (times scale) and the softmax weights P are
// rounded to it, K and V are not (int8 / fp8 codes are exact in bf16). Each rounding is at most
// 2^-9 relative in bf16 (2^-12 in f16). With |q|, |v| <= 1 and |k| <= 2 here, a score moves by
// at most 2^-9 * scale * sum |q_d k_d| (about 2^-9 * sqrt(head_dim) / 2 for these random
// inputs, the errors of the terms partly cancelling) and an output by its P-weighted spread of
// score errors times |v|, plus 2^-9 |v| from rounding P. Measured on the simulator: at most
// 4e-3 (bf16 products) and 3e-4 (f16); the tolerances leave a factor 2.5-3. Everything else
// (f32 KV, other head dims) is f32 arithmetic in another order: 5e-4.
float PrefillTolerance(KvCacheDType dtype, int64_t head_dim) {
  if (dtype == KvCacheDType::kF32 || (head_dim != 64 && head_dim != 128 && head_dim != 256)) {
    return 5e-4f;
  }
  return dtype == KvCacheDType::kF16 ? 1e-3f : 1e-2f;
}

// Decode runs on tensor cores for every KV dtype but f32 at head dims 64, 128 and 256 when two or
// more query heads share a KV head: Q and P rounded to bf16 for bf16 KV (the prefill bound
// above), to f16 for f16, int8 and fp8 KV (whose codes are exact in f16). Measured on the
// simulator: at most 1.5e-3 (bf16) and 4e-4 (f16 products; fp8 the largest). The other decode
// kernels (f32 KV, other head dims, one head per KV head) are f32 arithmetic in another order:
// 5e-4.
float DecodeTolerance(KvCacheDType dtype, int64_t head_dim, int64_t gqa) {
  if (dtype == KvCacheDType::kF32 || gqa < 2 ||
      (head_dim != 64 && head_dim != 128 && head_dim != 256)) {
    return 5e-4f;
  }
  return dtype == KvCacheDType::kBF16 ? 1e-2f : 1e-3f;
}

class CudaAttentionTest : public ::testing::TestWithParam<bool> {};

TEST_P(CudaAttentionTest, MatchesCpuAtOddShapesForEveryKvDType) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::ThreadPool pool(0);
  const bool decode = GetParam();
  const bool small = SmallShapes();
  const std::vector<int64_t> batches =
      small ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 3, 17};
  const std::vector<int64_t> contexts =
      small ? std::vector<int64_t>{1, 15, 17, 300} : std::vector<int64_t>{1, 15, 16, 17, 1000};
  const std::vector<int64_t> gqas =
      small ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{1, 4, 8};
  uint32_t seed = 1;
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (int64_t batch : batches) {
      for (int64_t context : contexts) {
        for (int64_t head_dim : {64, 128}) {
          for (int64_t gqa : gqas) {
            const Case c{batch, context, head_dim, gqa, dtype, decode};
            const float diff = RunCase(gpu, &pool, c, ++seed);
            const float tolerance =
                decode ? DecodeTolerance(dtype, head_dim, gqa) : PrefillTolerance(dtype, head_dim);
            EXPECT_LT(diff, tolerance) << KvCacheDTypeName(dtype) << " batch " << batch << " ctx "
                                       << context << " d " << head_dim << " gqa " << gqa;
          }
        }
      }
    }
  }
}

TEST_P(CudaAttentionTest, SlidingWindow) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::ThreadPool pool(0);
  for (int32_t window : {1, 7, 40}) {
    const Case c{3, 100, 64, 4, KvCacheDType::kBF16, GetParam(), window};
    const float tolerance = GetParam() ? DecodeTolerance(c.dtype, c.head_dim, c.gqa)
                                       : PrefillTolerance(c.dtype, c.head_dim);
    EXPECT_LT(RunCase(gpu, &pool, c, 99), tolerance) << "window " << window;
  }
}

// bf16 activations (the CUDA model's default): q read as bf16 (the bandwidth decode kernel two at
// a time), out written as bf16 by every kernel -- the bandwidth and general decode kernels, the
// split merge, the CUDA-core and the tensor-core prefill. The CPU reads the same rounded q; out
// is rounded once more (|out| <= 1: 2^-9), on top of each path's f32 tolerance.
TEST_P(CudaAttentionTest, Bf16QueriesAndOutput) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::ThreadPool pool(0);
  const bool decode = GetParam();
  struct Shape {
    int64_t batch, context, head_dim, gqa;
    KvCacheDType dtype;
  };
  const std::vector<Shape> shapes = {
      {3, 17, 128, 4, KvCacheDType::kBF16},     // bandwidth decode / tensor-core prefill
      {1, 300, 64, 8, KvCacheDType::kFp8E4M3},  // splits + merge at decode
      {3, 40, 96, 1, KvCacheDType::kBF16},      // general decode kernel / CUDA-core prefill
      {2, 33, 64, 4, KvCacheDType::kF32}};      // CUDA-core prefill
  uint32_t seed = 700;
  for (const Shape& s : shapes) {
    Case c{s.batch, s.context, s.head_dim, s.gqa, s.dtype, decode};
    c.act = DType::kBF16;
    const float tolerance = (decode ? DecodeTolerance(s.dtype, s.head_dim, s.gqa)
                                    : PrefillTolerance(s.dtype, s.head_dim)) +
                            1.0f / 256.0f;
    EXPECT_LT(RunCase(gpu, &pool, c, ++seed), tolerance)
        << KvCacheDTypeName(s.dtype) << " batch " << s.batch << " ctx " << s.context << " d "
        << s.head_dim << " gqa " << s.gqa;
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeAndPrefill, CudaAttentionTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Decode" : "Prefill"; });

// The tensor-core prefill kernel where its tiling has edges: query counts that are not multiples
// of its 16-row warp tiles, head dims 64 / 128 / 256 (32-key tiles at 256), GQA groups of 1, 4
// and 8 (one tile holding rows of several heads), full prefill and chunks over a cached prefix
// whose keys cross many 16-slot blocks, and sliding windows narrower and wider than a key tile.
TEST(CudaPrefillAttentionTest, TensorCoreTilesMatchCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::ThreadPool pool(0);
  struct Shape {
    int64_t batch, context, chunk, head_dim, gqa;
    int32_t window;
  };
  const std::vector<Shape> shapes = {
      {1, 45, 45, 64, 1, 0},       // full prefill, 45 queries
      {2, 97, 97, 128, 4, 0},      // full prefill, 4 heads a token in each tile
      {1, 150, 150, 64, 8, 0},     // 8 heads a token: 8 tokens a 64-row tile
      {3, 200, 23, 256, 8, 0},     // 23-token chunks after a 177-token prefix
      {2, 120, 50, 128, 1, 20},    // window narrower than a key tile
      {2, 200, 200, 64, 4, 70},    // window wider than a key tile
      {1, 300, 33, 256, 1, 100}};  // chunk and window at head_dim 256
  uint32_t seed = 500;
  for (KvCacheDType dtype : {KvCacheDType::kBF16, KvCacheDType::kF16, KvCacheDType::kInt8}) {
    for (const Shape& s : shapes) {
      Case c{s.batch, s.context, s.head_dim, s.gqa, dtype, false, s.window};
      c.chunk = s.chunk;
      EXPECT_LT(RunCase(gpu, &pool, c, ++seed), PrefillTolerance(dtype, s.head_dim))
          << KvCacheDTypeName(dtype) << " batch " << s.batch << " ctx " << s.context << " chunk "
          << s.chunk << " d " << s.head_dim << " gqa " << s.gqa << " window " << s.window;
    }
  }
}

// A decode run captured in a CUDA graph and replayed after the context lengths changed on the
// device gives what a fresh CPU run gives: the plan (split count) fixes the work partition.
TEST(CudaGraphTest, DecodeAttentionReplaysWithNewContextLengths) {
  KVSERVE_REQUIRE_CUDA(gpu);
  ASSERT_TRUE(gpu->supports_graphs());
  const Case c = SmallShapes() ? Case{3, 300, 128, 4, KvCacheDType::kF16, true}
                               : Case{17, 1000, 128, 4, KvCacheDType::kF16, true};
  HostBatch h = Build(c, 5);
  AttentionShape shape = ShapeOf(h, c);
  const AttentionPlan plan = gpu->PlanAttention(shape);
  DeviceBuffer dq = Upload(gpu, h.q), dout = Upload(gpu, std::vector<float>(h.q.size()));
  DeviceBuffer dqs = Upload(gpu, h.q_start), dql = Upload(gpu, h.q_len), dctx = Upload(gpu, h.ctx);
  DeviceBuffer dt = Upload(gpu, h.tables), dk = Upload(gpu, h.k), dv = Upload(gpu, h.v);
  const cpu::PagedAttentionArgs args =
      Args(h, c, dq.as<float>(), dout.as<float>(), dqs.as<int32_t>(), dql.as<int32_t>(),
           dctx.as<int32_t>(), dt.as<int32_t>(), {dk.get(), nullptr}, {dv.get(), nullptr});
  gpu->RunAttention(plan, args);  // warm-up: sizes the scratch before the capture
  ASSERT_TRUE(gpu->Synchronize().ok());
  ASSERT_TRUE(gpu->BeginCapture().ok());
  gpu->RunAttention(plan, args);
  absl::StatusOr<int> graph = gpu->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int32_t& n : h.ctx) n = std::max(1, n - static_cast<int32_t>(c.context / 3));
  ASSERT_TRUE(gpu->CopyToDevice(dctx.get(), h.ctx.data(), h.ctx.size() * 4).ok());
  ASSERT_TRUE(gpu->LaunchGraph(*graph).ok());
  std::vector<float> want(h.q.size());
  cpu::CpuBackend cpu(nullptr);
  cpu.RunAttention(cpu.PlanAttention(shape), Args(h, c, h.q.data(), want.data(), h.q_start.data(),
                                                  h.q_len.data(), h.ctx.data(), h.tables.data(),
                                                  {h.k.data(), nullptr}, {h.v.data(), nullptr}));
  EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dout.get(), want.size()), want), 5e-4f);
}

// A decode step planned for the model's full context (as a graph capture plans it) gives the
// same bits as one planned for its real context: the split length comes from the capacity.
TEST(CudaAttentionPlanTest, DecodePlannedForTheCapacityGivesTheSameBits) {
  KVSERVE_REQUIRE_CUDA(gpu);
  const Case c{3, 300, 64, 4, KvCacheDType::kBF16, true};
  const HostBatch h = Build(c, 41);
  DeviceBuffer dq = Upload(gpu, h.q);
  DeviceBuffer dqs = Upload(gpu, h.q_start), dql = Upload(gpu, h.q_len), dctx = Upload(gpu, h.ctx);
  DeviceBuffer dt = Upload(gpu, h.tables), dk = Upload(gpu, h.k), dv = Upload(gpu, h.v);
  std::vector<std::vector<float>> outs;
  std::vector<AttentionPlan> plans;
  for (int64_t planned_len : {int64_t{300}, int64_t{4096}}) {
    AttentionShape shape = ShapeOf(h, c);
    shape.max_context_len = planned_len;
    shape.context_capacity = 4096;
    plans.push_back(gpu->PlanAttention(shape));
    DeviceBuffer dout = Upload(gpu, std::vector<float>(h.q.size()));
    gpu->RunAttention(plans.back(), Args(h, c, dq.as<float>(), dout.as<float>(), dqs.as<int32_t>(),
                                         dql.as<int32_t>(), dctx.as<int32_t>(), dt.as<int32_t>(),
                                         {dk.get(), nullptr}, {dv.get(), nullptr}));
    outs.push_back(Download<float>(gpu, dout.get(), h.q.size()));
  }
  EXPECT_NE(plans[0].num_splits, plans[1].num_splits);
  EXPECT_EQ(plans[0].split_len, plans[1].split_len);
  EXPECT_EQ(outs[0], outs[1]);
}

// Every partition of the decode kernels against the CPU: head dims 8 (one lane per row, as in
// stories260K) to 256, groups that put several heads on a warp (GQA 8, 32) or several warps on
// a head's keys (f32 GQA 2, int8 GQA 1), groups cut into several blocks (GQA 16, 20 and 32 on the
// tensor cores, eight heads a block), groups that leave some of the tensor-core kernel's eight
// head columns empty (GQA 2, 3, 5), every KV dtype on the tensor cores, and a head dim neither
// the tensor-core nor the bandwidth kernel takes (80: not a power-of-two number of 16-byte chunks).
TEST(CudaDecodeAttentionTest, EveryPartitionMatchesCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::ThreadPool pool(0);
  const Case cases[] = {
      {2, 70, 8, 2, KvCacheDType::kBF16, true},       {1, 300, 256, 8, KvCacheDType::kBF16, true},
      {2, 200, 128, 8, KvCacheDType::kFp8E4M3, true}, {1, 100, 64, 20, KvCacheDType::kInt8, true},
      {1, 130, 128, 32, KvCacheDType::kBF16, true},   {2, 150, 80, 4, KvCacheDType::kF16, true},
      {3, 90, 256, 2, KvCacheDType::kF32, true},      {2, 40, 128, 1, KvCacheDType::kInt8, true},
      {3, 77, 64, 3, KvCacheDType::kF16, true},       {2, 129, 128, 5, KvCacheDType::kBF16, true},
      {1, 1000, 256, 16, KvCacheDType::kF16, true},   {2, 33, 128, 2, KvCacheDType::kBF16, true},
  };
  uint32_t seed = 300;
  for (const Case& c : cases) {
    EXPECT_LT(RunCase(gpu, &pool, c, ++seed), DecodeTolerance(c.dtype, c.head_dim, c.gqa))
        << KvCacheDTypeName(c.dtype) << " batch " << c.batch << " ctx " << c.context << " d "
        << c.head_dim << " gqa " << c.gqa;
  }
}

// The CUDA-core decode kernel the tensor-core one replaced for GQA groups stays correct where a
// plan asks for it (cuda_kernels_bench's comparison rows). It is f32 arithmetic (measured on the
// simulator: at most 1.1e-7); the tensor-core kernel's roundings give 1e-4 and more on these
// inputs, so 1e-5 also shows that the request was followed.
TEST(CudaDecodeAttentionTest, CudaCoreKernelOnRequestMatchesCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::ThreadPool pool(0);
  uint32_t seed = 500;
  for (Case c : {Case{2, 150, 128, 4, KvCacheDType::kBF16, true},
                 Case{1, 300, 64, 8, KvCacheDType::kFp8E4M3, true},
                 Case{2, 90, 128, 4, KvCacheDType::kInt8, true}}) {
    c.kernel = DecodeKernel::kCudaCores;
    EXPECT_LT(RunCase(gpu, &pool, c, ++seed), 1e-5f)
        << KvCacheDTypeName(c.dtype) << " batch " << c.batch << " ctx " << c.context;
  }
}

// The simulator's count of global reads: decode reads each K/V byte (and int8/fp8 scale) of the
// attended keys once, for the whole GQA group, at any split count.
TEST(CudaDecodeAttentionTest, ReadsEachKvByteOnce) {
  KVSERVE_REQUIRE_CUDA(gpu);
  KVSERVE_SIMULATOR_ONLY();  // it counts the simulator's reads
  using CountFn = void (*)(int);
  using WatchFn = void (*)(int, const void*, size_t);
  using BytesFn = unsigned long long (*)(int);
  using HooksFn = int (*)();
  absl::StatusOr<void*> count = CudaLibrarySymbol("kvsim_count_global_reads", true);
  absl::StatusOr<void*> watch = CudaLibrarySymbol("kvsim_watch_reads", true);
  absl::StatusOr<void*> bytes = CudaLibrarySymbol("kvsim_global_read_bytes", true);
  absl::StatusOr<void*> hooks = CudaLibrarySymbol("kvsim_access_hooks_built_in", true);
  ASSERT_TRUE(count.ok() && watch.ok() && bytes.ok() && hooks.ok());
  if (reinterpret_cast<HooksFn>(*hooks)() == 0) {
    GTEST_SKIP() << "the simulator's kernels were built without access hooks (sanitizer build)"
                 << testing_ci::DeclaredCiSkip(
                        "the sanitizer jobs build the kernels without hooks; the README's test "
                        "command runs it");
  }
  for (const Case& c : {Case{2, 2000, 128, 4, KvCacheDType::kBF16, true},
                        Case{1, 1500, 64, 8, KvCacheDType::kFp8E4M3, true},
                        Case{2, 700, 128, 1, KvCacheDType::kInt8, true}}) {
    const HostBatch h = Build(c, 77);
    DeviceBuffer dq = Upload(gpu, h.q), dout = Upload(gpu, std::vector<float>(h.q.size()));
    DeviceBuffer dqs = Upload(gpu, h.q_start), dql = Upload(gpu, h.q_len);
    DeviceBuffer dctx = Upload(gpu, h.ctx), dt = Upload(gpu, h.tables);
    DeviceBuffer dk = Upload(gpu, h.k), dv = Upload(gpu, h.v);
    DeviceBuffer dks = Upload(gpu, h.k_scales), dvs = Upload(gpu, h.v_scales);
    const AttentionPlan plan = gpu->PlanAttention(ShapeOf(h, c));
    const auto args = Args(h, c, dq.as<float>(), dout.as<float>(), dqs.as<int32_t>(),
                           dql.as<int32_t>(), dctx.as<int32_t>(), dt.as<int32_t>(),
                           {dk.get(), dks.as<float>()}, {dv.get(), dvs.as<float>()});
    gpu->RunAttention(plan, args);  // sizes the scratch
    ASSERT_TRUE(gpu->Synchronize().ok());
    reinterpret_cast<WatchFn> (*watch)(0, dk.get(), h.k.size());
    reinterpret_cast<WatchFn> (*watch)(1, dv.get(), h.v.size());
    reinterpret_cast<WatchFn> (*watch)(2, dks.get(), h.k_scales.size() * sizeof(float));
    reinterpret_cast<WatchFn> (*watch)(3, dvs.get(), h.v_scales.size() * sizeof(float));
    reinterpret_cast<CountFn> (*count)(1);
    gpu->RunAttention(plan, args);
    ASSERT_TRUE(gpu->Synchronize().ok());
    reinterpret_cast<CountFn> (*count)(0);
    const bool scaled = c.dtype == KvCacheDType::kInt8 || c.dtype == KvCacheDType::kFp8E4M3;
    const int64_t row = c.head_dim * KvCacheDTypeElemBytes(c.dtype) + (scaled ? 4 : 0);
    uint64_t ideal = 0;
    for (int32_t n : h.ctx) ideal += uint64_t{2} * n * kKvHeads * row;
    uint64_t kv = 0;
    for (int slot = 0; slot < 4; ++slot) kv += reinterpret_cast<BytesFn>(*bytes)(slot);
    const uint64_t all = reinterpret_cast<BytesFn>(*bytes)(-1);
    const std::string what = std::string(KvCacheDTypeName(c.dtype)) + " batch " +
                             std::to_string(c.batch) + " ctx " + std::to_string(c.context) +
                             " gqa " + std::to_string(c.gqa) + ", " +
                             std::to_string(plan.num_splits) + " splits";
    EXPECT_GE(kv, ideal) << what;
    EXPECT_LE(static_cast<double>(kv), 1.05 * static_cast<double>(ideal)) << what;
    std::printf("decode %s: K/V reads %.3f x the ideal %llu bytes; all reads %.3f x\n",
                what.c_str(), static_cast<double>(kv) / static_cast<double>(ideal),
                static_cast<unsigned long long>(ideal),
                static_cast<double>(all) / static_cast<double>(ideal));
  }
}

}  // namespace
}  // namespace kvserve
