#include "worker/constraint/grammar.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/utf8.h"

namespace kvserve::constraint {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits the code points [lo, hi] (no surrogates) into UTF-8 byte-range sequences: each output
// sequence matches exactly the encodings of a sub-range, one byte range per byte position. The
// range is cut first where the encoded length changes, then wherever the low 6*i bits of lo are
// not all zero (or of hi not all one) while the bits above differ, so that what is left is a
// product of independent byte ranges.
void SplitUtf8Range(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out) {
  static constexpr uint32_t kLengthMax[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t max : kLengthMax) {
    if (lo <= max && hi > max) {
      SplitUtf8Range(lo, max, out);
      SplitUtf8Range(max + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      SplitUtf8Range(lo, lo | m, out);
      SplitUtf8Range((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      SplitUtf8Range(lo, (hi & ~m) - 1, out);
      SplitUtf8Range(hi & ~m, hi, out);
      return;
    }
  }
  std::string a, b;
  utf8::Append(lo, &a);
  utf8::Append(hi, &b);
  ByteRangeSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  }
  out->push_back(std::move(seq));
}

std::string ByteSetText(const ByteSet& set) {
  auto show = [](int b) {
    if (b == '\\' || b == ']' || b == '-' || b == '^') return absl::StrCat("\\", std::string(1, b));
    if (b >= 0x20 && b < 0x7F) return std::string(1, static_cast<char>(b));
    return absl::StrFormat("\\x%02X", b);
  };
  if (set.count() == 1) {
    for (int b = 0; b < 256; ++b) {
      if (!set.test(b)) continue;
      if (b == '"' || b == '\\') return absl::StrCat("\"\\", std::string(1, b), "\"");
      if (b >= 0x20 && b < 0x7F) return absl::StrCat("\"", std::string(1, b), "\"");
      return absl::StrFormat("[\\x%02X]", b);
    }
  }
  std::string text = "[";
  for (int b = 0; b < 256;) {
    if (!set.test(b)) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set.test(e + 1)) ++e;
    text += show(b);
    if (e > b) text += absl::StrCat("-", show(e));
    b = e + 1;
  }
  return text + "]";
}

}  // namespace

std::vector<std::pair<uint32_t, uint32_t>> ComplementRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

std::string Grammar::ToString() const {
  std::string text;
  for (int32_t r = 0; r < num_rules(); ++r) {
    absl::StrAppend(&text, rule_names_[r], " ::=");
    bool first = true;
    for (int32_t start : alternatives(r)) {
      absl::StrAppend(&text, first ? " " : " | ");
      first = false;
      bool empty = true;
      for (int32_t pos = start; elements_[pos].kind != GrammarElement::Kind::kEnd; ++pos) {
        const GrammarElement& e = elements_[pos];
        if (!empty) text += " ";
        empty = false;
        text += e.kind == GrammarElement::Kind::kRule ? rule_names_[e.index]
                                                      : ByteSetText(byte_sets_[e.index]);
      }
      if (empty) text += "\"\"";
    }
    text += "\n";
  }
  return text;
}

int32_t GrammarBuilder::AddRule(std::string name) {
  rules_.push_back({std::move(name), {}});
  return static_cast<int32_t>(rules_.size() - 1);
}

int32_t GrammarBuilder::FindRule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (rules_[i].name == name) return static_cast<int32_t>(i);
  }
  return -1;
}

void GrammarBuilder::AddAlternative(int32_t rule, Sequence seq) {
  rules_[rule].alternatives.push_back(std::move(seq));
}

std::string GrammarBuilder::UniqueName(std::string_view hint) {
  return absl::StrCat(std::string(hint), "-", next_anonymous_++);
}

int32_t GrammarBuilder::NewRule(std::string_view hint, std::vector<Sequence> alternatives) {
  const int32_t rule = AddRule(UniqueName(hint));
  rules_[rule].alternatives = std::move(alternatives);
  return rule;
}

absl::StatusOr<int32_t> GrammarBuilder::Repeat(std::string_view hint, const Sequence& seq,
                                               int64_t min, int64_t max) {
  if (min < 0 || (max >= 0 && max < min)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition {", min, ",", max, "} has its bounds out of order"));
  }
  if (min > kMaxRepeat || max > kMaxRepeat) {
    return absl::InvalidArgumentError(absl::StrCat("repetition count ", std::max(min, max),
                                                   " is above the limit of ", kMaxRepeat));
  }
  const Symbol item = seq.size() == 1 && seq[0].rule >= 0
                          ? seq[0]
                          : Symbol::Rule(NewRule(absl::StrCat(std::string(hint), "-item"), {seq}));
  Sequence body(static_cast<size_t>(min), item);
  if (max < 0) {
    // star ::= item star | ""  (right recursion: the parser's stack does not grow per item).
    const int32_t star = AddRule(UniqueName(absl::StrCat(std::string(hint), "-star")));
    AddAlternative(star, {item, Symbol::Rule(star)});
    AddAlternative(star, {});
    body.push_back(Symbol::Rule(star));
  } else if (max > min) {
    // opt_k ::= item opt_(k-1) | ""  allows up to k more items.
    int32_t tail = NewRule(absl::StrCat(std::string(hint), "-opt"), {{item}, {}});
    for (int64_t k = 2; k <= max - min; ++k) {
      tail = NewRule(absl::StrCat(std::string(hint), "-opt"), {{item, Symbol::Rule(tail)}, {}});
    }
    body.push_back(Symbol::Rule(tail));
  }
  return NewRule(hint, {std::move(body)});
}

int32_t GrammarBuilder::CharClass(std::string_view hint,
                                  std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate) {
  for (auto& [lo, hi] : ranges) hi = std::min(hi, kMaxCodePoint);
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negate) merged = ComplementRanges(std::move(merged));
  // Surrogates are not characters: UTF-8 never encodes them.
  std::vector<std::pair<uint32_t, uint32_t>> valid;
  for (const auto& [lo, hi] : merged) {
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      valid.emplace_back(lo, hi);
      continue;
    }
    if (lo < kSurrogateLo) valid.emplace_back(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) valid.emplace_back(kSurrogateHi + 1, hi);
  }
  std::vector<ByteRangeSeq> seqs;
  for (const auto& [lo, hi] : valid) SplitUtf8Range(lo, hi, &seqs);
  std::vector<Sequence> alternatives;
  ByteSet single;
  for (const ByteRangeSeq& ranges_seq : seqs) {
    Sequence seq;
    for (const auto& [lo, hi] : ranges_seq) {
      ByteSet set;
      for (int b = lo; b <= hi; ++b) set.set(b);
      seq.push_back(Symbol::Bytes(set));
    }
    if (seq.size() == 1) {
      single |= seq[0].bytes;
    } else {
      alternatives.push_back(std::move(seq));
    }
  }
  if (single.any()) alternatives.insert(alternatives.begin(), Sequence{Symbol::Bytes(single)});
  // An empty class matches nothing: a rule whose only alternative needs an impossible byte.
  if (alternatives.empty()) alternatives.push_back({Symbol::Bytes(ByteSet())});
  return NewRule(hint, std::move(alternatives));
}

Sequence GrammarBuilder::Literal(std::string_view text) {
  Sequence seq;
  seq.reserve(text.size());
  for (char c : text) seq.push_back(Symbol::Byte(static_cast<uint8_t>(c)));
  return seq;
}

absl::StatusOr<Grammar> GrammarBuilder::Build(int32_t root) const {
  const size_t n = rules_.size();
  if (root < 0 || static_cast<size_t>(root) >= n) {
    return absl::InvalidArgumentError("the grammar has no root rule");
  }
  size_t total = 0;
  for (const Rule& rule : rules_) {
    for (const Sequence& seq : rule.alternatives) {
      total += seq.size() + 1;
      for (const Symbol& s : seq) {
        if (s.rule >= 0 && rules_[s.rule].alternatives.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rule '", rules_[s.rule].name, "' is used by '", rule.name, "' but never defined"));
        }
      }
    }
  }
  if (rules_[root].alternatives.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("root rule '", rules_[root].name, "' is not defined"));
  }
  if (total > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("the grammar has ", total, " elements, above the limit of ", kMaxElements));
  }

  // Which rules can match the empty string (fixpoint).
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& seq : rules_[r].alternatives) {
        if (std::all_of(seq.begin(), seq.end(),
                        [&](const Symbol& s) { return s.rule >= 0 && nullable[s.rule]; })) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a rule reaching itself through leading symbols that can match nothing.
  std::vector<std::vector<int32_t>> leading(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& seq : rules_[r].alternatives) {
      for (const Symbol& s : seq) {
        if (s.rule < 0) break;
        leading[r].push_back(s.rule);
        if (!nullable[s.rule]) break;
      }
    }
  }
  // Depth-first search with an explicit stack (a user's grammar may chain many rules).
  std::vector<uint8_t> mark(n, 0);               // 0 new, 1 on the search path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // (rule, next edge to follow)
  for (size_t start = 0; start < n; ++start) {
    if (mark[start] != 0) continue;
    mark[start] = 1;
    path.emplace_back(static_cast<int32_t>(start), 0);
    while (!path.empty()) {
      auto& [rule, edge] = path.back();
      if (edge == leading[rule].size()) {
        mark[rule] = 2;
        path.pop_back();
        continue;
      }
      const int32_t next = leading[rule][edge++];
      if (mark[next] == 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("rule '", rules_[next].name,
                         "' is left-recursive (it can reach itself without matching a byte); "
                         "rewrite it with repetition"));
      }
      if (mark[next] == 0) {
        mark[next] = 1;
        path.emplace_back(next, 0);
      }
    }
  }

  Grammar g;
  g.root_ = root;
  g.elements_.reserve(total);
  g.rule_alt_begin_.reserve(n + 1);
  for (const Rule& rule : rules_) {
    g.rule_names_.push_back(rule.name);
    g.rule_alt_begin_.push_back(static_cast<int32_t>(g.alt_starts_.size()));
    for (const Sequence& seq : rule.alternatives) {
      g.alt_starts_.push_back(static_cast<int32_t>(g.elements_.size()));
      for (const Symbol& s : seq) {
        GrammarElement e;
        if (s.rule >= 0) {
          e.kind = GrammarElement::Kind::kRule;
          e.index = s.rule;
        } else {
          e.kind = GrammarElement::Kind::kBytes;
          e.index = static_cast<int32_t>(g.byte_sets_.size());
          g.byte_sets_.push_back(s.bytes);
        }
        g.elements_.push_back(e);
      }
      g.elements_.push_back({GrammarElement::Kind::kEnd, -1});
    }
  }
  g.rule_alt_begin_.push_back(static_cast<int32_t>(g.alt_starts_.size()));
  return g;
}

}  // namespace kvserve::constraint
