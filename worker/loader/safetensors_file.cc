#include "worker/loader/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using nlohmann::json;

/// The safetensors format caps the JSON header at 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::optional<DType> ParseDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return std::nullopt;
}

/// Parses one tensor entry of the header into `t` (offsets not yet bounds-checked).
absl::Status ParseEntry(const std::string& path, const std::string& name, const json& entry,
                        SafetensorsTensor* t) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' ", what));
  };
  if (!entry.is_object()) return error("is not a JSON object");
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return error("has no string 'dtype'");
  const std::string dtype = dtype_it->get<std::string>();
  std::optional<DType> parsed = ParseDType(dtype);
  if (!parsed.has_value()) {
    return error(absl::StrCat("has unsupported dtype '", dtype, "' (supported: F32, F16, BF16)"));
  }
  t->name = name;
  t->dtype = *parsed;
  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return error("has no array 'shape'");
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned()) {
      return error(absl::StrCat("has an invalid dimension ", d.dump(), " in its shape"));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return error("has a dimension that is too large");
    t->shape.push_back(static_cast<int64_t>(v));
  }
  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    return error("has no 'data_offsets' pair of non-negative integers");
  }
  t->begin = (*off_it)[0].get<uint64_t>();
  t->end = (*off_it)[1].get<uint64_t>();
  return absl::OkStatus();
}

/// Checks `t`'s byte range against the data section and its shape.
absl::Status CheckRange(const std::string& path, uint64_t data_size, const SafetensorsTensor& t) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' ", what));
  };
  if (t.begin > t.end) {
    return error(absl::StrCat("has data_offsets [", t.begin, ", ", t.end, "] with begin > end"));
  }
  if (t.end > data_size) {
    return error(absl::StrCat("has data_offsets [", t.begin, ", ", t.end,
                              "] past the end of the data section (", data_size, " bytes)"));
  }
  uint64_t expected = static_cast<uint64_t>(DTypeBlockBytes(t.dtype));
  for (int64_t d : t.shape) {
    if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected)) {
      return error("has a shape whose byte size overflows");
    }
  }
  if (t.end - t.begin != expected) {
    return error(absl::StrCat("has shape [", absl::StrJoin(t.shape, ", "), "] of ",
                              SafetensorsDTypeName(t.dtype), " (", expected,
                              " bytes) but data_offsets span ", t.end - t.begin, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    default:
      return "";
  }
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Parse(*std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(MappedFile file) {
  SafetensorsFile out;
  out.file_ = std::move(file);
  const std::string& path = out.file_.path();
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  const uint64_t size = out.file_.size();
  if (size < 8) {
    return error(absl::StrCat("file is ", size, " bytes, too short for a safetensors header"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, out.file_.data(), 8);  // little-endian host
  if (header_len > size - 8) {
    return error(absl::StrCat("header length ", header_len, " exceeds the file size ", size));
  }
  if (header_len > kMaxHeaderBytes) {
    return error(absl::StrCat("header length ", header_len, " exceeds the 100 MB limit"));
  }
  out.data_offset_ = 8 + header_len;
  const uint64_t data_size = size - out.data_offset_;
  const char* begin = reinterpret_cast<const char*>(out.file_.data()) + 8;
  json header;
  try {
    header = json::parse(begin, begin + header_len);
  } catch (const std::exception& e) {
    return error(absl::StrCat("invalid JSON header: ", e.what()));
  }
  if (!header.is_object()) return error("JSON header is not an object");
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) return error("__metadata__ is not a JSON object");
        for (const auto& [key, value] : entry.items()) {
          if (!value.is_string()) {
            return error(absl::StrCat("__metadata__ entry '", key, "' is not a string"));
          }
          out.metadata_[key] = value.get<std::string>();
        }
        continue;
      }
      SafetensorsTensor t;
      if (absl::Status s = ParseEntry(path, name, entry, &t); !s.ok()) return s;
      if (absl::Status s = CheckRange(path, data_size, t); !s.ok()) return s;
      t.data = out.file_.data() + out.data_offset_ + t.begin;
      out.tensors_.push_back(std::move(t));
    }
  } catch (const std::exception& e) {  // defensive: the checks above should prevent any throw
    return error(absl::StrCat("malformed JSON header: ", e.what()));
  }
  std::sort(out.tensors_.begin(), out.tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
            });
  for (size_t i = 0; i < out.tensors_.size(); ++i) out.index_[out.tensors_[i].name] = i;
  return out;
}

const SafetensorsTensor* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kvserve
