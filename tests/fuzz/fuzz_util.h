#ifndef KVSERVE_TESTS_FUZZ_FUZZ_UTIL_H_
#define KVSERVE_TESTS_FUZZ_FUZZ_UTIL_H_

// Helpers shared by the libFuzzer targets: parsers that only read files get the input through
// an anonymous in-memory file, so nothing touches the disk.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/io/mapped_file.h"

namespace kvserve::fuzz {

/// Aborts with `what` (a property the target checks failed: libFuzzer records the input).
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::abort();
}

/// A MappedFile holding exactly `data[0, size)`, mapped from a memfd through /proc/self/fd.
inline MappedFile MapBytes(const uint8_t* data, size_t size) {
  const int fd = memfd_create("kvserve-fuzz", MFD_CLOEXEC);
  if (fd < 0) Fail("memfd_create failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) Fail("write to memfd failed");
    done += static_cast<size_t>(n);
  }
  absl::StatusOr<MappedFile> file = MappedFile::Open("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  if (!file.ok()) Fail("mapping the memfd failed: " + std::string(file.status().message()));
  return *std::move(file);
}

/// Reads every byte of [data, data + size) so ASan checks the range really is mapped.
inline uint64_t Touch(const uint8_t* data, uint64_t size) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < size; ++i) sum += data[i];
  return sum;
}

}  // namespace kvserve::fuzz

#endif  // KVSERVE_TESTS_FUZZ_FUZZ_UTIL_H_
