#ifndef KVSERVE_COMMON_IO_ANONYMOUS_MEMORY_H_
#define KVSERVE_COMMON_IO_ANONYMOUS_MEMORY_H_

#include <cstddef>
#include <cstdint>

namespace kvserve {

/// Zeroed memory of one private anonymous mapping, made without touching it: RAM is committed as
/// pages are first written, so a large reservation costs address space until it is used. The
/// mapping is advised to use transparent huge pages (where the kernel offers them): streaming
/// reads then cross no 4 KiB page boundary and miss the TLB 512 times less often; reading model
/// weights from 2 MiB pages, one thread streamed ~1.25 times as fast as from 4 KiB pages
/// (docs/benchmarks.md, "Weights on huge pages"). A mapping of 2 MiB or more starts on a 2 MiB
/// boundary and extends to a multiple of 2 MiB, so every byte of it can sit in a huge page (the
/// kernel aligns only mappings whose length is a multiple of 2 MiB: eight plain 5.5 MiB mappings,
/// a bf16 FFN matrix each, kept 36 % of their bytes in 4 KiB pages). The price is committing
/// memory in 2 MiB steps: up to 2 MiB beyond size() once the last bytes are written. Move-only;
/// unmaps on destruction.
class AnonymousMemory {
 public:
  AnonymousMemory() = default;
  AnonymousMemory(AnonymousMemory&& other) noexcept;
  AnonymousMemory& operator=(AnonymousMemory&& other) noexcept;
  AnonymousMemory(const AnonymousMemory&) = delete;
  AnonymousMemory& operator=(const AnonymousMemory&) = delete;
  ~AnonymousMemory();

  /// Maps `bytes` (at least one) zero bytes, replacing any earlier mapping; false when the
  /// address space is not there (the earlier mapping is then kept). From 2 MiB on, data() is
  /// 2 MiB-aligned.
  bool Map(size_t bytes);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  // The length of the mapping behind `bytes` usable bytes: rounded up to whole huge pages from
  // 2 MiB on.
  static size_t MappedBytes(size_t bytes);
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_IO_ANONYMOUS_MEMORY_H_
