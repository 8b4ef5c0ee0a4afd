#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 '▁'

std::string ReplaceAll(const std::string& text, const Regex& pattern, std::string_view content) {
  const auto matches = pattern.FindAll(text);
  if (matches.empty()) return text;
  std::string out;
  size_t last = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text, last, begin - last);
    out.append(content);
    last = end;
  }
  out.append(text, last, std::string::npos);
  return out;
}

}  // namespace

void ByteLevelDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  std::string bytes;
  for (const std::string& token : *tokens) {
    const size_t mark = bytes.size();
    if (!ByteLevelToBytes(token, &bytes)) {
      // Not byte-level text (e.g. an added token): keep it as written.
      bytes.resize(mark);
      bytes.append(token);
    }
  }
  tokens->assign(1, utf8::ToValidLossy(bytes));
}

void ReplaceDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  for (std::string& token : *tokens) token = ReplaceAll(token, *pattern_, content_);
}

void ByteFallbackDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  std::vector<std::string> out;
  out.reserve(tokens->size());
  std::string pending;
  bool has_pending = false;
  for (std::string& token : *tokens) {
    const int byte = ParseBytePiece(token);
    if (byte >= 0) {
      pending.push_back(static_cast<char>(byte));
      has_pending = true;
      continue;
    }
    if (has_pending) {
      out.push_back(utf8::ToValidLossy(pending));
      pending.clear();
      has_pending = false;
    }
    out.push_back(std::move(token));
  }
  if (has_pending) out.push_back(utf8::ToValidLossy(pending));
  *tokens = std::move(out);
}

void FuseDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  tokens->assign(1, absl::StrJoin(*tokens, ""));
}

void StripDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  if (content_.empty()) return;
  for (std::string& token : *tokens) {
    std::string_view view = token;
    for (size_t i = 0; i < start_ && view.starts_with(content_); ++i) {
      view.remove_prefix(content_.size());
    }
    for (size_t i = 0; i < stop_ && view.ends_with(content_); ++i) {
      view.remove_suffix(content_.size());
    }
    token = std::string(view);
  }
}

void MetaspaceDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  for (size_t i = 0; i < tokens->size(); ++i) {
    std::string& token = (*tokens)[i];
    std::string out;
    std::string_view rest = token;
    while (!rest.empty()) {
      if (rest.starts_with(replacement_)) {
        out.push_back(' ');
        rest.remove_prefix(replacement_.size());
      } else {
        out.push_back(rest.front());
        rest.remove_prefix(1);
      }
    }
    if (i == 0 && strip_first_space_ && !out.empty() && out.front() == ' ') out.erase(0, 1);
    token = std::move(out);
  }
}

void SequenceDecoder::DecodeChain(std::vector<std::string>* tokens) const {
  for (const auto& step : steps_) step->DecodeChain(tokens);
}

std::unique_ptr<Decoder> MakeSentencePieceDecoder(bool strip_leading_space) {
  std::vector<std::unique_ptr<Decoder>> steps;
  steps.push_back(
      std::make_unique<ReplaceDecoder>(*Regex::Compile(kMetaspace, /*literal=*/true), " "));
  steps.push_back(std::make_unique<ByteFallbackDecoder>());
  steps.push_back(std::make_unique<FuseDecoder>());
  if (strip_leading_space) steps.push_back(std::make_unique<StripDecoder>(" ", 1, 0));
  return std::make_unique<SequenceDecoder>(std::move(steps));
}

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& j,
                                                         const std::string& where) {
  absl::StatusOr<std::string> type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<std::vector<std::unique_ptr<Decoder>>> steps =
        json_util::GetArrayOf<std::unique_ptr<Decoder>>(j, "decoders", where, DecoderFromJson);
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceDecoder>(*std::move(steps));
  }
  if (*type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (*type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (*type == "Fuse") return std::make_unique<FuseDecoder>();
  if (*type == "Replace") {
    absl::StatusOr<std::string> content = json_util::GetString(j, "content", where);
    if (!content.ok()) return content.status();
    const auto it = j.find("pattern");
    absl::StatusOr<std::unique_ptr<Regex>> pattern =
        PatternFromJson(it == j.end() ? nlohmann::json() : *it, json_util::Field(where, "pattern"));
    if (!pattern.ok()) return pattern.status();
    return std::make_unique<ReplaceDecoder>(*std::move(pattern), *std::move(content));
  }
  if (*type == "Strip") {
    absl::StatusOr<std::string> content = json_util::GetString(j, "content", where);
    if (!content.ok()) return content.status();
    const auto start = j.find("start");
    const auto stop = j.find("stop");
    const auto count = [](const nlohmann::json::const_iterator& it, const nlohmann::json& o) {
      return it != o.end() && it->is_number_unsigned() ? it->get<size_t>() : size_t{0};
    };
    return std::make_unique<StripDecoder>(*std::move(content), count(start, j), count(stop, j));
  }
  if (*type == "Metaspace") {
    std::string replacement(kMetaspace);
    if (const auto r = j.find("replacement"); r != j.end() && r->is_string()) {
      replacement = r->get<std::string>();
    }
    if (replacement.empty()) {
      return json_util::Invalid(json_util::Field(where, "replacement"), "must not be empty");
    }
    bool strip = true;
    if (const auto s = j.find("prepend_scheme"); s != j.end() && s->is_string()) {
      strip = s->get<std::string>() != "never";
    } else {
      absl::StatusOr<bool> add = json_util::GetBool(j, "add_prefix_space", true, where);
      if (!add.ok()) return add.status();
      strip = *add;
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip);
  }
  return json_util::Invalid(where, absl::StrCat("unsupported decoder type '", *type, "'"));
}

}  // namespace kvserve
