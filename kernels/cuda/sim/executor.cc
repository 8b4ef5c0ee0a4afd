// The simulator's executor: runs a launch's blocks over a thread pool, each block's CUDA threads
// as fibers on one OS thread, and checks what a GPU would not tell you. Every failed check names
// the kernel, the block and the thread:
//  - a barrier that the block's live threads reach at different places, or never (deadlock);
//  - warp collectives whose mask names a lane that does not exist or has exited, that leave out
//    the calling lane, that read a lane outside the mask, or that lanes reach at different places;
//  - accesses beyond the dynamic shared memory the launch requested;
//  - with KVSERVE_SIM_RACECHECK=1, two threads of a block touching one byte in the same barrier
//    interval, at least one of them writing (a data race).
// The last two need the kernels built with access hooks (KVSIM_INSTRUMENTED: gcc's
// -fsanitize=thread instrumentation, whose __tsan_* calls land here instead of in libtsan).

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fiber.h"
#include "internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVSIM_ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSIM_ASAN_BUILD 1
#endif
#endif

namespace kvsim {
namespace {

constexpr int kWarpSize = 32;
constexpr size_t kRedzone = 256;  // bytes either side of dynamic shared memory that are checked

// (snprintf rather than string concatenation: gcc 12 at -O3 warns falsely on the latter.)
std::string Dim(uint3 v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", v.x, v.y, v.z);
  return buf;
}

std::string Site(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(base != nullptr ? base + 1 : file) + ":" + std::to_string(line);
}

std::string Hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string Lanes(unsigned mask) {
  std::string out;
  for (int l = 0; l < kWarpSize; ++l) {
    if (((mask >> l) & 1u) == 0) continue;
    int e = l;
    while (e + 1 < kWarpSize && ((mask >> (e + 1)) & 1u)) ++e;
    char buf[16];
    if (e > l) {
      std::snprintf(buf, sizeof buf, "%s%d-%d", out.empty() ? "" : ",", l, e);
    } else {
      std::snprintf(buf, sizeof buf, "%s%d", out.empty() ? "" : ",", l);
    }
    out += buf;
    l = e;
  }
  return out;
}

/// "function+0xoff" for a code address, for access diagnostics.
std::string Symbolize(const void* pc) {
  Dl_info info{};
  if (pc == nullptr || dladdr(pc, &info) == 0) return "?";
  std::string out;
  if (info.dli_sname != nullptr) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    out = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
    std::free(demangled);
    char off[32];
    std::snprintf(off, sizeof off, "+0x%zx",
                  static_cast<size_t>(static_cast<const char*>(pc) -
                                      static_cast<const char*>(info.dli_saddr)));
    out += off;
  } else if (info.dli_fname != nullptr) {
    char off[32];
    std::snprintf(off, sizeof off, "+0x%zx",
                  static_cast<size_t>(static_cast<const char*>(pc) -
                                      static_cast<const char*>(info.dli_fbase)));
    out = std::string(info.dli_fname) + off;
  }
  return out;
}

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

enum class State : uint8_t { kReady, kBarrier, kWarp, kDone, kAborted };

struct Block;

/// One cp.async copy, queued until the wait that covers it.
struct AsyncCopyOp {
  void* dst;
  const void* src;
  unsigned bytes;
  unsigned src_bytes;
  const void* pc;
};

struct Thread {
  ThreadIndex index;  // what threadIdx & co. read
  Block* block = nullptr;
  int linear = 0;
  int warp = 0;
  int lane = 0;
  State state = State::kReady;
  void* sp = nullptr;
  FiberStack stack;
  void* fake_stack = nullptr;  // ASan's, while suspended
  const char* wait_file = "";
  int wait_line = 0;
  BarrierKind barrier_kind = BarrierKind::kPlain;
  int barrier_pred = 0;
  uint64_t value = 0;   // this lane's input to the open collective
  int arg = 0;          // and its argument (a shuffle's source lane differs per lane)
  uint64_t result = 0;  // its output, written by the lane that completes the collective
  std::vector<AsyncCopyOp> async_open;                // cp.async since the last commit
  std::deque<std::vector<AsyncCopyOp>> async_groups;  // committed, not yet waited for
};

struct Collective {
  WarpOp op;
  unsigned mask;
  unsigned arrived;
  int arg;
  int width;
  const char* file;
  int line;
};

struct Warp {
  unsigned exists = 0;  // lanes the block has
  unsigned live = 0;    // lanes that have not exited
  uint32_t sync_epoch = 0;
  std::vector<Collective> open;
};

/// Who touched a byte in the current barrier interval.
struct Cell {
  uint64_t epoch = 0;
  int32_t writer = -1;
  uint32_t writer_sync = 0;  // the writer's warp's sync_epoch at the write
  int32_t reader = -1;
  uint32_t reader_sync = 0;
  int32_t reader2 = -1;  // a second reader other than `reader`
  uint32_t reader2_sync = 0;
  const void* writer_pc = nullptr;
  const void* reader_pc = nullptr;
};

struct Block {
  const KernelLaunch* launch = nullptr;
  uint3 index{};
  int num_threads = 0;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  char* dyn = nullptr;
  size_t dyn_bytes = 0;
  void* sched_sp = nullptr;
  void* sched_fake = nullptr;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
  int live = 0;
  uint64_t epoch = 1;  // the barrier interval, unique per OS thread (never reused: no clearing)
  int barrier_result = 0;
  bool failed = false;
  cudaError_t code = cudaSuccess;
  std::string error;
  bool race_check = false;
  // Shared memory the race check watches: the dynamic buffer and the kernel module's
  // thread-local block, where static __shared__ arrays live (found on first need).
  std::vector<Cell>* dyn_cells = nullptr;
  struct TlsRange* tls = nullptr;
  bool tls_tried = false;
  uintptr_t threads_lo = 0, threads_hi = 0;  // the Thread array (read through threadIdx & co.)
};

/// One module's thread-local block on one OS thread: static __shared__ memory of its kernels.
struct TlsRange {
  uintptr_t module = 0;  // load address
  uintptr_t lo = 0;
  size_t bytes = 0;
  std::vector<Cell> cells;
};

/// Per OS thread: fiber stacks, dynamic shared memory, race-check state and the block being run.
struct Worker {
  StackCache stacks;
  std::vector<char> shared;  // redzone | dynamic shared | redzone (instrumented builds)
  std::vector<Cell> dyn_cells;
  std::deque<TlsRange> tls;  // by module (a deque: blocks keep pointers)
  uint64_t next_epoch = 1;
  const void* stack_bottom = nullptr;  // this OS thread's own stack (the scheduler's)
  size_t stack_size = 0;
  Block block;
};

Worker& ThisWorker() {
  thread_local Worker worker;
  return worker;
}

thread_local Thread* tls_thread = nullptr;  // global-dynamic: the library is dlopen'ed

std::atomic<int> g_race_check{-1};  // -1: not decided yet (KVSERVE_SIM_RACECHECK)

bool RaceCheckRequested() {
  int v = g_race_check.load(std::memory_order_relaxed);
  if (v < 0) {
    v = EnvFlag("KVSERVE_SIM_RACECHECK") ? 1 : 0;
    g_race_check.store(v);
  }
  return v == 1;
}

const char* OpName(WarpOp op);
std::string Lanes(unsigned mask);

// ---- switching ------------------------------------------------------------------------------

void Resume(Block& b, Thread& t) {
  tls_thread = &t;
  AnnounceSwitch(&b.sched_fake, t.stack.base, t.stack.size);
  kvsim_switch_fiber(&b.sched_sp, t.sp);
  FinishSwitch(b.sched_fake, nullptr, nullptr);
  tls_thread = nullptr;
}

/// Leaves thread t's fiber: straight to the next ready thread of the block (lanes of a warp
/// meeting at a shuffle hand over to each other without the scheduler in between: half the
/// switches), or to the scheduler when none is ready or the block failed. Returns when t is
/// resumed (never, for kDone and kAborted).
void Yield(Thread& t) {
  Block& b = *t.block;
  const bool final = t.state == State::kDone || t.state == State::kAborted;
  Thread* next = nullptr;
  if (!b.failed) {
    const size_t n = b.threads.size();
    for (size_t i = 1, j = static_cast<size_t>(t.linear) + 1; i < n; ++i, ++j) {
      if (j == n) j = 0;
      if (b.threads[j].state == State::kReady) {
        next = &b.threads[j];
        break;
      }
    }
  }
  if (next != nullptr) {
    tls_thread = next;
    AnnounceSwitch(final ? nullptr : &t.fake_stack, next->stack.base, next->stack.size);
    kvsim_switch_fiber(&t.sp, next->sp);
  } else {
    AnnounceSwitch(final ? nullptr : &t.fake_stack, b.sched_bottom, b.sched_size);
    kvsim_switch_fiber(&t.sp, b.sched_sp);
  }
  FinishSwitch(t.fake_stack, nullptr, nullptr);
  tls_thread = &t;
}

std::string Where(const Thread& t) {
  return std::string(t.block->launch->config.name) + ": block " + Dim(t.block->index) + " thread " +
         Dim(t.index.thread_idx);
}

void FailBlock(Block& b, cudaError_t code, std::string message) {
  if (b.failed) return;
  b.failed = true;
  b.code = code;
  b.error = std::move(message);
}

/// Leaves thread t's fiber for good, after FailBlock (KVSIM_FAIL).
[[noreturn]] void Abandon(Thread& t) {
  t.state = State::kAborted;
  Yield(t);
  __builtin_trap();  // an aborted fiber is never resumed
}

// Fails the block from inside thread t's fiber and abandons the fiber. A macro, so that the
// message's temporaries die before the fiber is left (its stack is never unwound).
#define KVSIM_FAIL(t, code, message)                            \
  do {                                                          \
    FailBlock(*(t).block, (code), Where(t) + ": " + (message)); \
    Abandon(t);                                                 \
  } while (0)

// ---- faults ------------------------------------------------------------------------------------
// A wild pointer in a kernel faults the OS thread. On a GPU that is cudaErrorIllegalAddress; here
// the fault handler (on an alternate stack, so a fiber's stack overflow is caught too) fails the
// block from inside the faulting fiber, naming kernel, block, thread and address, and the
// process goes on. Faults outside kernels go to the handler that was there before. Under
// AddressSanitizer, ASan's own handler reports instead.

#ifndef KVSIM_ASAN_BUILD
struct sigaction g_old_segv {};
struct sigaction g_old_bus {};

void OnFault(int sig, siginfo_t* info, void* /*context*/) {
  Thread* t = tls_thread;
  if (t == nullptr) {
    sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, nullptr);
    return;  // the faulting instruction runs again under the previous handler
  }
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const auto base = reinterpret_cast<uintptr_t>(t->stack.base);
  char what[160];
  if (addr < base && addr + 65536 >= base) {
    std::snprintf(what, sizeof what, "stack overflow (the simulator gives a thread %zu KiB)",
                  t->stack.size >> 10);
  } else {
    std::snprintf(what, sizeof what, "illegal memory access at address %#zx (%s)",
                  static_cast<size_t>(addr), sig == SIGSEGV ? "SIGSEGV" : "SIGBUS");
  }
  KVSIM_FAIL(*t, cudaErrorIllegalAddress, what);  // switches to the scheduler for good
}
#endif

void InstallFaultHandler() {
#ifndef KVSIM_ASAN_BUILD
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &OnFault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
  // Each OS thread that runs blocks needs its own alternate stack.
  thread_local std::vector<char> alt;
  if (alt.empty()) {
    alt.resize(size_t{64} << 10);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
  }
#endif
}

void FlushAsyncCopies(Thread& t);

void FiberMain(void* arg) {
  Thread& t = *static_cast<Thread*>(arg);
  Block& b = *t.block;
  FinishSwitch(nullptr, nullptr, nullptr);
  b.launch->invoke(b.launch->params);
  FlushAsyncCopies(t);
  t.state = State::kDone;
  --b.live;
  Warp& w = b.warps[static_cast<size_t>(t.warp)];
  w.live &= ~(1u << t.lane);
  for (const Collective& c : w.open) {
    if ((c.mask >> t.lane) & 1u) {
      FailBlock(b, cudaErrorLaunchFailure,
                Where(t) + ": exited while lanes " + Lanes(c.arrived) + " wait for it in " +
                    OpName(c.op) + " at " + Site(c.file, c.line) + " (mask " + Hex(c.mask) + ")");
    }
  }
  Yield(t);
  __builtin_trap();
}

// ---- the block scheduler ----------------------------------------------------------------------

/// "threads 0-15 wait in __shfl_xor_sync at f.cu:62; threads 16-31 at __syncthreads f.cu:64":
/// the waiting threads grouped by what they wait at, by linear thread id.
std::string DescribeWait(const Block& b) {
  std::string out;
  size_t i = 0;
  const size_t n = b.threads.size();
  while (i < n) {
    const Thread& t = b.threads[i];
    if (t.state != State::kBarrier && t.state != State::kWarp) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < n && b.threads[j].state == t.state && b.threads[j].wait_line == t.wait_line &&
           std::strcmp(b.threads[j].wait_file, t.wait_file) == 0) {
      ++j;
    }
    char range[64];
    if (j - i > 1) {
      std::snprintf(range, sizeof range, "threads %zu-%zu", i, j - 1);
    } else {
      std::snprintf(range, sizeof range, "thread %zu", i);
    }
    out +=
        (out.empty() ? "" : "; ") + std::string(range) +
        (t.state == State::kBarrier ? " wait at __syncthreads " : " wait in a warp collective ") +
        Site(t.wait_file, t.wait_line);
    i = j;
  }
  return out;
}

/// All live threads wait at a barrier: check they agree, then let them through.
void ReleaseBarrier(Block& b) {
  const Thread* first = nullptr;
  int count = 0;
  int all = 1;
  int any = 0;
  for (Thread& t : b.threads) {
    if (t.state != State::kBarrier) continue;
    if (first == nullptr) {
      first = &t;
    } else if (t.wait_line != first->wait_line || std::strcmp(t.wait_file, first->wait_file) != 0 ||
               t.barrier_kind != first->barrier_kind) {
      FailBlock(b, cudaErrorLaunchFailure,
                std::string(b.launch->config.name) + ": block " + Dim(b.index) +
                    ": threads wait at different barriers: thread " + Dim(first->index.thread_idx) +
                    " at " + Site(first->wait_file, first->wait_line) + ", thread " +
                    Dim(t.index.thread_idx) + " at " + Site(t.wait_file, t.wait_line));
      return;
    }
    count += t.barrier_pred;
    all &= t.barrier_pred;
    any |= t.barrier_pred;
  }
  switch (first->barrier_kind) {
    case BarrierKind::kPlain:
      b.barrier_result = 0;
      break;
    case BarrierKind::kCount:
      b.barrier_result = count;
      break;
    case BarrierKind::kAnd:
      b.barrier_result = all;
      break;
    case BarrierKind::kOr:
      b.barrier_result = any;
      break;
  }
  for (Thread& t : b.threads) {
    if (t.state == State::kBarrier) t.state = State::kReady;
  }
  b.epoch = ++ThisWorker().next_epoch;  // a new barrier interval for the race check
}

void RunBlock(Worker& w, const KernelLaunch& k, int64_t linear_block) {
  InstallFaultHandler();
  const LaunchConfig& c = k.config;
  Block& b = w.block;
  b.launch = &k;
  b.index = uint3{static_cast<unsigned>(linear_block % c.grid.x),
                  static_cast<unsigned>(linear_block / c.grid.x % c.grid.y),
                  static_cast<unsigned>(linear_block / (int64_t{c.grid.x} * c.grid.y))};
  b.num_threads = static_cast<int>(c.block.x * c.block.y * c.block.z);
  b.failed = false;
  b.code = cudaSuccess;
  b.error.clear();
  b.epoch = ++w.next_epoch;
  b.barrier_result = 0;
  b.race_check = RaceCheckRequested();
  b.tls = nullptr;
  b.tls_tried = false;
  if (b.race_check && w.dyn_cells.size() < c.shared_bytes) w.dyn_cells.resize(c.shared_bytes);
  b.dyn_cells = &w.dyn_cells;
  b.live = b.num_threads;
  if (w.stack_bottom == nullptr) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      size_t size = 0;
      pthread_attr_getstack(&attr, &addr, &size);
      w.stack_bottom = addr;
      w.stack_size = size;
      pthread_attr_destroy(&attr);
    }
  }
  b.sched_bottom = w.stack_bottom;
  b.sched_size = w.stack_size;
  // Dynamic shared memory: exactly the request, filled with 0xff (NaN as floats) so a read of
  // something never written shows.
  std::vector<char> exact;
#ifdef KVSIM_INSTRUMENTED
  if (w.shared.size() < c.shared_bytes + 2 * kRedzone)
    w.shared.resize(c.shared_bytes + 2 * kRedzone);
  b.dyn = w.shared.data() + kRedzone;
#else
  // No access hooks: an exact heap block, so AddressSanitizer catches overruns.
  exact.resize(std::max<size_t>(c.shared_bytes, 1));
  b.dyn = exact.data();
#endif
  b.dyn_bytes = c.shared_bytes;
  std::memset(b.dyn, 0xff, c.shared_bytes);

  b.threads.assign(static_cast<size_t>(b.num_threads), Thread{});
  b.warps.assign(static_cast<size_t>((b.num_threads + kWarpSize - 1) / kWarpSize), Warp{});
  b.threads_lo = reinterpret_cast<uintptr_t>(b.threads.data());
  b.threads_hi = b.threads_lo + sizeof(Thread) * b.threads.size();
  for (int i = 0; i < b.num_threads; ++i) {
    Thread& t = b.threads[static_cast<size_t>(i)];
    t.index.thread_idx = uint3{static_cast<unsigned>(i % c.block.x),
                               static_cast<unsigned>(i / c.block.x % c.block.y),
                               static_cast<unsigned>(i / (c.block.x * c.block.y))};
    t.index.block_idx = b.index;
    t.index.block_dim = c.block;
    t.index.grid_dim = c.grid;
    t.block = &b;
    t.linear = i;
    t.warp = i / kWarpSize;
    t.lane = i % kWarpSize;
    t.stack = w.stacks.Get(static_cast<size_t>(i));
    t.sp = PrepareFiber(t.stack, &FiberMain, &t);
    b.warps[static_cast<size_t>(t.warp)].exists |= 1u << t.lane;
  }
  for (Warp& warp : b.warps) warp.live = warp.exists;

  for (;;) {
    // Run the first ready thread; fibers hand over among themselves until none is ready.
    Thread* ready = nullptr;
    for (Thread& t : b.threads) {
      if (t.state == State::kReady) {
        ready = &t;
        break;
      }
    }
    if (ready != nullptr) {
      Resume(b, *ready);
      if (b.failed) break;
      continue;
    }
    if (b.live == 0) break;
    int at_barrier = 0;
    for (const Thread& t : b.threads) at_barrier += t.state == State::kBarrier;
    if (at_barrier == b.live) {
      ReleaseBarrier(b);
      if (b.failed) break;
      continue;
    }
    FailBlock(b, cudaErrorLaunchFailure,
              std::string(c.name) + ": block " + Dim(b.index) + ": deadlock: " + DescribeWait(b));
    break;
  }
  if (b.failed) {
    for (Thread& t : b.threads) {
      if (t.state != State::kDone) ForgetFrames(t.stack);  // abandoned mid-way
    }
  }
  // Abandoned fibers (after a failure) hold only trivially destructible kernel state.
}

// ---- warp collectives --------------------------------------------------------------------------

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kShflIdx:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kSync:
      return "__syncwarp";
  }
  return "?";
}

/// The lane whose value lane `lane` receives, or -1 for its own.
// The lane `lane` reads in shuffle `c`, given its own argument `arg` (__shfl_sync's source lane
// differs per lane; the up/down/xor deltas are the same in every lane, WarpCollective checks).
int SourceLane(const Collective& c, int lane, int arg) {
  const int seg = lane & ~(c.width - 1);
  switch (c.op) {
    case WarpOp::kShflIdx:
      return seg + ((arg % c.width) + c.width) % c.width;
    case WarpOp::kShflUp:
      return lane - arg >= seg ? lane - arg : -1;
    case WarpOp::kShflDown:
      return lane + arg < seg + c.width ? lane + arg : -1;
    case WarpOp::kShflXor: {
      const int src = lane ^ arg;
      return src < seg + c.width ? src : -1;
    }
    default:
      return -1;
  }
}

void Complete(Block& b, Warp& w, const Collective& c, int warp_index, Thread& caller) {
  const int base = warp_index * kWarpSize;
  unsigned votes = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    if ((c.mask >> l) & 1u) {
      if (b.threads[static_cast<size_t>(base + l)].value != 0) votes |= 1u << l;
    }
  }
  for (int l = 0; l < kWarpSize; ++l) {
    if (((c.mask >> l) & 1u) == 0) continue;
    Thread& t = b.threads[static_cast<size_t>(base + l)];
    switch (c.op) {
      case WarpOp::kShflIdx:
      case WarpOp::kShflUp:
      case WarpOp::kShflDown:
      case WarpOp::kShflXor: {
        const int src = SourceLane(c, l, t.arg);
        if (src >= 0 && ((c.mask >> src) & 1u) == 0) {
          KVSIM_FAIL(caller, cudaErrorLaunchFailure,
                     std::string(OpName(c.op)) + " at " + Site(c.file, c.line) + ": lane " +
                         std::to_string(l) + " reads lane " + std::to_string(src) +
                         ", which is not in the mask " + Hex(c.mask));
        }
        t.result = src >= 0 ? b.threads[static_cast<size_t>(base + src)].value : t.value;
        break;
      }
      case WarpOp::kBallot:
        t.result = votes;
        break;
      case WarpOp::kAny:
        t.result = votes != 0;
        break;
      case WarpOp::kAll:
        t.result = votes == c.mask;
        break;
      case WarpOp::kSync:
        t.result = 0;
        break;
    }
    if (&t != &caller) t.state = State::kReady;
  }
  ++w.sync_epoch;
}

// ---- the access hooks and the race check -----------------------------------------------------

bool Ordered(const Block& b, int32_t other, uint32_t other_sync, const Thread& t) {
  if (other == t.linear) return true;
  const int other_warp = other / kWarpSize;
  // Same warp with a warp collective in between: ordered (both took part in it).
  return other_warp == t.warp && other_sync != b.warps[static_cast<size_t>(t.warp)].sync_epoch;
}

/// The calling thread's thread-local block of the module holding the running kernel (null when
/// that module has none, or has not touched it on this thread yet).
TlsRange* ModuleTls(Block& b) {
  if (b.tls_tried) return b.tls;
  b.tls_tried = true;
  Dl_info info{};
  if (dladdr(b.launch->config.function, &info) == 0) return nullptr;
  const auto module = reinterpret_cast<uintptr_t>(info.dli_fbase);
  Worker& w = ThisWorker();
  for (TlsRange& r : w.tls) {
    if (r.module == module) return b.tls = &r;
  }
  struct Query {
    uintptr_t module;
    uintptr_t lo = 0;
    size_t bytes = 0;
  } q{module};
  dl_iterate_phdr(
      [](dl_phdr_info* m, size_t, void* data) {
        auto* q = static_cast<Query*>(data);
        if (static_cast<uintptr_t>(m->dlpi_addr) != q->module) return 0;
        for (int i = 0; i < m->dlpi_phnum; ++i) {
          if (m->dlpi_phdr[i].p_type == PT_TLS && m->dlpi_tls_data != nullptr) {
            q->lo = reinterpret_cast<uintptr_t>(m->dlpi_tls_data);
            q->bytes = m->dlpi_phdr[i].p_memsz;
          }
        }
        return 1;
      },
      &q);
  if (q.lo == 0) {
    b.tls_tried = false;  // not allocated on this thread yet: ask again at the next access
    return nullptr;
  }
  w.tls.push_back(TlsRange{module, q.lo, q.bytes, std::vector<Cell>(q.bytes)});
  return b.tls = &w.tls.back();
}

std::string DescribeAddress(const Block& b, uintptr_t a) {
  const auto lo = reinterpret_cast<uintptr_t>(b.dyn);
  if (a >= lo && a < lo + b.dyn_bytes) {
    return "dynamic shared memory byte " + std::to_string(a - lo);
  }
  if (b.tls != nullptr && a >= b.tls->lo && a < b.tls->lo + b.tls->bytes) {
    return "static __shared__ memory (byte " + std::to_string(a - b.tls->lo) +
           " of the kernel module's thread-local block)";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "address %#zx", static_cast<size_t>(a));
  return buf;
}

void RaceCheck(Thread& t, Cell* cells, uintptr_t a, size_t size, bool write, const void* pc) {
  Block& b = *t.block;
  const uint32_t sync = b.warps[static_cast<size_t>(t.warp)].sync_epoch;
  for (size_t i = 0; i < size; ++i) {
    Cell& cell = cells[i];
    if (cell.epoch != b.epoch) cell = Cell{b.epoch};
    auto race = [&](int32_t other, const void* other_pc, bool other_wrote) {
      const Thread& o = b.threads[static_cast<size_t>(other)];
      KVSIM_FAIL(t, cudaErrorLaunchFailure,
                 std::string("data race on ") + DescribeAddress(b, a + i) + ": this thread " +
                     (write ? "writes" : "reads") + " it (" + Symbolize(pc) + ") and thread " +
                     Dim(o.index.thread_idx) + " " + (other_wrote ? "wrote" : "read") + " it (" +
                     Symbolize(other_pc) + ") with no __syncthreads between");
    };
    if (cell.writer >= 0 && !Ordered(b, cell.writer, cell.writer_sync, t)) {
      race(cell.writer, cell.writer_pc, true);
    }
    if (write) {
      if (cell.reader >= 0 && !Ordered(b, cell.reader, cell.reader_sync, t)) {
        race(cell.reader, cell.reader_pc, false);
      }
      if (cell.reader2 >= 0 && !Ordered(b, cell.reader2, cell.reader2_sync, t)) {
        race(cell.reader2, cell.reader_pc, false);
      }
      cell.writer = t.linear;
      cell.writer_sync = sync;
      cell.writer_pc = pc;
      cell.reader = cell.reader2 = -1;
    } else if (cell.reader < 0 || cell.reader == t.linear) {
      cell.reader = t.linear;
      cell.reader_sync = sync;
      cell.reader_pc = pc;
    } else {
      cell.reader2 = t.linear;
      cell.reader2_sync = sync;
    }
  }
}

// Global-memory read accounting (kvsim_count_global_reads): bytes every kernel thread loads
// from device allocations, each load counted (a byte read twice counts twice, as it costs twice
// on a GPU that misses its caches).
// Reads inside a watched range are also counted apart (kvsim_watch_reads).
constexpr int kReadWatches = 4;
struct ReadWatch {
  std::atomic<uintptr_t> lo{0};
  std::atomic<uintptr_t> hi{0};
  std::atomic<uint64_t> bytes{0};
};
std::atomic<bool> g_count_reads{false};
std::atomic<uint64_t> g_read_bytes{0};
ReadWatch g_read_watches[kReadWatches];

void CountGlobalRead(Block& b, uintptr_t a, size_t size) {
  const auto lo = reinterpret_cast<uintptr_t>(b.dyn);
  if (a >= lo && a < lo + b.dyn_bytes) return;
  TlsRange* tls = ModuleTls(b);
  if (tls != nullptr && a >= tls->lo && a < tls->lo + tls->bytes) return;
  if (!IsDeviceRange(reinterpret_cast<const void*>(a), size)) return;
  g_read_bytes.fetch_add(size, std::memory_order_relaxed);
  for (ReadWatch& w : g_read_watches) {
    if (a >= w.lo.load(std::memory_order_relaxed) &&
        a + size <= w.hi.load(std::memory_order_relaxed)) {
      w.bytes.fetch_add(size, std::memory_order_relaxed);
    }
  }
}

inline void OnAccess(const void* addr, size_t size, bool write, const void* pc) {
  Thread* t = tls_thread;
  if (t == nullptr) return;  // host code in an instrumented file
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const auto stack_lo = reinterpret_cast<uintptr_t>(t->stack.base);
  if (a >= stack_lo && a < stack_lo + t->stack.size) return;  // the thread's own locals
  Block& b = *t->block;
  const auto lo = reinterpret_cast<uintptr_t>(b.dyn);
  const uintptr_t hi = lo + b.dyn_bytes;
  if ((a + size > hi && a < hi + kRedzone) || (a < lo && a + size > lo - kRedzone)) {
    const long long off = static_cast<long long>(a) - static_cast<long long>(lo);
    KVSIM_FAIL(*t, cudaErrorIllegalAddress,
               std::string(write ? "write" : "read") + " of " + std::to_string(size) +
                   " bytes at dynamic shared memory byte " + std::to_string(off) +
                   ", outside the " + std::to_string(b.dyn_bytes) +
                   " bytes the launch requested (" + Symbolize(pc) + ")");
  }
  if (!write && g_count_reads.load(std::memory_order_relaxed)) CountGlobalRead(b, a, size);
  if (!b.race_check) return;
  // Shared memory only, like compute-sanitizer's racecheck: dynamic, then static.
  if (a >= lo && a + size <= hi) {
    RaceCheck(*t, b.dyn_cells->data() + (a - lo), a, size, write, pc);
    return;
  }
  TlsRange* tls = ModuleTls(b);
  if (tls != nullptr && a >= tls->lo && a + size <= tls->lo + tls->bytes) {
    RaceCheck(*t, tls->cells.data() + (a - tls->lo), a, size, write, pc);
  }
}

// ---- cp.async -----------------------------------------------------------------------------------
// A thread's copies wait in its queue until the cp.async.wait_group that covers them, the latest
// moment the PTX ISA lets a program rely on them: a tile read before its wait is stale here.

void PerformAsyncCopy(const AsyncCopyOp& c) {
  if (c.src_bytes > 0) OnAccess(c.src, c.src_bytes, false, c.pc);
  OnAccess(c.dst, c.bytes, true, c.pc);
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
}

// Not inlined into FiberMain, whose frame never returns (the fiber ends by switching away): under
// AddressSanitizer, scope-poisoned slots of an earlier fiber's FiberMain on the reused stack
// would flag this loop's temporaries (stack-use-after-scope).
__attribute__((noinline)) void FlushAsyncCopies(Thread& t) {
  while (!t.async_groups.empty()) {
    const std::vector<AsyncCopyOp>& g = t.async_groups.front();
    for (size_t i = 0; i < g.size(); ++i) PerformAsyncCopy(g[i]);
    t.async_groups.pop_front();
  }
  for (size_t i = 0; i < t.async_open.size(); ++i) PerformAsyncCopy(t.async_open[i]);
  t.async_open.clear();
}

}  // namespace

void AsyncCopy(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
  Thread* t = tls_thread;
  if (t == nullptr) return;
  const void* pc = __builtin_return_address(0);
  // The GPU may write the bytes any time from here to the wait: the race check sees a write now
  // (other threads still reading the buffer without a barrier in between race with it) and
  // again when the copy is made.
  OnAccess(dst, bytes, true, pc);
  t->async_open.push_back(AsyncCopyOp{dst, src, bytes, std::min(src_bytes, bytes), pc});
}

void AsyncCommit() {
  Thread* t = tls_thread;
  if (t == nullptr) return;
  t->async_groups.push_back(std::move(t->async_open));
  t->async_open.clear();
}

void AsyncWait(int groups_left) {
  Thread* t = tls_thread;
  if (t == nullptr) return;
  while (t->async_groups.size() > static_cast<size_t>(std::max(groups_left, 0))) {
    for (const AsyncCopyOp& c : t->async_groups.front()) PerformAsyncCopy(c);
    t->async_groups.pop_front();
  }
}

namespace {

// ---- the pool ----------------------------------------------------------------------------------

class Pool {
 public:
  Pool() {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("KVSERVE_SIM_THREADS"); env != nullptr && *env != '\0') {
      n = std::atoi(env);
    }
    n = std::clamp(n, 1, 256);
    for (int i = 0; i + 1 < n; ++i) workers_.emplace_back([this] { Loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int helpers() const { return static_cast<int>(workers_.size()); }
  void Submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: launches may run during static teardown
  return *pool;
}

}  // namespace

void SetRaceCheck(bool on) { g_race_check.store(on ? 1 : 0); }

bool CatchesFaults() {
#ifdef KVSIM_ASAN_BUILD
  return false;
#else
  return true;
#endif
}

bool AccessHooksBuiltIn() {
#ifdef KVSIM_INSTRUMENTED
  return true;
#else
  return false;
#endif
}

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  Pool& pool = ThePool();
  const int helpers = static_cast<int>(std::min<int64_t>(pool.helpers(), n - 1));
  if (helpers == 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    int running = 0;
  };
  auto shared = std::make_shared<Shared>();
  shared->running = helpers;
  auto body = [shared, n, &fn] {
    for (int64_t i; (i = shared->next.fetch_add(1)) < n;) fn(i);
  };
  for (int h = 0; h < helpers; ++h) {
    pool.Submit([shared, body] {
      body();
      std::lock_guard<std::mutex> lock(shared->mu);
      if (--shared->running == 0) shared->cv.notify_all();
    });
  }
  body();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->running == 0; });
}

void ExecuteKernel(const KernelLaunch& k) {
  const LaunchConfig& c = k.config;
  const int64_t blocks = int64_t{c.grid.x} * c.grid.y * c.grid.z;
  std::atomic<bool> failed{false};
  std::mutex mu;
  cudaError_t code = cudaSuccess;
  std::string error;
  ParallelFor(blocks, [&](int64_t i) {
    if (failed.load(std::memory_order_relaxed)) return;
    Worker& w = ThisWorker();
    RunBlock(w, k, i);
    if (w.block.failed) {
      std::lock_guard<std::mutex> lock(mu);
      if (!failed.exchange(true)) {
        code = w.block.code;
        error = w.block.error;
      }
    }
  });
  if (failed.load()) RaiseFault(k.device, code, error);
}

// ---- the device-side API -----------------------------------------------------------------------

const ThreadIndex* Self() { return &tls_thread->index; }

int SyncThreads(BarrierKind kind, int predicate, const char* file, int line) {
  Thread& t = *tls_thread;
  t.state = State::kBarrier;
  t.barrier_kind = kind;
  t.barrier_pred = predicate;
  t.wait_file = file;
  t.wait_line = line;
  Yield(t);
  return t.block->barrier_result;
}

uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                        const char* file, int line) {
  Thread& t = *tls_thread;
  Block& b = *t.block;
  Warp& w = b.warps[static_cast<size_t>(t.warp)];
  // The text of a diagnostic, made only when one is given (this is the hot path of shuffles).
  auto what = [&] { return std::string(OpName(op)) + " at " + Site(file, line); };
  if (width <= 0 || width > kWarpSize || (width & (width - 1)) != 0) {
    KVSIM_FAIL(t, cudaErrorLaunchFailure,
               what() + ": width " + std::to_string(width) + " is not a power of two in [1, 32]");
  }
  if (((mask >> t.lane) & 1u) == 0) {
    KVSIM_FAIL(t, cudaErrorLaunchFailure,
               what() + ": the mask " + Hex(mask) + " leaves out the calling lane " +
                   std::to_string(t.lane));
  }
  if (const unsigned missing = mask & ~w.exists; missing != 0) {
    KVSIM_FAIL(t, cudaErrorLaunchFailure,
               what() + ": the mask " + Hex(mask) + " names lane(s) " + Lanes(missing) +
                   " of warp " + std::to_string(t.warp) + ", which the block (" +
                   std::to_string(b.num_threads) + " threads) does not have");
  }
  if (const unsigned gone = mask & ~w.live; gone != 0) {
    KVSIM_FAIL(t, cudaErrorLaunchFailure,
               what() + ": the mask " + Hex(mask) + " names lane(s) " + Lanes(gone) + " of warp " +
                   std::to_string(t.warp) + ", which have exited");
  }
  Collective* c = nullptr;
  for (Collective& o : w.open) {
    if (o.mask == mask) {
      c = &o;
    } else if ((o.mask & mask) != 0) {
      KVSIM_FAIL(t, cudaErrorLaunchFailure,
                 what() + ": overlaps a " + OpName(o.op) + " at " + Site(o.file, o.line) +
                     " with mask " + Hex(o.mask) + " that lanes " + Lanes(o.arrived) + " wait in");
    }
  }
  if (c == nullptr) {
    w.open.push_back(Collective{op, mask, 0, arg, width, file, line});
    c = &w.open.back();
  } else if (c->op != op || c->line != line ||
             (c->file != file && std::strcmp(c->file, file) != 0) ||
             ((op == WarpOp::kShflXor || op == WarpOp::kShflUp || op == WarpOp::kShflDown) &&
              c->arg != arg) ||
             c->width != width) {
    KVSIM_FAIL(t, cudaErrorLaunchFailure,
               what() + ": lanes " + Lanes(c->arrived) + " of the same mask wait in " +
                   OpName(c->op) + " at " + Site(c->file, c->line) +
                   " (divergent warp collectives)");
  }
  t.value = value;
  t.arg = arg;
  c->arrived |= 1u << t.lane;
  if (c->arrived == mask) {
    const Collective done = *c;
    w.open.erase(w.open.begin() + (c - w.open.data()));
    Complete(b, w, done, t.warp, t);
    return t.result;
  }
  t.state = State::kWarp;
  t.wait_file = file;
  t.wait_line = line;
  Yield(t);
  return t.result;
}

unsigned ActiveMask() {
  const Thread& t = *tls_thread;
  return t.block->warps[static_cast<size_t>(t.warp)].live;
}

void* DynamicShared() { return tls_thread->block->dyn; }

const char* KernelNameFromSignature(const char* pretty) {
  // "... [with auto F = ns::Kernel<args>]" -> "Kernel<args>"
  std::string s(pretty);
  size_t at = s.find("F = ");
  std::string name = at == std::string::npos ? s : s.substr(at + 4);
  if (!name.empty() && name.back() == ']') name.pop_back();
  const size_t angle = name.find('<');
  const size_t scope = name.rfind("::", angle);
  if (scope != std::string::npos) name = name.substr(scope + 2);
  // One per kernel, for the process's life (reachable from here, so not a leak).
  static std::mutex mu;
  static std::deque<std::string>* names = new std::deque<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  names->push_back(std::move(name));
  return names->back().c_str();
}

// ---- atomics -----------------------------------------------------------------------------------

int AtomicAddI32(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
unsigned AtomicAddU32(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
unsigned long long AtomicAddU64(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <typename T, typename F>
T CasLoop(T* p, F f) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, f(old), true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
/// atomicAdd on a float type F through a CAS loop on its bits U.
template <typename F, typename U>
F AtomicAddFloat(F* p, F v) {
  static_assert(sizeof(F) == sizeof(U));
  const U old = CasLoop(reinterpret_cast<U*>(p), [v](U bits) {
    F f;
    std::memcpy(&f, &bits, sizeof f);
    f += v;
    std::memcpy(&bits, &f, sizeof f);
    return bits;
  });
  F out;
  std::memcpy(&out, &old, sizeof out);
  return out;
}
float AtomicAddF32(float* p, float v) { return AtomicAddFloat<float, uint32_t>(p, v); }
double AtomicAddF64(double* p, double v) { return AtomicAddFloat<double, uint64_t>(p, v); }
int AtomicMaxI32(int* p, int v) {
  return CasLoop(p, [v](int o) { return std::max(o, v); });
}
int AtomicMinI32(int* p, int v) {
  return CasLoop(p, [v](int o) { return std::min(o, v); });
}
unsigned AtomicMaxU32(unsigned* p, unsigned v) {
  return CasLoop(p, [v](unsigned o) { return std::max(o, v); });
}
unsigned AtomicMinU32(unsigned* p, unsigned v) {
  return CasLoop(p, [v](unsigned o) { return std::min(o, v); });
}
int AtomicExchI32(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
unsigned AtomicExchU32(unsigned* p, unsigned v) {
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
float AtomicExchF32(float* p, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = __atomic_exchange_n(reinterpret_cast<uint32_t*>(p), bits, __ATOMIC_RELAXED);
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}
int AtomicCasI32(int* p, int compare, int v) {
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}
unsigned AtomicCasU32(unsigned* p, unsigned compare, unsigned v) {
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}
unsigned long long AtomicCasU64(unsigned long long* p, unsigned long long compare,
                                unsigned long long v) {
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;
}
unsigned AtomicOrU32(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
unsigned AtomicAndU32(unsigned* p, unsigned v) {
  return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);
}
void ThreadFence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

}  // namespace kvsim

// ---- global-memory read accounting, for tests that dlopen this library
// --------------------------- Needs the access hooks (kvsim_access_hooks_built_in): without them
// nothing is counted.

extern "C" __attribute__((visibility("default"))) int kvsim_access_hooks_built_in() {
  return kvsim::AccessHooksBuiltIn() ? 1 : 0;
}

/// Starts (on != 0: from zero, every watch too) or stops counting the bytes kernel threads read
/// from device memory. Each load counts: a byte read twice counts twice.
extern "C" __attribute__((visibility("default"))) void kvsim_count_global_reads(int on) {
  if (on != 0) {
    kvsim::g_read_bytes.store(0);
    for (kvsim::ReadWatch& w : kvsim::g_read_watches) w.bytes.store(0);
  }
  kvsim::g_count_reads.store(on != 0);
}

/// Also counts, apart, the reads inside [base, base + bytes) in watch `slot` (0..3).
extern "C" __attribute__((visibility("default"))) void kvsim_watch_reads(int slot, const void* base,
                                                                         size_t bytes) {
  if (slot < 0 || slot >= kvsim::kReadWatches) return;
  kvsim::ReadWatch& w = kvsim::g_read_watches[slot];
  w.lo.store(reinterpret_cast<uintptr_t>(base));
  w.hi.store(reinterpret_cast<uintptr_t>(base) + bytes);
  w.bytes.store(0);
}

/// Bytes read from device memory since counting started: all (slot -1) or watch `slot`'s.
extern "C" __attribute__((visibility("default"))) unsigned long long kvsim_global_read_bytes(
    int slot) {
  if (slot < 0 || slot >= kvsim::kReadWatches) return kvsim::g_read_bytes.load();
  return kvsim::g_read_watches[slot].bytes.load();
}

// ---- gcc's -fsanitize=thread instrumentation, received here -----------------------------------
// Only the simulator's kernel files are compiled with it (and without libtsan), so each memory
// access of a kernel calls one of these with its address.

#define KVSIM_HOOK_VIS extern "C" __attribute__((visibility("hidden")))
#define KVSIM_ACCESS_HOOKS(n)                                  \
  KVSIM_HOOK_VIS void __tsan_read##n(void* a) {                \
    kvsim::OnAccess(a, n, false, __builtin_return_address(0)); \
  }                                                            \
  KVSIM_HOOK_VIS void __tsan_write##n(void* a) {               \
    kvsim::OnAccess(a, n, true, __builtin_return_address(0));  \
  }                                                            \
  KVSIM_HOOK_VIS void __tsan_unaligned_read##n(void* a) {      \
    kvsim::OnAccess(a, n, false, __builtin_return_address(0)); \
  }                                                            \
  KVSIM_HOOK_VIS void __tsan_unaligned_write##n(void* a) {     \
    kvsim::OnAccess(a, n, true, __builtin_return_address(0));  \
  }
KVSIM_ACCESS_HOOKS(1)
KVSIM_ACCESS_HOOKS(2)
KVSIM_ACCESS_HOOKS(4)
KVSIM_ACCESS_HOOKS(8)
KVSIM_ACCESS_HOOKS(16)
#undef KVSIM_ACCESS_HOOKS
KVSIM_HOOK_VIS void __tsan_read_range(void* a, unsigned long n) {
  kvsim::OnAccess(a, n, false, __builtin_return_address(0));
}
KVSIM_HOOK_VIS void __tsan_write_range(void* a, unsigned long n) {
  kvsim::OnAccess(a, n, true, __builtin_return_address(0));
}
KVSIM_HOOK_VIS void __tsan_init() {}
KVSIM_HOOK_VIS void __tsan_func_entry(void*) {}
KVSIM_HOOK_VIS void __tsan_func_exit() {}
KVSIM_HOOK_VIS void __tsan_vptr_update(void**, void*) {}
KVSIM_HOOK_VIS void __tsan_vptr_read(void**) {}

// Atomics in instrumented files (e.g. function-local static guards) come here as calls; every
// order is served as sequentially consistent, which is at least as strong as asked.
#define KVSIM_ATOMIC_HOOKS(bits, type)                                                             \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_load(const volatile type* a, int) {                    \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                   \
  }                                                                                                \
  KVSIM_HOOK_VIS void __tsan_atomic##bits##_store(volatile type* a, type v, int) {                 \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_exchange(volatile type* a, type v, int) {              \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_fetch_add(volatile type* a, type v, int) {             \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_fetch_sub(volatile type* a, type v, int) {             \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_fetch_and(volatile type* a, type v, int) {             \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_fetch_or(volatile type* a, type v, int) {              \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_fetch_xor(volatile type* a, type v, int) {             \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  KVSIM_HOOK_VIS int __tsan_atomic##bits##_compare_exchange_strong(volatile type* a, type* c,      \
                                                                   type v, int, int) {             \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }                                                                                                \
  KVSIM_HOOK_VIS int __tsan_atomic##bits##_compare_exchange_weak(volatile type* a, type* c,        \
                                                                 type v, int, int) {               \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }                                                                                                \
  KVSIM_HOOK_VIS type __tsan_atomic##bits##_compare_exchange_val(volatile type* a, type c, type v, \
                                                                 int, int) {                       \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
    return c;                                                                                      \
  }
KVSIM_ATOMIC_HOOKS(8, uint8_t)
KVSIM_ATOMIC_HOOKS(16, uint16_t)
KVSIM_ATOMIC_HOOKS(32, uint32_t)
KVSIM_ATOMIC_HOOKS(64, uint64_t)
#undef KVSIM_ATOMIC_HOOKS
KVSIM_HOOK_VIS void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
KVSIM_HOOK_VIS void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
