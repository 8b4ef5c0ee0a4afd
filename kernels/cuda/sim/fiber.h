#ifndef KVSERVE_KERNELS_CUDA_SIM_FIBER_H_
#define KVSERVE_KERNELS_CUDA_SIM_FIBER_H_

// Fibers for simulated CUDA threads: a stack each and a hand-written x86-64 context switch
// (callee-saved registers, MXCSR and the x87 control word), ~20 ns a switch against ~1 us for
// swapcontext, which makes a system call for the signal mask. Under AddressSanitizer every switch
// is announced with the sanitizer's fiber API, so ASan follows the stacks.

#include <cstddef>
#include <vector>

namespace kvsim {

struct FiberStack {
  char* base = nullptr;  // lowest usable byte (a guard page lies below)
  size_t size = 0;
};

/// Stacks of one OS thread's fibers, made on demand and kept for reuse.
class StackCache {
 public:
  StackCache() = default;
  StackCache(const StackCache&) = delete;
  StackCache& operator=(const StackCache&) = delete;
  ~StackCache();
  /// The i-th stack (0-based), allocated on first use.
  FiberStack Get(size_t i);

 private:
  std::vector<FiberStack> stacks_;
};

using FiberEntry = void (*)(void* arg);

/// A stack pointer from which SwitchFiber starts entry(arg) on `stack`. `entry` must never
/// return: it ends by switching away for good.
void* PrepareFiber(FiberStack stack, FiberEntry entry, void* arg);

/// Saves the running context's stack pointer in *from and resumes the one saved in `to`.
extern "C" void kvsim_switch_fiber(void** from, void* to);

/// ASan's fiber annotations (no-ops without ASan). `fake` keeps ASan's fake-stack handle of the
/// context being left; pass null when that context will never run again.
/// ForgetFrames clears ASan's stack poisoning left on a stack by frames of a fiber that was
/// abandoned mid-way (after a kernel fault), before the stack is reused.
#if defined(__SANITIZE_ADDRESS__)
void AnnounceSwitch(void** fake, const void* to_bottom, size_t to_size);
void FinishSwitch(void* fake, const void** from_bottom, size_t* from_size);
void ForgetFrames(FiberStack stack);
#else
inline void AnnounceSwitch(void**, const void*, size_t) {}
inline void FinishSwitch(void*, const void**, size_t*) {}
inline void ForgetFrames(FiberStack) {}
#endif

}  // namespace kvsim

#endif  // KVSERVE_KERNELS_CUDA_SIM_FIBER_H_
