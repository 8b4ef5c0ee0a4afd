// Token masks over real vocabularies: token bytes agree with the tokenizer's own decoder, and every
// mask equals the brute-force answer (each token's bytes fed to a copy of the parser).
#include "worker/constraint/constraint.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve::constraint {
namespace {

std::string SharedPath(const std::string& relative) {
  return std::string(KVSERVE_SHARED_DIR) + "/" + relative;
}

struct Vocabulary {
  const char* name;
  std::string tokenizer_json;
};

std::vector<Vocabulary> Vocabularies() {
  return {{"stories260K", SharedPath("models/stories260K-hf/tokenizer.json")},
          {"gpt2", SharedPath("models/tokenizers/gpt2/tokenizer.json")},
          {"tinyllama", SharedPath("models/tokenizers/tinyllama-1.1b-chat-v1.0/tokenizer.json")}};
}

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "title": {"type": "string", "maxLength": 12},
    "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
    "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "horror"]}, "maxItems": 3},
    "rating": {"type": "number"}
  },
  "required": ["title", "year"]
})";

// After any text before them, a run of tokens decodes to the concatenation of their bytes.
TEST(TokenTrieTest, TokenBytesAgreeWithTheDecoder) {
  for (const Vocabulary& v : Vocabularies()) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJsonFile(v.tokenizer_json);
    ASSERT_TRUE(tok.ok()) << tok.status();
    std::unique_ptr<TokenTrie> trie = TokenTrie::FromTokenizer(**tok);
    // Tokens that are whole characters, and tokens that are parts of one (byte fallback).
    std::vector<TokenId> usable, whole;
    for (TokenId id = 0; id < trie->vocab_size(); ++id) {
      if (trie->bytes(id).empty()) continue;
      usable.push_back(id);
      if (utf8::IsValid(trie->bytes(id))) whole.push_back(id);
    }
    ASSERT_GT(usable.size(), static_cast<size_t>(trie->vocab_size()) * 9 / 10) << v.name;
    absl::StatusOr<std::vector<TokenId>> context =
        (*tok)->Encode("Hello", {.add_special_tokens = false});
    ASSERT_TRUE(context.ok());
    absl::StatusOr<std::string> context_text = (*tok)->Decode(*context);
    ASSERT_TRUE(context_text.ok());
    std::mt19937 rng(11);
    int checked = 0;
    for (int run = 0; run < 400; ++run) {
      std::vector<TokenId> ids = *context;
      std::string expected = *context_text;
      for (int k = 0; k < 6; ++k) {
        const TokenId id =
            rng() % 4 == 0 ? usable[rng() % usable.size()] : whole[rng() % whole.size()];
        ids.push_back(id);
        expected += trie->bytes(id);
      }
      if (!utf8::IsValid(expected)) continue;  // partial characters decode to U+FFFD
      absl::StatusOr<std::string> decoded = (*tok)->Decode(ids);
      ASSERT_TRUE(decoded.ok());
      ASSERT_EQ(*decoded, expected) << v.name;
      ++checked;
    }
    EXPECT_GT(checked, 100) << v.name;
  }
}

TEST(ConstraintTest, MasksEqualBruteForceAlongRandomWalks) {
  ConstraintCompiler compiler;
  absl::StatusOr<std::shared_ptr<const CompiledConstraint>> compiled =
      compiler.Compile({ConstraintSpec::Kind::kJsonSchema, kSchema});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  for (const Vocabulary& v : Vocabularies()) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJsonFile(v.tokenizer_json);
    ASSERT_TRUE(tok.ok()) << tok.status();
    std::shared_ptr<const TokenTrie> trie = TokenTrie::FromTokenizer(**tok);
    // Large vocabularies: fewer steps, and the brute force over every 16th token (a different
    // residue each step), so that the test stays quick under the sanitizers.
    const bool large = trie->vocab_size() > 10000;
    const int steps = large ? 8 : 60;
    const int stride = large ? 16 : 1;
    std::mt19937 rng(3);
    for (int walk = 0; walk < (large ? 2 : 3); ++walk) {
      GrammarMatcher matcher((*compiled)->grammar());
      std::string text;
      for (int step = 0; step < steps && matcher.CanContinue(); ++step) {
        std::shared_ptr<const TokenBitmask> mask = (*compiled)->Mask(matcher, *trie);
        for (TokenId id = step % stride; id < trie->vocab_size(); id += stride) {
          const std::string& bytes = trie->bytes(id);
          GrammarMatcher copy = matcher;
          const bool fits = !bytes.empty() && copy.Advance(bytes);
          ASSERT_EQ(MaskAllows(*mask, id), fits)
              << v.name << " after '" << text << "': token " << id << " '" << bytes << "'";
        }
        std::vector<TokenId> allowed;
        for (TokenId id = 0; id < trie->vocab_size(); ++id) {
          if (MaskAllows(*mask, id)) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty()) << v.name << " after '" << text << "'";
        const TokenId pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(matcher.Advance(trie->bytes(pick)));
        text += trie->bytes(pick);
      }
    }
  }
  EXPECT_GT((*compiled)->mask_misses(), 0u);
}

TEST(ConstraintTest, CompilerSharesCompiledSpecsAndNamesErrors) {
  ConstraintCompiler compiler(/*capacity=*/2);
  const ConstraintSpec a{ConstraintSpec::Kind::kRegex, "[ab]+"};
  const ConstraintSpec b{ConstraintSpec::Kind::kGrammar, "root ::= \"x\""};
  const ConstraintSpec c{ConstraintSpec::Kind::kJsonObject, ""};
  auto first = compiler.Compile(a);
  auto again = compiler.Compile(a);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(first->get(), again->get());
  ASSERT_TRUE(compiler.Compile(b).ok());
  ASSERT_TRUE(compiler.Compile(c).ok());  // evicts a (capacity 2)
  auto recompiled = compiler.Compile(a);
  ASSERT_TRUE(recompiled.ok());
  EXPECT_NE(first->get(), recompiled->get());
  auto none = compiler.Compile({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->get(), nullptr);

  auto bad_json = compiler.Compile({ConstraintSpec::Kind::kJsonSchema, "{not json"});
  EXPECT_EQ(bad_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_json.status().message().find("not valid JSON"), std::string::npos);
  auto bad_keyword = compiler.Compile(
      {ConstraintSpec::Kind::kJsonSchema, R"({"type": "string", "contentEncoding": "base64"})"});
  EXPECT_EQ(bad_keyword.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_keyword.status().message().find("contentEncoding"), std::string::npos);
}

TEST(ConstraintTest, EndOfSequenceOnlyWhereTheOutputIsComplete) {
  // Tokens: 0 = EOS, 1 = "a", 2 = "b", 3 = "ab", 4 = "c".
  std::shared_ptr<const TokenTrie> trie =
      TokenTrie::FromTokens(5, {{1, "a"}, {2, "b"}, {3, "ab"}, {4, "c"}});
  ConstraintCompiler compiler;
  auto compiled = compiler.Compile({ConstraintSpec::Kind::kRegex, "a(b|bb)"});
  ASSERT_TRUE(compiled.ok());
  const TokenId eos[] = {0};
  ConstraintState state(*compiled, trie, eos);
  auto allowed = [&] {
    std::vector<TokenId> ids;
    const TokenBitmask& mask = state.Allowed();
    for (TokenId id = 0; id < 5; ++id) {
      if (MaskAllows(mask, id)) ids.push_back(id);
    }
    return ids;
  };
  EXPECT_EQ(allowed(), (std::vector<TokenId>{1, 3}));
  EXPECT_EQ(state.Accept(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.Accept(4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(state.Accept(3).ok());  // "ab": complete, or one more b
  EXPECT_TRUE(state.CanEnd());
  EXPECT_FALSE(state.Complete());
  EXPECT_EQ(allowed(), (std::vector<TokenId>{0, 2}));
  ASSERT_TRUE(state.Accept(2).ok());
  EXPECT_TRUE(state.Complete());
  EXPECT_EQ(allowed(), (std::vector<TokenId>{0}));
}

}  // namespace
}  // namespace kvserve::constraint
