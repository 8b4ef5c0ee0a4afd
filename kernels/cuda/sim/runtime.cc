// The CUDA runtime API on the simulator: devices with H200-class properties, device memory as
// host allocations, in-order streams, graph capture with CUDA's capture rules, events, function
// attributes with sm_90's shared-memory limits, and last-error / sticky-error semantics.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "internal.h"
#include "worker/planner/byte_size.h"

struct CUstream_st {
  int device = 0;
  bool capturing = false;
  bool invalidated = false;  // an illegal call happened during the capture
  cudaError_t invalidated_by = cudaSuccess;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::vector<kvsim::Op> captured;
  std::mutex pending_mu;
  std::vector<std::shared_ptr<kvsim::Pending>> pending;  // unfinished asynchronous work
};

struct CUgraph_st {
  int device = 0;
  std::vector<kvsim::Op> ops;
};

struct CUgraphExec_st {
  int device = 0;
  std::vector<kvsim::Op> ops;
};

struct CUevent_st {
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

namespace kvsim {
namespace {

constexpr size_t kDefaultSharedBytes = 48 * 1024;
constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_90's opt-in limit per block
constexpr int kMaxThreadsPerBlock = 1024;

/// A size from the environment ("2GiB", "512MiB", plain bytes), or `fallback`.
size_t EnvBytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  absl::StatusOr<int64_t> bytes = kvserve::ParseByteSize(v);
  if (!bytes.ok() || *bytes <= 0) {
    std::fprintf(stderr, "kvsim: %s: %s; using %zu bytes\n", name,
                 std::string(bytes.status().message()).c_str(), fallback);
    return fallback;
  }
  return static_cast<size_t>(*bytes);
}

struct Device {
  std::mutex mu;
  size_t capacity = 0;
  size_t used = 0;
  cudaError_t sticky = cudaSuccess;
  CUstream_st null_stream;
};

struct Allocation {
  size_t bytes;
  int device;
};

struct State {
  int count = 4;
  std::vector<std::unique_ptr<Device>> devices;
  std::mutex mem_mu;
  std::map<uintptr_t, Allocation> allocations;  // by start address
  std::unordered_set<uintptr_t> host_allocations;  // cudaHostAlloc
  std::mutex attr_mu;
  std::unordered_map<const void*, int> max_dynamic_shared;
  std::mutex diag_mu;
  std::deque<std::string> diagnostics;  // kept for the process's life: cudaGetErrorString's text
  std::atomic<const char*> launch_failure_text{nullptr};
  std::atomic<const char*> illegal_address_text{nullptr};
  std::atomic<int> global_captures{0};
  State() {
    if (const char* v = std::getenv("KVSERVE_SIM_DEVICES"); v != nullptr && *v != '\0') {
      count = std::clamp(std::atoi(v), 0, 64);
    }
    const size_t capacity = EnvBytes("KVSERVE_SIM_DEVICE_MEMORY", size_t{2} << 30);
    for (int i = 0; i < count; ++i) {
      devices.push_back(std::make_unique<Device>());
      devices.back()->capacity = capacity;
      devices.back()->null_stream.device = i;
    }
  }
};

State& S() {
  static State* s = new State();  // never destroyed: backends may be freed during teardown
  return *s;
}

thread_local int tls_device = 0;
thread_local cudaError_t tls_last_error = cudaSuccess;
thread_local std::vector<CUstream_st*> tls_captures;  // streams this thread is capturing

bool ValidDevice(int d) { return d >= 0 && d < S().count; }

CUstream_st* Resolve(cudaStream_t s) {
  return s != nullptr ? s : &S().devices[static_cast<size_t>(CurrentDevice())]->null_stream;
}

cudaError_t Ret(cudaError_t e) {
  if (e != cudaSuccess) tls_last_error = e;
  return e;
}

/// A call that may not happen while this thread (or, in global mode, any thread) captures:
/// invalidates those captures and returns the error to give, or cudaSuccess.
cudaError_t CheckCaptureSafe() {
  bool hit = false;
  for (CUstream_st* s : tls_captures) {
    if (s->mode == cudaStreamCaptureModeRelaxed) continue;
    s->invalidated = true;
    s->invalidated_by = cudaErrorStreamCaptureUnsupported;
    hit = true;
  }
  if (!hit && S().global_captures.load() > 0 && tls_captures.empty()) {
    // Another thread captures in global mode: this call is unsafe for it.
    hit = true;
  }
  return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

bool NoDevice() { return S().count == 0; }

}  // namespace

int CurrentDevice() { return tls_device; }
int DeviceCount() { return S().count; }
int StreamDevice(cudaStream_t stream) { return Resolve(stream)->device; }

cudaError_t StickyError(int device) {
  if (!ValidDevice(device)) return cudaErrorInvalidDevice;
  Device& d = *S().devices[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(d.mu);
  return d.sticky;
}

void RaiseFault(int device, cudaError_t code, const std::string& message) {
  State& s = S();
  const std::string text = "kvsim: " + message;
  std::fprintf(stderr, "%s\n", text.c_str());
  const char* saved;
  {
    std::lock_guard<std::mutex> lock(s.diag_mu);
    s.diagnostics.push_back(std::string(code == cudaErrorIllegalAddress
                                            ? "an illegal memory access was encountered"
                                            : "unspecified launch failure") +
                            " (" + text + ")");
    saved = s.diagnostics.back().c_str();
  }
  (code == cudaErrorIllegalAddress ? s.illegal_address_text : s.launch_failure_text).store(saved);
  if (ValidDevice(device)) {
    Device& d = *s.devices[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.sticky == cudaSuccess) d.sticky = code;
  }
  tls_last_error = code;
}

void SetLastError(cudaError_t error) { tls_last_error = error; }

bool IsDeviceRange(const void* p, size_t bytes) {
  State& s = S();
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(s.mem_mu);
  auto it = s.allocations.upper_bound(a);
  if (it == s.allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second.bytes;
}

namespace {

thread_local cudaStream_t tls_executing = nullptr;

int PendingTimeoutSeconds() {
  const char* v = std::getenv("KVSERVE_SIM_NCCL_TIMEOUT_S");
  const int s = v != nullptr ? std::atoi(v) : 0;
  return s > 0 ? s : 120;
}

/// Waits for the stream's asynchronous work; an error when some of it never finishes.
cudaError_t DrainPending(CUstream_st* s) {
  std::vector<std::shared_ptr<Pending>> pending;
  {
    std::lock_guard<std::mutex> lock(s->pending_mu);
    pending.swap(s->pending);
  }
  for (const std::shared_ptr<Pending>& p : pending) {
    std::unique_lock<std::mutex> lock(p->mu);
    if (!p->cv.wait_for(lock, std::chrono::seconds(PendingTimeoutSeconds()),
                        [&] { return p->done; })) {
      std::fprintf(stderr,
                   "kvsim: a stream waited %d s for an NCCL collective whose peers never "
                   "came\n",
                   PendingTimeoutSeconds());
      return cudaErrorLaunchFailure;
    }
  }
  return cudaSuccess;
}

/// Runs one op on a (non-capturing) stream, after the stream's asynchronous work.
cudaError_t RunOp(CUstream_st* s, cudaStream_t handle, const Op& op) {
  if (const cudaError_t e = DrainPending(s); e != cudaSuccess) return e;
  if (const cudaError_t e = StickyError(s->device); e != cudaSuccess) return e;
  tls_executing = handle;
  op();
  tls_executing = nullptr;
  return cudaSuccess;
}

}  // namespace

cudaStream_t ExecutingStream() { return tls_executing; }

void AddPending(cudaStream_t stream, std::shared_ptr<Pending> pending) {
  CUstream_st* s = Resolve(stream);
  std::lock_guard<std::mutex> lock(s->pending_mu);
  s->pending.push_back(std::move(pending));
}

cudaError_t Enqueue(cudaStream_t stream, Op op) {
  CUstream_st* s = Resolve(stream);
  if (s->capturing) {
    if (s->invalidated) return cudaErrorStreamCaptureInvalidated;
    s->captured.push_back(std::move(op));
    return cudaSuccess;
  }
  return RunOp(s, stream, op);
}

void LaunchKernel(const LaunchConfig& config, void* params, InvokeFn invoke, DestroyFn destroy) {
  auto launch = std::make_shared<KernelLaunch>();
  launch->config = config;
  launch->params = params;
  launch->invoke = invoke;
  launch->destroy = destroy;
  launch->device = StreamDevice(config.stream);
  const dim3 g = config.grid;
  const dim3 b = config.block;
  const int64_t threads = int64_t{b.x} * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0 || threads > kMaxThreadsPerBlock ||
      b.z > 64 || g.y > 65535 || g.z > 65535 || g.x > 0x7fffffffu) {
    SetLastError(cudaErrorInvalidConfiguration);
    std::fprintf(stderr,
                 "kvsim: %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)\n",
                 config.name, g.x, g.y, g.z, b.x, b.y, b.z);
    return;
  }
  size_t limit = kDefaultSharedBytes;
  {
    std::lock_guard<std::mutex> lock(S().attr_mu);
    auto it = S().max_dynamic_shared.find(config.function);
    if (it != S().max_dynamic_shared.end()) limit = static_cast<size_t>(it->second);
  }
  if (config.shared_bytes > limit) {
    SetLastError(cudaErrorInvalidValue);
    std::fprintf(stderr,
                 "kvsim: %s: %zu bytes of dynamic shared memory requested, %zu allowed (raise it "
                 "with cudaFuncAttributeMaxDynamicSharedMemorySize, up to %zu)\n",
                 config.name, config.shared_bytes, limit, kMaxSharedBytes);
    return;
  }
  const cudaError_t e = Enqueue(config.stream, [launch] { ExecuteKernel(*launch); });
  if (e != cudaSuccess) SetLastError(e);
}

}  // namespace kvsim

using kvsim::S;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  *count = S().count;
  return S().count == 0 ? kvsim::Ret(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!kvsim::ValidDevice(device)) return kvsim::Ret(cudaErrorInvalidDevice);
  kvsim::tls_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  if (kvsim::NoDevice()) return kvsim::Ret(cudaErrorNoDevice);
  *device = kvsim::tls_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  if (!kvsim::ValidDevice(device)) return kvsim::Ret(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "kvsim simulated H200");
  prop->totalGlobalMem = S().devices[static_cast<size_t>(device)]->capacity;
  prop->sharedMemPerBlock = kvsim::kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = kvsim::kMaxSharedBytes;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = kvsim::kMaxThreadsPerBlock;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->memoryBusWidth = 6144;
  prop->concurrentKernels = 1;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) { return cudaDriverGetVersion(version); }

cudaError_t cudaDeviceSynchronize(void) {
  if (const cudaError_t e = kvsim::CheckCaptureSafe(); e != cudaSuccess) return kvsim::Ret(e);
  // (Asynchronous work lives on streams; the null stream's is drained here too.)
  if (const cudaError_t e = kvsim::DrainPending(kvsim::Resolve(nullptr)); e != cudaSuccess) {
    return kvsim::Ret(e);
  }
  return kvsim::Ret(kvsim::StickyError(kvsim::CurrentDevice()));
}

cudaError_t cudaDeviceReset(void) {
  const int device = kvsim::CurrentDevice();
  if (!kvsim::ValidDevice(device)) return kvsim::Ret(cudaErrorInvalidDevice);
  kvsim::Device& d = *S().devices[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(d.mu);
  d.sticky = cudaSuccess;
  kvsim::tls_last_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t sticky = kvsim::StickyError(kvsim::CurrentDevice());
  const cudaError_t e = kvsim::tls_last_error;
  kvsim::tls_last_error = cudaSuccess;
  return sticky != cudaSuccess && sticky != cudaErrorInvalidDevice ? sticky : e;
}

cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t sticky = kvsim::StickyError(kvsim::CurrentDevice());
  return sticky != cudaSuccess && sticky != cudaErrorInvalidDevice ? sticky : kvsim::tls_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define KVSIM_NAME_(e) \
  case e:              \
    return #e;
    KVSIM_NAME_(cudaSuccess)
    KVSIM_NAME_(cudaErrorInvalidValue)
    KVSIM_NAME_(cudaErrorMemoryAllocation)
    KVSIM_NAME_(cudaErrorInitializationError)
    KVSIM_NAME_(cudaErrorInvalidConfiguration)
    KVSIM_NAME_(cudaErrorInvalidDevicePointer)
    KVSIM_NAME_(cudaErrorInvalidMemcpyDirection)
    KVSIM_NAME_(cudaErrorInsufficientDriver)
    KVSIM_NAME_(cudaErrorNoDevice)
    KVSIM_NAME_(cudaErrorInvalidDevice)
    KVSIM_NAME_(cudaErrorInvalidResourceHandle)
    KVSIM_NAME_(cudaErrorIllegalState)
    KVSIM_NAME_(cudaErrorNotReady)
    KVSIM_NAME_(cudaErrorIllegalAddress)
    KVSIM_NAME_(cudaErrorLaunchOutOfResources)
    KVSIM_NAME_(cudaErrorLaunchFailure)
    KVSIM_NAME_(cudaErrorStreamCaptureUnsupported)
    KVSIM_NAME_(cudaErrorStreamCaptureInvalidated)
    KVSIM_NAME_(cudaErrorStreamCaptureMerge)
    KVSIM_NAME_(cudaErrorStreamCaptureUnmatched)
    KVSIM_NAME_(cudaErrorStreamCaptureUnjoined)
    KVSIM_NAME_(cudaErrorStreamCaptureIsolation)
    KVSIM_NAME_(cudaErrorStreamCaptureImplicit)
    KVSIM_NAME_(cudaErrorCapturedEvent)
    KVSIM_NAME_(cudaErrorStreamCaptureWrongThread)
    KVSIM_NAME_(cudaErrorUnknown)
#undef KVSIM_NAME_
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalAddress: {
      const char* t = S().illegal_address_text.load();
      return t != nullptr ? t : "an illegal memory access was encountered";
    }
    case cudaErrorLaunchFailure: {
      const char* t = S().launch_failure_text.load();
      return t != nullptr ? t : "unspecified launch failure";
    }
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (const cudaError_t e = kvsim::CheckCaptureSafe(); e != cudaSuccess) return kvsim::Ret(e);
  const int device = kvsim::CurrentDevice();
  if (!kvsim::ValidDevice(device)) return kvsim::Ret(cudaErrorNoDevice);
  if (const cudaError_t e = kvsim::StickyError(device); e != cudaSuccess) return kvsim::Ret(e);
  kvsim::Device& d = *S().devices[static_cast<size_t>(device)];
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) & ~size_t{255};
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.used + rounded > d.capacity) return kvsim::Ret(cudaErrorMemoryAllocation);
    d.used += rounded;
  }
  void* p = nullptr;
  // The exact size: AddressSanitizer then reports a kernel's access one past the end.
  if (posix_memalign(&p, 256, std::max<size_t>(bytes, 1)) != 0) {
    std::lock_guard<std::mutex> lock(d.mu);
    d.used -= rounded;
    return kvsim::Ret(cudaErrorMemoryAllocation);
  }
  // Fresh device memory holds garbage on a GPU: 0xff bytes (NaN floats) make a read of
  // something never written show, for buffers small enough to fill cheaply.
  if (bytes <= (size_t{64} << 20)) std::memset(p, 0xff, bytes);
  {
    std::lock_guard<std::mutex> lock(S().mem_mu);
    S().allocations[reinterpret_cast<uintptr_t>(p)] = kvsim::Allocation{bytes, device};
  }
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  const cudaError_t capture = kvsim::CheckCaptureSafe();
  if (capture != cudaSuccess) return kvsim::Ret(capture);
  kvsim::Allocation a{};
  {
    std::lock_guard<std::mutex> lock(S().mem_mu);
    auto it = S().allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == S().allocations.end()) {
      std::fprintf(stderr, "kvsim: cudaFree(%p): not the start of a live device allocation\n", ptr);
      return kvsim::Ret(cudaErrorInvalidValue);
    }
    a = it->second;
    S().allocations.erase(it);
  }
  std::free(ptr);
  kvsim::Device& d = *S().devices[static_cast<size_t>(a.device)];
  std::lock_guard<std::mutex> lock(d.mu);
  d.used -= (std::max<size_t>(a.bytes, 1) + 255) & ~size_t{255};
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned /*flags*/) {
  if (ptr == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (const cudaError_t e = kvsim::CheckCaptureSafe(); e != cudaSuccess) return kvsim::Ret(e);
  void* p = nullptr;
  if (posix_memalign(&p, 4096, std::max<size_t>(bytes, 1)) != 0) {
    return kvsim::Ret(cudaErrorMemoryAllocation);
  }
  {
    std::lock_guard<std::mutex> lock(S().mem_mu);
    S().host_allocations.insert(reinterpret_cast<uintptr_t>(p));
  }
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(S().mem_mu);
    if (S().host_allocations.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      std::fprintf(stderr, "kvsim: cudaFreeHost(%p): not from cudaHostAlloc\n", ptr);
      return kvsim::Ret(cudaErrorInvalidValue);
    }
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  const int device = kvsim::CurrentDevice();
  if (!kvsim::ValidDevice(device)) return kvsim::Ret(cudaErrorNoDevice);
  kvsim::Device& d = *S().devices[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(d.mu);
  *free_bytes = d.capacity - d.used;
  *total_bytes = d.capacity;
  return cudaSuccess;
}

namespace {

/// Checks a copy's pointers against its direction; an error names the bad side.
cudaError_t CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                      const char* what) {
  const bool dst_dev = kvsim::IsDeviceRange(dst, bytes);
  const bool src_dev = kvsim::IsDeviceRange(src, bytes);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dst_dev;
      break;
    case cudaMemcpyDeviceToHost:
      ok = src_dev;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dst_dev && src_dev;
      break;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      break;
    default:
      return cudaErrorInvalidMemcpyDirection;
  }
  if (!ok) {
    std::fprintf(stderr,
                 "kvsim: %s of %zu bytes (kind %d): %s%s not inside one device allocation\n", what,
                 bytes, static_cast<int>(kind),
                 (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) && !dst_dev
                     ? "the destination "
                     : "",
                 (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) && !src_dev
                     ? "the source "
                     : "");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t e = CheckCopy(dst, src, bytes, kind, "cudaMemcpyAsync"); e != cudaSuccess) {
    return kvsim::Ret(e);
  }
  return kvsim::Ret(kvsim::Enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); }));
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t e = kvsim::CheckCaptureSafe(); e != cudaSuccess) return kvsim::Ret(e);
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!kvsim::IsDeviceRange(dst, bytes)) {
    std::fprintf(stderr, "kvsim: cudaMemset of %zu bytes at %p: not inside one device allocation\n",
                 bytes, dst);
    return kvsim::Ret(cudaErrorInvalidValue);
  }
  return kvsim::Ret(
      kvsim::Enqueue(stream, [dst, value, bytes] { std::memset(dst, value, bytes); }));
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (const cudaError_t e = kvsim::CheckCaptureSafe(); e != cudaSuccess) return kvsim::Ret(e);
  return cudaMemsetAsync(dst, value, bytes, nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned /*flags*/) {
  if (stream == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  if (kvsim::NoDevice()) return kvsim::Ret(cudaErrorNoDevice);
  auto* s = new CUstream_st();
  s->device = kvsim::CurrentDevice();
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return kvsim::Ret(cudaErrorInvalidResourceHandle);
  auto& caps = kvsim::tls_captures;
  caps.erase(std::remove(caps.begin(), caps.end(), stream), caps.end());
  if (stream->capturing && stream->mode == cudaStreamCaptureModeGlobal) --S().global_captures;
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = kvsim::Resolve(stream);
  if (s->capturing) {
    s->invalidated = true;
    s->invalidated_by = cudaErrorStreamCaptureUnsupported;
    return kvsim::Ret(cudaErrorStreamCaptureUnsupported);
  }
  if (const cudaError_t e = kvsim::CheckCaptureSafe(); e != cudaSuccess) return kvsim::Ret(e);
  if (const cudaError_t e = kvsim::DrainPending(s); e != cudaSuccess) return kvsim::Ret(e);
  return kvsim::Ret(kvsim::StickyError(s->device));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (stream == nullptr) return kvsim::Ret(cudaErrorStreamCaptureUnsupported);  // legacy stream
  if (stream->capturing) return kvsim::Ret(cudaErrorIllegalState);
  stream->capturing = true;
  stream->invalidated = false;
  stream->invalidated_by = cudaSuccess;
  stream->mode = mode;
  stream->captured.clear();
  kvsim::tls_captures.push_back(stream);
  if (mode == cudaStreamCaptureModeGlobal) ++S().global_captures;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  *graph = nullptr;
  if (stream == nullptr || !stream->capturing) return kvsim::Ret(cudaErrorIllegalState);
  auto& caps = kvsim::tls_captures;
  if (std::find(caps.begin(), caps.end(), stream) == caps.end()) {
    return kvsim::Ret(cudaErrorStreamCaptureWrongThread);
  }
  caps.erase(std::remove(caps.begin(), caps.end(), stream), caps.end());
  if (stream->mode == cudaStreamCaptureModeGlobal) --S().global_captures;
  stream->capturing = false;
  std::vector<kvsim::Op> ops = std::move(stream->captured);
  stream->captured.clear();
  if (stream->invalidated) {
    stream->invalidated = false;
    return kvsim::Ret(cudaErrorStreamCaptureInvalidated);
  }
  auto* g = new CUgraph_st();
  g->device = stream->device;
  g->ops = std::move(ops);
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  CUstream_st* s = kvsim::Resolve(stream);
  *status = !s->capturing    ? cudaStreamCaptureStatusNone
            : s->invalidated ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long /*flags*/) {
  if (exec == nullptr || graph == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  auto* e = new CUgraphExec_st();
  e->device = graph->device;
  e->ops = graph->ops;  // the launches are shared, their parameters frozen at capture
  *exec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  CUstream_st* s = kvsim::Resolve(stream);
  if (s->capturing) {
    for (const kvsim::Op& op : exec->ops) s->captured.push_back(op);
    return cudaSuccess;
  }
  for (const kvsim::Op& op : exec->ops) {
    // A fault stops the rest, as on a GPU.
    if (const cudaError_t e = kvsim::RunOp(s, stream, op); e != cudaSuccess) return kvsim::Ret(e);
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned /*flags*/) {
  if (event == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  *event = new CUevent_st();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return kvsim::Ret(cudaErrorInvalidResourceHandle);
  return kvsim::Ret(kvsim::Enqueue(stream, [event] {
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
  }));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return kvsim::Ret(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  if (!start->recorded || !end->recorded) return kvsim::Ret(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return kvsim::Ret(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > kvsim::kMaxSharedBytes) {
      std::fprintf(stderr,
                   "kvsim: cudaFuncSetAttribute: %d bytes of dynamic shared memory exceeds "
                   "sm_90's %zu\n",
                   value, kvsim::kMaxSharedBytes);
      return kvsim::Ret(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(S().attr_mu);
    S().max_dynamic_shared[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  return kvsim::Ret(cudaErrorInvalidValue);
}

}  // extern "C"
