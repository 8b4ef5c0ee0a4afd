// `kvserve generate --endpoint` against the in-process fake server: the request it sends and the
// output it prints (the same JSON objects as local mode).

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/client/sdk/fake_inference_server.h"

namespace kvserve {
namespace {

using testing::FakeInferenceServer;

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout, then stderr.
};

RunResult Kvserve(const std::string& args) {
  RunResult r;
  const std::string command = std::string(KVSERVE_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// "Hel" + "lo" for sample 0, finishing on length.
std::vector<v1::GenerateResponse> HelloChunks() {
  std::vector<v1::GenerateResponse> chunks(2);
  chunks[0].add_token_ids(40);
  chunks[0].add_token_ids(41);
  chunks[0].set_text("Hel");
  chunks[1].add_token_ids(42);
  chunks[1].set_text("lo");
  chunks[1].set_finish_reason(v1::FINISH_REASON_LENGTH);
  chunks[1].mutable_usage()->set_prompt_tokens(3);
  chunks[1].mutable_usage()->set_completion_tokens(3);
  chunks[1].mutable_usage()->set_cached_prompt_tokens(0);
  chunks[1].mutable_usage()->set_peak_kv_blocks(1);
  return chunks;
}

TEST(RemoteGenerateTest, JsonMatchesLocalModeAndSendsTheFlags) {
  FakeInferenceServer server;
  server.service().SetChunks(HelloChunks());
  const RunResult r = Kvserve("generate --endpoint " + server.address() +
                              " --prompt Hi --max-tokens 3 --temperature 0 --top-k 4 --seed 9 "
                              "--stop '\\n' --cache-salt s1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  // The fake tokenizer: BOS, then the bytes of the text.
  EXPECT_EQ(j["prompt_token_ids"], nlohmann::json({1, 'H', 'i'}));
  EXPECT_EQ(j["token_ids"], nlohmann::json({40, 41, 42}));
  EXPECT_EQ(j["text"], "Hello");
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"], nlohmann::json({{"prompt_tokens", 3},
                                        {"completion_tokens", 3},
                                        {"cached_prompt_tokens", 0},
                                        {"peak_kv_blocks", 1}}));
  EXPECT_FALSE(j.contains("logprobs"));

  const v1::GenerateRequest sent = server.service().last_generate_request();
  EXPECT_TRUE(sent.prompt().empty());
  EXPECT_EQ(sent.prompt_token_ids_size(), 3);
  EXPECT_EQ(sent.model(), "");
  EXPECT_EQ(sent.max_tokens(), 3u);
  EXPECT_EQ(sent.sampling().temperature(), 0.0f);
  EXPECT_EQ(sent.sampling().top_k(), 4u);
  EXPECT_EQ(sent.sampling().seed(), 9u);
  ASSERT_EQ(sent.stop_size(), 1);
  EXPECT_EQ(sent.stop(0), "\\n");
  EXPECT_EQ(sent.cache_salt(), "s1");
  EXPECT_FALSE(sent.has_logprobs());
}

TEST(RemoteGenerateTest, PlainModeStreamsTheText) {
  FakeInferenceServer server;
  server.service().SetChunks(HelloChunks());
  const RunResult r = Kvserve("generate --endpoint " + server.address() +
                              " --model stories260K --prompt Hi --no-special");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "Hello\n");
  const v1::GenerateRequest sent = server.service().last_generate_request();
  EXPECT_EQ(sent.prompt(), "Hi");
  EXPECT_EQ(sent.model(), "stories260K");
  ASSERT_TRUE(sent.has_add_special_tokens());
  EXPECT_FALSE(sent.add_special_tokens());
}

TEST(RemoteGenerateTest, SeveralPromptsPrintInOrder) {
  FakeInferenceServer server;
  server.service().SetChunks(HelloChunks());
  const RunResult r = Kvserve("generate --endpoint " + server.address() +
                              " --prompt 'A: ' --prompt 'B: ' --prompt 'C: '");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "A: Hello\nB: Hello\nC: Hello\n");
  EXPECT_EQ(server.service().generate_calls(), 3);
}

TEST(RemoteGenerateTest, ErrorsNameTheEndpointOrTheFlag) {
  FakeInferenceServer server;
  const std::string address = server.address();
  server.Shutdown();
  RunResult r = Kvserve("generate --endpoint " + address + " --prompt Hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find(address), std::string::npos) << r.out;

  r = Kvserve("generate --endpoint " + address + " --prompt Hi --top-k -1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--top-k"), std::string::npos) << r.out;

  r = Kvserve("generate --prompt Hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--model"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvserve
