#include "worker/constraint/json_schema.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/constraint/regex_grammar.h"

namespace kvserve::constraint {
namespace {

using json = nlohmann::ordered_json;

// Deepest schema nesting (the compiler recurses once per level).
constexpr int kMaxNesting = 64;
// Digits an integer part may have: 16 keeps every generated integer exact in a double.
constexpr int kMaxIntegerDigits = 16;
constexpr int64_t kLargestInteger = 9999999999999999;  // 10^16 - 1

// Keywords that only annotate a schema.
const std::set<std::string>& Annotations() {
  static const auto* kAnnotations = new std::set<std::string>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return *kAnnotations;
}

const std::map<std::string, std::string>& FormatPatterns() {
  static const auto* kFormats = [] {
    const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])";
    const std::string time =
        "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-"
        "9])";
    const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    return new std::map<std::string, std::string>{
        {"date", date},
        {"time", time},
        {"date-time", date + "T" + time},
        {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
        {"ipv4", absl::StrCat("(", octet, "\\.){3}", octet)},
        {"email",
         "[a-z0-9]{1,32}(\\.[a-z0-9]{1,32}){0,2}@[a-z0-9]{1,32}(\\.[a-z0-9]{1,32}){0,2}\\.[a-z]{2,"
         "8}"},
    };
  }();
  return *kFormats;
}

ByteSet Range(char lo, char hi) {
  ByteSet set;
  for (int c = static_cast<uint8_t>(lo); c <= static_cast<uint8_t>(hi); ++c) set.set(c);
  return set;
}

Symbol Digits(char lo, char hi) { return Symbol::Bytes(Range(lo, hi)); }

// The decimal integers with the same number of digits as lo and hi (lo <= hi, leading zeros
// allowed in both), as alternatives of one byte set per digit.
std::vector<Sequence> SameLengthRange(std::string_view lo, std::string_view hi) {
  if (lo.empty()) return {Sequence()};
  const bool lo_rest_min = lo.substr(1).find_first_not_of('0') == std::string_view::npos;
  const bool hi_rest_max = hi.substr(1).find_first_not_of('9') == std::string_view::npos;
  if (lo_rest_min && hi_rest_max) {
    Sequence seq{Digits(lo[0], hi[0])};
    for (size_t i = 1; i < lo.size(); ++i) seq.push_back(Digits('0', '9'));
    return {seq};
  }
  std::vector<Sequence> out;
  auto prefixed = [&](char first, std::vector<Sequence> rest) {
    for (Sequence& seq : rest) {
      seq.insert(seq.begin(), Symbol::Byte(static_cast<uint8_t>(first)));
      out.push_back(std::move(seq));
    }
  };
  if (lo[0] == hi[0]) {
    prefixed(lo[0], SameLengthRange(lo.substr(1), hi.substr(1)));
    return out;
  }
  const std::string nines(lo.size() - 1, '9');
  const std::string zeros(lo.size() - 1, '0');
  prefixed(lo[0], SameLengthRange(lo.substr(1), nines));
  if (lo[0] + 1 <= hi[0] - 1) {
    Sequence seq{Digits(static_cast<char>(lo[0] + 1), static_cast<char>(hi[0] - 1))};
    for (size_t i = 1; i < lo.size(); ++i) seq.push_back(Digits('0', '9'));
    out.push_back(std::move(seq));
  }
  prefixed(hi[0], SameLengthRange(zeros, hi.substr(1)));
  return out;
}

int64_t Pow10(int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

// Alternatives spelling exactly the integers in [lo, hi] (0 <= lo <= hi), without leading zeros.
std::vector<Sequence> NonNegativeRange(int64_t lo, int64_t hi) {
  std::vector<Sequence> out;
  if (lo == 0) {
    out.push_back(GrammarBuilder::Literal("0"));
    lo = 1;
  }
  for (int n = 1; n <= kMaxIntegerDigits && lo <= hi; ++n) {
    const int64_t first = Pow10(n - 1), last = Pow10(n) - 1;
    if (lo > last) continue;
    const int64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a > b) continue;
    for (Sequence& seq : SameLengthRange(std::to_string(a), std::to_string(b))) {
      out.push_back(std::move(seq));
    }
    lo = b + 1;
  }
  return out;
}

// Alternatives spelling exactly the integers in [lo, hi].
std::vector<Sequence> IntegerRange(int64_t lo, int64_t hi) {
  std::vector<Sequence> out;
  if (lo < 0) {
    for (Sequence& seq : NonNegativeRange(std::max<int64_t>(1, -std::min<int64_t>(hi, -1)), -lo)) {
      seq.insert(seq.begin(), Symbol::Byte('-'));
      out.push_back(std::move(seq));
    }
  }
  if (hi >= 0) {
    for (Sequence& seq : NonNegativeRange(std::max<int64_t>(lo, 0), hi))
      out.push_back(std::move(seq));
  }
  return out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder* b, const json& root) : b_(b), root_(root) {}

  absl::StatusOr<Symbol> Value(const json& schema, const std::string& path) {
    // The compiler recurses once per level of nesting.
    if (++depth_ > kMaxNesting) {
      return Error(path, absl::StrCat("schemas nested deeper than ", kMaxNesting));
    }
    absl::StatusOr<Symbol> value = ValueAtDepth(schema, path);
    --depth_;
    return value;
  }

  /// Optional whitespace before the document: one space or newline.
  Symbol LeadingSpace() {
    ByteSet set;
    set.set(' ');
    set.set('\n');
    return Symbol::Rule(b_->NewRule("lead", {{Symbol::Bytes(set)}, {}}));
  }

 private:
  absl::StatusOr<Symbol> ValueAtDepth(const json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return Symbol::Rule(AnyValue());
      return Error(path, "the schema false matches nothing");
    }
    if (!schema.is_object()) return Error(path, "a schema must be an object or a boolean");
    if (schema.contains("$ref")) return Ref(schema, path);
    if (schema.contains("anyOf") || schema.contains("oneOf")) return AnyOf(schema, path);
    if (schema.contains("allOf")) return AllOf(schema, path);
    if (schema.contains("enum") || schema.contains("const")) return Enum(schema, path);

    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& e : t) {
          if (!e.is_string()) return Error(path, "type must be a string or a list of strings");
          types.push_back(e.get<std::string>());
        }
      } else {
        return Error(path, "type must be a string or a list of strings");
      }
    } else {
      types = InferredTypes(schema);
    }
    if (types.empty()) {
      if (absl::Status s = CheckKeywords(schema, path, {}); !s.ok()) return s;
      return Symbol::Rule(AnyValue());
    }
    // Keywords of any listed type are allowed; each type reads its own.
    std::set<std::string> allowed;
    for (const std::string& type : types) {
      const std::set<std::string>& own = TypeKeywords(type);
      allowed.insert(own.begin(), own.end());
    }
    if (absl::Status s = CheckKeywords(schema, path, allowed); !s.ok()) return s;
    std::vector<Sequence> alternatives;
    for (const std::string& type : types) {
      absl::StatusOr<Symbol> one = OfType(schema, type, path);
      if (!one.ok()) return one.status();
      alternatives.push_back({*one});
    }
    if (alternatives.size() == 1) return alternatives[0][0];
    return Symbol::Rule(b_->NewRule("types", std::move(alternatives)));
  }

  int32_t AnyValue() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = b_->AddRule("value");
    const int32_t members = b_->AddRule("members");
    const int32_t elements = b_->AddRule("elements");
    const Symbol ws = Space();
    const Symbol value = Symbol::Rule(any_value_);
    // object ::= "{" ws ( string ws ":" ws value ( "," ws string ws ":" ws value )* )? ws "}"
    const Sequence member = {Symbol::Rule(String(-1, -1)), ws, Symbol::Byte(':'), ws, value};
    Sequence more = {Symbol::Byte(','), ws};
    more.insert(more.end(), member.begin(), member.end());
    Sequence members_seq = member;
    members_seq.push_back(Symbol::Rule(*b_->Repeat("more-members", more, 0, -1)));
    b_->AddAlternative(members, members_seq);
    const int32_t object = b_->NewRule(
        "object", {{Symbol::Byte('{'), ws, Symbol::Rule(members), ws, Symbol::Byte('}')},
                   {Symbol::Byte('{'), ws, Symbol::Byte('}')}});
    Sequence elements_seq = {
        value, Symbol::Rule(*b_->Repeat("more-elements", {Symbol::Byte(','), ws, value}, 0, -1))};
    b_->AddAlternative(elements, elements_seq);
    const int32_t array = b_->NewRule(
        "array", {{Symbol::Byte('['), ws, Symbol::Rule(elements), ws, Symbol::Byte(']')},
                  {Symbol::Byte('['), ws, Symbol::Byte(']')}});
    b_->AddAlternative(any_value_, {Symbol::Rule(object)});
    b_->AddAlternative(any_value_, {Symbol::Rule(array)});
    b_->AddAlternative(any_value_, {Symbol::Rule(String(-1, -1))});
    b_->AddAlternative(any_value_, {Symbol::Rule(Number())});
    for (const char* literal : {"true", "false", "null"}) {
      b_->AddAlternative(any_value_, GrammarBuilder::Literal(literal));
    }
    return any_value_;
  }

  absl::Status Error(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("json schema at ", path.empty() ? "/" : path, ": ", what));
  }
  absl::Status Unsupported(const std::string& path, const std::string& keyword) const {
    return absl::InvalidArgumentError(absl::StrCat("json schema: ", keyword, " at ",
                                                   path.empty() ? "/" : path, " is not supported"));
  }

  // Every keyword of `schema` must be an annotation, one of `allowed`, or "type".
  absl::Status CheckKeywords(const json& schema, const std::string& path,
                             const std::set<std::string>& allowed) const {
    for (const auto& [key, value] : schema.items()) {
      if (key == "type" || Annotations().contains(key) || allowed.contains(key)) continue;
      return Unsupported(path, key);
    }
    return absl::OkStatus();
  }

  static const std::set<std::string>& TypeKeywords(const std::string& type) {
    static const auto* kKeywords = new std::map<std::string, std::set<std::string>>{
        {"object", {"properties", "required", "additionalProperties"}},
        {"array", {"items", "prefixItems", "minItems", "maxItems"}},
        {"string", {"minLength", "maxLength", "pattern", "format"}},
        {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
        {"integer", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
    };
    static const auto* kNone = new std::set<std::string>();
    auto it = kKeywords->find(type);
    return it == kKeywords->end() ? *kNone : it->second;
  }

  static std::vector<std::string> InferredTypes(const json& schema) {
    static const std::set<std::string> kObject = {"properties", "required", "additionalProperties"};
    static const std::set<std::string> kArray = {"items", "prefixItems", "minItems", "maxItems"};
    static const std::set<std::string> kString = {"minLength", "maxLength", "pattern", "format"};
    static const std::set<std::string> kNumber = {"minimum", "maximum", "exclusiveMinimum",
                                                  "exclusiveMaximum"};
    for (const auto& [key, value] : schema.items()) {
      if (kObject.contains(key)) return {"object"};
      if (kArray.contains(key)) return {"array"};
      if (kString.contains(key)) return {"string"};
      if (kNumber.contains(key)) return {"number"};
    }
    return {};
  }

  absl::StatusOr<Symbol> OfType(const json& schema, const std::string& type,
                                const std::string& path) {
    if (type == "string") return StringSchema(schema, path);
    if (type == "integer" || type == "number") return NumberSchema(schema, type, path);
    if (type == "boolean" || type == "null") {
      if (type == "null")
        return Symbol::Rule(b_->NewRule("null", {GrammarBuilder::Literal("null")}));
      return Symbol::Rule(b_->NewRule(
          "boolean", {GrammarBuilder::Literal("true"), GrammarBuilder::Literal("false")}));
    }
    if (type == "object") return ObjectSchema(schema, path);
    if (type == "array") return ArraySchema(schema, path);
    return Error(path, absl::StrCat("unknown type '", type, "'"));
  }

  // --- Strings ---

  // A JSON string of min..max characters (max < 0: unbounded).
  int32_t String(int64_t min, int64_t max) {
    const auto key = std::make_pair(min, max);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
    const int32_t ch = Char();
    const int32_t rule = b_->NewRule(
        "string",
        {{Symbol::Byte('"'),
          Symbol::Rule(*b_->Repeat("chars", {Symbol::Rule(ch)}, std::max<int64_t>(min, 0), max)),
          Symbol::Byte('"')}});
    strings_[key] = rule;
    return rule;
  }

  // One character inside a JSON string: unescaped (not '"', '\\' or a control character) or an
  // escape; \u escapes never spell a surrogate, so every escape is one character.
  int32_t Char() {
    if (char_ >= 0) return char_;
    const int32_t plain = b_->CharClass("plain-char", {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}},
                                        /*negate=*/true);
    ByteSet simple;
    for (char c : std::string_view("\"\\/bfnrt")) simple.set(static_cast<uint8_t>(c));
    ByteSet hex = Range('0', '9') | Range('a', 'f') | Range('A', 'F');
    ByteSet hex_no_d =
        Range('0', '9') | Range('a', 'c') | Range('e', 'f') | Range('A', 'C') | Range('E', 'F');
    ByteSet d;
    d.set('d');
    d.set('D');
    const int32_t escape =
        b_->NewRule("escape", {{Symbol::Byte('\\'), Symbol::Bytes(simple)},
                               {Symbol::Byte('\\'), Symbol::Byte('u'), Symbol::Bytes(hex_no_d),
                                Symbol::Bytes(hex), Symbol::Bytes(hex), Symbol::Bytes(hex)},
                               {Symbol::Byte('\\'), Symbol::Byte('u'), Symbol::Bytes(d),
                                Digits('0', '7'), Symbol::Bytes(hex), Symbol::Bytes(hex)}});
    char_ = b_->NewRule("char", {{Symbol::Rule(plain)}, {Symbol::Rule(escape)}});
    return char_;
  }

  absl::StatusOr<Symbol> StringSchema(const json& schema, const std::string& path) {
    absl::StatusOr<int64_t> min = Count(schema, "minLength", 0, path);
    absl::StatusOr<int64_t> max = Count(schema, "maxLength", -1, path);
    if (!min.ok()) return min.status();
    if (!max.ok()) return max.status();
    if (*max >= 0 && *max < *min) return Error(path, "maxLength is below minLength");
    const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
    std::optional<std::string> pattern;
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) return Error(path, "pattern must be a string");
      pattern = schema["pattern"].get<std::string>();
    }
    if (schema.contains("format")) {
      if (!schema["format"].is_string()) return Error(path, "format must be a string");
      const std::string format = schema["format"].get<std::string>();
      auto it = FormatPatterns().find(format);
      if (it == FormatPatterns().end()) {
        return Unsupported(path, absl::StrCat("format '", format, "'"));
      }
      if (pattern.has_value() || has_length) {
        return Unsupported(path, "format together with pattern, minLength or maxLength");
      }
      pattern = it->second;
    }
    if (pattern.has_value()) {
      if (has_length) return Unsupported(path, "pattern together with minLength or maxLength");
      absl::StatusOr<int32_t> rule = AddRegexRule(b_, *pattern, RegexOptions{.json_string = true});
      if (!rule.ok()) return Error(path, std::string(rule.status().message()));
      return Symbol::Rule(b_->NewRule(
          "pattern-string", {{Symbol::Byte('"'), Symbol::Rule(*rule), Symbol::Byte('"')}}));
    }
    if (*min > GrammarBuilder::kMaxRepeat || *max > GrammarBuilder::kMaxRepeat) {
      return Unsupported(path, absl::StrCat("a length bound above ", GrammarBuilder::kMaxRepeat));
    }
    return Symbol::Rule(String(*min, *max));
  }

  // A non-negative integer keyword, or `fallback` when absent.
  absl::StatusOr<int64_t> Count(const json& schema, const char* key, int64_t fallback,
                                const std::string& path) const {
    if (!schema.contains(key)) return fallback;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return Error(path, absl::StrCat(key, " must be a non-negative integer"));
    }
    return v.get<int64_t>();
  }

  // --- Numbers ---

  // Any JSON number (bounded digits).
  int32_t Number() {
    if (number_ >= 0) return number_;
    const int32_t integer = UnboundedInteger();
    const int32_t fraction = *b_->Repeat("fraction-digits", {Digits('0', '9')}, 1, 16);
    const int32_t exponent = *b_->Repeat("exponent-digits", {Digits('0', '9')}, 1, 2);
    ByteSet e;
    e.set('e');
    e.set('E');
    ByteSet sign;
    sign.set('+');
    sign.set('-');
    const int32_t frac_part =
        b_->NewRule("frac", {{Symbol::Byte('.'), Symbol::Rule(fraction)}, {}});
    const int32_t exp_sign = b_->NewRule("exp-sign", {{Symbol::Bytes(sign)}, {}});
    const int32_t exp_part = b_->NewRule(
        "exp", {{Symbol::Bytes(e), Symbol::Rule(exp_sign), Symbol::Rule(exponent)}, {}});
    number_ = b_->NewRule(
        "number", {{Symbol::Rule(integer), Symbol::Rule(frac_part), Symbol::Rule(exp_part)}});
    return number_;
  }

  int32_t UnboundedInteger() {
    if (integer_ >= 0) return integer_;
    const int32_t digits =
        *b_->Repeat("integer-digits", {Digits('0', '9')}, 0, kMaxIntegerDigits - 1);
    const int32_t magnitude = b_->NewRule(
        "magnitude", {GrammarBuilder::Literal("0"), {Digits('1', '9'), Symbol::Rule(digits)}});
    integer_ = b_->NewRule(
        "integer", {{Symbol::Byte('-'), Symbol::Rule(magnitude)}, {Symbol::Rule(magnitude)}});
    return integer_;
  }

  absl::StatusOr<Symbol> NumberSchema(const json& schema, const std::string& type,
                                      const std::string& path) {
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!schema.contains(key)) continue;
      const json& v = schema[key];
      if (!v.is_number()) return Error(path, absl::StrCat(key, " must be a number"));
      const double x = v.get<double>();
      const bool is_min = key[0] == 'm' ? std::string_view(key) == "minimum"
                                        : std::string_view(key) == "exclusiveMinimum";
      const bool exclusive = key[0] == 'e';
      std::optional<double>& bound = is_min ? lo : hi;
      bool& bound_exclusive = is_min ? lo_exclusive : hi_exclusive;
      // Two bounds on one side: the tighter one counts.
      const bool tighter =
          !bound.has_value() || (is_min ? x > *bound : x < *bound) || (x == *bound && exclusive);
      if (tighter) {
        bound = x;
        bound_exclusive = exclusive;
      }
    }
    const bool integer = type == "integer";
    if (!lo.has_value() && !hi.has_value()) {
      return Symbol::Rule(integer ? UnboundedInteger() : Number());
    }
    const double big = static_cast<double>(kLargestInteger);
    // The integers in range.
    const double lo_int = !lo ? -big : lo_exclusive ? std::floor(*lo) + 1 : std::ceil(*lo);
    const double hi_int = !hi ? big : hi_exclusive ? std::ceil(*hi) - 1 : std::floor(*hi);
    std::vector<Sequence> alternatives;
    if (lo_int <= hi_int && lo_int <= big && hi_int >= -big) {
      alternatives = IntegerRange(static_cast<int64_t>(std::max(lo_int, -big)),
                                  static_cast<int64_t>(std::min(hi_int, big)));
    }
    if (!integer) {
      // Numbers k.f with k >= 0 and a fraction that is not zero lie strictly between k and k + 1:
      // in range when k >= lo and k + 1 <= hi.
      const double k_lo = std::max(0.0, lo ? std::ceil(*lo) : 0.0);
      const double k_hi = hi ? std::floor(*hi) - 1 : big;
      if (k_lo <= k_hi && k_lo <= big) {
        const int32_t fraction =
            b_->NewRule("nonzero-fraction",
                        {{Symbol::Byte('.'),
                          Symbol::Rule(*b_->Repeat("fraction-digits", {Digits('0', '9')}, 0, 15)),
                          Digits('1', '9')}});
        for (Sequence& seq :
             IntegerRange(static_cast<int64_t>(k_lo), static_cast<int64_t>(std::min(k_hi, big)))) {
          seq.push_back(Symbol::Rule(fraction));
          alternatives.push_back(std::move(seq));
        }
      }
    }
    if (alternatives.empty()) return Error(path, "no number satisfies its bounds");
    return Symbol::Rule(
        b_->NewRule(integer ? "integer-range" : "number-range", std::move(alternatives)));
  }

  // --- Objects and arrays ---

  absl::StatusOr<Symbol> ObjectSchema(const json& schema, const std::string& path) {
    const Symbol ws = Space();
    std::vector<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) return Error(path, "required must be a list");
      for (const json& name : schema["required"]) {
        if (!name.is_string()) return Error(path, "required must list strings");
        required.push_back(name.get<std::string>());
      }
    }
    const json empty = json::object();
    const json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (!properties.is_object()) return Error(path, "properties must be an object");
    if (properties.empty() && required.empty()) {
      // A map: any keys, values from additionalProperties (or anything).
      const json additional =
          schema.contains("additionalProperties") ? schema["additionalProperties"] : json(true);
      if (additional.is_boolean() && !additional.get<bool>()) {
        return Symbol::Rule(b_->NewRule("empty-object", {GrammarBuilder::Literal("{}")}));
      }
      absl::StatusOr<Symbol> value = Value(additional, path + "/additionalProperties");
      if (!value.ok()) return value.status();
      const Sequence member = {Symbol::Rule(String(-1, -1)), ws, Symbol::Byte(':'), ws, *value};
      Sequence more = {Symbol::Byte(','), ws};
      more.insert(more.end(), member.begin(), member.end());
      Sequence body = member;
      body.push_back(Symbol::Rule(*b_->Repeat("more-members", more, 0, -1)));
      return Symbol::Rule(
          b_->NewRule("map", {{Symbol::Byte('{'), ws, Symbol::Rule(b_->NewRule("members", {body})),
                               ws, Symbol::Byte('}')},
                              {Symbol::Byte('{'), ws, Symbol::Byte('}')}}));
    }
    // The properties in schema order, then required names the schema does not describe.
    struct Property {
      std::string name;
      bool required;
      Symbol value;
    };
    std::vector<Property> props;
    std::set<std::string> named;
    for (const auto& [name, sub] : properties.items()) {
      absl::StatusOr<Symbol> value = Value(sub, absl::StrCat(path, "/properties/", name));
      if (!value.ok()) return value.status();
      const bool is_required = std::find(required.begin(), required.end(), name) != required.end();
      props.push_back({name, is_required, *value});
      named.insert(name);
    }
    for (const std::string& name : required) {
      if (named.insert(name).second) props.push_back({name, true, Symbol::Rule(AnyValue())});
    }
    // first(i): the members from i on when none came before; rest(i): when one did (each then
    // starts with a comma). An optional member may be skipped; a required one may not.
    const size_t n = props.size();
    std::vector<int32_t> first(n + 1), rest(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      first[i] = b_->AddRule(absl::StrCat("members-from-", i));
      rest[i] = b_->AddRule(absl::StrCat("more-members-from-", i));
    }
    b_->AddAlternative(first[n], {});
    b_->AddAlternative(rest[n], {});
    for (size_t i = n; i-- > 0;) {
      Sequence kv = GrammarBuilder::Literal(json(props[i].name).dump());
      kv.insert(kv.end(), {ws, Symbol::Byte(':'), ws, props[i].value});
      Sequence with = kv;
      with.push_back(Symbol::Rule(rest[i + 1]));
      b_->AddAlternative(first[i], with);
      Sequence comma = {Symbol::Byte(','), ws};
      comma.insert(comma.end(), with.begin(), with.end());
      b_->AddAlternative(rest[i], comma);
      if (!props[i].required) {
        b_->AddAlternative(first[i], {Symbol::Rule(first[i + 1])});
        b_->AddAlternative(rest[i], {Symbol::Rule(rest[i + 1])});
      }
    }
    return Symbol::Rule(b_->NewRule(
        "object", {{Symbol::Byte('{'), ws, Symbol::Rule(first[0]), ws, Symbol::Byte('}')}}));
  }

  absl::StatusOr<Symbol> ArraySchema(const json& schema, const std::string& path) {
    absl::StatusOr<int64_t> min = Count(schema, "minItems", 0, path);
    absl::StatusOr<int64_t> max = Count(schema, "maxItems", -1, path);
    if (!min.ok()) return min.status();
    if (!max.ok()) return max.status();
    if (*max >= 0 && *max < *min) return Error(path, "maxItems is below minItems");
    const Symbol ws = Space();
    const Sequence sep = {Symbol::Byte(','), ws};
    if (schema.contains("prefixItems")) {
      // Exactly the prefix items, in order.
      const json& prefix = schema["prefixItems"];
      if (!prefix.is_array() || prefix.empty()) return Error(path, "prefixItems must be a list");
      const auto k = static_cast<int64_t>(prefix.size());
      if (k < *min || (*max >= 0 && k > *max)) {
        return Unsupported(path, "prefixItems with a length outside minItems..maxItems");
      }
      Sequence seq = {Symbol::Byte('['), ws};
      for (size_t i = 0; i < prefix.size(); ++i) {
        absl::StatusOr<Symbol> item = Value(prefix[i], absl::StrCat(path, "/prefixItems/", i));
        if (!item.ok()) return item.status();
        if (i > 0) seq.insert(seq.end(), sep.begin(), sep.end());
        seq.push_back(*item);
      }
      seq.insert(seq.end(), {ws, Symbol::Byte(']')});
      return Symbol::Rule(b_->NewRule("tuple", {seq}));
    }
    absl::StatusOr<Symbol> item =
        Value(schema.contains("items") ? schema["items"] : json(true), path + "/items");
    if (!item.ok()) return item.status();
    if (*max == 0) return Symbol::Rule(b_->NewRule("empty-array", {GrammarBuilder::Literal("[]")}));
    Sequence more = sep;
    more.push_back(*item);
    absl::StatusOr<int32_t> tail =
        b_->Repeat("more-items", more, std::max<int64_t>(*min - 1, 0), *max < 0 ? -1 : *max - 1);
    if (!tail.ok()) return Error(path, std::string(tail.status().message()));
    std::vector<Sequence> alternatives = {
        {Symbol::Byte('['), ws, *item, Symbol::Rule(*tail), ws, Symbol::Byte(']')}};
    if (*min == 0) alternatives.push_back({Symbol::Byte('['), ws, Symbol::Byte(']')});
    return Symbol::Rule(b_->NewRule("array", std::move(alternatives)));
  }

  // --- Combinators ---

  absl::StatusOr<Symbol> AnyOf(const json& schema, const std::string& path) {
    const char* key = schema.contains("anyOf") ? "anyOf" : "oneOf";
    if (absl::Status s = CheckKeywords(schema, path, {key}); !s.ok()) return s;
    if (schema.contains("type")) return Unsupported(path, absl::StrCat("type together with ", key));
    const json& list = schema[key];
    if (!list.is_array() || list.empty()) return Error(path, absl::StrCat(key, " must be a list"));
    std::vector<Sequence> alternatives;
    for (size_t i = 0; i < list.size(); ++i) {
      absl::StatusOr<Symbol> one = Value(list[i], absl::StrCat(path, "/", key, "/", i));
      if (!one.ok()) return one.status();
      alternatives.push_back({*one});
    }
    return Symbol::Rule(b_->NewRule("any-of", std::move(alternatives)));
  }

  absl::StatusOr<Symbol> AllOf(const json& schema, const std::string& path) {
    if (absl::Status s = CheckKeywords(schema, path, {"allOf"}); !s.ok()) return s;
    const json& list = schema["allOf"];
    if (!list.is_array() || list.size() != 1 || schema.contains("type")) {
      return Unsupported(path, "allOf with more than one schema");
    }
    return Value(list[0], path + "/allOf/0");
  }

  absl::StatusOr<Symbol> Enum(const json& schema, const std::string& path) {
    if (absl::Status s = CheckKeywords(schema, path, {"enum", "const"}); !s.ok()) return s;
    std::vector<json> values;
    if (schema.contains("const")) {
      values.push_back(schema["const"]);
    } else {
      if (!schema["enum"].is_array() || schema["enum"].empty()) {
        return Error(path, "enum must be a non-empty list");
      }
      for (const json& v : schema["enum"]) values.push_back(v);
    }
    std::vector<Sequence> alternatives;
    for (const json& v : values) {
      if (schema.contains("type") && !MatchesType(v, schema["type"])) continue;
      alternatives.push_back(GrammarBuilder::Literal(v.dump()));
    }
    if (alternatives.empty()) return Error(path, "no enum value has the schema's type");
    return Symbol::Rule(b_->NewRule("enum", std::move(alternatives)));
  }

  static bool MatchesType(const json& v, const json& type) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer")
        return v.is_number_integer() ||
               (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array()) {
      for (const json& t : type) {
        if (t.is_string() && one(t.get<std::string>())) return true;
      }
    }
    return false;
  }

  absl::StatusOr<Symbol> Ref(const json& schema, const std::string& path) {
    if (absl::Status s = CheckKeywords(schema, path, {"$ref"}); !s.ok()) return s;
    if (!schema["$ref"].is_string()) return Error(path, "$ref must be a string");
    const std::string ref = schema["$ref"].get<std::string>();
    if (auto it = refs_.find(ref); it != refs_.end()) return Symbol::Rule(it->second);
    if (ref.empty() || ref[0] != '#') {
      return Unsupported(path,
                         absl::StrCat("$ref '", ref, "' (only references within the schema)"));
    }
    const json* target = &root_;
    if (ref.size() > 1) {
      if (ref[1] != '/') return Unsupported(path, absl::StrCat("$ref '", ref, "'"));
      for (const std::string& part :
           std::vector<std::string>(absl::StrSplit(ref.substr(2), '/', absl::AllowEmpty()))) {
        std::string token;
        for (size_t i = 0; i < part.size(); ++i) {
          if (part[i] == '~' && i + 1 < part.size() && (part[i + 1] == '0' || part[i + 1] == '1')) {
            token.push_back(part[i + 1] == '0' ? '~' : '/');
            ++i;
          } else {
            token.push_back(part[i]);
          }
        }
        if (target->is_object() && target->contains(token)) {
          target = &(*target)[token];
        } else {
          return Error(path, absl::StrCat("$ref '", ref, "' points at nothing"));
        }
      }
    }
    // Declared before it is compiled, so recursive references find it.
    const int32_t rule = b_->AddRule(absl::StrCat("ref-", refs_.size()));
    refs_[ref] = rule;
    absl::StatusOr<Symbol> value = Value(*target, ref.substr(1));
    if (!value.ok()) return value.status();
    b_->AddAlternative(rule, {*value});
    return Symbol::Rule(rule);
  }

  // Optional whitespace between tokens: one space at most.
  Symbol Space() {
    if (space_ < 0) space_ = b_->NewRule("ws", {GrammarBuilder::Literal(" "), {}});
    return Symbol::Rule(space_);
  }

  GrammarBuilder* b_;
  const json& root_;
  int depth_ = 0;
  int32_t any_value_ = -1;
  int32_t char_ = -1;
  int32_t number_ = -1;
  int32_t integer_ = -1;
  int32_t space_ = -1;
  std::map<std::pair<int64_t, int64_t>, int32_t> strings_;
  std::map<std::string, int32_t> refs_;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaGrammar(const json& schema) {
  GrammarBuilder builder;
  SchemaCompiler compiler(&builder, schema);
  absl::StatusOr<Symbol> value = compiler.Value(schema, "");
  if (!value.ok()) return value.status();
  const int32_t root = builder.NewRule("root", {{compiler.LeadingSpace(), *value}});
  return builder.Build(root);
}

absl::StatusOr<Symbol> AddJsonSchemaRule(GrammarBuilder* builder, const json& schema) {
  SchemaCompiler compiler(builder, schema);
  return compiler.Value(schema, "");
}

absl::StatusOr<Grammar> JsonObjectGrammar() { return JsonSchemaGrammar(json{{"type", "object"}}); }

}  // namespace kvserve::constraint
