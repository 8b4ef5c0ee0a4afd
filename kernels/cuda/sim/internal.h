#ifndef KVSERVE_KERNELS_CUDA_SIM_INTERNAL_H_
#define KVSERVE_KERNELS_CUDA_SIM_INTERNAL_H_

// What the simulator's parts share: devices, streams (in-order queues that run work at once or
// record it while capturing), kernel launches and fault reporting. Not part of the CUDA surface.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_runtime_api.h"
#include "kvsim_device.h"

namespace kvsim {

/// One queued piece of stream work: a kernel, a copy, a GEMM, a collective.
using Op = std::function<void()>;

/// A launch as queued: owns the converted parameters.
struct KernelLaunch {
  LaunchConfig config;
  void* params = nullptr;
  InvokeFn invoke = nullptr;
  DestroyFn destroy = nullptr;
  int device = 0;
  KernelLaunch() = default;
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;
  ~KernelLaunch() {
    if (destroy != nullptr) destroy(params);
  }
};

/// The calling thread's current device (cudaSetDevice), 0 by default.
int CurrentDevice();
/// Number of simulated devices (KVSERVE_SIM_DEVICES, default 4).
int DeviceCount();
/// The device a stream belongs to (the null stream: the current device).
int StreamDevice(cudaStream_t stream);

/// Runs `op` now on `stream`, or appends it to the stream's capture. Returns the stream's or
/// device's error instead when there is one (the op then does not run). Before an op runs, the
/// stream's unfinished asynchronous work (see Pending) completes, as stream order requires.
cudaError_t Enqueue(cudaStream_t stream, Op op);

/// Asynchronous stream work: the one kind the simulator has is an NCCL collective, which a rank
/// posts and which completes when the last rank of its clique arrives. The stream waits for it
/// before its next op and in cudaStreamSynchronize, as a GPU stream waits for an NCCL kernel.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
  }
};
/// The stream an op runs on, while it runs (for ops that leave Pending work behind).
cudaStream_t ExecutingStream();
/// Makes `stream` wait for `pending` before anything after the running op.
void AddPending(cudaStream_t stream, std::shared_ptr<Pending> pending);

/// The device's sticky error (a kernel fault), cudaSuccess when none.
cudaError_t StickyError(int device);
/// Records a kernel fault on `device`: sticky until cudaDeviceReset, printed to stderr, and the
/// text cudaGetErrorString(code) returns from then on.
void RaiseFault(int device, cudaError_t code, const std::string& message);
/// Sets the calling thread's last error (cudaGetLastError).
void SetLastError(cudaError_t error);

/// Whether [p, p + bytes) lies inside one live device allocation.
bool IsDeviceRange(const void* p, size_t bytes);

/// Runs every block of a launch on the executor's threads (executor.cc). Faults are raised on
/// the launch's device.
void ExecuteKernel(const KernelLaunch& launch);

/// Turns the shared-memory race check on or off for later launches (default:
/// KVSERVE_SIM_RACECHECK). It needs the kernels built with access hooks.
void SetRaceCheck(bool on);
/// Whether the kernels of this build report their memory accesses (KVSIM_INSTRUMENTED): without,
/// neither the race check nor the simulator's shared-memory bounds check run (ASan's does).
bool AccessHooksBuiltIn();

/// Whether a kernel's wild access becomes cudaErrorIllegalAddress naming the thread (false under
/// AddressSanitizer, whose own handler reports it and stops the process).
bool CatchesFaults();

/// The executor's worker threads (KVSERVE_SIM_THREADS, default the machine's cores): runs
/// fn(0..n-1) over them and the calling thread, returning when all are done.
void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace kvsim

#endif  // KVSERVE_KERNELS_CUDA_SIM_INTERNAL_H_
