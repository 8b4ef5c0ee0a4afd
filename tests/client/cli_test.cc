// End-to-end tests of the `kvserve` binary: golden generations, tokenize output, and one-line
// errors for bad model files.

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/model/golden.h"

namespace kvserve {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// `env`: assignments put before the command (shell syntax).
RunResult Kvserve(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(KVSERVE_BINARY) + " " + args + " 2>&1";
  RunResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class GenerateGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateGoldenTest, GreedyJsonMatchesReference) {
  const auto golden = testing_golden::LoadStoriesGolden();
  for (const auto& c : golden.cases) {
    RunResult r = Kvserve("generate --model " + Quote(GetParam()) + " --prompt " + Quote(c.prompt) +
                          " --max-tokens " + std::to_string(c.generated_ids.size()) +
                          " --temperature 0 --json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prompt_token_ids"].get<std::vector<TokenId>>(), c.prompt_ids);
    EXPECT_EQ(j["token_ids"].get<std::vector<TokenId>>(), c.generated_ids) << c.prompt;
    EXPECT_EQ(j["finish_reason"], "length");
    // The reference text is the prompt followed by the continuation.
    EXPECT_EQ(c.prompt + j["text"].get<std::string>(), c.text);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GenerateGoldenTest,
                         ::testing::Values(testing_golden::kStoriesGguf,
                                           testing_golden::kStoriesHf),
                         [](const auto& info) { return info.index == 0 ? "gguf" : "hf"; });

TEST(CliTest, StreamsTextAndStopsAtStopString) {
  RunResult r = Kvserve(std::string("generate --model ") + testing_golden::kStoriesGguf +
                        " --prompt 'Once upon a time' --temperature 0 --max-tokens 60 --stop Lily");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, ", there was a little girl named \n");
}

TEST(CliTest, TensorParallelGenerateMatchesReference) {
  const auto golden = testing_golden::LoadStoriesGolden();
  RunResult r = Kvserve(std::string("generate --model ") + testing_golden::kStoriesHf +
                        " --prompt 'Once upon a time' --max-tokens 196 --temperature 0 --tp 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].get<std::vector<TokenId>>(),
            golden.cases[0].generated_ids);
}

// The CUDA backend's sources, on the CUDA simulator, through the whole CLI: the golden tokens
// (with f32 weights kept as f32, as on the CPU).
TEST(CliTest, CudaSimGenerateMatchesReference) {
  const auto golden = testing_golden::LoadStoriesGolden();
  RunResult r = Kvserve(std::string("generate --model ") + testing_golden::kStoriesGguf +
                            " --prompt 'Once upon a time' --max-tokens 64 --temperature 0 --json "
                            "--device cuda-sim --keep-f32-weights",
                        // Under ASan: no fake stack per simulated thread (see tests/kernels/cuda).
                        "ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:detect_stack_use_after_return=0\"");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<TokenId> want(golden.cases[0].generated_ids.begin(),
                                  golden.cases[0].generated_ids.begin() + 64);
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].get<std::vector<TokenId>>(), want);
}

// Size flags take units; a bad one is a one-line error quoting it.
TEST(CliTest, KvCacheMemoryTakesUnits) {
  const std::string base = std::string("generate --model ") + testing_golden::kStoriesGguf +
                           " --prompt 'Once upon a time' --max-tokens 4 --temperature 0 --json";
  RunResult ok = Kvserve(base + " --kv-cache-memory 2MiB");
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["token_ids"].size(), 4u);
  RunResult bad = Kvserve(base + " --kv-cache-memory '2 parsecs'");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("2 parsecs"), std::string::npos) << bad.out;
}

TEST(CliTest, SeededSamplingIsReproducible) {
  const std::string args = std::string("generate --model ") + testing_golden::kStoriesGguf +
                           " --prompt 'Lily and Tom' --temperature 0.9 --top-p 0.9 --seed 42 "
                           "--max-tokens 40 --json";
  RunResult a = Kvserve(args);
  RunResult b = Kvserve(args);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
}

TEST(CliTest, TokenizeJson) {
  RunResult r = Kvserve(std::string("tokenize --tokenizer ") + testing_golden::kStoriesGguf +
                        " --text 'Once upon a time' --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"], nlohmann::json({1, 403, 407, 261, 378}));
  r = Kvserve(std::string("tokenize --tokenizer ") + KVSERVE_SHARED_DIR +
              "/models/tokenizers/gpt2 --text 'Hello, world!' --no-special --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"], nlohmann::json({15496, 11, 995, 0}));
}

// `kvserve chat-template` reproduces every reference rendering of ../shared/models/chat_templates
// byte for byte from the files alone (the model's tokenizer_config.json and a request file), and
// fails with the reference's message and exit status 1 where the reference raised an error.
TEST(CliTest, ChatTemplateRendersTheReferenceCases) {
  using Ordered = nlohmann::ordered_json;
  const std::string dir = test_util::TestScratchDir();
  const std::string root = std::string(KVSERVE_SHARED_DIR) + "/models/chat_templates";
  int cases = 0;
  for (const char* model :
       {"deepseek-r1", "llama-3.2-3b-instruct", "mistral-7b-instruct-v0.3",
        "qwen2.5-coder-3b-instruct", "qwen2.5-instruct-doublebrace-variant", "qwen3-4b"}) {
    std::ifstream in(root + "/" + model + "/golden.json");
    const Ordered golden = Ordered::parse(in);
    for (const Ordered& c : golden.at("cases")) {
      SCOPED_TRACE(std::string(model) + " " + c.at("name").get<std::string>());
      const Ordered request = {{"messages", c.at("messages")},
                               {"tools", c.at("tools")},
                               {"add_generation_prompt", c.at("add_generation_prompt")},
                               {"extra", c.at("extra")}};
      const std::string file = dir + "/request.json";
      std::ofstream(file) << request.dump();
      const RunResult r =
          Kvserve("chat-template --config " + Quote(root + "/" + model) + " --request " +
                  Quote(file) + " --date " + golden.at("strftime_date").get<std::string>());
      ++cases;
      if (c.contains("rendered")) {
        EXPECT_EQ(r.exit_code, 0) << r.out;
        EXPECT_EQ(r.out, c.at("rendered").get<std::string>());
      } else {
        EXPECT_EQ(r.exit_code, 1) << r.out;
        EXPECT_NE(r.out.find(c.at("error").get<std::string>()), std::string::npos) << r.out;
      }
    }
  }
  EXPECT_EQ(cases, 37);
  const RunResult bad = Kvserve("chat-template --config " + Quote(root + "/qwen3-4b") +
                                " --request " + Quote(dir + "/missing.json"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("missing.json"), std::string::npos) << bad.out;
}

TEST(CliTest, HelpListsFlags) {
  RunResult r = Kvserve("generate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--model", "--prompt", "--max-tokens", "--temperature", "--top-p",
                           "--top-k", "--seed", "--json"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  }
}

TEST(CliTest, BadModelFilesGiveOneLineErrors) {
  const std::string dir = test_util::TestScratchDir();
  // A GGUF cut in half, and a file that is not GGUF at all.
  std::ifstream in(testing_golden::kStoriesGguf, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string truncated = dir + "/truncated.gguf";
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const std::string garbage = dir + "/garbage.gguf";
  std::ofstream(garbage, std::ios::binary) << "NOTGGUF and some more bytes to read";
  for (const std::string& path : {truncated, garbage, dir + "/missing.gguf"}) {
    RunResult r = Kvserve("generate --model " + Quote(path) + " --prompt hi");
    EXPECT_NE(r.exit_code, 0) << path;
    EXPECT_NE(r.out.find(path), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not one line: " << r.out;
  }
}

}  // namespace
}  // namespace kvserve
