#ifndef KVSERVE_KERNELS_CUDA_SIM_INCLUDE_KVSIM_DEVICE_H_
#define KVSERVE_KERNELS_CUDA_SIM_INCLUDE_KVSIM_DEVICE_H_

// The device side of CUDA C++ as the simulator runs it: kernels/cuda/*.cu compile with the host
// compiler against this header and run on the CPU. Every CUDA thread is a fiber; the threads of a
// block run cooperatively on one OS thread, blocks spread over a thread pool
// (kernels/cuda/sim/executor.cc). What it checks, and what it cannot, is in
// docs/architecture.md ("The CUDA simulator").
//
// Launches go through KVSERVE_LAUNCH and dynamic shared memory through KVSERVE_DYNAMIC_SHARED
// (kernels/cuda/launch.cuh), which expand to the real syntax under nvcc.

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_fp16.h"
#include "cuda_runtime_api.h"

#define KVSERVE_CUDA_SIM 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Static shared memory: one copy per OS thread, and a block runs on one OS thread from start to
// end, so each running block has its own.
#define __shared__ thread_local
#define __constant__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct uint3 {
  unsigned x, y, z;
};

struct alignas(8) uint2 {
  unsigned x, y;
};

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

struct alignas(8) float2 {
  float x, y;
};

struct alignas(16) float4 {
  float x, y, z, w;
};

inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit like CUDA's
};

namespace kvsim {

/// What a CUDA thread sees of itself: its indices and its launch's shape.
struct ThreadIndex {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

/// The calling CUDA thread. A fiber never changes, so within one kernel call the answer is
/// constant (hence `const`: the compiler may keep it in a register).
__attribute__((const)) const ThreadIndex* Self();

// Barriers and warp collectives; `file`/`line` name the call site in diagnostics.
enum class BarrierKind : uint8_t { kPlain, kCount, kAnd, kOr };
int SyncThreads(BarrierKind kind, int predicate, const char* file, int line);

enum class WarpOp : uint8_t { kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSync };
/// One lane's part in a warp collective over `mask`; returns this lane's result bits.
uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                        const char* file, int line);
unsigned ActiveMask();

inline void SyncWarp(const char* file, int line, unsigned mask = 0xffffffffu) {
  WarpCollective(WarpOp::kSync, mask, 0, 0, 32, file, line);
}

template <typename T>
inline T Shuffle(WarpOp op, const char* file, int line, unsigned mask, T v, int arg,
                 int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move <= 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = WarpCollective(op, mask, bits, arg, width, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

/// Dynamic shared memory of the calling thread's block (exactly the launch's request).
void* DynamicShared();

// cp.async (kernels/cuda/ptx.cuh): copies are queued per thread, grouped by AsyncCommit, and
// performed by the AsyncWait that covers them (or when the thread exits), reading `src_bytes`
// of `src` and zero-filling the rest of `bytes` at `dst`.
void AsyncCopy(void* dst, const void* src, unsigned bytes, unsigned src_bytes);
void AsyncCommit();
/// Performs every committed group but the newest `groups_left`.
void AsyncWait(int groups_left);

// Atomics (device-wide: blocks of one launch run on several OS threads).
int AtomicAddI32(int* p, int v);
unsigned AtomicAddU32(unsigned* p, unsigned v);
unsigned long long AtomicAddU64(unsigned long long* p, unsigned long long v);
float AtomicAddF32(float* p, float v);
double AtomicAddF64(double* p, double v);
int AtomicMaxI32(int* p, int v);
int AtomicMinI32(int* p, int v);
unsigned AtomicMaxU32(unsigned* p, unsigned v);
unsigned AtomicMinU32(unsigned* p, unsigned v);
int AtomicExchI32(int* p, int v);
unsigned AtomicExchU32(unsigned* p, unsigned v);
float AtomicExchF32(float* p, float v);
int AtomicCasI32(int* p, int compare, int v);
unsigned AtomicCasU32(unsigned* p, unsigned compare, unsigned v);
unsigned long long AtomicCasU64(unsigned long long* p, unsigned long long compare,
                                unsigned long long v);
unsigned AtomicOrU32(unsigned* p, unsigned v);
unsigned AtomicAndU32(unsigned* p, unsigned v);
void ThreadFence();

// Launches.
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  cudaStream_t stream;
  const void* function;  // the kernel, for cudaFuncSetAttribute
  const char* name;      // for diagnostics
};
using InvokeFn = void (*)(const void* params);
using DestroyFn = void (*)(void* params);
/// Queues the launch on its stream (or records it while the stream captures); takes ownership
/// of `params`. Bad configurations set the last error as CUDA does.
void LaunchKernel(const LaunchConfig& config, void* params, InvokeFn invoke, DestroyFn destroy);
/// "Name<args>" from a __PRETTY_FUNCTION__ naming the kernel (kept for the process's life).
const char* KernelNameFromSignature(const char* pretty);

template <auto F>
const char* KernelName() {
  static const char* const name = KernelNameFromSignature(__PRETTY_FUNCTION__);
  return name;
}

template <auto F, typename... P, typename... A>
void LaunchWith(void (*)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  // Parameters are converted and copied at launch, as CUDA does.
  using Params = std::tuple<std::decay_t<P>...>;
  void* params = new Params(std::forward<A>(args)...);
  LaunchKernel(
      LaunchConfig{grid, block, shared_bytes, stream, reinterpret_cast<const void*>(F),
                   KernelName<F>()},
      params, [](const void* p) { std::apply(F, *static_cast<const Params*>(p)); },
      [](void* p) { delete static_cast<Params*>(p); });
}

template <auto F, typename... A>
void Launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, A&&... args) {
  LaunchWith<F>(F, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}

}  // namespace kvsim

#define threadIdx (::kvsim::Self()->thread_idx)
#define blockIdx (::kvsim::Self()->block_idx)
#define blockDim (::kvsim::Self()->block_dim)
#define gridDim (::kvsim::Self()->grid_dim)
inline constexpr int warpSize = 32;

#define __syncthreads() ::kvsim::SyncThreads(::kvsim::BarrierKind::kPlain, 1, __FILE__, __LINE__)
#define __syncthreads_count(p) \
  ::kvsim::SyncThreads(::kvsim::BarrierKind::kCount, (p) ? 1 : 0, __FILE__, __LINE__)
#define __syncthreads_and(p) \
  ::kvsim::SyncThreads(::kvsim::BarrierKind::kAnd, (p) ? 1 : 0, __FILE__, __LINE__)
#define __syncthreads_or(p) \
  ::kvsim::SyncThreads(::kvsim::BarrierKind::kOr, (p) ? 1 : 0, __FILE__, __LINE__)

#define __shfl_sync(mask, v, src, ...)                                     \
  ::kvsim::Shuffle(::kvsim::WarpOp::kShflIdx, __FILE__, __LINE__, mask, v, \
                   src __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_up_sync(mask, v, d, ...)                                   \
  ::kvsim::Shuffle(::kvsim::WarpOp::kShflUp, __FILE__, __LINE__, mask, v, \
                   d __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_down_sync(mask, v, d, ...)                                   \
  ::kvsim::Shuffle(::kvsim::WarpOp::kShflDown, __FILE__, __LINE__, mask, v, \
                   d __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_xor_sync(mask, v, m, ...)                                   \
  ::kvsim::Shuffle(::kvsim::WarpOp::kShflXor, __FILE__, __LINE__, mask, v, \
                   m __VA_OPT__(, ) __VA_ARGS__)
#define __ballot_sync(mask, p)                                                                  \
  static_cast<unsigned>(::kvsim::WarpCollective(::kvsim::WarpOp::kBallot, mask, (p) ? 1 : 0, 0, \
                                                32, __FILE__, __LINE__))
#define __any_sync(mask, p)                                                                 \
  static_cast<int>(::kvsim::WarpCollective(::kvsim::WarpOp::kAny, mask, (p) ? 1 : 0, 0, 32, \
                                           __FILE__, __LINE__))
#define __all_sync(mask, p)                                                                 \
  static_cast<int>(::kvsim::WarpCollective(::kvsim::WarpOp::kAll, mask, (p) ? 1 : 0, 0, 32, \
                                           __FILE__, __LINE__))
#define __syncwarp(...) ::kvsim::SyncWarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __activemask() ::kvsim::ActiveMask()
#define __threadfence() ::kvsim::ThreadFence()
#define __threadfence_block() ::kvsim::ThreadFence()

// Atomics, by CUDA's overloads.
inline int atomicAdd(int* p, int v) { return kvsim::AtomicAddI32(p, v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return kvsim::AtomicAddU32(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return kvsim::AtomicAddU64(p, v);
}
inline float atomicAdd(float* p, float v) { return kvsim::AtomicAddF32(p, v); }
inline double atomicAdd(double* p, double v) { return kvsim::AtomicAddF64(p, v); }
inline int atomicMax(int* p, int v) { return kvsim::AtomicMaxI32(p, v); }
inline int atomicMin(int* p, int v) { return kvsim::AtomicMinI32(p, v); }
inline unsigned atomicMax(unsigned* p, unsigned v) { return kvsim::AtomicMaxU32(p, v); }
inline unsigned atomicMin(unsigned* p, unsigned v) { return kvsim::AtomicMinU32(p, v); }
inline int atomicExch(int* p, int v) { return kvsim::AtomicExchI32(p, v); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return kvsim::AtomicExchU32(p, v); }
inline float atomicExch(float* p, float v) { return kvsim::AtomicExchF32(p, v); }
inline int atomicCAS(int* p, int c, int v) { return kvsim::AtomicCasI32(p, c, v); }
inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) {
  return kvsim::AtomicCasU32(p, c, v);
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c,
                                    unsigned long long v) {
  return kvsim::AtomicCasU64(p, c, v);
}
inline unsigned atomicOr(unsigned* p, unsigned v) { return kvsim::AtomicOrU32(p, v); }
inline unsigned atomicAnd(unsigned* p, unsigned v) { return kvsim::AtomicAndU32(p, v); }

// Math the kernels use beyond <cmath>: CUDA's integer min/max overloads and bit casts.
#define KVSIM_MINMAX_(T)                           \
  inline T max(T a, T b) { return a < b ? b : a; } \
  inline T min(T a, T b) { return b < a ? b : a; }
KVSIM_MINMAX_(int)
KVSIM_MINMAX_(unsigned)
KVSIM_MINMAX_(long)
KVSIM_MINMAX_(unsigned long)
KVSIM_MINMAX_(long long)
KVSIM_MINMAX_(unsigned long long)
#undef KVSIM_MINMAX_
inline float max(float a, float b) { return fmaxf(a, b); }
inline float min(float a, float b) { return fminf(a, b); }

inline unsigned __float_as_uint(float f) { return kvsim::FloatBits(f); }
inline float __uint_as_float(unsigned u) { return kvsim::BitsFloat(u); }
inline int __float_as_int(float f) { return static_cast<int>(__float_as_uint(f)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return fminf(fmaxf(x, 0.0f), 1.0f); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

#endif  // KVSERVE_KERNELS_CUDA_SIM_INCLUDE_KVSIM_DEVICE_H_
