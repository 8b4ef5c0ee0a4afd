#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#define KVSIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSIM_ASAN 1
#endif
#endif

#ifdef KVSIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "kvsim: the fiber switch is written for x86-64"
#endif

// kvsim_switch_fiber(from = rdi, to = rsi). The saved frame, from the saved stack pointer up:
// MXCSR (4 bytes), x87 control word (4), r15, r14, r13, r12, rbx, rbp, return address.
// kvsim_fiber_start is the first "return address" of a new fiber: it calls r13(r12).
__asm__(
    ".text\n"
    ".globl kvsim_switch_fiber\n"
    ".hidden kvsim_switch_fiber\n"
    ".type kvsim_switch_fiber,@function\n"
    "kvsim_switch_fiber:\n"
    "  .cfi_startproc\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size kvsim_switch_fiber, .-kvsim_switch_fiber\n"
    ".globl kvsim_fiber_start\n"
    ".hidden kvsim_fiber_start\n"
    ".type kvsim_fiber_start,@function\n"
    "kvsim_fiber_start:\n"
    "  .cfi_startproc\n"
    "  .cfi_undefined rip\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    "  .cfi_endproc\n"
    ".size kvsim_fiber_start, .-kvsim_fiber_start\n");

extern "C" void kvsim_fiber_start();

namespace kvsim {
namespace {

#ifdef KVSIM_ASAN
constexpr size_t kStackBytes = size_t{256} << 10;  // ASan's redzones make frames larger
#else
constexpr size_t kStackBytes = size_t{64} << 10;
#endif

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

StackCache::~StackCache() {
  for (const FiberStack& s : stacks_) munmap(s.base - PageSize(), s.size + PageSize());
}

FiberStack StackCache::Get(size_t i) {
  while (stacks_.size() <= i) {
    const size_t total = kStackBytes + PageSize();
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "kvsim: cannot map a %zu-byte fiber stack\n", total);
      std::abort();
    }
    mprotect(p, PageSize(), PROT_NONE);  // guard page: an overflow faults instead of corrupting
    stacks_.push_back(FiberStack{static_cast<char*>(p) + PageSize(), kStackBytes});
  }
  return stacks_[i];
}

void* PrepareFiber(FiberStack stack, FiberEntry entry, void* arg) {
  auto top = reinterpret_cast<uintptr_t>(stack.base + stack.size) & ~uintptr_t{15};
  // After the switch pops 8 words (control words and six registers) and returns, rsp = top,
  // 16-byte aligned, so the call in kvsim_fiber_start enters `entry` with the ABI's alignment.
  auto* frame = reinterpret_cast<uint64_t*>(top - 8 * sizeof(uint64_t));
  uint32_t control[2] = {0x1f80u, 0x037fu};  // default MXCSR and x87 control word
  std::memcpy(&frame[0], control, sizeof control);
  frame[1] = 0;                                  // r15
  frame[2] = 0;                                  // r14
  frame[3] = reinterpret_cast<uint64_t>(entry);  // r13
  frame[4] = reinterpret_cast<uint64_t>(arg);    // r12
  frame[5] = 0;                                  // rbx
  frame[6] = 0;                                  // rbp
  frame[7] = reinterpret_cast<uint64_t>(&kvsim_fiber_start);
  return frame;
}

#ifdef KVSIM_ASAN
void AnnounceSwitch(void** fake, const void* to_bottom, size_t to_size) {
  __sanitizer_start_switch_fiber(fake, to_bottom, to_size);
}

void FinishSwitch(void* fake, const void** from_bottom, size_t* from_size) {
  __sanitizer_finish_switch_fiber(fake, from_bottom, from_size);
}

void ForgetFrames(FiberStack stack) { ASAN_UNPOISON_MEMORY_REGION(stack.base, stack.size); }
#endif

}  // namespace kvsim
