// The grammar compilers (regular expressions, GBNF, JSON schemas) and the matcher that follows
// them, checked string by string: every case says whether the whole text matches.
#include "worker/constraint/grammar.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/constraint/gbnf.h"
#include "worker/constraint/json_schema.h"
#include "worker/constraint/matcher.h"
#include "worker/constraint/regex_grammar.h"

namespace kvserve::constraint {
namespace {

using json = nlohmann::ordered_json;

// Whether `text` is a complete match of `grammar`.
bool Matches(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher m(grammar);
  return m.Advance(text) && m.CanEnd();
}

// Whether `text` is a prefix of some match.
bool IsPrefix(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher m(grammar);
  return m.Advance(text);
}

std::shared_ptr<const Grammar> Regex(std::string_view pattern) {
  absl::StatusOr<Grammar> g = RegexGrammar(pattern);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status();
  return g.ok() ? std::make_shared<const Grammar>(std::move(*g)) : nullptr;
}

std::shared_ptr<const Grammar> Gbnf(std::string_view text) {
  absl::StatusOr<Grammar> g = GbnfGrammar(text);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::make_shared<const Grammar>(std::move(*g)) : nullptr;
}

std::shared_ptr<const Grammar> Schema(const json& schema) {
  absl::StatusOr<Grammar> g = JsonSchemaGrammar(schema);
  EXPECT_TRUE(g.ok()) << schema.dump() << ": " << g.status();
  return g.ok() ? std::make_shared<const Grammar>(std::move(*g)) : nullptr;
}

TEST(RegexGrammarTest, WholeTextMatches) {
  struct Case {
    const char* pattern;
    const char* text;
    bool match;
  };
  const Case cases[] = {
      {"abc", "abc", true},
      {"abc", "ab", false},
      {"abc", "abcd", false},
      {"^a|b$", "b", true},
      {"[a-c]+x?", "abcabc", true},
      {"[a-c]+x?", "abcx", true},
      {"[a-c]+x?", "x", false},
      {"[^a-c]", "d", true},
      {"[^a-c]", "b", false},
      {"(ab|cd){2,3}", "abcd", true},
      {"(ab|cd){2,3}", "ab", false},
      {"(ab|cd){2,3}", "cdcdab", true},
      {"(ab|cd){2,3}", "abababab", false},
      {"\\d{3}-\\d{4}", "555-1234", true},
      {"\\d{3}-\\d{4}", "555-123", false},
      {"\\w+@\\w+\\.com", "a_1@b2.com", true},
      {"\\s*x", "  \t\nx", true},
      {"\\S", " ", false},
      {"[\\D]", "7", false},
      {"a.c", "a€c", true},
      {"a.c", "a\nc", false},
      {"[α-ω]+", "λόγος", false},  // ό (U+03CC) is outside α-ω
      {"[α-ω]+", "λογοσ", true},
      {"\\u00e9|\\x41", "é", true},
      {"\\u00e9|\\x41", "A", true},
      {"(?:x|y)(?<name>z)?", "xz", true},
      {"a{2}", "aa", true},
      {"a{2,}", "aaaaa", true},
      {"a{2,}", "a", false},
      {"a{,2}", "a{,2}", true},  // not a counted quantifier: literal braces
      {"[-a]", "-", true},
      {"[a\\-z]", "-", true},
      {"[a\\-z]", "b", false},
      {"😀+", "😀😀", true},
      {"[^\\x00-\\x7F]", "ÿ", true},
      {"[^\\x00-\\x7F]", "y", false},
      {"x*?y", "xxy", true},
      {"", "", true},
      {"(a|)b", "b", true},
  };
  for (const Case& c : cases) {
    std::shared_ptr<const Grammar> g = Regex(c.pattern);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(Matches(g, c.text), c.match) << "/" << c.pattern << "/ on '" << c.text << "'";
  }
}

TEST(RegexGrammarTest, UnsupportedConstructsAreNamed) {
  struct Case {
    const char* pattern;
    const char* message;
  };
  const Case cases[] = {
      {"(a)\\1", "backreferences"},
      {"a(?=b)", "lookaround"},
      {"\\bword", "word boundaries"},
      {"a$b", "'$' before the end"},
      {"(ab", "missing ')'"},
      {"ab)", "unmatched ')'"},
      {"[ab", "unterminated character class"},
      {"*a", "nothing to repeat"},
      {"a**", "cannot follow a quantifier"},
      {"a++", "possessive"},
      {"[z-a]", "out of order"},
      {"\\q", "unknown escape"},
      {"a{3,2}", "out of order"},
      {"a{20000}", "above the limit"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Grammar> g = RegexGrammar(c.pattern);
    ASSERT_FALSE(g.ok()) << c.pattern;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.message), std::string::npos)
        << c.pattern << ": " << g.status();
  }
}

// Every code point below U+30000 (and a sample above) matches a class exactly when it is in it:
// the UTF-8 range splitting leaves nothing out and lets nothing extra in.
TEST(RegexGrammarTest, Utf8ClassesAreExact) {
  std::shared_ptr<const Grammar> g =
      Regex("[\\u0041-\\u005A\\u00e0-\\u07ff\\u0800-\\uabcd\\u{1F600}-\\u{1F64F}]");
  ASSERT_NE(g, nullptr);
  std::shared_ptr<const Grammar> negated =
      Regex("[^\\u0041-\\u005A\\u00e0-\\u07ff\\u0800-\\uabcd\\u{1F600}-\\u{1F64F}]");
  ASSERT_NE(negated, nullptr);
  auto in_class = [](uint32_t cp) {
    return (cp >= 0x41 && cp <= 0x5A) || (cp >= 0xE0 && cp <= 0xABCD) ||
           (cp >= 0x1F600 && cp <= 0x1F64F);
  };
  for (uint32_t cp = 0; cp < 0x30000; cp += (cp < 0x2000 ? 1 : 7)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string text;
    utf8::Append(cp, &text);
    ASSERT_EQ(Matches(g, text), in_class(cp)) << std::hex << cp;
    ASSERT_EQ(Matches(negated, text), !in_class(cp)) << std::hex << cp;
  }
  // Malformed UTF-8 matches nothing: an overlong '/' and a lone continuation byte.
  EXPECT_FALSE(IsPrefix(negated, "\xC0\xAF"));
  EXPECT_FALSE(IsPrefix(negated, "\x80"));
}

TEST(GbnfTest, ParsesRulesGroupsAndRepetition) {
  std::shared_ptr<const Grammar> g = Gbnf(R"(
    # answers separated by commas
    root   ::= answer ("," ws answer)*
    answer ::= "yes" | "no"
             | [0-9]{1,3}
    ws     ::= [ \t]?
  )");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "yes"));
  EXPECT_TRUE(Matches(g, "yes, no,12"));
  EXPECT_TRUE(Matches(g, "123"));
  EXPECT_FALSE(Matches(g, "1234"));
  EXPECT_FALSE(Matches(g, "yes,"));
  EXPECT_TRUE(IsPrefix(g, "yes,"));
  EXPECT_FALSE(IsPrefix(g, "maybe"));
}

TEST(GbnfTest, RecursionAndEscapes) {
  std::shared_ptr<const Grammar> g = Gbnf(
      "root ::= list\n"
      "list ::= \"(\" (item (\" \" item)*)? \")\"\n"
      "item ::= list | [a-z\\x5F]+ | \"\\\"q\\\"\" | \"\\u00e9\"\n");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "()"));
  EXPECT_TRUE(Matches(g, "(a (b c) ((d_)) \"q\" é)"));
  EXPECT_FALSE(Matches(g, "(a (b c)"));
  EXPECT_TRUE(IsPrefix(g, "(a (b c)"));
  EXPECT_FALSE(Matches(g, "(A)"));
}

TEST(GbnfTest, ErrorsNameTheProblem) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"", "empty"},
      {"start ::= \"a\"", "no rule named 'root'"},
      {"root ::= missing", "'missing' is used by 'root' but never defined"},
      {"root ::= root \"a\" | \"b\"", "left-recursive"},
      {"root ::= x\nx ::= \"\"? root", "left-recursive"},
      {"root ::= \"a", "unterminated literal"},
      {"root ::= [a", "unterminated character class"},
      {"root ::= (\"a\"", "missing ')'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root = \"a\"", "expected '::='"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Grammar> g = GbnfGrammar(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.message), std::string::npos)
        << c.text << ": " << g.status();
  }
}

TEST(JsonSchemaGrammarTest, ObjectsWithRequiredAndOptionalProperties) {
  std::shared_ptr<const Grammar> g = Schema(json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "ok"]
  })"));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, R"({"name": "x", "ok": true})"));
  EXPECT_TRUE(Matches(g, R"({"name":"x","age":-12,"tags":["a", "b"],"ok":false})"));
  EXPECT_TRUE(Matches(g, R"( { "name": "\u00e9\n", "tags": [], "ok": true })"));
  EXPECT_FALSE(Matches(g, R"({"ok": true})"));                          // name is required
  EXPECT_FALSE(Matches(g, R"({"ok": true, "name": "x"})"));             // schema order
  EXPECT_FALSE(Matches(g, R"({"name": "toolong", "ok": true})"));       // maxLength 5
  EXPECT_FALSE(Matches(g, R"({"name": "x", "ok": true, "more": 1})"));  // not in the schema
  EXPECT_FALSE(Matches(g, R"({"name": "x", "tags": ["a","b","a"], "ok": true})"));
  EXPECT_FALSE(Matches(g, R"({"name": "x", "tags": ["c"], "ok": true})"));
  EXPECT_FALSE(Matches(g, R"({"name": "x", "age": 01, "ok": true})"));
  EXPECT_FALSE(Matches(g, R"({"name": "\ud800", "ok": true})"));  // a lone surrogate
  EXPECT_FALSE(Matches(g, R"({"name": "x",, "ok": true})"));
  EXPECT_FALSE(Matches(g, "{\"name\": \"a\tb\", \"ok\": true}"));  // a raw control character
}

TEST(JsonSchemaGrammarTest, IntegerBoundsAreExact) {
  for (const auto& [lo, hi] :
       std::vector<std::pair<int, int>>{{5, 123}, {-150, -7}, {-9, 1000}, {0, 0}}) {
    std::shared_ptr<const Grammar> g =
        Schema(json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
    ASSERT_NE(g, nullptr);
    for (int v = -1200; v <= 1200; ++v) {
      ASSERT_EQ(Matches(g, std::to_string(v)), v >= lo && v <= hi) << lo << ".." << hi << ": " << v;
    }
  }
  std::shared_ptr<const Grammar> exclusive =
      Schema(json{{"type", "integer"}, {"exclusiveMinimum", 2.5}, {"exclusiveMaximum", 7}});
  ASSERT_NE(exclusive, nullptr);
  for (int v = -10; v <= 20; ++v) {
    EXPECT_EQ(Matches(exclusive, std::to_string(v)), v >= 3 && v <= 6) << v;
  }
  std::shared_ptr<const Grammar> at_least = Schema(json{{"type", "integer"}, {"minimum", 10}});
  ASSERT_NE(at_least, nullptr);
  EXPECT_TRUE(Matches(at_least, "10"));
  EXPECT_TRUE(Matches(at_least, "9999999999999999"));
  EXPECT_FALSE(Matches(at_least, "9"));
  EXPECT_FALSE(Matches(at_least, "-10"));
}

TEST(JsonSchemaGrammarTest, NumberBoundsAdmitOnlyNumbersInRange) {
  std::shared_ptr<const Grammar> g =
      Schema(json{{"type", "number"}, {"minimum", 1.5}, {"exclusiveMaximum", 4}});
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "2"));
  EXPECT_TRUE(Matches(g, "3.999"));
  EXPECT_TRUE(Matches(g, "2.5"));
  EXPECT_FALSE(Matches(g, "4"));
  EXPECT_FALSE(Matches(g, "1"));
  EXPECT_FALSE(Matches(g, "1.2"));
  EXPECT_FALSE(Matches(g, "4.5"));
  EXPECT_FALSE(Matches(g, "2.0"));  // never generated (a zero fraction), though valid
  std::shared_ptr<const Grammar> any = Schema(json{{"type", "number"}});
  ASSERT_NE(any, nullptr);
  for (const char* ok : {"0", "-0.5", "12.25e+3", "1E9", "-7"}) EXPECT_TRUE(Matches(any, ok)) << ok;
  for (const char* bad : {"01", ".5", "1.", "+1", "1e", "--1"})
    EXPECT_FALSE(Matches(any, bad)) << bad;
}

TEST(JsonSchemaGrammarTest, StringsPatternsFormatsAndCombinators) {
  std::shared_ptr<const Grammar> g = Schema(json::parse(R"({
    "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{2}\"\\d$"}},
    "type": "object",
    "properties": {
      "code": {"$ref": "#/$defs/code"},
      "when": {"type": "string", "format": "date"},
      "id": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
      "kind": {"type": ["string", "null"], "minLength": 2, "maxLength": 2},
      "fixed": {"const": {"k": [1, "two"]}}
    },
    "required": ["code", "when", "id", "kind", "fixed"]
  })"));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(
      g,
      R"({"code": "AB\"7", "when": "2026-12-02", "id": null, "kind": "xy", "fixed": {"k":[1,"two"]}})"));
  EXPECT_TRUE(Matches(
      g,
      R"({"code": "ZZ\"0", "when": "1999-01-28", "id": 5, "kind": null, "fixed": {"k":[1,"two"]}})"));
  EXPECT_FALSE(Matches(
      g,
      R"({"code": "AB7", "when": "2026-12-02", "id": null, "kind": "xy", "fixed": {"k":[1,"two"]}})"));
  EXPECT_FALSE(Matches(
      g,
      R"({"code": "AB\"7", "when": "2026-13-02", "id": null, "kind": "xy", "fixed": {"k":[1,"two"]}})"));
  EXPECT_FALSE(Matches(
      g,
      R"({"code": "AB\"7", "when": "2026-12-02", "id": null, "kind": "xyz", "fixed": {"k":[1,"two"]}})"));
}

TEST(JsonSchemaGrammarTest, RecursiveSchemas) {
  std::shared_ptr<const Grammar> g = Schema(json::parse(R"({
    "type": "object",
    "properties": {"value": {"type": "integer"},
                   "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["value"]
  })"));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(
      Matches(g, R"({"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]})"));
  EXPECT_FALSE(Matches(g, R"({"value": 1, "children": [{"children": []}]})"));
}

TEST(JsonSchemaGrammarTest, AnyJsonObject) {
  absl::StatusOr<Grammar> built = JsonObjectGrammar();
  ASSERT_TRUE(built.ok()) << built.status();
  auto g = std::make_shared<const Grammar>(std::move(*built));
  EXPECT_TRUE(Matches(g, R"({})"));
  EXPECT_TRUE(Matches(g, R"({"a": [1, {"b": null}, "c", true, -2.5e3]})"));
  EXPECT_FALSE(Matches(g, R"([1])"));
  EXPECT_FALSE(Matches(g, R"({"a": })"));
  EXPECT_FALSE(Matches(g, R"({a: 1})"));
}

TEST(JsonSchemaGrammarTest, UnsupportedKeywordsAreNamed) {
  struct Case {
    const char* schema;
    const char* message;
  };
  const Case cases[] = {
      {R"({"type": "integer", "multipleOf": 3})", "multipleOf at / is not supported"},
      {R"({"properties": {"x": {"type": "string", "format": "hostname"}}})",
       "format 'hostname' at /properties/x is not supported"},
      {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "allOf with more than one"},
      {R"({"type": "wat"})", "unknown type 'wat'"},
      {R"({"$ref": "#/$defs/none"})", "points at nothing"},
      {R"({"$ref": "http://example.com/s.json"})", "only references within the schema"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no number satisfies"},
      {R"({"type": "string", "pattern": "(a"})", "missing ')'"},
      {R"(false)", "matches nothing"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Grammar> g = JsonSchemaGrammar(json::parse(c.schema));
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.message), std::string::npos)
        << c.schema << ": " << g.status();
  }
}

// Inputs built to exhaust the compilers' recursion are refused or handled without recursion.
TEST(GrammarLimitsTest, DeepNestingIsRefusedAndLongRuleChainsCompile) {
  const std::string deep_regex = std::string(300, '(') + "a" + std::string(300, ')');
  EXPECT_NE(RegexGrammar(deep_regex).status().message().find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(GbnfGrammar(absl::StrCat("root ::= ", deep_regex))
                .status()
                .message()
                .find("nested too deeply"),
            std::string::npos);
  json schema = {{"type", "integer"}};
  for (int i = 0; i < 100; ++i) schema = {{"type", "array"}, {"items", schema}};
  EXPECT_NE(JsonSchemaGrammar(schema).status().message().find("nested deeper than"),
            std::string::npos);
  // 50,000 rules, each starting with the next: the left-recursion check walks them without
  // recursing; closing the chain into a loop is found.
  std::string chain;
  for (int i = 0; i < 50000; ++i) absl::StrAppend(&chain, "r", i, " ::= r", i + 1, " \"x\"\n");
  absl::StatusOr<Grammar> open =
      GbnfGrammar(absl::StrCat("root ::= r0\n", chain, "r50000 ::= \"y\"\n"));
  EXPECT_TRUE(open.ok()) << open.status();
  absl::StatusOr<Grammar> closed =
      GbnfGrammar(absl::StrCat("root ::= r0\n", chain, "r50000 ::= r0\n"));
  EXPECT_NE(closed.status().message().find("left-recursive"), std::string::npos) << closed.status();
}

// Each "a" doubles the parses of r ::= "a" r "b" | "a" r "c" | "": the matcher gives up past its
// limit instead of using exponential time and memory.
TEST(GrammarLimitsTest, ExponentiallyAmbiguousGrammarsOverflow) {
  std::shared_ptr<const Grammar> g =
      Gbnf("root ::= r\nr ::= \"a\" r \"b\" | \"a\" r \"c\" | \"\"\n");
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.Advance("aaaa"));
  EXPECT_FALSE(m.overflowed());
  EXPECT_FALSE(m.Advance(std::string(20, 'a')));
  EXPECT_TRUE(m.overflowed());
  EXPECT_FALSE(m.Advance("b"));
  std::vector<std::pair<TokenId, std::string>> bytes = {{0, "a"}, {1, "b"}};
  TokenBitmask mask;
  m.FillTokenMask(*TokenTrie::FromTokens(2, bytes), &mask);
  EXPECT_FALSE(MaskAllows(mask, 0) || MaskAllows(mask, 1));
  // The unambiguous twin follows 20 a's and their closing letters.
  std::shared_ptr<const Grammar> plain = Gbnf("root ::= r\nr ::= \"a\" r [bc] | \"\"\n");
  GrammarMatcher p(plain);
  EXPECT_TRUE(p.Advance(std::string(20, 'a') + std::string(20, 'c')));
  EXPECT_TRUE(p.CanEnd());
}

// A large enum starts with one stack per value: far from the ambiguity limit's concern.
TEST(GrammarLimitsTest, AnEnumOfTenThousandValuesIsFollowed) {
  json values = json::array();
  for (int i = 0; i < 10000; ++i) values.push_back(absl::StrCat("value-", i));
  std::shared_ptr<const Grammar> g = Schema(json{{"enum", values}});
  ASSERT_NE(g, nullptr);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.Advance("\"value-9"));
  EXPECT_FALSE(m.overflowed());
  EXPECT_TRUE(m.Advance("876\""));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(Matches(g, "\"value-10000\""));
}

// A byte-level vocabulary (one token per byte value) makes the token mask the set of allowed next
// bytes: random walks through a schema's grammar produce documents that nlohmann::json parses.
TEST(JsonSchemaGrammarTest, RandomWalksParseAsJson) {
  std::vector<std::pair<TokenId, std::string>> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(b, std::string(1, static_cast<char>(b)));
  std::shared_ptr<const TokenTrie> trie = TokenTrie::FromTokens(256, bytes);
  std::shared_ptr<const Grammar> g = Schema(json::parse(R"({
    "type": "object",
    "properties": {
      "s": {"type": "string", "maxLength": 4},
      "n": {"type": "number"},
      "a": {"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 300}, "maxItems": 3},
      "o": {"type": "object", "properties": {"e": {"enum": ["x", 2, null]}}, "required": ["e"]}
    },
    "required": ["s", "a"]
  })"));
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(7);
  int parsed = 0;
  for (int walk = 0; walk < 300; ++walk) {
    GrammarMatcher m(g);
    std::string text;
    TokenBitmask mask;
    while (text.size() < 400) {
      if (m.CanEnd() && (!m.CanContinue() || rng() % 4 == 0)) break;
      m.FillTokenMask(*trie, &mask);
      std::vector<int> allowed;
      for (int b = 0; b < 256; ++b) {
        if (MaskAllows(mask, b)) allowed.push_back(b);
      }
      ASSERT_FALSE(allowed.empty()) << text;
      // Prefer ASCII so walks end; UTF-8 bytes still come up.
      int b = allowed[rng() % allowed.size()];
      if (b >= 0x80 && rng() % 8 != 0) {
        for (int tries = 0; tries < 8 && b >= 0x80; ++tries) b = allowed[rng() % allowed.size()];
      }
      ASSERT_TRUE(m.Advance(std::string(1, static_cast<char>(b))));
      text.push_back(static_cast<char>(b));
    }
    if (!m.CanEnd()) continue;  // ran out of room
    json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    ASSERT_TRUE(doc.contains("s") && doc["s"].is_string()) << text;
    ASSERT_TRUE(doc.contains("a") && doc["a"].is_array() && doc["a"].size() <= 3) << text;
    for (const json& v : doc["a"])
      ASSERT_TRUE(v.is_number_integer() && v >= -3 && v <= 300) << text;
    ++parsed;
  }
  EXPECT_GT(parsed, 150);
}

}  // namespace
}  // namespace kvserve::constraint
