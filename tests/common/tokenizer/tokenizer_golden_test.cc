// Golden tests: every case of every shared/models/tokenizers/*/golden.json (made with
// transformers.js), plus the stories260K prompt ids (made with llama2.c).

#include <memory>
#include <string>
#include <thread>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/golden_cases.h"

namespace kvserve {
namespace {

using testing::GoldenCase;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EncodeAndDecodeMatchReference) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJsonFile(testing::TokenizerJsonPath(GetParam()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<GoldenCase> cases = testing::ReadGoldenCases(GetParam());
  ASSERT_GE(cases.size(), 20u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << GetParam() << " case " << c.index << ": " << c.text);
    absl::StatusOr<std::vector<TokenId>> with = (*tok)->Encode(c.text);
    ASSERT_TRUE(with.ok()) << with.status();
    EXPECT_EQ(*with, c.ids_with_special);
    absl::StatusOr<std::vector<TokenId>> without =
        (*tok)->Encode(c.text, {.add_special_tokens = false});
    ASSERT_TRUE(without.ok()) << without.status();
    EXPECT_EQ(*without, c.ids_no_special);
    absl::StatusOr<std::string> decoded = (*tok)->Decode(c.ids_no_special);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c.decoded);
    absl::StatusOr<std::string> skipped =
        (*tok)->Decode(c.ids_with_special, {.skip_special_tokens = true});
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, c.decoded_skip_special);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTokenizers, GoldenTest,
                         ::testing::ValuesIn(testing::GoldenTokenizers()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (const char c : info.param) name.push_back(isalnum(c) ? c : '_');
                           return name;
                         });

TEST(GoldenTest, KnownIdsAndSpecialTokens) {
  auto llama = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("tinyllama-1.1b-chat-v1.0"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ((*llama)->vocab_size(), 32000);
  EXPECT_EQ((*llama)->bos_id(), 1);
  EXPECT_EQ((*llama)->eos_id(), 2);
  EXPECT_TRUE((*llama)->IsSpecial(1));
  EXPECT_FALSE((*llama)->IsSpecial(15043));
  EXPECT_EQ((*llama)->IdToPiece(15043), "\xE2\x96\x81Hello");
  EXPECT_EQ((*llama)->PieceToId("<0x0A>"), 13);
  EXPECT_EQ((*llama)->PieceToId("no such piece"), std::nullopt);
  EXPECT_NE((*llama)->chat_template().find("<|assistant|>"), std::string::npos);

  auto gpt2 = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("gpt2"));
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ((*gpt2)->vocab_size(), 50257);
  EXPECT_EQ((*gpt2)->PieceToId("\xC4\xA0Hello"), 18435);
  EXPECT_EQ((*gpt2)->eos_id(), 50256);
  EXPECT_TRUE((*gpt2)->chat_template().empty());

  auto smol = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("smollm2-135m"));
  ASSERT_TRUE(smol.ok()) << smol.status();
  EXPECT_EQ((*smol)->vocab_size(), 49152);
  EXPECT_EQ((*smol)->eos_id(), 0);
  EXPECT_EQ((*smol)->bos_id(), 0);
  for (TokenId id = 0; id < 17; ++id) EXPECT_TRUE((*smol)->IsSpecial(id)) << id;
}

TEST(GoldenTest, Stories260KPromptIds) {
  auto tok = Tokenizer::FromJsonFile(testing::SharedPath("models/stories260K-hf/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 512);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  const nlohmann::json golden =
      testing::ReadJsonFile(testing::SharedPath("models/stories260K/golden.json"));
  int checked = 0;
  for (const nlohmann::json& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt").get<std::string>();
    const auto expected = c.at("prompt_token_ids").get<std::vector<TokenId>>();
    absl::StatusOr<std::vector<TokenId>> ids = (*tok)->Encode(prompt);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, expected) << prompt;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(GoldenTest, LongInputsAreFast) {
  auto llama = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("tinyllama-1.1b-chat-v1.0"));
  auto gpt2 = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("gpt2"));
  ASSERT_TRUE(llama.ok() && gpt2.ok());
  std::string text;
  while (text.size() < 100 * 1024) {
    text += "The quick brown fox jumps over the lazy dog. \xE4\xBD\xA0\xE5\xA5\xBD 12345\n";
  }
  for (const Tokenizer* t : {llama->get(), gpt2->get()}) {
    absl::StatusOr<std::vector<TokenId>> ids = t->Encode(text, {.add_special_tokens = false});
    ASSERT_TRUE(ids.ok());
    absl::StatusOr<std::string> back = t->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
    // Long runs of one character class stress both the regex splitter and the merge loop.
    std::string spaces = "x";
    spaces.append(100000, ' ');
    spaces.push_back('y');
    for (const std::string& run : {std::string(300, 'a'), std::string(100000, 'a'), spaces,
                                   std::string(50000, '7'), std::string(30000, '!')}) {
      ids = t->Encode(run, {.add_special_tokens = false});
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(*t->Decode(*ids), run);
    }
  }
}

TEST(GoldenTest, EncodeIsSafeFromSeveralThreads) {
  for (const std::string& name : testing::GoldenTokenizers()) {
    auto tok = Tokenizer::FromJsonFile(testing::TokenizerJsonPath(name));
    ASSERT_TRUE(tok.ok()) << tok.status();
    const std::vector<GoldenCase> cases = testing::ReadGoldenCases(name);
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 5; ++round) {
          for (const GoldenCase& c : cases) {
            absl::StatusOr<std::vector<TokenId>> ids = (*tok)->Encode(c.text);
            if (!ids.ok() || *ids != c.ids_with_special) ++mismatches[t];
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(mismatches, std::vector<int>(4, 0)) << name;
  }
}

}  // namespace
}  // namespace kvserve
