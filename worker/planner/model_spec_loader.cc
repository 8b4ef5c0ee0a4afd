#include "worker/planner/model_spec_loader.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/mapped_file.h"
#include "nlohmann/json.hpp"
#include "worker/planner/tensor_sharding.h"

namespace kvserve {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// Safetensors headers larger than this are refused (real ones are a few MB at most).
constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// Reads config field `key` as a non-negative int: nullopt when absent or null.
absl::StatusOr<std::optional<int>> OptInt(const Json& config, absl::string_view key,
                                          const std::string& origin) {
  const auto it = config.find(std::string(key));
  if (it == config.end() || it->is_null()) return std::nullopt;
  int64_t value = -1;
  if (it->is_number_integer()) {
    value = it->get<int64_t>();
  } else if (it->is_number_float()) {
    const double d = it->get<double>();
    if (d >= 0 && d <= INT_MAX && d == static_cast<double>(static_cast<int64_t>(d))) {
      value = static_cast<int64_t>(d);
    }
  }
  if (value < 0 || value > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": field \"", key, "\" must be a non-negative integer, got ", it->dump()));
  }
  return static_cast<int>(value);
}

bool OptBool(const Json& config, absl::string_view key, bool fallback) {
  const auto it = config.find(std::string(key));
  return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string OptString(const Json& config, absl::string_view key) {
  const auto it = config.find(std::string(key));
  return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The dtype the checkpoint stores its matmul weights in, from torch_dtype / dtype and a
// quantization_config (fp8, or 4-bit GPTQ/AWQ).
std::optional<WeightDType> CheckpointDType(const Json& config) {
  const auto quant = config.find("quantization_config");
  if (quant != config.end() && quant->is_object()) {
    const std::string method = OptString(*quant, "quant_method");
    if (method == "fp8") return WeightDType::kFp8;
    const auto bits = quant->find("bits");
    if (bits != quant->end() && bits->is_number_integer()) {
      if (bits->get<int>() == 4) return WeightDType::kInt4;
      if (bits->get<int>() == 8) return WeightDType::kInt8;
    }
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    absl::StatusOr<WeightDType> dtype = ParseWeightDType(OptString(config, key));
    if (dtype.ok()) return *dtype;
  }
  return std::nullopt;
}

constexpr std::array<absl::string_view, 8> kKnownModelTypes = {
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3"};
constexpr std::array<absl::string_view, 5> kLlamaFields = {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"};

absl::Status CheckModelType(const Json& config, const std::string& origin, ModelSpec& spec) {
  if (std::find(kKnownModelTypes.begin(), kKnownModelTypes.end(), spec.model_type) !=
      kKnownModelTypes.end()) {
    return absl::OkStatus();
  }
  std::vector<absl::string_view> missing;
  for (absl::string_view field : kLlamaFields) {
    if (!config.contains(std::string(field))) missing.push_back(field);
  }
  const std::string known = absl::StrJoin(kKnownModelTypes, ", ");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": unsupported model_type \"", spec.model_type, "\" (supported: ", known,
        ", or any config with the Llama fields; missing ", absl::StrJoin(missing, ", "), ")"));
  }
  for (const char* moe_field : {"num_experts", "n_routed_experts", "kv_lora_rank"}) {
    if (config.contains(moe_field)) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": unsupported model_type \"", spec.model_type, "\": its \"", moe_field,
          "\" layout is not one the planner knows (supported: ", known, ")"));
    }
  }
  spec.assumed_llama_like = true;
  return absl::OkStatus();
}

// Reads the fields of a parsed config object into `spec`.
absl::Status FillFromConfig(const Json& config, const std::string& origin, ModelSpec& spec) {
  spec.model_type = OptString(config, "model_type");
  if (spec.model_type.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": missing or non-string field \"model_type\""));
  }
  if (absl::Status s = CheckModelType(config, origin, spec); !s.ok()) return s;

  // Assigns a required (or, with a fallback, optional) integer field.
  auto read = [&](absl::string_view key, int& out, std::optional<int> fallback) -> absl::Status {
    absl::StatusOr<std::optional<int>> value = OptInt(config, key, origin);
    if (!value.ok()) return value.status();
    if (value->has_value()) {
      out = **value;
    } else if (fallback.has_value()) {
      out = *fallback;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": missing required field \"", key, "\""));
    }
    return absl::OkStatus();
  };
  const bool deepseek = absl::StartsWith(spec.model_type, "deepseek_v");
  absl::Status s;
  if (s = read("num_hidden_layers", spec.num_layers, {}); !s.ok()) return s;
  if (s = read("hidden_size", spec.hidden_size, {}); !s.ok()) return s;
  if (s = read("num_attention_heads", spec.num_heads, {}); !s.ok()) return s;
  if (s = read("intermediate_size", spec.intermediate_size, {}); !s.ok()) return s;
  if (s = read("vocab_size", spec.vocab_size, {}); !s.ok()) return s;
  if (s = read("num_key_value_heads", spec.num_kv_heads, spec.num_heads); !s.ok()) return s;
  if (s = read("max_position_embeddings", spec.max_position_embeddings, 0); !s.ok()) return s;
  if (spec.num_heads > 0) {
    if (s = read("head_dim", spec.head_dim, spec.hidden_size / spec.num_heads); !s.ok()) {
      return s;
    }
  }
  spec.tie_word_embeddings = OptBool(config, "tie_word_embeddings", false);
  spec.checkpoint_dtype = CheckpointDType(config);

  if (spec.model_type == "qwen2") {
    spec.qkv_bias = true;
    if (OptBool(config, "use_sliding_window", false)) {
      if (s = read("sliding_window", spec.sliding_window, 0); !s.ok()) return s;
    }
  } else if (spec.model_type == "qwen3" || spec.model_type == "qwen3_moe") {
    spec.qk_norm = true;
    spec.qkv_bias = spec.o_bias = OptBool(config, "attention_bias", false);
    if (OptBool(config, "use_sliding_window", false)) {
      if (s = read("sliding_window", spec.sliding_window, 0); !s.ok()) return s;
    }
  } else if (!deepseek) {
    spec.qkv_bias = spec.o_bias = OptBool(config, "attention_bias", false);
    if (s = read("sliding_window", spec.sliding_window, 0); !s.ok()) return s;
  }

  // Mixtral-style MoE: every layer has num_local_experts experts of width intermediate_size.
  int local_experts = 0;
  if (s = read("num_local_experts", local_experts, 0); !s.ok()) return s;
  if (local_experts > 0) {
    spec.moe.num_routed_experts = local_experts;
    spec.moe.moe_intermediate_size = spec.intermediate_size;
    if (s = read("num_experts_per_tok", spec.moe.num_experts_per_tok, 2); !s.ok()) return s;
  } else if (spec.model_type == "mixtral") {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": mixtral config lacks \"num_local_experts\""));
  }
  // Qwen3-MoE: num_experts experts of width moe_intermediate_size in every layer (counted as
  // if decoder_sparse_step were 1 and mlp_only_layers empty, the only layout the engine runs).
  if (spec.model_type == "qwen3_moe") {
    MoeSpec& moe = spec.moe;
    if (s = read("num_experts", moe.num_routed_experts, {}); !s.ok()) return s;
    if (s = read("moe_intermediate_size", moe.moe_intermediate_size, {}); !s.ok()) return s;
    if (s = read("num_experts_per_tok", moe.num_experts_per_tok, {}); !s.ok()) return s;
  }

  if (deepseek) {
    MoeSpec& moe = spec.moe;
    if (s = read("n_routed_experts", moe.num_routed_experts, 0); !s.ok()) return s;
    if (s = read("n_shared_experts", moe.num_shared_experts, 0); !s.ok()) return s;
    if (s = read("moe_intermediate_size", moe.moe_intermediate_size, 0); !s.ok()) return s;
    if (s = read("num_experts_per_tok", moe.num_experts_per_tok, 0); !s.ok()) return s;
    if (s = read("first_k_dense_replace", moe.first_k_dense_replace, 0); !s.ok()) return s;
    if (s = read("moe_layer_freq", moe.moe_layer_freq, 1); !s.ok()) return s;
    moe.router_bias = OptString(config, "topk_method") == "noaux_tc";
    MlaSpec& mla = spec.mla;
    if (s = read("kv_lora_rank", mla.kv_lora_rank, {}); !s.ok()) return s;
    if (s = read("q_lora_rank", mla.q_lora_rank, 0); !s.ok()) return s;
    if (s = read("qk_rope_head_dim", mla.qk_rope_head_dim, {}); !s.ok()) return s;
    if (s = read("qk_nope_head_dim", mla.qk_nope_head_dim, {}); !s.ok()) return s;
    if (s = read("v_head_dim", mla.v_head_dim, {}); !s.ok()) return s;
    if (mla.kv_lora_rank == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": field \"kv_lora_rank\" must be positive"));
    }
    spec.head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    // MLA caches one latent per token; the k/v "heads" of the config play no part.
    spec.num_kv_heads = spec.num_heads;
  }
  return spec.Validate();
}

// Adds the tensor bytes of one safetensors file, reading only its header.
absl::Status AddSafetensorsHeader(const fs::path& file, int num_layers, ShardedSizes& sizes) {
  const std::string name = file.string();
  std::error_code ec;
  const uint64_t file_size = fs::file_size(file, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(name, ": cannot stat: ", ec.message()));
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(name, ": cannot open"));
  unsigned char len_bytes[8] = {};
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(len_bytes), 8)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": too short for a safetensors file"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxSafetensorsHeaderBytes || header_len > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": safetensors header length ", header_len,
                                                   " exceeds the file size ", file_size));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": truncated safetensors header"));
  }
  const Json json = Json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": safetensors header is not a JSON object"));
  }
  const uint64_t data_size = file_size - 8 - header_len;
  for (const auto& [tensor, info] : json.items()) {
    if (tensor == "__metadata__") continue;
    const Json* offsets = nullptr;
    if (info.is_object()) {
      const auto it = info.find("data_offsets");
      if (it != info.end()) offsets = &*it;
    }
    if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": tensor \"", tensor, "\" lacks data_offsets [begin, end]"));
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": tensor \"", tensor, "\" has data_offsets [", begin, ", ", end,
                       "] outside the ", data_size, "-byte data section"));
    }
    AddShardedBytes(ClassifyHfTensor(tensor, num_layers), static_cast<int64_t>(end - begin), sizes);
  }
  return absl::OkStatus();
}

// The safetensors files a model directory's weights live in (see LoadModelSpec).
absl::StatusOr<std::vector<fs::path>> SafetensorsFiles(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    absl::StatusOr<std::string> text = ReadFileToString(index.string());
    if (!text.ok()) return text.status();
    const Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    const Json* map = nullptr;
    if (!json.is_discarded() && json.is_object()) {
      const auto it = json.find("weight_map");
      if (it != json.end() && it->is_object()) map = &*it;
    }
    if (map == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(index.string(), ": missing object field \"weight_map\""));
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string() || absl::StrContains(shard.get<std::string>(), "/")) {
        return absl::InvalidArgumentError(absl::StrCat(index.string(), ": weight_map entry for \"",
                                                       tensor, "\" is not a file name"));
      }
      shards.insert(shard.get<std::string>());
    }
    std::vector<fs::path> files;
    for (const std::string& shard : shards) files.push_back(dir / shard);
    return files;
  }
  if (fs::exists(dir / "model.safetensors", ec)) {
    return std::vector<fs::path>{dir / "model.safetensors"};
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string file_name = entry.path().filename().string();
    if (absl::EndsWith(file_name, ".safetensors") && !absl::StartsWith(file_name, "consolidated")) {
      files.push_back(entry.path());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir.string(), ": cannot list: ", ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

bool LooksLikeGguf(const std::string& path) {
  if (absl::EndsWith(path, ".gguf")) return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromConfigJson(std::string_view json_text,
                                                  const std::string& origin) {
  const Json config = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  }
  ModelSpec spec;
  spec.source = origin;
  try {
    if (absl::Status s = FillFromConfig(config, origin, spec); !s.ok()) return s;
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", e.what()));
  }
  return spec;
}

absl::StatusOr<std::optional<ShardedSizes>> SafetensorsWeightBytes(const std::string& dir,
                                                                   int num_layers) {
  absl::StatusOr<std::vector<fs::path>> files = SafetensorsFiles(dir);
  if (!files.ok()) return files.status();
  if (files->empty()) return std::optional<ShardedSizes>();
  ShardedSizes sizes;
  try {
    for (const fs::path& file : *files) {
      if (absl::Status s = AddSafetensorsHeader(file, num_layers, sizes); !s.ok()) return s;
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": safetensors header: ", e.what()));
  }
  return std::optional<ShardedSizes>(sizes);
}

absl::StatusOr<ModelSpec> LoadModelSpec(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string config_path = (fs::path(path) / "config.json").string();
    absl::StatusOr<std::string> text = ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    absl::StatusOr<ModelSpec> spec = ModelSpecFromConfigJson(*text, config_path);
    if (!spec.ok()) return spec.status();
    spec->source = path;
    absl::StatusOr<std::optional<ShardedSizes>> bytes =
        SafetensorsWeightBytes(path, spec->num_layers);
    if (!bytes.ok()) return bytes.status();
    spec->tensor_bytes = *bytes;
    return spec;
  }
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  if (LooksLikeGguf(path)) {
    absl::StatusOr<GgufFile> file = GgufFile::Open(path);
    if (!file.ok()) return file.status();
    return ModelSpecFromGguf(*file);
  }
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ModelSpecFromConfigJson(*text, path);
}

}  // namespace kvserve
