#ifndef KVSERVE_WORKER_LOADER_SAFETENSORS_FILE_H_
#define KVSERVE_WORKER_LOADER_SAFETENSORS_FILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/mapped_file.h"
#include "kernels/dtype.h"

namespace kvserve {

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  /// Outermost first (PyTorch order); empty for a scalar.
  std::vector<int64_t> shape;
  /// [begin, end) relative to the start of the data section (just after the header).
  uint64_t begin = 0;
  uint64_t end = 0;
  /// Start of the data inside the mapping.
  const uint8_t* data = nullptr;

  uint64_t nbytes() const { return end - begin; }
};

/// A parsed, validated safetensors file: an 8-byte little-endian header length, a JSON header
/// mapping tensor names to {dtype, shape, data_offsets} (plus an optional string-to-string
/// `__metadata__`), then the data section. Every tensor's byte range has been checked against
/// the data section and against shape x dtype size. Only F32, F16 and BF16 are accepted.
/// Errors are one line: "<path>: <what is wrong>".
class SafetensorsFile {
 public:
  /// Maps and parses `path`.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  /// Parses an already mapped file (takes ownership).
  static absl::StatusOr<SafetensorsFile> Parse(MappedFile file);

  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;

  const std::string& path() const { return file_.path(); }
  /// The `__metadata__` entries (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Tensors sorted by data offset.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const SafetensorsTensor* Find(absl::string_view name) const;
  /// Absolute file offset of the data section.
  uint64_t data_offset() const { return data_offset_; }

  /// The underlying mapping; tensor data pointers stay valid if it is moved elsewhere.
  const MappedFile& file() const { return file_; }
  /// Moves the mapping out (e.g. into ModelWeights::files); this object must not be used after.
  MappedFile TakeFile() && { return std::move(file_); }

 private:
  SafetensorsFile() = default;

  MappedFile file_;
  uint64_t data_offset_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

/// The safetensors dtype string for `dtype` ("F32", "F16", "BF16"); quantized types have none
/// and give "".
absl::string_view SafetensorsDTypeName(DType dtype);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_LOADER_SAFETENSORS_FILE_H_
