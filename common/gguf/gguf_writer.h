#ifndef KVSERVE_COMMON_GGUF_GGUF_WRITER_H_
#define KVSERVE_COMMON_GGUF_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/gguf/gguf_file.h"

namespace kvserve {

/// Builds a GGUF file in memory: metadata of any type (nested arrays included) and tensors
/// placed at aligned offsets. It writes what it is given without validating it, so tests can
/// also produce deliberately inconsistent files (e.g. an unknown ggml type number).
class GgufWriter {
 public:
  /// Options for the file as a whole.
  struct Options {
    /// Written in the header; the reader accepts 2 and 3.
    uint32_t version = 3;
    /// Tensor data alignment. When not 32 the writer adds `general.alignment` (uint32) unless
    /// the caller set that key.
    uint32_t alignment = 32;
  };

  GgufWriter() = default;
  explicit GgufWriter(Options options) : options_(options) {}

  /// Adds (or replaces) a metadata entry; entries are written in first-insertion order.
  void Set(std::string key, GgufValue value);
  void SetU32(std::string key, uint32_t v) { Set(std::move(key), GgufValue::U32(v)); }
  void SetI32(std::string key, int32_t v) { Set(std::move(key), GgufValue::I32(v)); }
  void SetF32(std::string key, float v) { Set(std::move(key), GgufValue::F32(v)); }
  void SetBool(std::string key, bool v) { Set(std::move(key), GgufValue::Bool(v)); }
  void SetString(std::string key, std::string v) {
    Set(std::move(key), GgufValue::String(std::move(v)));
  }
  void SetStringArray(std::string key, const std::vector<std::string>& v);
  void SetF32Array(std::string key, const std::vector<float>& v);
  void SetI32Array(std::string key, const std::vector<int32_t>& v);

  /// Adds a tensor. `dims` are in GGUF order (innermost first); `bytes` is copied as the data.
  /// The offset is the next multiple of the alignment after the previous tensor.
  void AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                 absl::string_view bytes);

  /// The complete file.
  std::string Serialize() const;
  /// Serialize() written to `path`; errors name the path.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    std::string bytes;
  };

  Options options_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

/// Writes `bytes` to `path` (truncating); errors name the path. Shared by the model writers.
absl::Status WriteStringToFile(const std::string& path, absl::string_view bytes);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_GGUF_GGUF_WRITER_H_
