#include "common/tokenizer/tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/json_util.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using json = nlohmann::json;
using json_util::Invalid;

absl::Status WithFile(const std::string& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
}

absl::StatusOr<TokenId> GetId(const json& j, const std::string& key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0 ||
      it->get<int64_t>() > (int64_t{1} << 30)) {
    return Invalid(json_util::Field(where, key), "expected a token id (non-negative integer)");
  }
  return static_cast<TokenId>(it->get<int64_t>());
}

absl::Status LoadModel(const json& root, TokenizerParts* parts) {
  const auto model_it = root.find("model");
  if (model_it == root.end() || !model_it->is_object()) return Invalid("model", "missing object");
  const json& m = *model_it;
  if (const auto type = m.find("type"); type != m.end()) {
    if (!type->is_string()) return Invalid("model.type", "expected a string");
    if (type->get<std::string>() != "BPE") {
      return Invalid("model.type",
                     absl::StrCat("unsupported model type '", type->get<std::string>(),
                                  "' (only BPE is supported)"));
    }
  } else if (!m.contains("merges")) {
    return Invalid("model", "no \"type\" and no \"merges\": unsupported model type");
  }
  const auto vocab_it = m.find("vocab");
  if (vocab_it == m.end() || !vocab_it->is_object()) {
    return Invalid("model.vocab", "expected an object of piece -> id");
  }
  absl::flat_hash_map<std::string, TokenId> vocab;
  vocab.reserve(vocab_it->size());
  for (const auto& [piece, id] : vocab_it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 30)) {
      return Invalid(absl::StrCat("model.vocab[\"", piece, "\"]"), "expected a token id");
    }
    vocab[piece] = static_cast<TokenId>(id.get<int64_t>());
    parts->SetPiece(static_cast<TokenId>(id.get<int64_t>()), piece, false);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const auto merges_it = m.find("merges");
  if (merges_it != m.end()) {
    if (!merges_it->is_array()) return Invalid("model.merges", "expected an array");
    merges.reserve(merges_it->size());
    for (size_t i = 0; i < merges_it->size(); ++i) {
      const json& e = (*merges_it)[i];
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Invalid(absl::StrCat("model.merges[", i, "]"),
                         absl::StrCat("expected \"left right\", got '", s, "'"));
        }
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        return Invalid(absl::StrCat("model.merges[", i, "]"),
                       "expected \"left right\" or [\"left\", \"right\"]");
      }
    }
  }
  BpeModelOptions options;
  if (const auto unk = m.find("unk_token"); unk != m.end() && unk->is_string()) {
    const auto found = vocab.find(unk->get<std::string>());
    if (found == vocab.end()) {
      return Invalid("model.unk_token",
                     absl::StrCat("'", unk->get<std::string>(), "' is not in model.vocab"));
    }
    options.unk_id = found->second;
  }
  for (const auto& [key, field] :
       {std::pair<const char*, std::string*>{"continuing_subword_prefix",
                                             &options.continuing_subword_prefix},
        {"end_of_word_suffix", &options.end_of_word_suffix}}) {
    if (const auto it = m.find(key); it != m.end() && it->is_string()) {
      *field = it->get<std::string>();
    }
  }
  for (const auto& [key, field] : {std::pair<const char*, bool*>{"fuse_unk", &options.fuse_unk},
                                   {"byte_fallback", &options.byte_fallback},
                                   {"ignore_merges", &options.ignore_merges}}) {
    absl::StatusOr<bool> value = json_util::GetBool(m, key, false, "model");
    if (!value.ok()) return value.status();
    *field = *value;
  }
  absl::StatusOr<std::unique_ptr<BpeModel>> model =
      BpeModel::Create(std::move(vocab), merges, std::move(options));
  if (!model.ok()) return model.status();
  parts->model = *std::move(model);
  return absl::OkStatus();
}

absl::Status LoadAddedTokens(const json& root, TokenizerParts* parts) {
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Invalid("added_tokens", "expected an array");
  std::vector<AddedToken> raw;
  std::vector<AddedToken> normalized;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!e.is_object()) return Invalid(where, "expected an object");
    AddedToken t;
    absl::StatusOr<TokenId> id = GetId(e, "id", where);
    if (!id.ok()) return id.status();
    absl::StatusOr<std::string> content = json_util::GetString(e, "content", where);
    if (!content.ok()) return content.status();
    t.id = *id;
    t.content = *std::move(content);
    for (const auto& [key, field, fallback] :
         {std::tuple<const char*, bool*, bool>{"special", &t.special, false},
          {"lstrip", &t.lstrip, false},
          {"rstrip", &t.rstrip, false},
          {"single_word", &t.single_word, false}}) {
      absl::StatusOr<bool> value = json_util::GetBool(e, key, fallback, where);
      if (!value.ok()) return value.status();
      *field = *value;
    }
    absl::StatusOr<bool> norm = json_util::GetBool(e, "normalized", !t.special, where);
    if (!norm.ok()) return norm.status();
    t.normalized = *norm;
    parts->SetPiece(t.id, t.content, t.special);
    // Without a normalizer, normalized text is the raw text.
    (t.normalized && parts->normalizer != nullptr ? normalized : raw).push_back(std::move(t));
  }
  parts->raw_tokens = AddedTokenMatcher(raw);
  parts->normalized_tokens = AddedTokenMatcher(normalized);
  return absl::OkStatus();
}

// Ids of a post-processor special token by name: the processor's own table, else the vocab.
absl::StatusOr<std::vector<TokenId>> SpecialIds(const json& table, const std::string& name,
                                                const TokenizerParts& parts,
                                                const std::string& where) {
  if (const auto it = table.find(name); table.is_object() && it != table.end()) {
    const auto ids = it->find("ids");
    if (ids != it->end() && ids->is_array()) {
      std::vector<TokenId> out;
      for (const json& id : *ids) {
        if (!id.is_number_integer()) return Invalid(where, "special token ids must be integers");
        out.push_back(id.get<TokenId>());
      }
      return out;
    }
  }
  const auto found = parts.piece_ids.find(name);
  if (found == parts.piece_ids.end()) {
    return Invalid(where, absl::StrCat("special token '", name, "' is not in the vocabulary"));
  }
  return std::vector<TokenId>{found->second};
}

absl::Status LoadPostProcessor(const json& j, const std::string& where, TokenizerParts* parts) {
  absl::StatusOr<std::string> type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();  // Offsets only; no ids.
  if (*type == "Sequence") {
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return Invalid(json_util::Field(where, "processors"), "expected an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      absl::Status s =
          LoadPostProcessor((*it)[i], absl::StrCat(where, ".processors[", i, "]"), parts);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    const auto single = j.find("single");
    if (single == j.end() || !single->is_array()) {
      return Invalid(json_util::Field(where, "single"), "expected an array");
    }
    const json table = j.value("special_tokens", json::object());
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string item_where = absl::StrCat(where, ".single[", i, "]");
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const auto special = item.find("SpecialToken");
      if (special == item.end() || !special->is_object()) {
        return Invalid(item_where, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
      absl::StatusOr<std::string> name = json_util::GetString(*special, "id", item_where);
      if (!name.ok()) return name.status();
      absl::StatusOr<std::vector<TokenId>> ids = SpecialIds(table, *name, *parts, item_where);
      if (!ids.ok()) return ids.status();
      auto& target = seen_sequence ? parts->suffix_ids : parts->prefix_ids;
      target.insert(target.end(), ids->begin(), ids->end());
    }
    return absl::OkStatus();
  }
  if (*type == "RobertaProcessing" || *type == "BertProcessing") {
    for (const auto& [key, target] :
         {std::pair<const char*, std::vector<TokenId>*>{"cls", &parts->prefix_ids},
          {"sep", &parts->suffix_ids}}) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
        return Invalid(json_util::Field(where, key), "expected [\"token\", id]");
      }
      target->push_back((*it)[1].get<TokenId>());
    }
    return absl::OkStatus();
  }
  return Invalid(where, absl::StrCat("unsupported post_processor type '", *type, "'"));
}

// A token name in tokenizer_config.json: "text" or {"content": "text", ...}.
std::optional<std::string> TokenName(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    if (const auto c = it->find("content"); c != it->end() && c->is_string()) {
      return c->get<std::string>();
    }
  }
  return std::nullopt;
}

TokenId IdOf(const TokenizerParts& parts, const std::optional<std::string>& name) {
  if (!name.has_value()) return kNoToken;
  const auto it = parts.piece_ids.find(*name);
  return it == parts.piece_ids.end() ? kNoToken : it->second;
}

absl::Status ApplyConfig(const json& config, TokenizerParts* parts) {
  if (!config.is_object()) return Invalid("", "expected an object");
  const std::optional<std::string> bos_name = TokenName(config, "bos_token");
  const std::optional<std::string> eos_name = TokenName(config, "eos_token");
  if (bos_name.has_value()) parts->bos_id = IdOf(*parts, bos_name);
  if (eos_name.has_value()) parts->eos_id = IdOf(*parts, eos_name);
  // Like LlamaTokenizerFast: explicit add_bos_token / add_eos_token rebuild the post-processor.
  for (const auto& [key, target, id] : {std::tuple<const char*, std::vector<TokenId>*, TokenId>{
                                            "add_bos_token", &parts->prefix_ids, parts->bos_id},
                                        {"add_eos_token", &parts->suffix_ids, parts->eos_id}}) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_boolean()) return Invalid(key, "expected true or false");
    target->clear();
    if (it->get<bool>()) {
      if (id == kNoToken) {
        return Invalid(key,
                       "is true but the matching bos_token/eos_token is not in the vocabulary");
      }
      target->push_back(id);
    }
  }
  if (const auto it = config.find("chat_template"); it != config.end()) {
    if (it->is_string()) {
      parts->chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // [{"name": ..., "template": ...}]: the "default" one, else the first.
      for (const json& e : *it) {
        if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
        if (parts->chat_template.empty() || e.value("name", "") == "default") {
          parts->chat_template = e["template"].get<std::string>();
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LoadParts(const json& root, TokenizerParts* parts) {
  if (!root.is_object()) return Invalid("", "expected a JSON object at the top level");
  if (const auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    absl::StatusOr<std::unique_ptr<Normalizer>> n = NormalizerFromJson(*it, "normalizer");
    if (!n.ok()) return n.status();
    parts->normalizer = *std::move(n);
  }
  if (const auto it = root.find("pre_tokenizer"); it != root.end() && !it->is_null()) {
    absl::StatusOr<std::unique_ptr<PreTokenizer>> p = PreTokenizerFromJson(*it, "pre_tokenizer");
    if (!p.ok()) return p.status();
    parts->pre_tokenizer = *std::move(p);
  }
  if (const auto it = root.find("decoder"); it != root.end() && !it->is_null()) {
    absl::StatusOr<std::unique_ptr<Decoder>> d = DecoderFromJson(*it, "decoder");
    if (!d.ok()) return d.status();
    parts->decoder = *std::move(d);
  }
  absl::Status s = LoadModel(root, parts);
  if (!s.ok()) return s;
  s = LoadAddedTokens(root, parts);
  if (!s.ok()) return s;
  if (const auto it = root.find("post_processor"); it != root.end() && !it->is_null()) {
    s = LoadPostProcessor(*it, "post_processor", parts);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerParts>> LoadTokenizerJson(const std::string& path) {
  absl::StatusOr<json> root = ReadJson(path);
  if (!root.ok()) return root.status();
  auto parts = std::make_unique<TokenizerParts>();
  try {
    absl::Status s = LoadParts(*root, parts.get());
    if (!s.ok()) return WithFile(path, s);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected JSON content: ", e.what()));
  }
  // Defaults before the config: a lone post-processor prefix token is the BOS token; GPT-2
  // style vocabularies end text with <|endoftext|>.
  if (parts->prefix_ids.size() == 1) parts->bos_id = parts->prefix_ids[0];
  if (const auto it = parts->piece_ids.find("<|endoftext|>"); it != parts->piece_ids.end()) {
    if (parts->special[it->second]) parts->eos_id = it->second;
  }
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    absl::StatusOr<json> config = ReadJson(config_path.string());
    if (!config.ok()) return config.status();
    try {
      absl::Status s = ApplyConfig(*config, parts.get());
      if (!s.ok()) return WithFile(config_path.string(), s);
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path.string(), ": unexpected JSON content: ", e.what()));
    }
  }
  return parts;
}

}  // namespace kvserve
