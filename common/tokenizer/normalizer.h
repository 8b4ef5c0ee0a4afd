#ifndef KVSERVE_COMMON_TOKENIZER_NORMALIZER_H_
#define KVSERVE_COMMON_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"
#include "nlohmann/json_fwd.hpp"

namespace kvserve {

/// Rewrites one section of input text (the text between two added tokens) before
/// pre-tokenization, like tokenizer.json's "normalizer". Input and output are valid UTF-8.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// Normalizes `text` in place.
  virtual void Normalize(std::string* text) const = 0;
};

/// Prepends a fixed string to non-empty text ("Prepend": Llama's "▁" dummy prefix).
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override;

 private:
  std::string prefix_;
};

/// Replaces every match of a pattern (plain string or regex) with `content` ("Replace").
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override;

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

/// Applies normalizers in order ("Sequence").
class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override;

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

/// Unicode normalization forms and lower-casing through ICU ("NFC", "NFD", "NFKC", "NFKD",
/// "Lowercase").
class IcuNormalizer : public Normalizer {
 public:
  enum class Form { kNfc, kNfd, kNfkc, kNfkd, kLowercase };
  explicit IcuNormalizer(Form form) : form_(form) {}
  void Normalize(std::string* text) const override;

 private:
  Form form_;
};

/// Removes leading and/or trailing Unicode whitespace ("Strip").
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override;

 private:
  bool left_;
  bool right_;
};

/// Builds a normalizer from its tokenizer.json object; `where` names it in errors. An unsupported
/// "type" is an INVALID_ARGUMENT error that names the type.
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& j,
                                                               const std::string& where);

/// Parses a {"String": s} or {"Regex": r} pattern object (shared by Replace and Split).
absl::StatusOr<std::unique_ptr<Regex>> PatternFromJson(const nlohmann::json& j,
                                                       const std::string& where);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_TOKENIZER_NORMALIZER_H_
