#include "common/gguf/gguf_file.h"

#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvserve {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;   // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;  // nested arrays deeper than this are refused
constexpr uint64_t kMaxKeyLength = 65535;

/// Size in the file of a scalar of `type`, 0 for string/array, nullopt for unknown numbers.
std::optional<uint64_t> ScalarSize(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return std::nullopt;
}

/// Fewest bytes one element of `type` can take in the file (used to bound claimed counts).
uint64_t MinEncodedSize(GgufType type) {
  if (type == GgufType::kString) return 8;
  if (type == GgufType::kArray) return 12;
  return *ScalarSize(static_cast<uint32_t>(type));
}

}  // namespace

std::string GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return absl::StrCat("type ", static_cast<uint32_t>(type));
}

std::string GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
    case GgmlType::kBF16:
      return "BF16";
  }
  return absl::StrCat("type ", static_cast<uint32_t>(type));
}

std::pair<uint64_t, uint64_t> GgmlBlock(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return {1, 4};
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return {1, 2};
    case GgmlType::kQ4_0:
      return {32, 18};
    case GgmlType::kQ4_1:
      return {32, 20};
    case GgmlType::kQ5_0:
      return {32, 22};
    case GgmlType::kQ5_1:
      return {32, 24};
    case GgmlType::kQ8_0:
      return {32, 34};
    case GgmlType::kQ4_K:
      return {256, 144};
    case GgmlType::kQ5_K:
      return {256, 176};
    case GgmlType::kQ6_K:
      return {256, 210};
  }
  return {0, 0};
}

std::optional<uint64_t> GgmlRowBytes(GgmlType type, int64_t row_elems) {
  const auto [elems, bytes] = GgmlBlock(type);
  if (row_elems < 0 || elems == 0) return std::nullopt;
  const uint64_t n = static_cast<uint64_t>(row_elems);
  if (n % elems != 0 || n / elems > UINT64_MAX / bytes) return std::nullopt;
  return n / elems * bytes;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // overflow excluded by the parser
  return n;
}

std::optional<int64_t> GgufValue::AsInt64() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(v);
        } else {
          return static_cast<int64_t>(v);
        }
      },
      storage_);
}

std::optional<uint64_t> GgufValue::AsUint64() const {
  return std::visit(
      [](const auto& v) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_signed_v<T>) {
          if (v < 0) return std::nullopt;
          return static_cast<uint64_t>(v);
        } else {
          return static_cast<uint64_t>(v);
        }
      },
      storage_);
}

std::optional<double> GgufValue::AsDouble() const {
  if (const float* f = std::get_if<float>(&storage_)) return *f;
  if (const double* d = std::get_if<double>(&storage_)) return *d;
  return std::nullopt;
}

std::optional<bool> GgufValue::AsBool() const {
  if (const bool* b = std::get_if<bool>(&storage_)) return *b;
  return std::nullopt;
}

std::string GgufValue::DebugString() const {
  if (const std::string* s = AsString()) return absl::StrCat("\"", *s, "\"");
  if (const GgufArray* a = AsArray()) {
    return absl::StrCat("[", a->elements.size(), " x ", GgufTypeName(a->element_type), "]");
  }
  if (std::optional<bool> b = AsBool()) return *b ? "true" : "false";
  if (std::optional<double> d = AsDouble()) return absl::StrCat(*d);
  if (std::optional<int64_t> i = AsInt64()) return absl::StrCat(*i);
  if (std::optional<uint64_t> u = AsUint64()) return absl::StrCat(*u);
  return "?";
}

/// Reads the GGUF layout out of a mapping, checking every read against the file size.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* out)
      : out_(out), data_(out->file_.data()), size_(out->file_.size()) {}

  absl::Status Run() {
    uint32_t magic = 0;
    if (size_ < 4) return Error(absl::StrCat("file is ", size_, " bytes, too short for GGUF"));
    if (absl::Status s = Read(&magic, "the magic"); !s.ok()) return s;
    if (magic != kGgufMagic) return Error("not a GGUF file (bad magic)");
    uint32_t version = 0;
    if (absl::Status s = Read(&version, "the version"); !s.ok()) return s;
    if (version != 2 && version != 3) {
      return Error(absl::StrCat("unsupported GGUF version ", version, " (supported: 2, 3)"));
    }
    out_->version_ = version;
    uint64_t tensor_count = 0;
    uint64_t kv_count = 0;
    if (absl::Status s = Read(&tensor_count, "the tensor count"); !s.ok()) return s;
    if (absl::Status s = Read(&kv_count, "the metadata count"); !s.ok()) return s;
    // Each metadata entry takes at least 13 bytes and each tensor info at least 32.
    if (kv_count > Remaining() / 13) {
      return Error(absl::StrCat("metadata count ", kv_count, " exceeds what the file can hold"));
    }
    if (tensor_count > Remaining() / 32) {
      return Error(absl::StrCat("tensor count ", tensor_count, " exceeds what the file can hold"));
    }
    if (absl::Status s = ReadMetadata(kv_count); !s.ok()) return s;
    if (absl::Status s = ReadAlignment(); !s.ok()) return s;
    if (absl::Status s = ReadTensorInfos(tensor_count); !s.ok()) return s;
    return PlaceTensors();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(out_->path(), ": ", what));
  }
  absl::Status Truncated(absl::string_view what) const {
    return Error(
        absl::StrCat("file ends inside ", what, " (offset ", pos_, ", file is ", size_, " bytes)"));
  }
  uint64_t Remaining() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* v, absl::string_view what) {
    if (Remaining() < sizeof(T)) return Truncated(what);
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* s, absl::string_view what) {
    uint64_t len = 0;
    if (absl::Status st = Read(&len, what); !st.ok()) return st;
    if (len > Remaining()) {
      return Error(absl::StrCat(what, " claims ", len, " bytes but only ", Remaining(),
                                " remain in the file"));
    }
    s->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status ReadValue(uint32_t type, int depth, const std::string& key, GgufValue* out) {
    const std::string what = absl::StrCat("the value of '", key, "'");
    switch (static_cast<GgufType>(type)) {
      case GgufType::kUint8:
        return ReadScalar<uint8_t>(what, GgufValue::U8, out);
      case GgufType::kInt8:
        return ReadScalar<int8_t>(what, GgufValue::I8, out);
      case GgufType::kUint16:
        return ReadScalar<uint16_t>(what, GgufValue::U16, out);
      case GgufType::kInt16:
        return ReadScalar<int16_t>(what, GgufValue::I16, out);
      case GgufType::kUint32:
        return ReadScalar<uint32_t>(what, GgufValue::U32, out);
      case GgufType::kInt32:
        return ReadScalar<int32_t>(what, GgufValue::I32, out);
      case GgufType::kFloat32:
        return ReadScalar<float>(what, GgufValue::F32, out);
      case GgufType::kUint64:
        return ReadScalar<uint64_t>(what, GgufValue::U64, out);
      case GgufType::kInt64:
        return ReadScalar<int64_t>(what, GgufValue::I64, out);
      case GgufType::kFloat64:
        return ReadScalar<double>(what, GgufValue::F64, out);
      case GgufType::kBool: {
        uint8_t b = 0;
        if (absl::Status s = Read(&b, what); !s.ok()) return s;
        *out = GgufValue::Bool(b != 0);
        return absl::OkStatus();
      }
      case GgufType::kString: {
        std::string s;
        if (absl::Status st = ReadString(&s, what); !st.ok()) return st;
        *out = GgufValue::String(std::move(s));
        return absl::OkStatus();
      }
      case GgufType::kArray:
        return ReadArray(depth, key, out);
    }
    return Error(absl::StrCat("metadata key '", key, "' has unknown value type ", type));
  }

  template <typename T, typename Make>
  absl::Status ReadScalar(absl::string_view what, Make make, GgufValue* out) {
    T v{};
    if (absl::Status s = Read(&v, what); !s.ok()) return s;
    *out = make(v);
    return absl::OkStatus();
  }

  absl::Status ReadArray(int depth, const std::string& key, GgufValue* out) {
    if (depth >= kMaxArrayDepth) {
      return Error(
          absl::StrCat("metadata key '", key, "' nests arrays deeper than ", kMaxArrayDepth));
    }
    const std::string what = absl::StrCat("the array header of '", key, "'");
    uint32_t element_type = 0;
    uint64_t count = 0;
    if (absl::Status s = Read(&element_type, what); !s.ok()) return s;
    if (!ScalarSize(element_type).has_value()) {
      return Error(
          absl::StrCat("metadata key '", key, "' is an array of unknown type ", element_type));
    }
    if (absl::Status s = Read(&count, what); !s.ok()) return s;
    const GgufType etype = static_cast<GgufType>(element_type);
    if (count > Remaining() / MinEncodedSize(etype)) {
      return Error(absl::StrCat("array '", key, "' claims ", count, " elements of type ",
                                GgufTypeName(etype), ", more than the remaining ", Remaining(),
                                " bytes can hold"));
    }
    std::vector<GgufValue> elements(count);
    for (uint64_t i = 0; i < count; ++i) {
      if (absl::Status s = ReadValue(element_type, depth + 1, key, &elements[i]); !s.ok()) {
        return s;
      }
    }
    *out = GgufValue::Array(etype, std::move(elements));
    return absl::OkStatus();
  }

  absl::Status ReadMetadata(uint64_t kv_count) {
    out_->metadata_.reserve(kv_count);
    for (uint64_t i = 0; i < kv_count; ++i) {
      const std::string what = absl::StrCat("metadata key #", i);
      std::string key;
      if (absl::Status s = ReadString(&key, what); !s.ok()) return s;
      if (key.empty() || key.size() > kMaxKeyLength) {
        return Error(absl::StrCat(what, " has invalid length ", key.size()));
      }
      uint32_t type = 0;
      if (absl::Status s = Read(&type, absl::StrCat("the type of '", key, "'")); !s.ok()) {
        return s;
      }
      GgufValue value;
      if (absl::Status s = ReadValue(type, 0, key, &value); !s.ok()) return s;
      if (!out_->metadata_index_.emplace(key, out_->metadata_.size()).second) {
        return Error(absl::StrCat("duplicate metadata key '", key, "'"));
      }
      out_->metadata_.emplace_back(std::move(key), std::move(value));
    }
    return absl::OkStatus();
  }

  absl::Status ReadAlignment() {
    const GgufValue* v = out_->Find("general.alignment");
    if (v == nullptr) return absl::OkStatus();
    const uint32_t* a = std::get_if<uint32_t>(&v->storage());
    if (a == nullptr) {
      return Error(absl::StrCat("general.alignment has type ", GgufTypeName(v->type()),
                                ", expected uint32"));
    }
    if (*a == 0 || (*a & (*a - 1)) != 0) {
      return Error(absl::StrCat("general.alignment ", *a, " is not a power of two"));
    }
    out_->alignment_ = *a;
    return absl::OkStatus();
  }

  absl::Status ReadTensorInfos(uint64_t tensor_count) {
    out_->tensors_.reserve(tensor_count);
    for (uint64_t i = 0; i < tensor_count; ++i) {
      GgufTensorInfo info;
      if (absl::Status s = ReadString(&info.name, absl::StrCat("the name of tensor #", i));
          !s.ok()) {
        return s;
      }
      if (info.name.empty()) return Error(absl::StrCat("tensor #", i, " has an empty name"));
      const std::string tname = absl::StrCat("tensor '", info.name, "'");
      uint32_t n_dims = 0;
      if (absl::Status s = Read(&n_dims, absl::StrCat("the info of ", tname)); !s.ok()) return s;
      if (n_dims == 0 || n_dims > kMaxDims) {
        return Error(
            absl::StrCat(tname, " has ", n_dims, " dimensions (supported: 1 to ", kMaxDims, ")"));
      }
      int64_t numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        uint64_t dim = 0;
        if (absl::Status s = Read(&dim, absl::StrCat("the dims of ", tname)); !s.ok()) return s;
        if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Error(absl::StrCat(tname, " has invalid dimension ", dim));
        }
        if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel)) {
          return Error(absl::StrCat(tname, " has too many elements (dimension product overflows)"));
        }
        info.dims.push_back(static_cast<int64_t>(dim));
      }
      uint32_t type = 0;
      if (absl::Status s = Read(&type, absl::StrCat("the type of ", tname)); !s.ok()) return s;
      if (absl::Status s = Read(&info.offset, absl::StrCat("the offset of ", tname)); !s.ok()) {
        return s;
      }
      info.type = static_cast<GgmlType>(type);
      if (GgmlTypeName(info.type).starts_with("type ")) {
        return Error(absl::StrCat(tname, " has unsupported ggml type ", type,
                                  " (supported: F32=0, F16=1, Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, "
                                  "Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, BF16=30)"));
      }
      std::optional<uint64_t> row = GgmlRowBytes(info.type, info.dims[0]);
      const uint64_t block = GgmlBlock(info.type).first;
      if (!row.has_value() && static_cast<uint64_t>(info.dims[0]) % block == 0) {
        return Error(absl::StrCat(tname, " is too large (row byte size overflows)"));
      }
      if (!row.has_value()) {
        return Error(absl::StrCat(tname, " of type ", GgmlTypeName(info.type), " has row length ",
                                  info.dims[0], ", not a multiple of the block size ", block));
      }
      const uint64_t rows = static_cast<uint64_t>(numel / info.dims[0]);
      if (__builtin_mul_overflow(*row, rows, &info.nbytes)) {
        return Error(absl::StrCat(tname, " is too large (byte size overflows)"));
      }
      if (!out_->tensor_index_.emplace(info.name, out_->tensors_.size()).second) {
        return Error(absl::StrCat("duplicate tensor name '", info.name, "'"));
      }
      out_->tensors_.push_back(std::move(info));
    }
    return absl::OkStatus();
  }

  absl::Status PlaceTensors() {
    const uint64_t align = out_->alignment_;
    const uint64_t start = (pos_ + align - 1) / align * align;  // pos_ <= size_, cannot overflow
    out_->data_offset_ = start;
    const uint64_t data_size = start <= size_ ? size_ - start : 0;
    for (GgufTensorInfo& t : out_->tensors_) {
      if (t.offset % align != 0) {
        return Error(absl::StrCat("tensor '", t.name, "' offset ", t.offset,
                                  " is not a multiple of the alignment ", align));
      }
      if (t.offset > data_size || t.nbytes > data_size - t.offset) {
        return Error(absl::StrCat("tensor '", t.name, "' data (offset ", t.offset, ", ", t.nbytes,
                                  " bytes) extends past the end of the file (data section holds ",
                                  data_size, " bytes)"));
      }
      t.data = data_ + start + t.offset;
    }
    return absl::OkStatus();
  }

  GgufFile* out_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Parse(*std::move(file));
}

absl::StatusOr<GgufFile> GgufFile::Parse(MappedFile file) {
  GgufFile out;
  out.file_ = std::move(file);
  GgufParser parser(&out);
  if (absl::Status s = parser.Run(); !s.ok()) return s;
  return out;
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const GgufValue*> Require(const GgufFile& f, absl::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": metadata key '", key, "' is missing"));
  }
  return v;
}

absl::Status WrongType(const GgufFile& f, absl::string_view key, const GgufValue& v,
                       absl::string_view expected) {
  std::string actual = GgufTypeName(v.type());
  if (const GgufArray* a = v.AsArray()) {
    actual = absl::StrCat("array of ", GgufTypeName(a->element_type));
  }
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' has type ",
                                                 actual, ", expected ", expected));
}

absl::Status OutOfRange(const GgufFile& f, absl::string_view key, const GgufValue& v,
                        absl::string_view type) {
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": metadata key '", key, "' value ",
                                                 v.DebugString(), " does not fit in ", type));
}

template <typename T>
absl::StatusOr<T> GetInteger(const GgufFile& f, absl::string_view key, absl::string_view name) {
  absl::StatusOr<const GgufValue*> v = Require(f, key);
  if (!v.ok()) return v.status();
  if (std::optional<int64_t> i = (*v)->AsInt64()) {
    if (*i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (*i > 0 &&
         static_cast<uint64_t>(*i) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return OutOfRange(f, key, **v, name);
    }
    return static_cast<T>(*i);
  }
  if (std::optional<uint64_t> u = (*v)->AsUint64()) {  // uint64 above INT64_MAX
    if (*u > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return OutOfRange(f, key, **v, name);
    }
    return static_cast<T>(*u);
  }
  return WrongType(f, key, **v, name);
}

absl::StatusOr<const GgufArray*> GetArray(const GgufFile& f, absl::string_view key,
                                          absl::string_view expected) {
  absl::StatusOr<const GgufValue*> v = Require(f, key);
  if (!v.ok()) return v.status();
  const GgufArray* a = (*v)->AsArray();
  if (a == nullptr) return WrongType(f, key, **v, expected);
  return a;
}

}  // namespace

absl::StatusOr<uint32_t> GgufFile::GetU32(absl::string_view key) const {
  return GetInteger<uint32_t>(*this, key, "uint32");
}

absl::StatusOr<uint64_t> GgufFile::GetU64(absl::string_view key) const {
  return GetInteger<uint64_t>(*this, key, "uint64");
}

absl::StatusOr<int32_t> GgufFile::GetI32(absl::string_view key) const {
  return GetInteger<int32_t>(*this, key, "int32");
}

absl::StatusOr<float> GgufFile::GetF32(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Require(*this, key);
  if (!v.ok()) return v.status();
  std::optional<double> d = (*v)->AsDouble();
  if (!d.has_value()) return WrongType(*this, key, **v, "float32");
  return static_cast<float>(*d);
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Require(*this, key);
  if (!v.ok()) return v.status();
  std::optional<bool> b = (*v)->AsBool();
  if (!b.has_value()) return WrongType(*this, key, **v, "bool");
  return *b;
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Require(*this, key);
  if (!v.ok()) return v.status();
  const std::string* s = (*v)->AsString();
  if (s == nullptr) return WrongType(*this, key, **v, "string");
  return *s;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(absl::string_view key) const {
  absl::StatusOr<const GgufArray*> a = GetArray(*this, key, "array of string");
  if (!a.ok()) return a.status();
  if ((*a)->element_type != GgufType::kString) {
    return WrongType(*this, key, *Find(key), "array of string");
  }
  std::vector<std::string> out;
  out.reserve((*a)->elements.size());
  for (const GgufValue& e : (*a)->elements) out.push_back(*e.AsString());
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetF32Array(absl::string_view key) const {
  absl::StatusOr<const GgufArray*> a = GetArray(*this, key, "array of float32");
  if (!a.ok()) return a.status();
  if ((*a)->element_type != GgufType::kFloat32 && (*a)->element_type != GgufType::kFloat64) {
    return WrongType(*this, key, *Find(key), "array of float32");
  }
  std::vector<float> out;
  out.reserve((*a)->elements.size());
  for (const GgufValue& e : (*a)->elements) out.push_back(static_cast<float>(*e.AsDouble()));
  return out;
}

absl::StatusOr<std::vector<int32_t>> GgufFile::GetI32Array(absl::string_view key) const {
  absl::StatusOr<const GgufArray*> a = GetArray(*this, key, "array of int32");
  if (!a.ok()) return a.status();
  std::vector<int32_t> out;
  out.reserve((*a)->elements.size());
  for (size_t i = 0; i < (*a)->elements.size(); ++i) {
    std::optional<int64_t> v = (*a)->elements[i].AsInt64();
    if (!v.has_value()) return WrongType(*this, key, *Find(key), "array of int32");
    if (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(path(), ": metadata key '", key, "' element ",
                                                     i, " value ", *v, " does not fit in int32"));
    }
    out.push_back(static_cast<int32_t>(*v));
  }
  return out;
}

}  // namespace kvserve
