// NCCL point-to-point on the CUDA simulator (kernels/cuda/sim/nccl.cc): ncclSend / ncclRecv on
// ncclCommInitRank communicators, between threads of this process and between processes (this
// binary run again as the peer, with a child-only test), and the failures that must not hang: a
// peer that dies, an abort from another thread, a size mismatch, a timeout. Also NCCL's
// non-blocking init (ncclCommInitRankConfig with blocking = 0): in progress until every rank has
// joined, abortable while a peer never comes.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/sim/sim_memory.h"
#include "tests/test_util/ci_skip.h"

extern char** environ;

namespace kvserve::simtest {
namespace {

using Clock = std::chrono::steady_clock;

/// Carries the parent's ncclUniqueId (hex) to a child.
constexpr char kIdEnv[] = "KVSIM_P2P_TEST_ID";
/// What a child exits with when its checks passed. Not 0: a child whose filter named no test
/// exits 0, which must read as a failure.
constexpr int kChildPassed = 37;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

ncclUniqueId NewId() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return id;
}

std::string Hex(const ncclUniqueId& id) {
  std::string out;
  char byte[3];
  for (char c : id.internal) {
    std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(c));
    out += byte;
  }
  return out;
}

/// The id the parent passed in the environment; false when not run as a child.
bool ParentId(ncclUniqueId* id) {
  const char* hex = std::getenv(kIdEnv);
  if (hex == nullptr || std::strlen(hex) != 2 * sizeof id->internal) return false;
  for (size_t i = 0; i < sizeof id->internal; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex + 2 * i, "%2x", &v) != 1) return false;
    id->internal[i] = static_cast<char>(v);
  }
  return true;
}

/// Runs this binary's SimNcclP2pChild.`test` (a DISABLED_ test: it runs only this way) as a fresh
/// process (not a fork of this threaded one), with `id` and `env` in its environment.
pid_t SpawnChild(const std::string& test, const ncclUniqueId& id,
                 const std::vector<std::string>& env = {}) {
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    // Sharding or an output file meant for this run would apply to the child's too.
    if (v.rfind("GTEST_", 0) == 0 || v.rfind(kIdEnv, 0) == 0 ||
        v.rfind("KVSERVE_SIM_NCCL_TIMEOUT_S=", 0) == 0) {
      continue;
    }
    vars.push_back(v);
  }
  vars.push_back(std::string(kIdEnv) + "=" + Hex(id));
  bool timeout_set = false;
  for (const std::string& v : env) {
    timeout_set |= v.rfind("KVSERVE_SIM_NCCL_TIMEOUT_S=", 0) == 0;
    vars.push_back(v);
  }
  // A broken child fails in seconds instead of waiting the default 120 s.
  if (!timeout_set) vars.push_back("KVSERVE_SIM_NCCL_TIMEOUT_S=10");
  std::vector<std::string> args = {"sim_nccl_p2p_test", "--gtest_also_run_disabled_tests",
                                   "--gtest_filter=SimNcclP2pChild." + test};
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int e = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
  EXPECT_EQ(e, 0) << std::strerror(e);
  return e == 0 ? pid : -1;
}

/// The child's wait status; kills it when it runs past `limit`.
int WaitChild(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(30)) {
  int status = 0;
  if (pid < 0) return -1;
  const Clock::time_point deadline = Clock::now() + limit;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ADD_FAILURE() << "the child ran past " << limit.count() << " s";
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

bool ChildPassed(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kChildPassed; }

/// Ends a child's test: its exit status is the parent's verdict.
void ExitChild(bool failed) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(failed ? 1 : kChildPassed);
}

/// Whether two buffers hold the same bytes (a vector's EXPECT_EQ would print megabytes).
template <typename T>
bool SameBytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

/// Rank `rank`'s payloads: distinct per rank, message and element.
std::vector<float> FloatPattern(int rank, int message, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(rank * 1000000 + message * 10000) + static_cast<float>(i % 9973);
  }
  return v;
}

std::vector<__nv_bfloat16> Bf16Pattern(int rank, size_t n) {
  std::vector<__nv_bfloat16> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = __float2bfloat16_rn(static_cast<float>((i * 7 + static_cast<size_t>(rank) * 131) % 251));
  }
  return v;
}

std::vector<int32_t> IntPattern(int rank, int message, size_t n) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rank * 100000 + message * 1000 + static_cast<int>(i);
  return v;
}

TEST(SimNcclP2p, TwoRankThreadsExchangeMegabytesBothWaysThenSmallMessagesInOrder) {
  const ncclUniqueId id = NewId();
  constexpr size_t kFloats = size_t{1} << 20;  // 4 MiB: many times a socket's buffer
  constexpr size_t kBf16s = size_t{3} << 19;   // 3 MiB
  constexpr int kSmall = 5;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&id, r] {
      const int peer = 1 - r;
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      ncclComm_t comm = nullptr;
      ASSERT_EQ(ncclCommInitRank(&comm, 2, id, r), ncclSuccess);
      int count = 0, rank = -1;
      EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
      EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
      EXPECT_EQ(count, 2);
      EXPECT_EQ(rank, r);
      cudaStream_t s = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      float* f_out = Upload(FloatPattern(r, 0, kFloats));
      float* f_in = DeviceAlloc<float>(kFloats);
      __nv_bfloat16* b_out = Upload(Bf16Pattern(r, kBf16s));
      __nv_bfloat16* b_in = DeviceAlloc<__nv_bfloat16>(kBf16s);
      // Both sides send first: the stream waits for each send before posting the recv, which
      // only works because a send completes without the peer's recv (its I/O thread reads).
      EXPECT_EQ(ncclSend(f_out, kFloats, ncclFloat32, peer, comm, s), ncclSuccess);
      EXPECT_EQ(ncclRecv(f_in, kFloats, ncclFloat32, peer, comm, s), ncclSuccess);
      EXPECT_EQ(ncclSend(b_out, kBf16s, ncclBfloat16, peer, comm, s), ncclSuccess);
      EXPECT_EQ(ncclRecv(b_in, kBf16s, ncclBfloat16, peer, comm, s), ncclSuccess);
      // Several small messages of different sizes, all posted before any recv: taken out of
      // order, a recv would meet the wrong size (or the wrong content).
      std::vector<int32_t*> small_out, small_in;
      for (int k = 0; k < kSmall; ++k) {
        const size_t n = static_cast<size_t>(3 * (k + 1));
        small_out.push_back(Upload(IntPattern(r, k, n)));
        small_in.push_back(DeviceAlloc<int32_t>(n));
        EXPECT_EQ(ncclSend(small_out.back(), n, ncclInt32, peer, comm, s), ncclSuccess);
      }
      for (int k = 0; k < kSmall; ++k) {
        EXPECT_EQ(ncclRecv(small_in[k], static_cast<size_t>(3 * (k + 1)), ncclInt32, peer, comm, s),
                  ncclSuccess);
      }
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      ncclResult_t async = ncclInternalError;
      EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      EXPECT_EQ(async, ncclSuccess) << ncclGetLastError(comm);
      EXPECT_TRUE(SameBytes(Download(f_in, kFloats), FloatPattern(peer, 0, kFloats)));
      EXPECT_TRUE(SameBytes(Download(b_in, kBf16s), Bf16Pattern(peer, kBf16s)));
      for (int k = 0; k < kSmall; ++k) {
        const size_t n = static_cast<size_t>(3 * (k + 1));
        EXPECT_EQ(Download(small_in[k], n), IntPattern(peer, k, n)) << "message " << k;
        cudaFree(small_out[k]);
        cudaFree(small_in[k]);
      }
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
      cudaFree(f_out);
      cudaFree(f_in);
      cudaFree(b_out);
      cudaFree(b_in);
      cudaStreamDestroy(s);
    });
  }
  for (std::thread& t : threads) t.join();
}

constexpr int kExchanged = 3;

size_t ExchangedFloats(int message) { return static_cast<size_t>(1000 * (message + 1) + 17); }

/// One side of TwoProcessesExchangeThreeMessagesEachWay: sends rank `rank`'s messages, receives
/// the peer's and checks them; `recv_first` posts each recv before the matching send.
void ExchangeThree(ncclComm_t comm, int rank, bool recv_first) {
  const int peer = 1 - rank;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::vector<float*> out, in;
  for (int k = 0; k < kExchanged; ++k) {
    out.push_back(Upload(FloatPattern(rank, k, ExchangedFloats(k))));
    in.push_back(DeviceAlloc<float>(ExchangedFloats(k)));
  }
  for (int k = 0; k < kExchanged; ++k) {
    const size_t n = ExchangedFloats(k);
    if (recv_first) {
      EXPECT_EQ(ncclRecv(in[k], n, ncclFloat32, peer, comm, s), ncclSuccess);
    }
    EXPECT_EQ(ncclSend(out[k], n, ncclFloat32, peer, comm, s), ncclSuccess);
    if (!recv_first) {
      EXPECT_EQ(ncclRecv(in[k], n, ncclFloat32, peer, comm, s), ncclSuccess);
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess) << ncclGetLastError(comm);
  for (int k = 0; k < kExchanged; ++k) {
    EXPECT_TRUE(
        SameBytes(Download(in[k], ExchangedFloats(k)), FloatPattern(peer, k, ExchangedFloats(k))))
        << "rank " << rank << ", message " << k << " from rank " << peer;
    cudaFree(out[k]);
    cudaFree(in[k]);
  }
  cudaStreamDestroy(s);
}

TEST(SimNcclP2p, TwoProcessesExchangeThreeMessagesEachWay) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSuccess);
  const pid_t child = SpawnChild("DISABLED_ExchangeThreeAsRank1", id);
  ExchangeThree(comm, 0, /*recv_first=*/false);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_TRUE(ChildPassed(WaitChild(child))) << "the child (rank 1) failed: see its output above";
}

TEST(SimNcclP2pChild, DISABLED_ExchangeThreeAsRank1) {
  ncclUniqueId id;
  if (!ParentId(&id)) {
    GTEST_SKIP() << "a child process's half of a test"
                 << testing_ci::DeclaredCiSkip("its parent test runs it");
  }
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 1), ncclSuccess);
  ExchangeThree(comm, 1, /*recv_first=*/true);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  ExitChild(HasFailure());
}

TEST(SimNcclP2p, APeerProcessThatDiesFailsThePendingRecvAndEveryLaterCall) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSuccess);
  const pid_t child = SpawnChild("DISABLED_SendOneThenWaitToBeKilledAsRank1", id);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* first = DeviceAlloc<float>(64);
  float* second = DeviceAlloc<float>(64);
  ASSERT_EQ(ncclRecv(first, 64, ncclFloat32, 1, comm, s), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(Download(first, 64), FloatPattern(1, 0, 64));
  // The child is alive and connected; it dies while this recv waits for its second message.
  ASSERT_EQ(ncclRecv(second, 64, ncclFloat32, 1, comm, s), ncclSuccess);
  kill(child, SIGKILL);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_LT(Seconds(t0), 5.0);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("from rank 1"), std::string::npos)
      << ncclGetLastError(comm);
  const Clock::time_point t1 = Clock::now();
  EXPECT_EQ(ncclSend(first, 64, ncclFloat32, 1, comm, s), ncclRemoteError);
  EXPECT_EQ(ncclRecv(first, 64, ncclFloat32, 1, comm, s), ncclRemoteError);
  EXPECT_LT(Seconds(t1), 0.5);
  const int status = WaitChild(child);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the child was to be killed, not to exit";
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaFree(first);
  cudaFree(second);
  cudaStreamDestroy(s);
}

TEST(SimNcclP2pChild, DISABLED_SendOneThenWaitToBeKilledAsRank1) {
  ncclUniqueId id;
  if (!ParentId(&id)) {
    GTEST_SKIP() << "a child process's half of a test"
                 << testing_ci::DeclaredCiSkip("its parent test runs it");
  }
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 1), ncclSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* d = Upload(FloatPattern(1, 0, 64));
  EXPECT_EQ(ncclSend(d, 64, ncclFloat32, 0, comm, s), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::seconds(20));  // the parent kills it long before
  ExitChild(HasFailure());
}

TEST(SimNcclP2p, APeerProcessThatDiesBeforeItEverSentFailsThePendingRecv) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSuccess);
  const pid_t child = SpawnChild("DISABLED_RecvOneThenWaitToBeKilledAsRank1", id);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* out = Upload(FloatPattern(0, 0, 64));
  float* in = DeviceAlloc<float>(64);
  // Only this rank's connection to the child exists: its end is all that tells of the death.
  ASSERT_EQ(ncclSend(out, 64, ncclFloat32, 1, comm, s), ncclSuccess);
  ASSERT_EQ(ncclRecv(in, 64, ncclFloat32, 1, comm, s), ncclSuccess);
  kill(child, SIGKILL);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_LT(Seconds(t0), 5.0);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError) << ncclGetLastError(comm);
  EXPECT_TRUE(WIFSIGNALED(WaitChild(child)));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaFree(out);
  cudaFree(in);
  cudaStreamDestroy(s);
}

TEST(SimNcclP2pChild, DISABLED_RecvOneThenWaitToBeKilledAsRank1) {
  ncclUniqueId id;
  if (!ParentId(&id)) {
    GTEST_SKIP() << "a child process's half of a test"
                 << testing_ci::DeclaredCiSkip("its parent test runs it");
  }
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, 1), ncclSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* d = DeviceAlloc<float>(64);
  EXPECT_EQ(ncclRecv(d, 64, ncclFloat32, 0, comm, s), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::seconds(20));  // the parent kills it long before
  ExitChild(HasFailure());
}

TEST(SimNcclP2p, AbortFromAnotherThreadReleasesAStreamWaitingInRecv) {
  const ncclUniqueId id = NewId();
  ncclComm_t comms[2] = {nullptr, nullptr};
  // One thread may init both ranks: the simulator's init does not wait for the others.
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    ASSERT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess);
  }
  std::atomic<bool> posted{false};
  ncclResult_t recv_result = ncclInternalError;
  cudaError_t synced = cudaErrorUnknown;
  double waited = 0;
  std::thread rank0([&] {
    cudaSetDevice(0);
    cudaStream_t s = nullptr;
    cudaStreamCreate(&s);
    float* d = DeviceAlloc<float>(16);
    recv_result = ncclRecv(d, 16, ncclFloat32, 1, comms[0], s);  // rank 1 never sends
    posted = true;
    const Clock::time_point t0 = Clock::now();
    synced = cudaStreamSynchronize(s);  // released by the abort below
    waited = Seconds(t0);
    cudaFree(d);
    cudaStreamDestroy(s);
  });
  while (!posted) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 now waits in the sync
  ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  rank0.join();
  EXPECT_EQ(recv_result, ncclSuccess);
  EXPECT_EQ(synced, cudaSuccess);
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}

TEST(SimNcclP2p, SizeMismatchFailsTheRecvAndBadArgumentsAreRefused) {
  const ncclUniqueId id = NewId();
  ncclComm_t comms[2] = {nullptr, nullptr};
  cudaStream_t streams[2] = {nullptr, nullptr};
  float* bufs[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    ASSERT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess);
    ASSERT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
    bufs[r] = DeviceAlloc<float>(12);
  }
  ncclComm_t c0 = comms[0];
  cudaStream_t s0 = streams[0];
  float* d0 = bufs[0];

  // Bad arguments fail the call, and leave the communicator usable.
  EXPECT_EQ(ncclSend(d0, 10, ncclFloat32, 0, c0, s0), ncclInvalidArgument);  // itself
  EXPECT_EQ(ncclSend(d0, 10, ncclFloat32, 2, c0, s0), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(d0, 10, ncclFloat32, -1, c0, s0), ncclInvalidArgument);
  std::vector<float> host(10);
  EXPECT_EQ(ncclSend(host.data(), 10, ncclFloat32, 1, c0, s0), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(d0, 10, ncclFloat32, 1, c0, streams[1]), ncclInvalidUsage);  // device 1's
  EXPECT_EQ(ncclAllReduce(d0, d0, 10, ncclFloat32, ncclSum, c0, s0), ncclInvalidUsage);
  EXPECT_EQ(ncclAllGather(d0, d0, 1, ncclFloat32, c0, s0), ncclInvalidUsage);
  ncclComm_t all[2];
  ASSERT_EQ(ncclCommInitAll(all, 2, nullptr), ncclSuccess);
  EXPECT_EQ(ncclSend(d0, 10, ncclFloat32, 1, all[0], s0), ncclInvalidUsage);
  for (ncclComm_t c : all) ncclCommDestroy(c);

  ncclUniqueId foreign{};
  std::memset(foreign.internal, 7, sizeof foreign.internal);
  ncclComm_t bad = nullptr;
  EXPECT_EQ(ncclCommInitRank(&bad, 2, foreign, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&bad, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&bad, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&bad, 2, id, -1), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&bad, 2, id, 0), ncclInvalidUsage);  // rank 0 exists already
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);

  // 10 floats sent, 12 expected: the recv fails and breaks rank 1's communicator.
  EXPECT_EQ(ncclSend(d0, 10, ncclFloat32, 1, c0, s0), ncclSuccess);
  EXPECT_EQ(ncclRecv(bufs[1], 12, ncclFloat32, 0, comms[1], streams[1]), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(streams[1]), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s0), cudaSuccess);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comms[1], &async), ncclSuccess);
  EXPECT_EQ(async, ncclInvalidUsage);
  const std::string error = ncclGetLastError(comms[1]);
  EXPECT_NE(error.find("48 bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("40 bytes"), std::string::npos) << error;
  EXPECT_EQ(ncclRecv(bufs[1], 10, ncclFloat32, 0, comms[1], streams[1]), ncclInvalidUsage);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
    cudaFree(bufs[r]);
    cudaStreamDestroy(streams[r]);
  }
}

TEST(SimNcclP2p, ARecvOrSendWhosePeerNeverComesTimesOut) {
  // The timeout is read per op, from the environment: a child sets it without touching this
  // process's environment while other threads may read it.
  const pid_t child =
      SpawnChild("DISABLED_TimeOutAfterOneSecond", NewId(), {"KVSERVE_SIM_NCCL_TIMEOUT_S=1"});
  EXPECT_TRUE(ChildPassed(WaitChild(child))) << "the child failed: see its output above";
}

TEST(SimNcclP2pChild, DISABLED_TimeOutAfterOneSecond) {
  ncclUniqueId id;
  if (!ParentId(&id)) {
    GTEST_SKIP() << "a child process's half of a test"
                 << testing_ci::DeclaredCiSkip("its parent test runs it");
  }
  // Rank 1 of neither id ever exists: the recv's peer never connects, the send's never listens.
  ncclComm_t receiver = nullptr, sender = nullptr;
  ASSERT_EQ(ncclCommInitRank(&receiver, 2, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&sender, 2, NewId(), 0), ncclSuccess);
  cudaStream_t s_recv = nullptr, s_send = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s_recv), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&s_send), cudaSuccess);
  float* d = DeviceAlloc<float>(8);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(ncclRecv(d, 8, ncclFloat32, 1, receiver, s_recv), ncclSuccess);
  EXPECT_EQ(ncclSend(d, 8, ncclFloat32, 1, sender, s_send), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s_recv), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s_send), cudaSuccess);
  const double waited = Seconds(t0);
  EXPECT_GT(waited, 0.5);
  EXPECT_LT(waited, 3.0);
  for (ncclComm_t c : {receiver, sender}) {
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSystemError);
    EXPECT_NE(std::string(ncclGetLastError(c)).find("timed out"), std::string::npos)
        << ncclGetLastError(c);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  cudaFree(d);
  cudaStreamDestroy(s_recv);
  cudaStreamDestroy(s_send);
  ExitChild(HasFailure());
}

ncclConfig_t NonBlocking() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

/// Rank `rank` of `nranks` by non-blocking init, the way kvserve's stage links open it.
ncclComm_t InitNonBlocking(int nranks, const ncclUniqueId& id, int rank) {
  ncclConfig_t config = NonBlocking();
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommInitRankConfig(&comm, nranks, id, rank, &config), ncclInProgress);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_NE(comm, nullptr);
  return comm;
}

/// Polls the communicator's state until it is not ncclInProgress or `limit_s` has passed; the
/// last state seen.
ncclResult_t AwaitInit(ncclComm_t comm, double limit_s = 5.0) {
  const Clock::time_point t0 = Clock::now();
  ncclResult_t state = ncclInProgress;
  while (true) {
    EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    if (state != ncclInProgress || Seconds(t0) > limit_s) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// Whether the state stays ncclInProgress for `seconds`, polled every millisecond.
bool StaysInProgress(ncclComm_t comm, double seconds) {
  const Clock::time_point t0 = Clock::now();
  while (Seconds(t0) < seconds) {
    ncclResult_t state = ncclInternalError;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclInProgress) {
      ADD_FAILURE() << "the state became " << ncclGetErrorString(state) << " after " << Seconds(t0)
                    << " s: " << ncclGetLastError(comm);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(SimNcclP2p, NonBlockingInitIsInProgressUntilThePeerJoinsThenExchanges) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm0 = InitNonBlocking(2, id, 0);
  ASSERT_NE(comm0, nullptr);
  // Rank 1 does not exist yet: the init cannot be done, and sends and recvs are refused.
  EXPECT_TRUE(StaysInProgress(comm0, 0.05));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  float* d = DeviceAlloc<float>(4);
  EXPECT_EQ(ncclSend(d, 4, ncclFloat32, 1, comm0, s), ncclInvalidUsage);
  EXPECT_EQ(ncclRecv(d, 4, ncclFloat32, 1, comm0, s), ncclInvalidUsage);
  EXPECT_TRUE(StaysInProgress(comm0, 0.01)) << "a refused call must not break the init";
  ncclResult_t state1 = ncclInternalError;
  std::thread rank1([&id, &state1] {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ncclComm_t comm1 = InitNonBlocking(2, id, 1);
    ASSERT_NE(comm1, nullptr);
    state1 = AwaitInit(comm1);
    if (state1 == ncclSuccess) ExchangeThree(comm1, 1, /*recv_first=*/true);
    EXPECT_EQ(ncclCommDestroy(comm1), ncclSuccess);
  });
  const Clock::time_point t0 = Clock::now();
  const ncclResult_t state0 = AwaitInit(comm0);
  const double joined_after = Seconds(t0);
  EXPECT_EQ(state0, ncclSuccess) << ncclGetLastError(comm0);
  EXPECT_LT(joined_after, 3.0);
  if (state0 == ncclSuccess) ExchangeThree(comm0, 0, /*recv_first=*/false);
  rank1.join();
  EXPECT_EQ(state1, ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm0), ncclSuccess);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(SimNcclP2p, NonBlockingInitWhosePeerNeverComesStaysInProgressUntilAborted) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = InitNonBlocking(2, id, 0);
  ASSERT_NE(comm, nullptr);
  // No timeout of its own: the caller's deadline decides (real NCCL leaves it to the caller).
  EXPECT_TRUE(StaysInProgress(comm, 0.3));
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  EXPECT_LT(Seconds(t0), 1.0);
  // The abort closed rank 0's socket: the rank may be created again.
  ncclComm_t again = nullptr;
  EXPECT_EQ(ncclCommInitRank(&again, 2, id, 0), ncclSuccess);
  if (again != nullptr) {
    EXPECT_EQ(ncclCommDestroy(again), ncclSuccess);
  }
}

TEST(SimNcclP2p, NonBlockingInitOfRanksThatDisagreeOnNranksFails) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // Rank 1 thinks there are 3 ranks: each refuses the other's hello, so neither ever joins.
  ncclComm_t two = InitNonBlocking(2, id, 0);
  ncclComm_t three = InitNonBlocking(3, id, 1);
  ASSERT_NE(two, nullptr);
  ASSERT_NE(three, nullptr);
  for (ncclComm_t c : {two, three}) {
    EXPECT_EQ(AwaitInit(c, 3.0), ncclRemoteError) << ncclGetLastError(c);
    EXPECT_NE(std::string(ncclGetLastError(c)).find("non-blocking init"), std::string::npos)
        << ncclGetLastError(c);
  }
  for (ncclComm_t c : {two, three}) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
}

TEST(SimNcclP2p, NonBlockingInitAcrossTwoProcessesThenExchanges) {
  const ncclUniqueId id = NewId();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = InitNonBlocking(2, id, 0);
  ASSERT_NE(comm, nullptr);
  const pid_t child = SpawnChild("DISABLED_NonBlockingInitThenExchangeAsRank1", id);
  const ncclResult_t state = AwaitInit(comm, 10.0);
  EXPECT_EQ(state, ncclSuccess) << ncclGetLastError(comm);
  if (state == ncclSuccess) {
    ExchangeThree(comm, 0, /*recv_first=*/false);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  } else {
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  }
  EXPECT_TRUE(ChildPassed(WaitChild(child))) << "the child (rank 1) failed: see its output above";
}

TEST(SimNcclP2pChild, DISABLED_NonBlockingInitThenExchangeAsRank1) {
  ncclUniqueId id;
  if (!ParentId(&id)) {
    GTEST_SKIP() << "a child process's half of a test"
                 << testing_ci::DeclaredCiSkip("its parent test runs it");
  }
  ncclComm_t comm = InitNonBlocking(2, id, 1);
  const ncclResult_t state = comm != nullptr ? AwaitInit(comm, 10.0) : ncclInternalError;
  EXPECT_EQ(state, ncclSuccess) << ncclGetLastError(comm);
  if (state == ncclSuccess) {
    ExchangeThree(comm, 1, /*recv_first=*/true);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  } else if (comm != nullptr) {
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  }
  ExitChild(HasFailure());
}

TEST(SimNcclP2p, InitRankConfigWithoutNonBlockingIsInitRank) {
  const ncclUniqueId id = NewId();
  ncclComm_t comms[2] = {nullptr, nullptr};
  // No config, then blocking = 1: both return at once, without waiting for the other rank.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(ncclCommInitRankConfig(&comms[0], 2, id, 0, nullptr), ncclSuccess);
  ncclResult_t state = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comms[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
  blocking.blocking = 1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(ncclCommInitRankConfig(&comms[1], 2, id, 1, &blocking), ncclSuccess);
  std::thread rank1([&comms] {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ExchangeThree(comms[1], 1, /*recv_first=*/true);
  });
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ExchangeThree(comms[0], 0, /*recv_first=*/false);
  rank1.join();
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);

  // NCCL_CONFIG_INITIALIZER alone leaves blocking undefined: blocking, as in NCCL.
  ncclConfig_t undefined = NCCL_CONFIG_INITIALIZER;
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&c, 2, NewId(), 0, &undefined), ncclSuccess);
  if (c != nullptr) {
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  // A config not from NCCL_CONFIG_INITIALIZER, or another blocking value, is refused.
  ncclConfig_t bad = NonBlocking();
  bad.magic = 0;
  ncclComm_t refused = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&refused, 2, NewId(), 0, &bad), ncclInvalidArgument);
  bad = NonBlocking();
  bad.blocking = 2;
  EXPECT_EQ(ncclCommInitRankConfig(&refused, 2, NewId(), 0, &bad), ncclInvalidArgument);
  EXPECT_EQ(refused, nullptr);
}

}  // namespace
}  // namespace kvserve::simtest
