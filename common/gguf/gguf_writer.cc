#include "common/gguf/gguf_writer.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian host (asserted by the reader)
  out->append(buf, sizeof(T));
}

void PutString(std::string* out, absl::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

/// Writes the payload of `value` (its type number is written by the caller). An array's
/// payload is its element type, count and element payloads; a nested array element is encoded
/// the same way.
void PutPayload(std::string* out, const GgufValue& value) {
  std::visit(
      [out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          PutString(out, v);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          Put<uint32_t>(out, static_cast<uint32_t>(v.element_type));
          Put<uint64_t>(out, v.elements.size());
          for (const GgufValue& e : v.elements) PutPayload(out, e);
        } else if constexpr (std::is_same_v<T, bool>) {
          Put<uint8_t>(out, v ? 1 : 0);
        } else {
          Put<T>(out, v);
        }
      },
      value.storage());
}

}  // namespace

void GgufWriter::Set(std::string key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::SetStringArray(std::string key, const std::vector<std::string>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (const std::string& s : v) elements.push_back(GgufValue::String(s));
  Set(std::move(key), GgufValue::Array(GgufType::kString, std::move(elements)));
}

void GgufWriter::SetF32Array(std::string key, const std::vector<float>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (float f : v) elements.push_back(GgufValue::F32(f));
  Set(std::move(key), GgufValue::Array(GgufType::kFloat32, std::move(elements)));
}

void GgufWriter::SetI32Array(std::string key, const std::vector<int32_t>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (int32_t i : v) elements.push_back(GgufValue::I32(i));
  Set(std::move(key), GgufValue::Array(GgufType::kInt32, std::move(elements)));
}

void GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                           absl::string_view bytes) {
  tensors_.push_back(Tensor{std::move(name), type, std::move(dims), std::string(bytes)});
}

std::string GgufWriter::Serialize() const {
  std::vector<std::pair<std::string, GgufValue>> metadata = metadata_;
  const uint64_t align = options_.alignment == 0 ? 1 : options_.alignment;
  if (options_.alignment != 32) {
    bool has_key = false;
    for (const auto& kv : metadata) has_key = has_key || kv.first == "general.alignment";
    if (!has_key) metadata.emplace_back("general.alignment", GgufValue::U32(options_.alignment));
  }
  std::string out;
  Put<uint32_t>(&out, 0x46554747);  // "GGUF"
  Put<uint32_t>(&out, options_.version);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, metadata.size());
  for (const auto& [key, value] : metadata) {
    PutString(&out, key);
    Put<uint32_t>(&out, static_cast<uint32_t>(value.type()));
    PutPayload(&out, value);
  }
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const Tensor& t : tensors_) {
    offsets.push_back(next);
    next = (next + t.bytes.size() + align - 1) / align * align;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, offsets[i]);
  }
  if (!tensors_.empty()) {
    out.resize((out.size() + align - 1) / align * align, '\0');
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], '\0');
      out.append(tensors_[i].bytes);
    }
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  return WriteStringToFile(path, Serialize());
}

absl::Status WriteStringToFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot open for writing: ", std::strerror(errno)));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvserve
