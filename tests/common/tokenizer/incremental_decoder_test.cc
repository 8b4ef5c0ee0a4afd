// IncrementalDecoder: streamed text equals Decode() of all ids, and no chunk is broken UTF-8.

#include <memory>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/golden_cases.h"

namespace kvserve {
namespace {

// Independent of the library: RFC 3629 well-formedness.
bool IsWellFormedUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (n > 0 && i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    i += n + 1;
  }
  return true;
}

struct Streamed {
  std::string text;
  std::vector<std::string> chunks;
};

Streamed Stream(const Tokenizer& tok, const std::vector<TokenId>& ids, DecodeOptions options) {
  IncrementalDecoder decoder(tok, options);
  Streamed out;
  for (const TokenId id : ids) {
    absl::StatusOr<std::string> chunk = decoder.Add(id);
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) continue;
    out.chunks.push_back(*chunk);
    out.text += *chunk;
  }
  out.chunks.push_back(decoder.Finish());
  out.text += out.chunks.back();
  return out;
}

class IncrementalGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalGoldenTest, ConcatenationEqualsDecode) {
  auto tok = Tokenizer::FromJsonFile(testing::TokenizerJsonPath(GetParam()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const testing::GoldenCase& c : testing::ReadGoldenCases(GetParam())) {
    SCOPED_TRACE(::testing::Message() << GetParam() << " case " << c.index << ": " << c.text);
    for (const bool skip : {false, true}) {
      const DecodeOptions options{.skip_special_tokens = skip};
      const Streamed s = Stream(**tok, c.ids_with_special, options);
      EXPECT_EQ(s.text, *(*tok)->Decode(c.ids_with_special, options));
      for (const std::string& chunk : s.chunks) EXPECT_TRUE(IsWellFormedUtf8(chunk)) << chunk;
    }
    EXPECT_EQ(Stream(**tok, c.ids_no_special, {}).text, c.decoded);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTokenizers, IncrementalGoldenTest,
                         ::testing::ValuesIn(testing::GoldenTokenizers()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (const char c : info.param) name.push_back(isalnum(c) ? c : '_');
                           return name;
                         });

class IncrementalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("tinyllama-1.1b-chat-v1.0"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    llama_ = *std::move(tok);
  }
  std::unique_ptr<Tokenizer> llama_;
};

TEST_F(IncrementalTest, HoldsByteFallbackUntilCharacterIsComplete) {
  // "I 😀": ▁I, ▁, then the four byte tokens of U+1F600 (F0 9F 98 80 = ids 243 162 155 131).
  const std::vector<TokenId> ids = {306, 29871, 243, 162, 155, 131};
  IncrementalDecoder decoder(*llama_);
  std::vector<std::string> chunks;
  for (const TokenId id : ids) chunks.push_back(*decoder.Add(id));
  EXPECT_EQ(chunks, (std::vector<std::string>{"I", " ", "", "", "", "\xF0\x9F\x98\x80"}));
  EXPECT_EQ(decoder.Finish(), "");
}

TEST_F(IncrementalTest, LeadingSpaceStripMatchesFullDecode) {
  // "Hello world": ▁Hello ▁world. The stripped dummy-prefix space must not reappear.
  IncrementalDecoder decoder(*llama_);
  EXPECT_EQ(*decoder.Add(15043), "Hello");
  EXPECT_EQ(*decoder.Add(3186), " world");
  EXPECT_EQ(decoder.Finish(), "");
}

TEST_F(IncrementalTest, PromptContextKeepsTheFirstTokensSpace) {
  // Prompt "<s> Hello" then generated "▁world": the output text is " world", so that prompt text
  // plus output text equals decoding everything.
  const std::vector<TokenId> prompt = {1, 15043};
  IncrementalDecoder decoder(*llama_, {.skip_special_tokens = true});
  decoder.SetPrompt(prompt);
  EXPECT_EQ(*decoder.Add(3186), " world");
  EXPECT_EQ(*decoder.Add(29991), "!");
  EXPECT_EQ(decoder.Finish(), "");
  const std::vector<TokenId> all = {1, 15043, 3186, 29991};
  EXPECT_EQ(*llama_->Decode(all, {.skip_special_tokens = true}), "Hello world!");
}

TEST_F(IncrementalTest, TruncatedTailBecomesReplacementCharacter) {
  IncrementalDecoder decoder(*llama_);
  EXPECT_EQ(*decoder.Add(243), "");  // <0xF0>
  EXPECT_EQ(*decoder.Add(162), "");  // <0x9F>
  EXPECT_EQ(decoder.Finish(), "\xEF\xBF\xBD");
}

TEST_F(IncrementalTest, OutOfRangeIdIsAnErrorAndIsNotKept) {
  IncrementalDecoder decoder(*llama_);
  EXPECT_EQ(*decoder.Add(15043), "Hello");
  absl::StatusOr<std::string> bad = decoder.Add(32000);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("32000"), std::string::npos);
  EXPECT_EQ(*decoder.Add(3186), " world");
}

}  // namespace
}  // namespace kvserve
