#include "worker/constraint/gbnf.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace kvserve::constraint {
namespace {

// Deepest group nesting (the parser recurses once per level).
constexpr int kMaxNesting = 200;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Parse() {
    SkipSpace();
    if (i_ == text_.size()) return Error("the grammar is empty");
    while (i_ < text_.size()) {
      const size_t start = i_;
      const std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace();
      if (text_.substr(i_, 3) != "::=") {
        i_ = start;
        return Error(absl::StrCat("expected '::=' after '", name, "'"));
      }
      i_ += 3;
      const int32_t rule = RuleNamed(name);
      if (builder_.IsDefined(rule))
        return Error(absl::StrCat("rule '", name, "' is defined twice"));
      absl::StatusOr<std::vector<Sequence>> alternatives = Alternatives(/*depth=*/0);
      if (!alternatives.ok()) return alternatives.status();
      for (Sequence& seq : *alternatives) builder_.AddAlternative(rule, std::move(seq));
      SkipSpace();
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) {
      return absl::InvalidArgumentError("gbnf: the grammar has no rule named 'root'");
    }
    absl::StatusOr<Grammar> grammar = builder_.Build(root->second);
    if (!grammar.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("gbnf: ", grammar.status().message()));
    }
    return grammar;
  }

 private:
  absl::Status Error(std::string_view what) const {
    int line = 1;
    for (size_t k = 0; k < i_ && k < text_.size(); ++k) line += text_[k] == '\n';
    return absl::InvalidArgumentError(absl::StrCat("gbnf: line ", line, ": ", std::string(what)));
  }

  void SkipSpace() {
    while (i_ < text_.size()) {
      const char c = text_[i_];
      if (c == '#') {
        while (i_ < text_.size() && text_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = i_;
    while (i_ < text_.size() && IsNameChar(text_[i_])) ++i_;
    return std::string(text_.substr(start, i_ - start));
  }

  int32_t RuleNamed(const std::string& name) {
    auto [it, inserted] = rules_.try_emplace(name, -1);
    if (inserted) it->second = builder_.AddRule(name);
    return it->second;
  }

  // True at `name ::=` (the start of the next rule).
  bool AtRuleStart() const {
    size_t k = i_;
    while (k < text_.size() && IsNameChar(text_[k])) ++k;
    if (k == i_) return false;
    while (k < text_.size() &&
           (text_[k] == ' ' || text_[k] == '\t' || text_[k] == '\n' || text_[k] == '\r')) {
      ++k;
    }
    return text_.substr(k, 3) == "::=";
  }

  absl::StatusOr<std::vector<Sequence>> Alternatives(int depth) {
    std::vector<Sequence> alternatives;
    while (true) {
      absl::StatusOr<Sequence> seq = Concat(depth);
      if (!seq.ok()) return seq.status();
      alternatives.push_back(std::move(*seq));
      SkipSpace();
      if (i_ < text_.size() && text_[i_] == '|') {
        ++i_;
        continue;
      }
      return alternatives;
    }
  }

  absl::StatusOr<Sequence> Concat(int depth) {
    Sequence seq;
    while (true) {
      SkipSpace();
      if (i_ == text_.size()) break;
      const char c = text_[i_];
      if (c == '|' || (c == ')' && depth > 0)) break;
      if (depth == 0 && AtRuleStart()) break;
      absl::StatusOr<Sequence> item = Item(depth);
      if (!item.ok()) return item.status();
      absl::StatusOr<Sequence> repeated = Postfix(std::move(*item));
      if (!repeated.ok()) return repeated.status();
      seq.insert(seq.end(), repeated->begin(), repeated->end());
    }
    return seq;
  }

  absl::StatusOr<Sequence> Item(int depth) {
    const char c = text_[i_];
    if (c == '"') return Literal();
    if (c == '[') return Class();
    if (c == '.') {
      ++i_;
      return Sequence{Symbol::Rule(builder_.CharClass("any-char", {}, /*negate=*/true))};
    }
    if (c == '(') {
      if (depth >= kMaxNesting) return Error("groups nested too deeply");
      ++i_;
      absl::StatusOr<std::vector<Sequence>> inner = Alternatives(depth + 1);
      if (!inner.ok()) return inner.status();
      SkipSpace();
      if (i_ == text_.size() || text_[i_] != ')') return Error("missing ')'");
      ++i_;
      if (inner->size() == 1) return std::move((*inner)[0]);
      return Sequence{Symbol::Rule(builder_.NewRule("group", std::move(*inner)))};
    }
    if (IsNameChar(c)) return Sequence{Symbol::Rule(RuleNamed(Name()))};
    return Error(absl::StrCat("unexpected '", std::string(1, c), "'"));
  }

  absl::StatusOr<Sequence> Postfix(Sequence item) {
    if (i_ == text_.size()) return item;
    int64_t min = 1, max = 1;
    const char c = text_[i_];
    if (c == '*') {
      min = 0, max = -1;
    } else if (c == '+') {
      min = 1, max = -1;
    } else if (c == '?') {
      min = 0, max = 1;
    } else if (c == '{') {
      ++i_;
      SkipSpace();
      if (!Number(&min)) return Error("expected a count after '{'");
      max = min;
      SkipSpace();
      if (i_ < text_.size() && text_[i_] == ',') {
        ++i_;
        SkipSpace();
        if (!Number(&max)) max = -1;
        SkipSpace();
      }
      if (i_ == text_.size() || text_[i_] != '}') return Error("missing '}'");
    } else {
      return item;
    }
    ++i_;
    absl::StatusOr<int32_t> rule = builder_.Repeat("repeat", item, min, max);
    if (!rule.ok()) return Error(std::string(rule.status().message()));
    return Sequence{Symbol::Rule(*rule)};
  }

  bool Number(int64_t* out) {
    const size_t start = i_;
    int64_t n = 0;
    while (i_ < text_.size() && text_[i_] >= '0' && text_[i_] <= '9') {
      n = std::min<int64_t>(n * 10 + (text_[i_] - '0'), GrammarBuilder::kMaxRepeat + 1);
      ++i_;
    }
    *out = n;
    return i_ > start;
  }

  // One character of a literal or class, escapes decoded.
  absl::StatusOr<uint32_t> Char() {
    if (i_ >= text_.size()) return Error("unterminated literal or class");
    const auto c = static_cast<uint8_t>(text_[i_]);
    if (c == '\\') {
      ++i_;
      if (i_ >= text_.size()) return Error("trailing backslash");
      const char e = text_[i_++];
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 't':
          return uint32_t{'\t'};
        case 'r':
          return uint32_t{'\r'};
        case 'x':
          return Hex(2);
        case 'u':
          return Hex(4);
        case 'U':
          return Hex(8);
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
          return static_cast<uint32_t>(e);
        default:
          return Error(absl::StrCat("unknown escape \\", std::string(1, e)));
      }
    }
    // A UTF-8 character.
    const size_t len = utf8::SequenceLength(text_, i_);
    if (len == 0) return Error("invalid UTF-8");
    const uint32_t cp = utf8::Decode(text_, i_, len);
    i_ += len;
    return cp;
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= text_.size()) return Error("short hexadecimal escape");
      const char h = text_[i_++];
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) return Error("bad hexadecimal escape");
      v = v * 16 + d;
    }
    if (v > 0x10FFFF) return Error("code point above U+10FFFF");
    return v;
  }

  absl::StatusOr<Sequence> Literal() {
    ++i_;  // '"'
    std::string bytes;
    while (i_ < text_.size() && text_[i_] != '"') {
      if (text_[i_] == '\n') return Error("newline inside a literal");
      absl::StatusOr<uint32_t> cp = Char();
      if (!cp.ok()) return cp.status();
      utf8::Append(*cp, &bytes);
    }
    if (i_ == text_.size()) return Error("unterminated literal");
    ++i_;
    return GrammarBuilder::Literal(bytes);
  }

  absl::StatusOr<Sequence> Class() {
    ++i_;  // '['
    bool negate = false;
    if (i_ < text_.size() && text_[i_] == '^') {
      negate = true;
      ++i_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (i_ < text_.size() && text_[i_] != ']') {
      absl::StatusOr<uint32_t> lo = Char();
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (i_ + 1 < text_.size() && text_[i_] == '-' && text_[i_ + 1] != ']') {
        ++i_;
        absl::StatusOr<uint32_t> end = Char();
        if (!end.ok()) return end.status();
        hi = *end;
        if (hi < *lo) return Error("character range out of order");
      }
      ranges.emplace_back(*lo, hi);
    }
    if (i_ == text_.size()) return Error("unterminated character class");
    ++i_;
    return Sequence{Symbol::Rule(builder_.CharClass("class", std::move(ranges), negate))};
  }

  std::string_view text_;
  size_t i_ = 0;
  GrammarBuilder builder_;
  std::map<std::string, int32_t> rules_;
};

}  // namespace

absl::StatusOr<Grammar> GbnfGrammar(std::string_view text) { return GbnfParser(text).Parse(); }

}  // namespace kvserve::constraint
