#include "common/io/anonymous_memory.h"

#include <sys/mman.h>

#include <algorithm>
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

void AnonymousMemory::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

bool AnonymousMemory::Map(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
#if defined(MADV_HUGEPAGE)
  (void)::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
  Reset();
  data_ = static_cast<uint8_t*>(p);
  size_ = bytes;
  return true;
}

}  // namespace kvserve
