#ifndef KVSERVE_COMMON_IO_MAPPED_FILE_H_
#define KVSERVE_COMMON_IO_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

/// A read-only memory mapping of a whole file. Move-only; unmaps on destruction.
/// Model weights are read straight out of the mapping, so the mapping must outlive every view
/// into it. An empty file maps to a valid object with size() == 0 and data() == nullptr.
class MappedFile {
 public:
  /// Maps `path` read-only. Errors name the path and the failing system call.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const {
    return std::string_view(reinterpret_cast<const char*>(data_), size_);
  }

 private:
  void Reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

/// Reads a whole (small) file into a string, e.g. a config.json. Errors name the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_IO_MAPPED_FILE_H_
