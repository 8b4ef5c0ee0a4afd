#ifndef KVSERVE_COMMON_GGUF_GGUF_FILE_H_
#define KVSERVE_COMMON_GGUF_GGUF_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/io/mapped_file.h"

namespace kvserve {

/// Metadata value types of the GGUF format; the numbers are the ones stored in the file.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// Lower-case name of a metadata type ("uint32", "string", ...); "type N" for unknown numbers.
std::string GgufTypeName(GgufType type);

/// Tensor element types (ggml_type numbers) that kvserve reads. Others are refused at parse time.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

/// Upper-case ggml name ("F32", "Q8_0", ...); "type N" for unsupported numbers.
std::string GgmlTypeName(GgmlType type);

class GgufValue;

/// A GGUF array: its element type and elements (which may themselves be arrays).
struct GgufArray {
  GgufType element_type = GgufType::kUint8;
  std::vector<GgufValue> elements;
};

/// One typed metadata value. The variant's alternative index equals the GgufType number, so
/// type() is exact: a uint32 key stays uint32 and a float64 stays float64.
class GgufValue {
 public:
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, GgufArray, uint64_t, int64_t, double>;

  GgufValue() = default;
  explicit GgufValue(Storage storage) : storage_(std::move(storage)) {}

  /// Typed constructors (the C++ type alone would be ambiguous for literals).
  static GgufValue U8(uint8_t v) { return GgufValue(Storage(std::in_place_index<0>, v)); }
  static GgufValue I8(int8_t v) { return GgufValue(Storage(std::in_place_index<1>, v)); }
  static GgufValue U16(uint16_t v) { return GgufValue(Storage(std::in_place_index<2>, v)); }
  static GgufValue I16(int16_t v) { return GgufValue(Storage(std::in_place_index<3>, v)); }
  static GgufValue U32(uint32_t v) { return GgufValue(Storage(std::in_place_index<4>, v)); }
  static GgufValue I32(int32_t v) { return GgufValue(Storage(std::in_place_index<5>, v)); }
  static GgufValue F32(float v) { return GgufValue(Storage(std::in_place_index<6>, v)); }
  static GgufValue Bool(bool v) { return GgufValue(Storage(std::in_place_index<7>, v)); }
  static GgufValue String(std::string v) {
    return GgufValue(Storage(std::in_place_index<8>, std::move(v)));
  }
  static GgufValue Array(GgufType element_type, std::vector<GgufValue> elements) {
    return GgufValue(Storage(std::in_place_index<9>, GgufArray{element_type, std::move(elements)}));
  }
  static GgufValue U64(uint64_t v) { return GgufValue(Storage(std::in_place_index<10>, v)); }
  static GgufValue I64(int64_t v) { return GgufValue(Storage(std::in_place_index<11>, v)); }
  static GgufValue F64(double v) { return GgufValue(Storage(std::in_place_index<12>, v)); }

  GgufType type() const { return static_cast<GgufType>(storage_.index()); }
  const Storage& storage() const { return storage_; }

  /// Any integer type (not bool) whose value fits; nullopt otherwise.
  std::optional<int64_t> AsInt64() const;
  std::optional<uint64_t> AsUint64() const;
  /// float32 or float64 as a double; nullopt otherwise.
  std::optional<double> AsDouble() const;
  /// bool only.
  std::optional<bool> AsBool() const;
  /// Pointer to the string or array, or nullptr when the value has another type.
  const std::string* AsString() const { return std::get_if<std::string>(&storage_); }
  const GgufArray* AsArray() const { return std::get_if<GgufArray>(&storage_); }

  /// Short human-readable rendering (arrays summarised), for diagnostics.
  std::string DebugString() const;

 private:
  Storage storage_;
};

/// One tensor's entry in the GGUF tensor-info table.
struct GgufTensorInfo {
  std::string name;
  /// Dimensions as the file lists them: innermost (contiguous) first, as in ggml's ne[].
  std::vector<int64_t> dims;
  GgmlType type = GgmlType::kF32;
  /// Offset of the data relative to the start of the data section (a multiple of alignment).
  uint64_t offset = 0;
  /// Bytes of data: rows * row bytes for block-quantized types.
  uint64_t nbytes = 0;
  /// Start of the data inside the mapping (valid while the GgufFile or its MappedFile lives).
  const uint8_t* data = nullptr;

  int64_t numel() const;
};

/// A parsed, fully validated GGUF (v2 or v3) file. Every length, count, dimension and offset has
/// been checked against the file size, so reading any tensor's [data, data + nbytes) is safe.
/// Errors are one line: "<path>: <what is wrong>".
class GgufFile {
 public:
  /// Maps and parses `path`.
  static absl::StatusOr<GgufFile> Open(const std::string& path);
  /// Parses an already mapped file (takes ownership).
  static absl::StatusOr<GgufFile> Parse(MappedFile file);

  GgufFile(GgufFile&&) = default;
  GgufFile& operator=(GgufFile&&) = default;

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  /// Absolute file offset where the tensor data section starts.
  uint64_t data_offset() const { return data_offset_; }

  /// Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// The value for `key`, or nullptr.
  const GgufValue* Find(absl::string_view key) const;
  bool Has(absl::string_view key) const { return Find(key) != nullptr; }

  /// Typed getters. Errors (NotFound when the key is absent, InvalidArgument on a type or range
  /// mismatch) name the path and the key. Integer getters accept any integer type whose value
  /// fits; float getters accept float32 and float64.
  absl::StatusOr<uint32_t> GetU32(absl::string_view key) const;
  absl::StatusOr<uint64_t> GetU64(absl::string_view key) const;
  absl::StatusOr<int32_t> GetI32(absl::string_view key) const;
  absl::StatusOr<float> GetF32(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(absl::string_view key) const;
  absl::StatusOr<std::vector<float>> GetF32Array(absl::string_view key) const;
  absl::StatusOr<std::vector<int32_t>> GetI32Array(absl::string_view key) const;

  /// Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  /// The underlying mapping; tensor data pointers stay valid if it is moved elsewhere.
  const MappedFile& file() const { return file_; }
  /// Moves the mapping out (e.g. into ModelWeights::files); this object must not be used after.
  MappedFile TakeFile() && { return std::move(file_); }

 private:
  GgufFile() = default;
  friend class GgufParser;

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

/// Elements and bytes per storage block of `type` ({1, 4} for F32, {256, 144} for Q4_K, ...);
/// {0, 0} for unsupported numbers.
std::pair<uint64_t, uint64_t> GgmlBlock(GgmlType type);

/// Bytes of one row of `row_elems` elements of `type`; nullopt when the type is unsupported or
/// the row length is not a multiple of the type's block size.
std::optional<uint64_t> GgmlRowBytes(GgmlType type, int64_t row_elems);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_GGUF_GGUF_FILE_H_
