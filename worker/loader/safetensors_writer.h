#ifndef KVSERVE_WORKER_LOADER_SAFETENSORS_WRITER_H_
#define KVSERVE_WORKER_LOADER_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace kvserve {

/// Builds a safetensors file in memory. Tensors are laid out in insertion order, each starting
/// at a multiple of 8 bytes of the data section; the header is padded with spaces to a multiple
/// of 8. Nothing is validated, so tests can write inconsistent files (a shape that does not
/// match the bytes, an unknown dtype string).
class SafetensorsWriter {
 public:
  /// Adds a `__metadata__` entry.
  void SetMetadata(std::string key, std::string value) { metadata_[key] = std::move(value); }
  /// Adds a tensor; `shape` is outermost first, `bytes` is copied as its data.
  void AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                 absl::string_view bytes);
  /// Same with a raw dtype string (e.g. "I64" to test refusal).
  void AddTensor(std::string name, std::string dtype, std::vector<int64_t> shape,
                 absl::string_view bytes);

  /// The complete file.
  std::string Serialize() const;
  /// Serialize() written to `path`; errors name the path.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_LOADER_SAFETENSORS_WRITER_H_
