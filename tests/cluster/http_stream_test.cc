// Server-sent events through the whole stack: an HTTP client on a raw socket, the HTTP front, an
// in-process router and a real worker (stories260K). What the fake-worker tests of the HTTP
// front cannot show: events leave while the engine is still generating, a client that goes away
// frees its request's KV blocks on the worker, and a character made of several byte tokens is
// never split across events.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/sdk/client.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http/http_server.h"
#include "router/router_server.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/server/worker_server.h"

namespace kvserve {
namespace {

using nlohmann::json;

const char kModel[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";
// "Once upon a time" with BOS.
const std::vector<TokenId> kPrompt = {1, 403, 407, 261, 378};

// Polls `done` every millisecond until it holds or 20 s pass.
template <typename F>
bool WaitFor(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The code points of UTF-8 `text` (-1 for a byte that starts no valid sequence).
std::vector<int32_t> CodePoints(const std::string& text) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const int length = byte < 0x80         ? 1
                       : (byte >> 5) == 6  ? 2
                       : (byte >> 4) == 14 ? 3
                       : (byte >> 3) == 30 ? 4
                                           : 0;
    if (length == 0 || i + length > text.size()) {
      out.push_back(-1);
      ++i;
      continue;
    }
    int32_t cp = length == 1 ? byte : byte & (0x7f >> length);
    for (int k = 1; k < length; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    out.push_back(cp);
    i += static_cast<size_t>(length);
  }
  return out;
}

// An HTTP/1.1 client on a plain socket, reading a server-sent event stream as it arrives.
class EventStream {
 public:
  EventStream(int port, const std::string& path, const json& body) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string text = body.dump();
    const std::string request = absl::StrCat("POST ", path,
                                             " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                             "Content-Type: application/json\r\nContent-Length: ",
                                             text.size(), "\r\n\r\n", text);
    EXPECT_EQ(::send(fd_, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    timeval timeout{20, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~EventStream() { Close(); }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // The next event's data (chunked transfer framing removed), or "" when the stream ended or
  // stalled for 20 s.
  std::string Next() {
    while (true) {
      const size_t start = body_.find("data: ", consumed_);
      const size_t end = start == std::string::npos ? start : body_.find("\n\n", start);
      if (end != std::string::npos) {
        consumed_ = end + 2;
        return body_.substr(start + 6, end - start - 6);
      }
      if (!ReadMore()) return "";
    }
  }

  const std::string& headers() const { return headers_; }

 private:
  // Reads from the socket and appends whole chunks' payloads to body_.
  bool ReadMore() {
    char buf[4096];
    const ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
    if (got <= 0) return false;
    raw_.append(buf, static_cast<size_t>(got));
    if (headers_.empty()) {
      const size_t end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return true;
      headers_ = raw_.substr(0, end + 4);
      raw_.erase(0, end + 4);
    }
    // Chunked transfer coding: "<hex size>\r\n<payload>\r\n".
    while (true) {
      const size_t line_end = raw_.find("\r\n");
      if (line_end == std::string::npos) break;
      const size_t size = std::stoul(raw_.substr(0, line_end), nullptr, 16);
      if (raw_.size() < line_end + 2 + size + 2) break;
      body_.append(raw_, line_end + 2, size);
      raw_.erase(0, line_end + 2 + size + 2);
    }
    return true;
  }

  int fd_ = -1;
  std::string raw_;
  std::string headers_;
  std::string body_;
  size_t consumed_ = 0;
};

class HttpStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = new LoadedModel(*LoadModel(kModel)); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  // One worker (`manual`: the test steps its engine), the router, and the HTTP front.
  void Start(bool manual) {
    EngineOptions engine_options;
    engine_options.num_threads = 1;
    engine_options.num_kv_blocks = 256;
    engine_options.run_loop_thread = !manual;
    engine_ = *Engine::Create(model_, engine_options);
    WorkerServerOptions server_options;
    server_options.model_name = "stories260K";
    worker_ = std::make_unique<WorkerServer>(model_, engine_.get(), server_options);
    absl::StatusOr<int> worker_port = worker_->Start("127.0.0.1:0");
    ASSERT_TRUE(worker_port.ok()) << worker_port.status();

    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = kModel;
    options.policy = "round_robin";
    options.pool.static_workers = {absl::StrCat("127.0.0.1:", *worker_port)};
    options.pool.probe_interval = absl::Hours(1);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);

    HttpServerOptions http_options;
    http_options.listen = "127.0.0.1:0";
    http_options.request_timeout = absl::Seconds(60);
    http_options.stream_heartbeat = absl::Milliseconds(50);
    HttpServerDeps deps;
    deps.channel = router_->InProcessChannel();
    deps.tokenizer = &router_->tokenizer();
    deps.model_name = router_->model_name();
    absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(http_options, deps);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
  }

  void TearDown() override {
    if (http_ != nullptr) http_->Shutdown();
    if (router_ != nullptr) router_->Shutdown();
    if (worker_ != nullptr) worker_->Shutdown();
  }

  // The text `generated` adds after kPrompt, decoded all at once.
  std::string TextAfterPrompt(const std::vector<TokenId>& generated) const {
    std::vector<TokenId> all = kPrompt;
    all.insert(all.end(), generated.begin(), generated.end());
    const std::string prompt = *router_->tokenizer().Decode(kPrompt);
    const std::string text = *router_->tokenizer().Decode(all);
    EXPECT_EQ(text.rfind(prompt, 0), 0u) << text;
    return text.substr(prompt.size());
  }

  static LoadedModel* model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<WorkerServer> worker_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;
};

LoadedModel* HttpStreamTest::model_ = nullptr;

// The engine is stepped by hand, so what the client reads is exactly what has been generated:
// the first event arrives while the engine holds the rest of the 400 tokens, and no [DONE] has
// come. The client then closes its socket without another step; the front's heartbeat write
// fails, the cancellation travels router → worker, and the request's blocks are freed without
// the 399 tokens still due being generated.
TEST_F(HttpStreamTest, EventsArriveAsGeneratedAndAVanishedClientFreesItsBlocks) {
  Start(/*manual=*/true);
  const EngineStats idle = engine_->stats();
  EventStream stream(http_->port(), "/v1/completions",
                     {{"prompt", kPrompt},
                      {"max_tokens", 400},
                      {"temperature", 0},
                      {"ignore_eos", true},
                      {"stream", true}});
  // Steps until the request has been admitted: that step ran its prefill and sampled token 1.
  ASSERT_TRUE(WaitFor([&] {
    engine_->StepOnce();
    return engine_->stats().num_running == 1;
  }));
  const int64_t steps_before_first = engine_->stats().num_steps;
  const json first = json::parse(stream.Next(), nullptr, false);
  EXPECT_EQ(stream.headers().rfind("HTTP/1.1 200", 0), 0u) << stream.headers();
  EXPECT_NE(stream.headers().find("text/event-stream"), std::string::npos) << stream.headers();
  ASSERT_TRUE(first.is_object()) << "no first event";
  // golden.json's greedy continuation starts with tokens 432 and 383.
  EXPECT_EQ(first["choices"][0]["text"], TextAfterPrompt({432}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  // One more step, one more event: each leaves as it is generated.
  engine_->StepOnce();
  const json second = json::parse(stream.Next(), nullptr, false);
  ASSERT_TRUE(second.is_object()) << "no second event";
  EXPECT_EQ(second["choices"][0]["text"],
            TextAfterPrompt({432, 383}).substr(TextAfterPrompt({432}).size()));
  EXPECT_GT(engine_->stats().used_blocks, idle.used_blocks);

  stream.Close();
  ASSERT_TRUE(WaitFor([&] { return worker_->stats().generate_cancelled == 1; }))
      << "the worker's Generate call was never cancelled";
  EXPECT_EQ(engine_->stats().num_steps, steps_before_first + 1) << "the engine was stepped";
  engine_->StepOnce();  // applies the abort
  const EngineStats after = engine_->stats();
  EXPECT_TRUE(engine_->idle());
  EXPECT_EQ(after.num_running, 0);
  EXPECT_EQ(after.used_blocks, idle.used_blocks);
}

// The byte a byte-fallback piece ("<0xE2>") stands for, or -1 for any other piece.
int ByteOfPiece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece.back() != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Whether `ids` spell a character of two or more bytes with consecutive byte-fallback tokens.
bool SpellsACharacterInBytes(const Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int lead = ByteOfPiece(tokenizer.IdToPiece(ids[i]));
    const size_t length = lead >= 0xC2 && lead <= 0xDF   ? 2
                          : lead >= 0xE1 && lead <= 0xEC ? 3
                                                         : 0;  // no overlong or surrogate forms
    if (length == 0 || i + length > ids.size()) continue;
    bool whole = true;
    for (size_t k = 1; k < length; ++k) {
      const int next = ByteOfPiece(tokenizer.IdToPiece(ids[i + k]));
      whole = whole && next >= 0x80 && next <= 0xBF;
    }
    if (whole) return true;
  }
  return false;
}

// At a very high temperature stories260K samples its byte-fallback tokens (<0x00>..<0xFF>);
// the test looks for a seed whose output spells a character of two or more bytes with
// consecutive byte tokens, and streams that request: no event carries part of a character, and
// the events together are exactly the text of all the tokens decoded at once.
TEST_F(HttpStreamTest, MultibyteCharactersAreNeverSplitAcrossEvents) {
  Start(/*manual=*/false);
  ClientOptions client_options;
  client_options.default_deadline = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::StrCat("127.0.0.1:", router_->port()), client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  const Tokenizer& tokenizer = router_->tokenizer();
  constexpr uint32_t kMaxTokens = 48;
  constexpr uint64_t kSeeds = 200;
  // Near-uniform sampling: about half the tokens are byte tokens.
  constexpr float kTemperature = 50.0f;
  uint64_t seed = 0;
  std::vector<TokenId> ids;
  for (uint64_t s = 1; s <= kSeeds && seed == 0; ++s) {
    GenerateParams params;
    params.prompt_token_ids = kPrompt;
    params.max_tokens = kMaxTokens;
    params.ignore_eos = true;
    params.sampling.temperature = kTemperature;
    params.sampling.seed = s;
    absl::StatusOr<Completion> c = (*client)->GenerateSync(params);
    ASSERT_TRUE(c.ok()) << c.status();
    if (!SpellsACharacterInBytes(tokenizer, c->samples[0].token_ids)) continue;
    seed = s;
    ids = c->samples[0].token_ids;
  }
  ASSERT_NE(seed, 0u) << "no seed in 1.." << kSeeds << " spelled a character in byte tokens";
  std::printf("seed %lu spells a multibyte character in byte tokens\n",
              static_cast<unsigned long>(seed));
  const std::string expected = TextAfterPrompt(ids);

  EventStream stream(http_->port(), "/v1/completions",
                     {{"prompt", kPrompt},
                      {"max_tokens", kMaxTokens},
                      {"temperature", kTemperature},
                      {"seed", seed},
                      {"ignore_eos", true},
                      {"stream", true}});
  std::string streamed;
  int events = 0;
  int empty = 0;
  while (true) {
    const std::string data = stream.Next();
    ASSERT_FALSE(data.empty()) << "the stream ended without [DONE] after " << events << " events";
    if (data == "[DONE]") break;
    const json event = json::parse(data, nullptr, false);
    ASSERT_TRUE(event.is_object()) << data;
    const std::string text = event["choices"][0]["text"];
    // A split character would reach the JSON encoder as broken bytes and leave as U+FFFD.
    for (int32_t cp : CodePoints(text)) EXPECT_GE(cp, 0) << "broken UTF-8 in " << data;
    empty += text.empty() ? 1 : 0;
    streamed += text;
    ++events;
  }
  EXPECT_EQ(streamed, expected) << "seed " << seed;
  EXPECT_EQ(events, static_cast<int>(kMaxTokens));
  // The first bytes of a character were held back: their tokens' events carry no text.
  EXPECT_GT(empty, 0);
}

}  // namespace
}  // namespace kvserve
