// Pipeline components (split behaviors, Llama-3 / Qwen2 style pre-tokenizers, Metaspace, NFC,
// list-form merges, ignore_merges) on small hand-made tokenizer.json files, and load/encode/decode
// errors. Expected values are worked out by hand from the Hugging Face tokenizers docs.

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/tokenizer/golden_cases.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Writes `content` as <scratch>/tok_<dir>/tokenizer.json and returns the path.
std::string WriteTokenizer(const std::string& dir, const std::string& content) {
  const fs::path folder = fs::path(test_util::ScratchPath("tok_" + dir));
  fs::create_directories(folder);
  const fs::path path = folder / "tokenizer.json";
  std::ofstream(path) << content;
  return path.string();
}

std::unique_ptr<Tokenizer> Load(const std::string& dir, const json& j) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJsonFile(WriteTokenizer(dir, j.dump()));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<std::string> SplitWith(SplitBehavior behavior, const std::string& text) {
  RegexSplitPreTokenizer split(*Regex::Compile("-", /*literal=*/true), behavior, false);
  std::vector<std::string> pieces = {text};
  split.Split(&pieces, true);
  return pieces;
}

TEST(SplitBehaviorTest, MatchesDocumentedExamples) {
  using V = std::vector<std::string>;
  const std::string text = "the-final--countdown";
  EXPECT_EQ(SplitWith(SplitBehavior::kRemoved, text), (V{"the", "final", "countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kIsolated, text),
            (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kMergedWithPrevious, text),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kMergedWithNext, text),
            (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kContiguous, text),
            (V{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizerTest, Llama3PatternSplitsDigitsInThrees) {
  auto pre = MakeByteLevelPreTokenizer(kLlama3Pattern, false);
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> pieces = {"I'M 1234567 ok\n\n"};
  (*pre)->Split(&pieces, true);
  // Byte-level spelling: ' ' is U+0120 'Ġ', '\n' is U+010A 'Ċ'.
  EXPECT_EQ(pieces, (std::vector<std::string>{"I", "'M", "\xC4\xA0", "123", "456", "7",
                                              "\xC4\xA0ok", "\xC4\x8A\xC4\x8A"}));
}

TEST(PreTokenizerTest, Qwen2PatternSplitsSingleDigits) {
  auto pre = MakeByteLevelPreTokenizer(kQwen2Pattern, false);
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string> pieces = {"x=42"};
  (*pre)->Split(&pieces, true);
  EXPECT_EQ(pieces, (std::vector<std::string>{"x", "=", "4", "2"}));
}

// A Llama-3 style file: Split(regex, Isolated) + ByteLevel(use_regex false), list-form merges.
json ByteLevelSplitTokenizer(bool ignore_merges) {
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 10}, {"content", "<|eot|>"}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", R"(\p{N}{1,3}| ?\p{L}+|\s+)"}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"ignore_merges", ignore_merges},
        {"vocab",
         {{"a", 0},
          {"b", 1},
          {"ab", 2},
          {"\xC4\xA0", 3},
          {"1", 4},
          {"2", 5},
          {"3", 6},
          {"12", 7},
          {"123", 8},
          {"4", 9},
          {"abab", 11},
          {"\xC4\xA0"
           "ab",
           12}}},
        {"merges", json::array({json::array({"a", "b"}), json::array({"1", "2"}),
                                json::array({"12", "3"}), json::array({"\xC4\xA0", "ab"})})}}}};
}

TEST(TokenizerJsonTest, SplitPlusByteLevelWithListMerges) {
  auto tok = Load("split", ByteLevelSplitTokenizer(false));
  ASSERT_NE(tok, nullptr);
  // "ab ab 1234<|eot|>": words "ab", " ab", "123", "4", then the added token.
  EXPECT_EQ(*tok->Encode("ab ab 1234<|eot|>"), (std::vector<TokenId>{2, 12, 3, 8, 9, 10}));
  EXPECT_EQ(*tok->Decode(std::vector<TokenId>{2, 12, 3, 8, 9, 10}), "ab ab 1234<|eot|>");
  EXPECT_EQ(*tok->Decode(std::vector<TokenId>{2, 10}, {.skip_special_tokens = true}), "ab");
  // Without ignore_merges "abab" has no merge path to id 11.
  EXPECT_EQ(*tok->Encode("abab"), (std::vector<TokenId>{2, 2}));
}

TEST(TokenizerJsonTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  auto tok = Load("ignore_merges", ByteLevelSplitTokenizer(true));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("abab"), (std::vector<TokenId>{11}));
}

TEST(TokenizerJsonTest, MetaspaceAndNfc) {
  const json j = {
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", "\xE2\x96\x81"},
        {"prepend_scheme", "first"},
        {"split", true}}},
      {"decoder",
       {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}}},
      {"added_tokens", json::array({{{"id", 0}, {"content", "<s>"}, {"special", true}}})},
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"<s>", 0},
          {"\xE2\x96\x81", 1},
          {"h", 2},
          {"\xC3\xA9", 3},
          {"\xE2\x96\x81h", 4},
          {"\xE2\x96\x81h\xC3\xA9", 5}}},
        {"merges", json::array({"\xE2\x96\x81 h", "\xE2\x96\x81h \xC3\xA9"})}}}};
  auto tok = Load("metaspace", j);
  ASSERT_NE(tok, nullptr);
  // "he\u0301 he\u0301": NFC makes "hé hé"; "first" prepends ▁ to the first section only.
  EXPECT_EQ(*tok->Encode("he\xCC\x81 he\xCC\x81"), (std::vector<TokenId>{5, 5}));
  EXPECT_EQ(*tok->Encode("<s>h"), (std::vector<TokenId>{0, 2}));
  EXPECT_EQ(*tok->Decode(std::vector<TokenId>{5, 5}), "h\xC3\xA9 h\xC3\xA9");
}

TEST(TokenizerErrorTest, MissingFileNamesThePath) {
  auto tok = Tokenizer::FromJsonFile("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrorTest, InvalidJsonNamesTheFile) {
  const std::string path = WriteTokenizer("invalid_json", "{\"model\": [1, 2");
  auto tok = Tokenizer::FromJsonFile(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
  EXPECT_NE(tok.status().message().find("invalid JSON"), std::string::npos) << tok.status();
}

TEST(TokenizerErrorTest, UnsupportedComponentsAreNamed) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}}, "Unigram"},
      {{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
        {"pre_tokenizer", {{"type", "BertPreTokenizer"}}}},
       "BertPreTokenizer"},
      {{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
        {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "Nmt"}}})}}}},
       "normalizer.normalizers[0]: unsupported normalizer type 'Nmt'"},
      {{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
        {"decoder", {{"type", "CTC"}}}},
       "CTC"},
      {{{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array({"a b"})}}}},
       "model.merges[0]"},
      {{{"model", {{"type", "BPE"}, {"vocab", {{"a", "zero"}}}, {"merges", json::array()}}}},
       "model.vocab"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteTokenizer("bad" + std::to_string(i), cases[i].first.dump());
    auto tok = Tokenizer::FromJsonFile(path);
    ASSERT_FALSE(tok.ok()) << cases[i].second;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(tok.status().message().find(cases[i].second), std::string::npos) << tok.status();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
  }
}

TEST(TokenizerErrorTest, DecodeRejectsOutOfRangeIds) {
  auto tok = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("gpt2"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  for (const TokenId id : {-1, 50257, 1 << 30}) {
    absl::StatusOr<std::string> text = (*tok)->Decode(std::vector<TokenId>{15496, id});
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(text.status().message().find(std::to_string(id)), std::string::npos);
  }
}

TEST(TokenizerErrorTest, EncodeRejectsInvalidUtf8) {
  auto tok = Tokenizer::FromJsonFile(testing::TokenizerJsonPath("gpt2"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::vector<TokenId>> ids = (*tok)->Encode("ok\xC3(");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("offset 2"), std::string::npos) << ids.status();
}

}  // namespace
}  // namespace kvserve
