// Tokenizer::FromGgufVocab, with vocabularies built the way a GGUF file stores them:
// - "llama" from llama2.c's tok512.bin (the vocabulary of stories260K.gguf);
// - "gpt2" from the GPT-2 / SmolLM2 tokenizer.json files, checked against their goldens.

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "common/tokenizer/gguf_vocab.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/tokenizer/golden_cases.h"

namespace kvserve {
namespace {

// tok512.bin: int32 max_token_length, then per id: float32 score, int32 length, bytes.
// Ids 0..2 are <unk> <s> </s> (types 2 3 3), 3..258 are <0xXX> (type 6), the rest normal, with
// the ASCII space that stands for U+2581 turned back into '▁' as the GGUF file has it.
GgufVocab ReadTok512() {
  std::ifstream in(testing::SharedPath("models/stories260K/tok512.bin"), std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  GgufVocab v;
  v.model = "llama";
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  size_t pos = 4;
  for (int id = 0; id < 512; ++id) {
    float score;
    int32_t len;
    EXPECT_LE(pos + 8, data.size());
    if (pos + 8 > data.size()) break;
    std::memcpy(&score, data.data() + pos, 4);
    std::memcpy(&len, data.data() + pos + 4, 4);
    pos += 8;
    std::string piece = data.substr(pos, len);
    pos += len;
    int32_t type = 1;
    if (id == 0) {
      piece = "<unk>";
      type = 2;
    } else if (id <= 2) {
      piece = id == 1 ? "<s>" : "</s>";
      type = 3;
    } else if (id <= 258) {
      type = 6;
    } else {
      std::string fixed;
      for (const char c : piece)
        fixed += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      piece = fixed;
    }
    v.tokens.push_back(piece);
    v.scores.push_back(score);
    v.token_types.push_back(type);
  }
  return v;
}

// A GGUF "gpt2" vocabulary from a byte-level tokenizer.json (added tokens as control tokens).
GgufVocab VocabFromTokenizerJson(const std::string& name, const std::string& pre) {
  const nlohmann::json root = testing::ReadJsonFile(testing::TokenizerJsonPath(name));
  GgufVocab v;
  v.model = "gpt2";
  v.pre = pre;
  const nlohmann::json& vocab = root.at("model").at("vocab");
  v.tokens.resize(vocab.size());
  v.token_types.assign(vocab.size(), 1);
  for (const auto& [piece, id] : vocab.items()) v.tokens.at(id.get<size_t>()) = piece;
  for (const nlohmann::json& t : root.at("added_tokens")) {
    v.token_types.at(t.at("id").get<size_t>()) = 3;
  }
  for (const nlohmann::json& m : root.at("model").at("merges"))
    v.merges.push_back(m.get<std::string>());
  return v;
}

TEST(GgufTokenizerTest, LlamaVocabEncodesStories260KPrompts) {
  auto tok = Tokenizer::FromGgufVocab(ReadTok512());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 512);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_TRUE((*tok)->IsSpecial(1));
  const nlohmann::json golden =
      testing::ReadJsonFile(testing::SharedPath("models/stories260K/golden.json"));
  for (const nlohmann::json& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt").get<std::string>();
    absl::StatusOr<std::vector<TokenId>> ids = (*tok)->Encode(prompt);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c.at("prompt_token_ids").get<std::vector<TokenId>>()) << prompt;
    EXPECT_EQ(*(*tok)->Decode(*ids, {.skip_special_tokens = true}), prompt);
  }
}

TEST(GgufTokenizerTest, LlamaVocabAgreesWithTokenizerJson) {
  auto gguf = Tokenizer::FromGgufVocab(ReadTok512());
  auto hf = Tokenizer::FromJsonFile(testing::SharedPath("models/stories260K-hf/tokenizer.json"));
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  ASSERT_TRUE(hf.ok()) << hf.status();
  const std::vector<std::string> fragments = {"Once",
                                              " upon",
                                              " a",
                                              " time",
                                              "the",
                                              " little",
                                              " girl",
                                              "Lily",
                                              " ",
                                              "  ",
                                              "\n",
                                              "\t",
                                              ",",
                                              ".",
                                              "!",
                                              "?",
                                              "'s",
                                              "\"",
                                              "123",
                                              "9",
                                              "é",
                                              "ñ",
                                              "\xE2\x80\x9C",
                                              "\xE2\x80\x99",
                                              "\xE4\xB8\xAD\xE6\x96\x87",
                                              "\xF0\x9F\x98\x80",
                                              "\xC2\xA0",
                                              "\xE2\x82\xAC",
                                              "<s>",
                                              "</s>",
                                              "<unk>",
                                              "ab",
                                              "xyz",
                                              "Q",
                                              "-",
                                              "don't",
                                              "\xD0\x9F\xD1\x80\xD0\xB8",
                                              "~",
                                              "<0x41>"};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pick(0, fragments.size() - 1);
  std::uniform_int_distribution<int> length(0, 12);
  for (int n = 0; n < 400; ++n) {
    std::string text;
    for (int k = length(rng); k > 0; --k) text += fragments[pick(rng)];
    for (const bool special : {true, false}) {
      absl::StatusOr<std::vector<TokenId>> a = (*gguf)->Encode(text, {special});
      absl::StatusOr<std::vector<TokenId>> b = (*hf)->Encode(text, {special});
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(*a, *b) << "'" << text << "'";
    }
    const std::vector<TokenId> ids = *(*hf)->Encode(text);
    EXPECT_EQ(*(*gguf)->Decode(ids), *(*hf)->Decode(ids)) << text;
  }
}

struct Gpt2Case {
  std::string name;
  std::string pre;
};

class GgufByteLevelTest : public ::testing::TestWithParam<Gpt2Case> {};

TEST_P(GgufByteLevelTest, MatchesGoldens) {
  auto tok = Tokenizer::FromGgufVocab(VocabFromTokenizerJson(GetParam().name, GetParam().pre));
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const testing::GoldenCase& c : testing::ReadGoldenCases(GetParam().name)) {
    SCOPED_TRACE(::testing::Message() << "case " << c.index << ": " << c.text);
    EXPECT_EQ(*(*tok)->Encode(c.text), c.ids_with_special);
    EXPECT_EQ(*(*tok)->Decode(c.ids_no_special), c.decoded);
    EXPECT_EQ(*(*tok)->Decode(c.ids_with_special, {.skip_special_tokens = true}),
              c.decoded_skip_special);
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, GgufByteLevelTest,
                         ::testing::Values(Gpt2Case{"gpt2", "gpt-2"},
                                           Gpt2Case{"smollm2-135m", "smollm"}),
                         [](const ::testing::TestParamInfo<Gpt2Case>& info) {
                           return info.param.pre == "smollm" ? std::string("smollm")
                                                             : std::string("gpt2");
                         });

TEST(GgufTokenizerTest, BadMetadataIsAnErrorNamingTheKey) {
  GgufVocab v = ReadTok512();
  v.model = "bert";
  auto tok = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("bert"), std::string::npos) << tok.status();

  v = ReadTok512();
  v.scores.pop_back();
  tok = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("tokenizer.ggml.scores"), std::string::npos);

  v = ReadTok512();
  v.bos_id = 9999;
  tok = Tokenizer::FromGgufVocab(v);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("bos_token_id"), std::string::npos);

  GgufVocab g = VocabFromTokenizerJson("gpt2", "no-such-pre");
  tok = Tokenizer::FromGgufVocab(g);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("no-such-pre"), std::string::npos);

  g = VocabFromTokenizerJson("gpt2", "gpt-2");
  g.merges.push_back("notatoken alsonot");
  tok = Tokenizer::FromGgufVocab(g);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("tokenizer.ggml.merges"), std::string::npos);
}

}  // namespace
}  // namespace kvserve
