#include "worker/constraint/regex_grammar.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/utf8.h"

namespace kvserve::constraint {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kEndOfPattern = 0xFFFFFFFF;
// Deepest group nesting (the parser recurses once per level).
constexpr int kMaxNesting = 200;

bool Contains(const Ranges& ranges, uint32_t cp) {
  for (const auto& [lo, hi] : ranges) {
    if (cp >= lo && cp <= hi) return true;
  }
  return false;
}

// Removes code point `cp` from every range.
Ranges Remove(const Ranges& ranges, uint32_t lo_cut, uint32_t hi_cut) {
  Ranges out;
  for (const auto& [lo, hi] : ranges) {
    if (hi < lo_cut || lo > hi_cut) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < lo_cut) out.emplace_back(lo, lo_cut - 1);
    if (hi > hi_cut) out.emplace_back(hi_cut + 1, hi);
  }
  return out;
}

// The JSON spelling of a character inside a string.
std::string JsonEscaped(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\t':
      return "\\t";
    case '\r':
      return "\\r";
    default:
      break;
  }
  if (cp < 0x20) return absl::StrFormat("\\u%04x", cp);
  std::string out;
  utf8::Append(cp, &out);
  return out;
}

class RegexParser {
 public:
  RegexParser(GrammarBuilder* builder, std::string_view pattern, const RegexOptions& options)
      : b_(builder), pattern_(pattern), options_(options) {}

  absl::StatusOr<int32_t> Parse() {
    if (absl::Status s = Decode(); !s.ok()) return s;
    if (Peek() == '^') ++i_;
    absl::StatusOr<std::vector<Sequence>> alternatives = Alternatives();
    if (!alternatives.ok()) return alternatives.status();
    if (Peek() == ')') return Error("unmatched ')'");
    if (i_ != cps_.size()) return Error("unexpected character");
    return b_->NewRule("regex", std::move(*alternatives));
  }

 private:
  absl::Status Decode() {
    for (size_t i = 0; i < pattern_.size();) {
      const size_t len = utf8::SequenceLength(pattern_, i);
      if (len == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("regex: invalid UTF-8 at byte ", i, " of the pattern"));
      }
      cps_.push_back(utf8::Decode(pattern_, i, len));
      offsets_.push_back(i);
      i += len;
    }
    return absl::OkStatus();
  }

  uint32_t Peek(size_t ahead = 0) const {
    return i_ + ahead < cps_.size() ? cps_[i_ + ahead] : kEndOfPattern;
  }
  size_t Offset() const { return i_ < offsets_.size() ? offsets_[i_] : pattern_.size(); }
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex: ", what, " at offset ", Offset(),
                                                   " of '", std::string(pattern_), "'"));
  }

  absl::StatusOr<std::vector<Sequence>> Alternatives() {
    std::vector<Sequence> alternatives;
    while (true) {
      absl::StatusOr<Sequence> seq = Concat();
      if (!seq.ok()) return seq.status();
      alternatives.push_back(std::move(*seq));
      if (Peek() != '|') return alternatives;
      ++i_;
    }
  }

  absl::StatusOr<Sequence> Concat() {
    Sequence seq;
    while (Peek() != kEndOfPattern && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++i_;
        if (Peek() != kEndOfPattern) return Error("'$' before the end of the pattern");
        break;
      }
      absl::StatusOr<Sequence> atom = Atom();
      if (!atom.ok()) return atom.status();
      absl::StatusOr<Sequence> quantified = Quantify(std::move(*atom));
      if (!quantified.ok()) return quantified.status();
      seq.insert(seq.end(), quantified->begin(), quantified->end());
    }
    return seq;
  }

  absl::StatusOr<Sequence> Quantify(Sequence atom) {
    int64_t min = 1, max = 1;
    const uint32_t c = Peek();
    if (c == '*') {
      min = 0, max = -1;
    } else if (c == '+') {
      min = 1, max = -1;
    } else if (c == '?') {
      min = 0, max = 1;
    } else if (c == '{' && IsCountedQuantifier()) {
      ++i_;
      min = Number();
      max = min;
      if (Peek() == ',') {
        ++i_;
        max = Peek() == '}' ? -1 : Number();
      }
      if (Peek() != '}') return Error("unterminated {n,m} quantifier");
    } else {
      return atom;
    }
    ++i_;
    if (Peek() == '?') {
      ++i_;  // Lazy: the same strings match.
    } else if (Peek() == '+') {
      return Error("possessive quantifiers are not supported");
    }
    if (Peek() == '*' || Peek() == '+' || (Peek() == '{' && IsCountedQuantifier())) {
      return Error("a quantifier cannot follow a quantifier");
    }
    absl::StatusOr<int32_t> rule = b_->Repeat("regex-repeat", atom, min, max);
    if (!rule.ok()) return Error(std::string(rule.status().message()));
    return Sequence{Symbol::Rule(*rule)};
  }

  // At '{': whether it starts {n}, {n,} or {n,m} (otherwise the brace is a literal).
  bool IsCountedQuantifier() const {
    size_t k = 1;
    if (!IsDigit(Peek(k))) return false;
    while (IsDigit(Peek(k))) ++k;
    if (Peek(k) == '}') return true;
    if (Peek(k) != ',') return false;
    ++k;
    while (IsDigit(Peek(k))) ++k;
    return Peek(k) == '}';
  }
  static bool IsDigit(uint32_t c) { return c >= '0' && c <= '9'; }
  int64_t Number() {
    int64_t n = 0;
    while (IsDigit(Peek())) {
      n = std::min<int64_t>(n * 10 + (Peek() - '0'), GrammarBuilder::kMaxRepeat + 1);
      ++i_;
    }
    return n;
  }

  absl::StatusOr<Sequence> Atom() {
    const uint32_t c = Peek();
    switch (c) {
      case '(':
        return Group();
      case '[':
        return Class();
      case '.':
        ++i_;
        return ClassSequence({{'\n', '\n'}}, /*negate=*/true);
      case '^':
        return Error("'^' after the start of the pattern");
      case '*':
      case '+':
      case '?':
        return Error("a quantifier with nothing to repeat");
      case '\\': {
        ++i_;
        absl::StatusOr<EscapeResult> e = Escape(/*in_class=*/false);
        if (!e.ok()) return e.status();
        if (e->is_class) return ClassSequence(std::move(e->ranges), e->negate);
        return LiteralSequence(e->literal);
      }
      default:
        ++i_;
        return LiteralSequence(c);
    }
  }

  absl::StatusOr<Sequence> Group() {
    if (++depth_ > kMaxNesting) return Error("groups nested too deeply");
    ++i_;  // '('
    if (Peek() == '?') {
      if (Peek(1) == ':') {
        i_ += 2;
      } else if (Peek(1) == '<' && Peek(2) != '=' && Peek(2) != '!') {
        i_ += 2;
        while (Peek() != '>' && Peek() != kEndOfPattern) ++i_;
        if (Peek() != '>') return Error("unterminated group name");
        ++i_;
      } else if (Peek(1) == 'P' && Peek(2) == '<') {
        i_ += 3;
        while (Peek() != '>' && Peek() != kEndOfPattern) ++i_;
        if (Peek() != '>') return Error("unterminated group name");
        ++i_;
      } else {
        return Error("lookaround and inline flags are not supported");
      }
    }
    absl::StatusOr<std::vector<Sequence>> alternatives = Alternatives();
    if (!alternatives.ok()) return alternatives.status();
    if (Peek() != ')') return Error("missing ')'");
    ++i_;
    --depth_;
    if (alternatives->size() == 1) return std::move((*alternatives)[0]);
    return Sequence{Symbol::Rule(b_->NewRule("regex-group", std::move(*alternatives)))};
  }

  // What a backslash escape stands for: a class (\d, \W, ...) or one character.
  struct EscapeResult {
    bool is_class = false;
    Ranges ranges;
    bool negate = false;
    uint32_t literal = 0;
  };
  static EscapeResult ClassEscape(Ranges ranges, bool negate) {
    return {.is_class = true, .ranges = std::move(ranges), .negate = negate};
  }
  static EscapeResult LiteralEscape(uint32_t cp) { return {.literal = cp}; }

  // After a backslash. Inside a class, negated class escapes come back complemented.
  absl::StatusOr<EscapeResult> Escape(bool in_class) {
    const uint32_t c = Peek();
    if (c == kEndOfPattern) return Error("trailing backslash");
    ++i_;
    static const Ranges kDigit = {{'0', '9'}};
    static const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd':
        return ClassEscape(kDigit, false);
      case 'w':
        return ClassEscape(kWord, false);
      case 's':
        return ClassEscape(kSpace, false);
      case 'D':
      case 'W':
      case 'S': {
        const Ranges& base = c == 'D' ? kDigit : c == 'W' ? kWord : kSpace;
        return in_class ? ClassEscape(ComplementRanges(base), false) : ClassEscape(base, true);
      }
      case 'n':
        return LiteralEscape('\n');
      case 't':
        return LiteralEscape('\t');
      case 'r':
        return LiteralEscape('\r');
      case 'f':
        return LiteralEscape('\f');
      case 'v':
        return LiteralEscape('\v');
      case '0':
        return LiteralEscape(0);
      case 'x':
        return Hex(2);
      case 'u':
        if (Peek() == '{') {
          ++i_;
          uint32_t value = 0;
          int digits = 0;
          while (Peek() != '}' && Peek() != kEndOfPattern && digits < 7) {
            const int d = HexDigit(Peek());
            if (d < 0) return Error("bad \\u{...} escape");
            value = value * 16 + d;
            ++digits, ++i_;
          }
          if (Peek() != '}' || digits == 0 || value > 0x10FFFF) return Error("bad \\u{...} escape");
          ++i_;
          return LiteralEscape(value);
        }
        return Hex(4);
      case 'b':
        if (in_class) return LiteralEscape('\b');
        return Error("word boundaries (\\b) are not supported");
      case 'B':
      case 'A':
      case 'z':
      case 'Z':
        return Error(absl::StrCat("the anchor \\", std::string(1, static_cast<char>(c)),
                                  " is not supported"));
      default:
        break;
    }
    if (c >= '1' && c <= '9') return Error("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return Error(absl::StrCat("unknown escape \\", std::string(1, static_cast<char>(c))));
    }
    return LiteralEscape(c);
  }

  static int HexDigit(uint32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  }
  absl::StatusOr<EscapeResult> Hex(int digits) {
    uint32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      const int d = HexDigit(Peek());
      if (d < 0) return Error("bad hexadecimal escape");
      value = value * 16 + d;
      ++i_;
    }
    return LiteralEscape(value);
  }

  absl::StatusOr<Sequence> Class() {
    ++i_;  // '['
    bool negate = false;
    if (Peek() == '^') {
      negate = true;
      ++i_;
    }
    Ranges ranges;
    bool first = true;
    while (Peek() != ']' || first) {
      first = false;
      if (Peek() == kEndOfPattern) return Error("unterminated character class");
      uint32_t lo = Peek();
      if (lo == '[' && Peek(1) == ':') return Error("POSIX classes ([:alpha:]) are not supported");
      ++i_;
      if (lo == '\\') {
        absl::StatusOr<EscapeResult> e = Escape(/*in_class=*/true);
        if (!e.ok()) return e.status();
        if (e->is_class) {
          ranges.insert(ranges.end(), e->ranges.begin(), e->ranges.end());
          continue;
        }
        lo = e->literal;
      }
      uint32_t hi = lo;
      if (Peek() == '-' && Peek(1) != ']' && Peek(1) != kEndOfPattern) {
        ++i_;
        hi = Peek();
        ++i_;
        if (hi == '\\') {
          absl::StatusOr<EscapeResult> e = Escape(/*in_class=*/true);
          if (!e.ok()) return e.status();
          if (e->is_class) return Error("a class escape cannot end a range");
          hi = e->literal;
        }
        if (hi < lo) return Error("character range out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    ++i_;  // ']'
    return ClassSequence(std::move(ranges), negate);
  }

  Sequence LiteralSequence(uint32_t cp) {
    std::string text;
    if (options_.json_string) {
      text = JsonEscaped(cp);
    } else {
      utf8::Append(cp, &text);
    }
    return GrammarBuilder::Literal(text);
  }

  Sequence ClassSequence(Ranges ranges, bool negate) {
    if (!options_.json_string) {
      return {Symbol::Rule(b_->CharClass("regex-class", std::move(ranges), negate))};
    }
    if (negate) ranges = ComplementRanges(std::move(ranges));
    // Inside a JSON string, characters that must be escaped are matched by their escapes.
    std::vector<Sequence> alternatives;
    for (uint32_t special :
         {uint32_t{'"'}, uint32_t{'\\'}, uint32_t{'\n'}, uint32_t{'\t'}, uint32_t{'\r'}}) {
      if (Contains(ranges, special))
        alternatives.push_back(GrammarBuilder::Literal(JsonEscaped(special)));
    }
    ranges = Remove(Remove(Remove(ranges, 0, 0x1F), '"', '"'), '\\', '\\');
    alternatives.insert(alternatives.begin(),
                        {Symbol::Rule(b_->CharClass("regex-class", std::move(ranges), false))});
    if (alternatives.size() == 1) return alternatives[0];
    return {Symbol::Rule(b_->NewRule("regex-class-json", std::move(alternatives)))};
  }

  GrammarBuilder* b_;
  std::string_view pattern_;
  RegexOptions options_;
  std::vector<uint32_t> cps_;
  std::vector<size_t> offsets_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<int32_t> AddRegexRule(GrammarBuilder* builder, std::string_view pattern,
                                     const RegexOptions& options) {
  return RegexParser(builder, pattern, options).Parse();
}

absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern) {
  GrammarBuilder builder;
  absl::StatusOr<int32_t> root = AddRegexRule(&builder, pattern);
  if (!root.ok()) return root.status();
  return builder.Build(*root);
}

}  // namespace kvserve::constraint
