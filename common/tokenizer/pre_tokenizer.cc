#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

// Cuts `text` into alternating gap / match segments (empty gaps omitted).
std::vector<Segment> Segments(std::string_view text, const Regex& pattern, bool invert) {
  std::vector<Segment> segments;
  size_t last = 0;
  for (const auto& [begin, end] : pattern.FindAll(text)) {
    if (begin > last) segments.push_back({last, begin, invert});
    segments.push_back({begin, end, !invert});
    last = end;
  }
  if (last < text.size()) segments.push_back({last, text.size(), invert});
  return segments;
}

// Applies a SplitBehavior to the segments; returns [begin, end) ranges to keep.
std::vector<std::pair<size_t, size_t>> ApplyBehavior(const std::vector<Segment>& segments,
                                                     SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Segment& s : segments) {
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Segment& s : segments) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      // A match joins the piece before it, unless that piece was itself a match.
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Mirror image: walk from the right; a match joins the piece after it unless that piece
      // was itself a match.
      bool next_match = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !next_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        next_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      // Runs of consecutive matches become one piece.
      bool previous_match = false;
      for (const Segment& s : segments) {
        if (s.is_match && previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  return out;
}

void SplitWithPattern(std::string_view text, const Regex& pattern, SplitBehavior behavior,
                      bool invert, std::vector<std::string>* out) {
  for (const auto& [begin, end] : ApplyBehavior(Segments(text, pattern, invert), behavior)) {
    if (end > begin) out->emplace_back(text.substr(begin, end - begin));
  }
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeRegexSplit(std::string_view pattern,
                                                             SplitBehavior behavior, bool invert) {
  absl::StatusOr<std::unique_ptr<Regex>> re = Regex::Compile(pattern, /*literal=*/false);
  if (!re.ok()) return re.status();
  return std::make_unique<RegexSplitPreTokenizer>(*std::move(re), behavior, invert);
}

absl::StatusOr<SplitBehavior> ParseBehavior(const nlohmann::json& j, const std::string& where) {
  absl::StatusOr<std::string> name = json_util::GetString(j, "behavior", where);
  if (!name.ok()) return name.status();
  if (*name == "Removed") return SplitBehavior::kRemoved;
  if (*name == "Isolated") return SplitBehavior::kIsolated;
  if (*name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (*name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (*name == "Contiguous") return SplitBehavior::kContiguous;
  return json_util::Invalid(json_util::Field(where, "behavior"),
                            absl::StrCat("unsupported split behavior '", *name, "'"));
}

}  // namespace

void PreTokenizer::Split(std::vector<std::string>* pieces, bool at_text_start) const {
  std::vector<std::string> out;
  out.reserve(pieces->size());
  for (size_t i = 0; i < pieces->size(); ++i) {
    SplitOne((*pieces)[i], at_text_start && i == 0, &out);
  }
  *pieces = std::move(out);
}

void RegexSplitPreTokenizer::SplitOne(std::string_view piece, bool /*first*/,
                                      std::vector<std::string>* out) const {
  SplitWithPattern(piece, *pattern_, behavior_, invert_, out);
}

void ByteLevelPreTokenizer::SplitOne(std::string_view piece, bool /*first*/,
                                     std::vector<std::string>* out) const {
  std::string text;
  if (add_prefix_space_ && (piece.empty() || piece.front() != ' ')) text.push_back(' ');
  text.append(piece);
  std::vector<std::string> parts;
  if (pattern_ != nullptr) {
    SplitWithPattern(text, *pattern_, SplitBehavior::kIsolated, false, &parts);
  } else if (!text.empty()) {
    parts.push_back(std::move(text));
  }
  for (const std::string& part : parts) {
    std::string mapped;
    BytesToByteLevel(part, &mapped);
    out->push_back(std::move(mapped));
  }
}

MetaspacePreTokenizer::MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
    : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {
  // A literal pattern always compiles.
  replacement_pattern_ = *Regex::Compile(replacement_, /*literal=*/true);
}

void MetaspacePreTokenizer::SplitOne(std::string_view piece, bool first,
                                     std::vector<std::string>* out) const {
  std::string text;
  for (const char c : piece) {
    if (c == ' ') {
      text.append(replacement_);
    } else {
      text.push_back(c);
    }
  }
  const bool prepend = prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && first);
  if (prepend && !text.starts_with(replacement_)) text.insert(0, replacement_);
  if (split_) {
    SplitWithPattern(text, *replacement_pattern_, SplitBehavior::kMergedWithNext, false, out);
  } else if (!text.empty()) {
    out->push_back(std::move(text));
  }
}

void SequencePreTokenizer::Split(std::vector<std::string>* pieces, bool at_text_start) const {
  for (const auto& step : steps_) step->Split(pieces, at_text_start);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeByteLevelPreTokenizer(std::string_view pattern,
                                                                        bool individual_digits) {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  if (individual_digits) {
    absl::StatusOr<std::unique_ptr<PreTokenizer>> digits =
        MakeRegexSplit("[0-9]", SplitBehavior::kIsolated, false);
    if (!digits.ok()) return digits.status();
    steps.push_back(*std::move(digits));
  }
  absl::StatusOr<std::unique_ptr<Regex>> re = Regex::Compile(pattern, /*literal=*/false);
  if (!re.ok()) return re.status();
  steps.push_back(std::make_unique<ByteLevelPreTokenizer>(false, *std::move(re)));
  return std::make_unique<SequencePreTokenizer>(std::move(steps));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& j,
                                                                   const std::string& where) {
  absl::StatusOr<std::string> type = json_util::GetType(j, where);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    absl::StatusOr<std::vector<std::unique_ptr<PreTokenizer>>> steps =
        json_util::GetArrayOf<std::unique_ptr<PreTokenizer>>(j, "pretokenizers", where, PreTokenizerFromJson);
    if (!steps.ok()) return steps.status();
    return std::make_unique<SequencePreTokenizer>(*std::move(steps));
  }
  if (*type == "ByteLevel") {
    absl::StatusOr<bool> prefix = json_util::GetBool(j, "add_prefix_space", true, where);
    absl::StatusOr<bool> use_regex = json_util::GetBool(j, "use_regex", true, where);
    if (!prefix.ok()) return prefix.status();
    if (!use_regex.ok()) return use_regex.status();
    std::unique_ptr<Regex> pattern;
    if (*use_regex) pattern = *Regex::Compile(kGpt2Pattern, /*literal=*/false);
    return std::make_unique<ByteLevelPreTokenizer>(*prefix, std::move(pattern));
  }
  if (*type == "Split") {
    const auto it = j.find("pattern");
    absl::StatusOr<std::unique_ptr<Regex>> pattern =
        PatternFromJson(it == j.end() ? nlohmann::json() : *it, json_util::Field(where, "pattern"));
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<SplitBehavior> behavior = ParseBehavior(j, where);
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = json_util::GetBool(j, "invert", false, where);
    if (!invert.ok()) return invert.status();
    return std::make_unique<RegexSplitPreTokenizer>(*std::move(pattern), *behavior, *invert);
  }
  if (*type == "Digits") {
    // ASCII digits, as transformers.js (the reference of our golden files) matches them.
    absl::StatusOr<bool> individual = json_util::GetBool(j, "individual_digits", false, where);
    if (!individual.ok()) return individual.status();
    return MakeRegexSplit(*individual ? "[0-9]" : "[0-9]+", SplitBehavior::kIsolated, false);
  }
  if (*type == "Whitespace") {
    return MakeRegexSplit(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, /*invert=*/true);
  }
  if (*type == "WhitespaceSplit") {
    return MakeRegexSplit(R"(\s+)", SplitBehavior::kRemoved, false);
  }
  if (*type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (const auto r = j.find("replacement"); r != j.end() && r->is_string()) {
      replacement = r->get<std::string>();
    }
    if (replacement.empty()) {
      return json_util::Invalid(json_util::Field(where, "replacement"), "must not be empty");
    }
    MetaspacePreTokenizer::Prepend prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (const auto s = j.find("prepend_scheme"); s != j.end() && s->is_string()) {
      const std::string scheme = s->get<std::string>();
      if (scheme == "first") {
        prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (scheme == "never") {
        prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else if (scheme != "always") {
        return json_util::Invalid(json_util::Field(where, "prepend_scheme"),
                                  absl::StrCat("unsupported scheme '", scheme, "'"));
      }
    } else {
      absl::StatusOr<bool> add = json_util::GetBool(j, "add_prefix_space", true, where);
      if (!add.ok()) return add.status();
      if (!*add) prepend = MetaspacePreTokenizer::Prepend::kNever;
    }
    absl::StatusOr<bool> split = json_util::GetBool(j, "split", true, where);
    if (!split.ok()) return split.status();
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), prepend, *split);
  }
  return json_util::Invalid(where, absl::StrCat("unsupported pre_tokenizer type '", *type, "'"));
}

}  // namespace kvserve
