#include "common/gguf/gguf_vocab_reader.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "common/io/mapped_file.h"
#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve {
namespace {

const std::string kShared = KVSERVE_SHARED_DIR;

absl::StatusOr<GgufVocab> VocabOf(const GgufWriter& w, const std::string& name) {
  const std::string path = test_util::ScratchPath(name);
  EXPECT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  return ReadGgufVocab(*f);
}

TEST(GgufVocabReaderTest, ReadsStories260K) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(kShared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<GgufVocab> v = ReadGgufVocab(*f);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->model, "llama");
  EXPECT_EQ(v->pre, "");
  ASSERT_EQ(v->tokens.size(), 512u);
  EXPECT_EQ(v->tokens[0], "<unk>");
  EXPECT_EQ(v->tokens[1], "<s>");
  EXPECT_EQ(v->tokens[2], "</s>");
  EXPECT_EQ(v->tokens[3], "<0x00>");
  EXPECT_EQ(v->tokens[258], "<0xFF>");
  ASSERT_EQ(v->token_types.size(), 512u);
  EXPECT_EQ(v->token_types[0], 2);
  EXPECT_EQ(v->token_types[1], 3);
  EXPECT_EQ(v->token_types[3], 6);
  EXPECT_EQ(v->token_types[300], 1);
  EXPECT_TRUE(v->merges.empty());
  EXPECT_EQ(v->bos_id, 1);
  EXPECT_EQ(v->eos_id, 2);
  EXPECT_EQ(v->unk_id, 0);
  EXPECT_EQ(v->pad_id, kNoToken);  // stored as 0xFFFFFFFF
  EXPECT_FALSE(v->add_bos.has_value());

  // Independent reference: tok512.bin stores (score, length, bytes) per token.
  absl::StatusOr<std::string> tok = ReadFileToString(kShared + "/models/stories260K/tok512.bin");
  ASSERT_TRUE(tok.ok());
  ASSERT_EQ(v->scores.size(), 512u);
  size_t pos = 4;
  for (int i = 0; i < 512; ++i) {
    float score;
    int32_t len;
    std::memcpy(&score, tok->data() + pos, 4);
    std::memcpy(&len, tok->data() + pos + 4, 4);
    pos += 8 + len;
    EXPECT_EQ(v->scores[i], score) << i;
  }
  EXPECT_EQ(v->scores[300], -41.0f);
}

TEST(GgufVocabReaderTest, ReadsGpt2StyleVocab) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "qwen2");
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "ab", "<|end|>"});
  w.SetI32Array("tokenizer.ggml.token_type", {1, 1, 1, 3});
  w.SetStringArray("tokenizer.ggml.merges", {"a b"});
  w.SetI32("tokenizer.ggml.bos_token_id", -1);
  w.SetU32("tokenizer.ggml.eos_token_id", 3);
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  w.SetBool("tokenizer.ggml.add_space_prefix", true);
  absl::StatusOr<GgufVocab> v = VocabOf(w, "gpt2.gguf");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->model, "gpt2");
  EXPECT_EQ(v->pre, "qwen2");
  EXPECT_EQ(v->merges, (std::vector<std::string>{"a b"}));
  EXPECT_TRUE(v->scores.empty());
  EXPECT_EQ(v->bos_id, kNoToken);
  EXPECT_EQ(v->eos_id, 3);
  EXPECT_EQ(v->add_bos, std::optional<bool>(false));
  EXPECT_FALSE(v->add_eos.has_value());
  EXPECT_EQ(v->add_space_prefix, std::optional<bool>(true));
}

TEST(GgufVocabReaderTest, Errors) {
  const std::string dir = test_util::TestScratchDir() + "/";
  {
    GgufWriter w;
    w.SetString("general.architecture", "llama");
    absl::StatusOr<GgufVocab> v = VocabOf(w, "notok.gguf");
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().message(),
              dir + "notok.gguf: no tokenizer in GGUF metadata (tokenizer.ggml.tokens)");
  }
  {
    GgufWriter w;
    w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"});
    w.SetF32Array("tokenizer.ggml.scores", {1.0f});
    absl::StatusOr<GgufVocab> v = VocabOf(w, "scores.gguf");
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().message(), dir +
                                        "scores.gguf: metadata key 'tokenizer.ggml.scores' has "
                                        "1 entries but tokenizer.ggml.tokens has 2");
  }
  {
    GgufWriter w;
    w.SetStringArray("tokenizer.ggml.tokens", {"a", "b"});
    w.SetU32("tokenizer.ggml.eos_token_id", 7);
    absl::StatusOr<GgufVocab> v = VocabOf(w, "eos.gguf");
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().message(), dir +
                                        "eos.gguf: metadata key 'tokenizer.ggml.eos_token_id' "
                                        "is 7, outside the vocabulary of 2 tokens");
  }
  {
    GgufWriter w;
    w.SetF32Array("tokenizer.ggml.tokens", {1.0f});
    absl::StatusOr<GgufVocab> v = VocabOf(w, "toktype.gguf");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("'tokenizer.ggml.tokens' has type array of float32"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kvserve
