// The CUDA simulator itself: execution semantics (indices, barriers, shared memory, warp
// collectives, streams, graphs, cuBLAS, NCCL) and every check it promises, each on a kernel
// with the bug planted (tests/kernels/cuda/sim/sim_test_kernels.cu).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/sim/sim_memory.h"
#include "kernels/cuda/sim/internal.h"
#include "kernels/dtype.h"
#include "tests/kernels/cuda/sim/sim_test_kernels.h"
#include "tests/test_util/ci_skip.h"

namespace kvserve::simtest {
namespace {

// CI's ASan job (scripts/sanitize.sh asan) skips the checks ASan takes over; its plain build
// runs them.
const std::string kAsanJob = testing_ci::DeclaredCiSkip("the plain build runs it, not ASan's");

/// Runs a launch that must fault; returns the error text (and clears the sticky error).
std::string ExpectFault(cudaError_t launch_result, cudaError_t want = cudaErrorLaunchFailure) {
  EXPECT_EQ(launch_result, want);
  EXPECT_EQ(cudaDeviceSynchronize(), want);
  const std::string text = cudaGetErrorString(want);
  EXPECT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return text;
}

TEST(CudaSim, DeviceLooksLikeAnH200) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_GE(count, 2);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.multiProcessorCount, 132);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, size_t{227} * 1024);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared by the read
}

TEST(CudaSim, IndicesCoverAThreeDimensionalLaunch) {
  const dim3 grid(3, 2, 2);
  const dim3 block(8, 4, 2);
  const size_t n = 12 * 64;
  uint32_t* d = DeviceAlloc<uint32_t>(n);
  ASSERT_EQ(LaunchIndices(grid, block, d, nullptr), cudaSuccess);
  const std::vector<uint32_t> got = Download(d, n);
  for (uint32_t b = 0; b < 12; ++b) {
    for (uint32_t t = 0; t < 64; ++t) ASSERT_EQ(got[b * 64 + t], (b << 16) | t);
  }
  cudaFree(d);
}

TEST(CudaSim, BarriersAndDynamicSharedMemory) {
  const int n = 100;
  const int blocks = 5;
  std::vector<float> in(n * blocks);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7) - 2.0f;
  float* d_in = Upload(in);
  float* d_out = DeviceAlloc<float>(blocks);
  int* d_counts = DeviceAlloc<int>(blocks);
  ASSERT_EQ(LaunchBlockSum(d_in, n, blocks, d_out, d_counts), cudaSuccess);
  const std::vector<float> out = Download(d_out, blocks);
  const std::vector<int> counts = Download(d_counts, blocks);
  for (int b = 0; b < blocks; ++b) {
    float want = 0;
    int positive = 0;
    for (int i = 0; i < n; ++i) want += in[b * n + i];
    for (int i = 0; i < 64; ++i) positive += in[b * n + i] > 0;
    EXPECT_FLOAT_EQ(out[b], want);
    EXPECT_EQ(counts[b], positive);
  }
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_counts);
}

TEST(CudaSim, WarpCollectives) {
  std::vector<int> in(64);
  for (int i = 0; i < 64; ++i) in[i] = (i * 13) % 41;
  int* d_in = Upload(in);
  int* xs = DeviceAlloc<int>(64);
  int* up = DeviceAlloc<int>(64);
  int* down = DeviceAlloc<int>(64);
  int* idx = DeviceAlloc<int>(64);
  unsigned* ballot = DeviceAlloc<unsigned>(64);
  int* any = DeviceAlloc<int>(64);
  int* all = DeviceAlloc<int>(64);
  ASSERT_EQ(LaunchWarpOps(d_in, xs, up, down, idx, ballot, any, all), cudaSuccess);
  const auto g_xs = Download(xs, 64), g_up = Download(up, 64), g_down = Download(down, 64),
             g_idx = Download(idx, 64), g_any = Download(any, 64), g_all = Download(all, 64);
  const auto g_ballot = Download(ballot, 64);
  for (int w = 0; w < 2; ++w) {
    int sum = 0;
    unsigned votes = 0;
    bool has40 = false;
    for (int l = 0; l < 32; ++l) {
      sum += in[w * 32 + l];
      if (in[w * 32 + l] % 3 == 0) votes |= 1u << l;
      has40 |= in[w * 32 + l] == 40;
    }
    for (int l = 0; l < 32; ++l) {
      const int i = w * 32 + l;
      EXPECT_EQ(g_xs[i], sum);
      EXPECT_EQ(g_up[i], l >= 3 ? in[i - 3] : in[i]);
      const int seg_end = (l / 16 + 1) * 16;  // width 16
      EXPECT_EQ(g_down[i], l + 5 < seg_end ? in[i + 5] : in[i]);
      EXPECT_EQ(g_idx[i], in[w * 32 + (7 * i + 3) % 32]);  // a source lane per lane
      EXPECT_EQ(g_ballot[i], votes);
      EXPECT_EQ(g_any[i], has40 ? 1 : 0);
      EXPECT_EQ(g_all[i], 1);
    }
  }
  for (void* p : {static_cast<void*>(d_in), static_cast<void*>(xs), static_cast<void*>(up),
                  static_cast<void*>(down), static_cast<void*>(idx), static_cast<void*>(ballot),
                  static_cast<void*>(any), static_cast<void*>(all)}) {
    cudaFree(p);
  }
}

TEST(CudaSim, DivergentBarriersAreReported) {
  const std::string text = ExpectFault(LaunchDivergentBarrier());
  EXPECT_NE(text.find("DivergentBarrierKernel"), std::string::npos) << text;
  EXPECT_NE(text.find("different barriers"), std::string::npos) << text;
}

TEST(CudaSim, ShuffleAgainstABarrierIsADeadlock) {
  const std::string text = ExpectFault(LaunchShuffleDeadlock());
  EXPECT_NE(text.find("ShuffleDeadlockKernel"), std::string::npos) << text;
  EXPECT_NE(text.find("deadlock"), std::string::npos) << text;
  EXPECT_NE(text.find("__syncthreads"), std::string::npos) << text;
}

TEST(CudaSim, MaskNamingAMissingLaneIsReported) {
  const std::string text = ExpectFault(LaunchMaskBeyondBlock());
  EXPECT_NE(text.find("MaskKernel"), std::string::npos) << text;
  EXPECT_NE(text.find("16-31"), std::string::npos) << text;
  EXPECT_NE(text.find("does not have"), std::string::npos) << text;
}

TEST(CudaSim, MaskNamingAnExitedLaneIsReported) {
  const std::string text = ExpectFault(LaunchMaskExitedLanes());
  EXPECT_NE(text.find("MaskExitedKernel"), std::string::npos) << text;
  EXPECT_NE(text.find("exited"), std::string::npos) << text;
}

TEST(CudaSim, SharedMemoryOverrunIsReported) {
  if (!kvsim::AccessHooksBuiltIn())
    GTEST_SKIP() << "kernels without access hooks (ASan build)" << kAsanJob;
  const std::string text = ExpectFault(LaunchSharedOverrun(), cudaErrorIllegalAddress);
  EXPECT_NE(text.find("SharedOverrunKernel"), std::string::npos) << text;
  EXPECT_NE(text.find("outside the 128 bytes the launch requested"), std::string::npos) << text;
}

TEST(CudaSim, WildAccessIsAnIllegalAddressNamingTheThread) {
  if (!kvsim::CatchesFaults())
    GTEST_SKIP() << "ASan build: ASan reports wild accesses itself" << kAsanJob;
  float* p = DeviceAlloc<float>(32);
  const std::string text = ExpectFault(LaunchWildRead(p, p), cudaErrorIllegalAddress);
  EXPECT_NE(text.find("WildReadKernel: block (0,0,0) thread (5,0,0): illegal memory access"),
            std::string::npos)
      << text;
  cudaFree(p);
}

TEST(CudaSim, RaceCheckFindsAMissingBarrierAndTrustsBarriersAndSyncwarp) {
  if (!kvsim::AccessHooksBuiltIn())
    GTEST_SKIP() << "kernels without access hooks (ASan build)" << kAsanJob;
  kvsim::SetRaceCheck(true);
  float* out = DeviceAlloc<float>(64);
  ASSERT_EQ(LaunchNeighbourRead(true, out), cudaSuccess);
  const std::vector<float> got = Download(out, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], static_cast<float>((i + 1) % 64));
  ASSERT_EQ(LaunchWarpSyncedExchange(out), cudaSuccess);
  EXPECT_EQ(Download(out, 2)[0], 0.5f);
  const std::string text = ExpectFault(LaunchNeighbourRead(false, out));
  EXPECT_NE(text.find("NeighbourKernel"), std::string::npos) << text;
  EXPECT_NE(text.find("data race on dynamic shared memory byte"), std::string::npos) << text;
  const std::string static_text = ExpectFault(LaunchStaticNeighbourRead(out));
  EXPECT_NE(static_text.find("StaticNeighbourKernel"), std::string::npos) << static_text;
  EXPECT_NE(static_text.find("data race on static __shared__ memory"), std::string::npos)
      << static_text;
  kvsim::SetRaceCheck(false);
  cudaFree(out);
}

TEST(CudaSim, LaunchConfigurationIsValidated) {
  EXPECT_EQ(LaunchWithConfig(dim3(2048), 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(LaunchWithConfig(dim3(32), 64 * 1024), cudaErrorInvalidValue);  // > 48 KiB default
  EXPECT_EQ(AllowSharedBytes(228 * 1024), cudaErrorInvalidValue);           // > sm_90's 227 KiB
  cudaGetLastError();
  ASSERT_EQ(AllowSharedBytes(100 * 1024), cudaSuccess);
  EXPECT_EQ(LaunchWithConfig(dim3(32), 64 * 1024), cudaSuccess);
  EXPECT_EQ(LaunchWithConfig(dim3(32), 101 * 1024), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // configuration errors are not sticky
}

TEST(CudaSim, GraphsReplayCapturedWorkAndEnforceCaptureRules) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const int n = 300;
  std::vector<float> x(n, 1.0f);
  float* d_x = Upload(x);
  float* d_y = DeviceAlloc<float>(n);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(LaunchAffine(d_x, d_y, n, s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_TRUE(std::isnan(Download(d_y, 1)[0]));
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  EXPECT_EQ(Download(d_y, n)[n - 1], 3.0f);
  std::vector<float> x2(n, 5.0f);  // replay reads device memory as it is now
  ASSERT_EQ(cudaMemcpy(d_x, x2.data(), sizeof(float) * n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(Download(d_y, n)[7], 11.0f);

  // No allocation and no synchronisation while capturing: the capture is invalidated.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t bad = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(bad, nullptr);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(s, &bad), cudaErrorStreamCaptureInvalidated);
  // Relaxed mode allows allocation.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 16), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(s, &bad), cudaSuccess);
  cudaGraphDestroy(bad);
  cudaFree(p);
  cudaGetLastError();

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(d_x);
  cudaFree(d_y);
  cudaStreamDestroy(s);
}

TEST(CudaSim, FaultsAreStickyUntilReset) {
  EXPECT_EQ(LaunchMaskBeyondBlock(), cudaErrorLaunchFailure);
  float* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, 4), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);  // sticky: reading does not clear it
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaSim, CopiesAreCheckedAgainstDeviceAllocations) {
  std::vector<float> host(8, 1.0f);
  float* d = DeviceAlloc<float>(8);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 9 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), d, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  cudaGetLastError();
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, total + 1), cudaErrorMemoryAllocation);
  cudaGetLastError();
}

TEST(CudaSim, HalfAndBf16ConversionsRoundToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = __half2float(__ushort_as_half(static_cast<uint16_t>(h)));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(static_cast<uint16_t>(h))));
      continue;
    }
    EXPECT_EQ(f, HalfToFloat(static_cast<uint16_t>(h)));
    ASSERT_EQ(__half_as_ushort(__float2half_rn(f)), h) << h;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(__half_as_ushort(__float2half_rn(f)), FloatToHalf(f)) << f;
    ASSERT_EQ(__bfloat16_as_ushort(__float2bfloat16_rn(f)), FloatToBF16(f)) << f;
  }
  EXPECT_EQ(__half_as_ushort(__float2half_rn(65520.0f)), 0x7c00);  // rounds to inf
  EXPECT_EQ(__half_as_ushort(__float2half_rn(65504.0f)), 0x7bff);
  EXPECT_EQ(__half_as_ushort(__float2half_rn(std::ldexp(1.0f, -25))), 0);  // tie to even: 0
  EXPECT_EQ(__half_as_ushort(__float2half_rn(std::ldexp(3.0f, -26))), 1);  // above the tie
}

TEST(CudaSim, GemmExMatchesAReference) {
  const int m = 37, n = 5, k = 70;  // y^T [m, n] = W [m, k] (stored k-major, op T) x^T [k, n]
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> w(static_cast<size_t>(m) * k), x(static_cast<size_t>(k) * n);
  for (auto& v : w) v = FloatToBF16(u(rng));
  for (auto& v : x) v = FloatToBF16(u(rng));
  uint16_t* d_w = Upload(w);
  uint16_t* d_x = Upload(x);
  float* d_y = DeviceAlloc<float>(static_cast<size_t>(m) * n);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, d_w, CUDA_R_16BF, k, d_x,
                         CUDA_R_16BF, k, &beta, d_y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  const std::vector<float> y = Download(d_y, static_cast<size_t>(m) * n);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double want = 0;
      for (int p = 0; p < k; ++p) {
        want += static_cast<double>(BF16ToFloat(w[static_cast<size_t>(i) * k + p])) *
                BF16ToFloat(x[static_cast<size_t>(j) * k + p]);
      }
      EXPECT_NEAR(y[static_cast<size_t>(j) * m + i], want, 1e-4) << i << "," << j;
    }
  }
  // ld smaller than the stored rows: refused.
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, d_w, CUDA_R_16BF, k - 1, d_x,
                         CUDA_R_16BF, k, &beta, d_y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  // An operand past its allocation faults the device, naming cublasGemmEx.
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n + 1, k, &alpha, d_w, CUDA_R_16BF, k, d_x,
                         CUDA_R_16BF, k, &beta, d_y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  const std::string text = ExpectFault(cudaErrorIllegalAddress, cudaErrorIllegalAddress);
  EXPECT_NE(text.find("cublasGemmEx"), std::string::npos) << text;
  cublasDestroy(h);
  cudaFree(d_w);
  cudaFree(d_x);
  cudaFree(d_y);
}

TEST(CudaSim, NcclAllReduceAndAllGatherAcrossRankThreads) {
  constexpr int kRanks = 2;
  ncclComm_t comms[kRanks];
  ASSERT_EQ(ncclCommInitAll(comms, kRanks, nullptr), ncclSuccess);
  std::vector<std::vector<float>> reduced(kRanks), gathered(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      std::vector<float> v(10);
      for (int i = 0; i < 10; ++i) v[i] = static_cast<float>(r * 100 + i);
      float* d = Upload(v);
      float* all = DeviceAlloc<float>(10 * kRanks);
      EXPECT_EQ(ncclAllGather(d, all, 10, ncclFloat, comms[r], s), ncclSuccess);
      EXPECT_EQ(ncclAllReduce(d, d, 10, ncclFloat, ncclSum, comms[r], s), ncclSuccess);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      reduced[r] = Download(d, 10);
      gathered[r] = Download(all, 10 * kRanks);
      cudaFree(d);
      cudaFree(all);
      cudaStreamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(reduced[r][i], static_cast<float>(100 + 2 * i));
      EXPECT_EQ(gathered[r][i], static_cast<float>(i));
      EXPECT_EQ(gathered[r][10 + i], static_cast<float>(100 + i));
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

TEST(CudaSim, NcclCollectivesAreAsynchronousAndAbortReleasesTheirStreams) {
  ncclComm_t comms[2];
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess);
  ncclResult_t posted = ncclInternalError, after_abort = ncclSuccess;
  cudaError_t synced = cudaErrorUnknown;
  std::atomic<bool> was_posted{false};
  std::thread rank0([&] {
    cudaSetDevice(0);
    cudaStream_t s = nullptr;
    cudaStreamCreate(&s);
    float* d = DeviceAlloc<float>(4);
    // Rank 1 never comes: the call returns (NCCL calls are asynchronous); the stream waits.
    posted = ncclAllReduce(d, d, 4, ncclFloat, ncclSum, comms[0], s);
    was_posted = true;
    synced = cudaStreamSynchronize(s);  // released by the abort below (or already released)
    after_abort = ncclAllReduce(d, d, 4, ncclFloat, ncclSum, comms[0], s);
    cudaFree(d);
    cudaStreamDestroy(s);
  });
  while (!was_posted) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // most often rank 0 now waits
  ASSERT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  rank0.join();
  EXPECT_EQ(posted, ncclSuccess);
  EXPECT_EQ(synced, cudaSuccess);
  EXPECT_EQ(after_abort, ncclRemoteError);
  ncclCommAbort(comms[0]);
}

}  // namespace
}  // namespace kvserve::simtest
