#include "common/tokenizer/normalizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace kvserve {

void PrependNormalizer::Normalize(std::string* text) const {
  if (!text->empty()) text->insert(0, prefix_);
}

void ReplaceNormalizer::Normalize(std::string* text) const {
  const auto matches = pattern_->FindAll(*text);
  if (matches.empty()) return;
  std::string out;
  out.reserve(text->size());
  size_t last = 0;
  for (const auto& [begin, end] : matches) {
    out.append(*text, last, begin - last);
    out.append(content_);
    last = end;
  }
  out.append(*text, last, std::string::npos);
  *text = std::move(out);
}

void SequenceNormalizer::Normalize(std::string* text) const {
  for (const auto& step : steps_) step->Normalize(text);
}

void IcuNormalizer::Normalize(std::string* text) const {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text->data(), text->size()));
  icu::UnicodeString result;
  if (form_ == Form::kLowercase) {
    result = u.toLower(icu::Locale::getRoot());
  } else {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = nullptr;
    switch (form_) {
      case Form::kNfc:
        n = icu::Normalizer2::getNFCInstance(status);
        break;
      case Form::kNfd:
        n = icu::Normalizer2::getNFDInstance(status);
        break;
      case Form::kNfkc:
        n = icu::Normalizer2::getNFKCInstance(status);
        break;
      default:
        n = icu::Normalizer2::getNFKDInstance(status);
        break;
    }
    if (U_FAILURE(status) || n == nullptr) return;  // ICU data missing: leave text as is.
    result = n->normalize(u, status);
    if (U_FAILURE(status)) return;
  }
  text->clear();
  result.toUTF8String(*text);
}

void StripNormalizer::Normalize(std::string* text) const {
  size_t begin = 0;
  size_t end = text->size();
  if (left_) {
    while (begin < end) {
      const size_t len = utf8::SequenceLength(*text, begin);
      if (len == 0 || !u_isUWhiteSpace(static_cast<UChar32>(utf8::Decode(*text, begin, len)))) {
        break;
      }
      begin += len;
    }
  }
  if (right_) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && ((*text)[start] & 0xC0) == 0x80) --start;
      const size_t len = utf8::SequenceLength(*text, start);
      if (len == 0 || !u_isUWhiteSpace(static_cast<UChar32>(utf8::Decode(*text, start, len)))) {
        break;
      }
      end = start;
    }
  }
  *text = text->substr(begin, end - begin);
}

absl::StatusOr<std::unique_ptr<Regex>> PatternFromJson(const nlohmann::json& j,
                                                       const std::string& where) {
  if (j.is_object()) {
    if (const auto it = j.find("String"); it != j.end() && it->is_string()) {
      return Regex::Compile(it->get<std::string>(), /*literal=*/true);
    }
    if (const auto it = j.find("Regex"); it != j.end() && it->is_string()) {
      absl::StatusOr<std::unique_ptr<Regex>> re = Regex::Compile(it->get<std::string>(), false);
      if (!re.ok()) return json_util::Invalid(where, std::string(re.status().message()));
      return re;
    }
  }
  return json_util::Invalid(where, "expected {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& j,
                                                               const std::string& where) {
  absl::StatusOr<std::string> type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<std::vector<std::unique_ptr<Normalizer>>> steps =
        json_util::GetArrayOf<std::unique_ptr<Normalizer>>(j, "normalizers", where, NormalizerFromJson);
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequenceNormalizer>(*std::move(steps));
  }
  if (*type == "Prepend") {
    absl::StatusOr<std::string> prefix = json_util::GetString(j, "prepend", where);
    if (!prefix.ok()) return prefix.status();
    return std::make_unique<PrependNormalizer>(*std::move(prefix));
  }
  if (*type == "Replace") {
    absl::StatusOr<std::string> content = json_util::GetString(j, "content", where);
    if (!content.ok()) return content.status();
    const auto it = j.find("pattern");
    absl::StatusOr<std::unique_ptr<Regex>> pattern =
        PatternFromJson(it == j.end() ? nlohmann::json() : *it, json_util::Field(where, "pattern"));
    if (!pattern.ok()) return pattern.status();
    return std::make_unique<ReplaceNormalizer>(*std::move(pattern), *std::move(content));
  }
  if (*type == "NFC") return std::make_unique<IcuNormalizer>(IcuNormalizer::Form::kNfc);
  if (*type == "NFD") return std::make_unique<IcuNormalizer>(IcuNormalizer::Form::kNfd);
  if (*type == "NFKC") return std::make_unique<IcuNormalizer>(IcuNormalizer::Form::kNfkc);
  if (*type == "NFKD") return std::make_unique<IcuNormalizer>(IcuNormalizer::Form::kNfkd);
  if (*type == "Lowercase") {
    return std::make_unique<IcuNormalizer>(IcuNormalizer::Form::kLowercase);
  }
  if (*type == "Strip") {
    absl::StatusOr<bool> left = json_util::GetBool(j, "strip_left", true, where);
    absl::StatusOr<bool> right = json_util::GetBool(j, "strip_right", true, where);
    if (!left.ok()) return left.status();
    if (!right.ok()) return right.status();
    return std::make_unique<StripNormalizer>(*left, *right);
  }
  return json_util::Invalid(where, absl::StrCat("unsupported normalizer type '", *type, "'"));
}

}  // namespace kvserve
