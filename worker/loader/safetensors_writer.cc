#include "worker/loader/safetensors_writer.h"

#include "common/gguf/gguf_writer.h"
#include "nlohmann/json.hpp"
#include "worker/loader/safetensors_file.h"

namespace kvserve {

void SafetensorsWriter::AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                  absl::string_view bytes) {
  AddTensor(std::move(name), std::string(SafetensorsDTypeName(dtype)), std::move(shape), bytes);
}

void SafetensorsWriter::AddTensor(std::string name, std::string dtype, std::vector<int64_t> shape,
                                  absl::string_view bytes) {
  tensors_.push_back(
      Tensor{std::move(name), std::move(dtype), std::move(shape), std::string(bytes)});
}

std::string SafetensorsWriter::Serialize() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::string data;
  for (const Tensor& t : tensors_) {
    data.resize((data.size() + 7) / 8 * 8, '\0');
    const uint64_t begin = data.size();
    data.append(t.bytes);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string out;
  const uint64_t len = text.size();
  out.append(reinterpret_cast<const char*>(&len), 8);  // little-endian host
  out.append(text);
  out.append(data);
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  return WriteStringToFile(path, Serialize());
}

}  // namespace kvserve
