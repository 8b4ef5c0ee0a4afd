// `kvserve up --http-listen --metrics-listen`: the local cluster a newcomer starts with
// scripts/run.sh answers an OpenAI completion over HTTP and serves Prometheus metrics, at the
// addresses it prints. Loopback only; no timing assertions.

#include <httplib.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/cli/child_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using std::chrono::seconds;

// "http://HOST:PORT/..." or "HOST:PORT ..." -> HOST, PORT.
void SplitHostPort(std::string text, std::string* host, int* port) {
  if (text.rfind("http://", 0) == 0) text = text.substr(7);
  text = text.substr(0, text.find_first_of("/ "));
  const size_t colon = text.rfind(':');
  ASSERT_NE(colon, std::string::npos) << text;
  *host = text.substr(0, colon);
  ASSERT_TRUE(absl::SimpleAtoi(text.substr(colon + 1), port)) << text;
}

TEST(UpCommandTest, ServesOpenAiHttpAndMetricsAtThePrintedAddresses) {
  absl::StatusOr<cli::ChildProcess> up = cli::ChildProcess::Spawn(
      {KVSERVE_BINARY, "up", "--listen", "127.0.0.1:0", "--workers", "1", "--http-listen",
       "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--model",
       KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf"});
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<std::string> api = up->WaitForLine("kvserve up: OpenAI API on ", seconds(120));
  ASSERT_TRUE(api.ok()) << api.status();
  absl::StatusOr<std::string> metrics =
      up->WaitForLine("kvserve up: Prometheus metrics on ", seconds(30));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  absl::StatusOr<std::string> serving = up->WaitForLine("kvserve up: serving on ", seconds(30));
  ASSERT_TRUE(serving.ok()) << serving.status();

  std::string host;
  int port = 0;
  SplitHostPort(*api, &host, &port);
  httplib::Client client(host, port);
  client.set_read_timeout(60, 0);
  // The router admits its worker after the first health probe: /health says when.
  bool ready = false;
  for (int attempt = 0; attempt < 600 && !ready; ++attempt) {
    const httplib::Result health = client.Get("/health");
    ready = health && health->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(ready) << "the cluster never became ready";
  const httplib::Result completion = client.Post(
      "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})",
      "application/json");
  ASSERT_TRUE(completion) << httplib::to_string(completion.error());
  ASSERT_EQ(completion->status, 200) << completion->body;
  const nlohmann::json body = nlohmann::json::parse(completion->body);
  ASSERT_EQ(body["choices"].size(), 1u) << completion->body;
  EXPECT_FALSE(body["choices"][0]["text"].get<std::string>().empty()) << completion->body;
  EXPECT_EQ(body["usage"]["completion_tokens"], 8) << completion->body;

  SplitHostPort(*metrics, &host, &port);
  httplib::Client scrape(host, port);
  const httplib::Result page = scrape.Get("/metrics");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  ASSERT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("kvserve_router_"), std::string::npos) << page->body.substr(0, 2000);

  EXPECT_EQ(up->Stop(seconds(20)), 0);
}

}  // namespace
}  // namespace kvserve
