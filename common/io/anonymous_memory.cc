#include "common/io/anonymous_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace kvserve {

AnonymousMemory::AnonymousMemory(AnonymousMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AnonymousMemory& AnonymousMemory::operator=(AnonymousMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AnonymousMemory::~AnonymousMemory() { Reset(); }

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

}  // namespace

size_t AnonymousMemory::MappedBytes(size_t bytes) {
  return bytes >= kHugePage ? RoundUp(bytes, kHugePage) : bytes;
}

void AnonymousMemory::Reset() {
  if (data_ != nullptr) ::munmap(data_, MappedBytes(size_));
  data_ = nullptr;
  size_ = 0;
}

bool AnonymousMemory::Map(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  const size_t mapped = MappedBytes(bytes);
  if (mapped < bytes) return false;  // rounding overflowed: no address space is that large
  // Huge pages need 2 MiB-aligned 2 MiB ranges, and the kernel aligns an anonymous mapping only
  // when its length is a multiple of 2 MiB: reserve one huge page more and trim to alignment.
  const size_t reserve = mapped >= kHugePage ? mapped + kHugePage : mapped;
  if (reserve < mapped) return false;
  void* p = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  auto* base = static_cast<uint8_t*>(p);
  uint8_t* aligned = base;
  if (reserve > mapped) {
    aligned = base + (RoundUp(reinterpret_cast<uintptr_t>(base), kHugePage) -
                      reinterpret_cast<uintptr_t>(base));
    if (aligned > base) ::munmap(base, static_cast<size_t>(aligned - base));
    const size_t tail = static_cast<size_t>(base + reserve - (aligned + mapped));
    if (tail > 0) ::munmap(aligned + mapped, tail);
  }
#if defined(MADV_HUGEPAGE)
  (void)::madvise(aligned, mapped, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  Reset();
  data_ = aligned;
  size_ = bytes;
  return true;
}

}  // namespace kvserve
