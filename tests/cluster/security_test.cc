// Security end to end on loopback: TLS to the router, mutual TLS from the router to a worker
// (certificates made with openssl per run), API keys over gRPC and HTTP with per-key limits,
// and tenant isolation of the prefix cache.

#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth/tls_credentials.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "router/http/http_server.h"
#include "router/router_server.h"
#include "tests/cluster/process_cluster.h"

namespace kvserve {
namespace {

using std::chrono::seconds;
using testing::ConnectClient;
using testing::Greedy;
using testing::Prompt;
using testing::Spawned;
using testing::SpawnRouter;
using testing::SpawnWorker;

// A CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by it,
// and an unrelated CA with its own client certificate; made once per test binary.
class Certs {
 public:
  static const Certs& Get() {
    static Certs* certs = new Certs();
    return *certs;
  }
  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }
  std::string Read(const std::string& name) const {
    std::ifstream in(Path(name));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string& error() const { return error_; }

 private:
  Certs() {
    std::string tmpl = ::testing::TempDir() + "kvserve-certs-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    Write("server.ext",
          "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
          "extendedKeyUsage=serverAuth\n");
    Write("client.ext", "extendedKeyUsage=clientAuth\n");
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string ca_ext =
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign";
    for (const char* ca : {"ca", "other-ca"}) {
      Run(absl::StrCat("openssl req -x509 ", ec, " -keyout ", ca, ".key -out ", ca,
                       ".pem -days 2 -subj /CN=kvserve-test-", ca, " ", ca_ext));
    }
    int serial = 10;
    auto sign = [&](const std::string& name, const std::string& ca, const std::string& cn,
                    const std::string& ext) {
      Run(absl::StrCat("openssl req ", ec, " -keyout ", name, ".key -out ", name,
                       ".csr -subj /CN=", cn));
      Run(absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                       ".key -set_serial ", serial++, " -days 2 -out ", name, ".pem -extfile ",
                       ext));
    };
    sign("server", "ca", "localhost", "server.ext");
    sign("client", "ca", "kvserve-router", "client.ext");
    sign("other-client", "other-ca", "kvserve-router", "client.ext");
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(Path(name)) << text;
  }
  void Run(const std::string& command) {
    if (!error_.empty()) return;
    const std::string full = absl::StrCat("cd '", dir_, "' && ", command, " >>openssl.log 2>&1");
    if (std::system(full.c_str()) != 0) error_ = absl::StrCat("failed: ", command);
  }
  std::string dir_;
  std::string error_;
};

// Client options for the test CA plus, optionally, a client certificate ("client" or
// "other-client").
ClientOptions TlsClient(const std::string& ca, const std::string& client_cert = "") {
  const Certs& certs = Certs::Get();
  ClientOptions options;
  options.tls_root_certs = certs.Read(ca + ".pem");
  if (!client_cert.empty()) {
    options.tls_client_cert = certs.Read(client_cert + ".pem");
    options.tls_client_key = certs.Read(client_cert + ".key");
  }
  options.max_attempts = 1;
  options.connect_timeout = absl::ZeroDuration();
  return options;
}

absl::Status TryGenerate(const std::string& address, ClientOptions options) {
  absl::StatusOr<std::unique_ptr<Client>> client = ConnectClient(address, options);
  if (!client.ok()) return client.status();
  CallOptions call;
  call.deadline = absl::Seconds(10);
  absl::StatusOr<Completion> c = (*client)->GenerateSync(Greedy(Prompt(3, 8), 4), call);
  if (!c.ok()) return c.status();
  if (c->samples.size() != 1 || c->samples[0].token_ids.size() != 4) {
    return absl::InternalError("wrong completion");
  }
  return absl::OkStatus();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Certs::Get().error().empty())
        << Certs::Get().error() << " (see " << Certs::Get().dir() << "/openssl.log)";
  }
  std::string Cert(const std::string& name) const { return Certs::Get().Path(name); }
};

TEST_F(SecurityTest, TlsFrontServesTlsClientsAndRefusesOthers) {
  absl::StatusOr<Spawned> worker = SpawnWorker();
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<Spawned> router = SpawnRouter(
      {worker->address}, {"--tls-cert", Cert("server.pem"), "--tls-key", Cert("server.key")});
  ASSERT_TRUE(router.ok()) << router.status();

  EXPECT_TRUE(TryGenerate(router->address, TlsClient("ca")).ok());
  // The same over "localhost" (the certificate's DNS name).
  const std::string port = router->address.substr(router->address.rfind(':') + 1);
  EXPECT_TRUE(TryGenerate("localhost:" + port, TlsClient("ca")).ok());
  // A plaintext client cannot talk to a TLS port; a client trusting another CA rejects the
  // router's certificate.
  ClientOptions plaintext;
  plaintext.max_attempts = 1;
  absl::Status plain = TryGenerate(router->address, plaintext);
  EXPECT_TRUE(absl::IsUnavailable(plain)) << plain;
  absl::Status wrong_ca = TryGenerate(router->address, TlsClient("other-ca"));
  EXPECT_TRUE(absl::IsUnavailable(wrong_ca)) << wrong_ca;

  // `kvserve generate --endpoint ... --tls-ca ...`.
  absl::StatusOr<cli::ChildProcess> generate = cli::ChildProcess::Spawn(
      {KVSERVE_BINARY, "generate", "--endpoint", router->address, "--tls-ca", Cert("ca.pem"),
       "--prompt", "Once upon a time", "--max-tokens", "4", "--temperature", "0", "--json"});
  ASSERT_TRUE(generate.ok()) << generate.status();
  absl::StatusOr<std::string> line = generate->WaitForLine("{", seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NE(line->find("\"completion_tokens\":4"), std::string::npos) << *line;
  int generate_exit = -1;
  ASSERT_TRUE(testing::WaitUntil([&] { return generate->Exited(&generate_exit); }, seconds(30)));
  EXPECT_TRUE(WIFEXITED(generate_exit) && WEXITSTATUS(generate_exit) == 0) << generate_exit;
  EXPECT_TRUE(testing::WaitPoolFree(worker->address, std::chrono::seconds(5)).ok());
}

TEST_F(SecurityTest, RouterFrontWithClientCaRequiresClientCertificates) {
  absl::StatusOr<Spawned> worker = SpawnWorker();
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<Spawned> router =
      SpawnRouter({worker->address}, {"--tls-cert", Cert("server.pem"), "--tls-key",
                                      Cert("server.key"), "--tls-client-ca", Cert("ca.pem")});
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_TRUE(TryGenerate(router->address, TlsClient("ca", "client")).ok());
  absl::Status no_cert = TryGenerate(router->address, TlsClient("ca"));
  EXPECT_TRUE(absl::IsUnavailable(no_cert)) << no_cert;
  absl::Status other = TryGenerate(router->address, TlsClient("ca", "other-client"));
  EXPECT_TRUE(absl::IsUnavailable(other)) << other;
}

// An in-process router in front of a worker process that requires client certificates.
TEST_F(SecurityTest, WorkerWithClientCaAcceptsOnlyARouterWithAValidCertificate) {
  absl::StatusOr<Spawned> worker =
      SpawnWorker({"--tls-cert", Cert("server.pem"), "--tls-key", Cert("server.key"),
                   "--tls-client-ca", Cert("ca.pem")});
  ASSERT_TRUE(worker.ok()) << worker.status();

  struct Case {
    const char* name;
    auth::ChannelTlsFiles tls;
    bool admitted;
  };
  const std::vector<Case> cases = {
      {"valid client certificate", {Cert("ca.pem"), Cert("client.pem"), Cert("client.key")}, true},
      {"no client certificate", {Cert("ca.pem"), "", ""}, false},
      {"certificate from another CA",
       {Cert("ca.pem"), Cert("other-client.pem"), Cert("other-client.key")},
       false},
      {"plaintext", {}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = testing::kTestModel;
    options.pool.static_workers = {worker->address};
    options.pool.probe_interval = absl::Hours(1);  // the initial probe round decides
    options.worker_tls = c.tls;
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    ASSERT_TRUE(router.ok()) << router.status();
    std::shared_ptr<WorkerHandle> handle = (*router)->pool().Find(worker->address);
    ASSERT_NE(handle, nullptr);
    EXPECT_EQ(handle->healthy(), c.admitted);
    ClientOptions plaintext;
    plaintext.max_attempts = 1;
    absl::Status status = TryGenerate(absl::StrCat("127.0.0.1:", (*router)->port()), plaintext);
    if (c.admitted) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_TRUE(absl::IsUnavailable(status)) << status;
    }
    (*router)->Shutdown();
  }
  // The worker's own port: GetLoad only with the client certificate.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> good =
      auth::MakeChannelCredentials({Cert("ca.pem"), Cert("client.pem"), Cert("client.key"), ""});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(testing::WaitPoolFree(worker->address, seconds(5), *good).ok());
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> no_cert =
      auth::MakeChannelCredentials({Cert("ca.pem"), "", "", ""});
  ASSERT_TRUE(no_cert.ok()) << no_cert.status();
  EXPECT_FALSE(testing::UsedBlocks(worker->address, *no_cert).ok());
  EXPECT_FALSE(testing::UsedBlocks(worker->address).ok());
}

TEST_F(SecurityTest, BadTlsFlagsAreClearErrors) {
  RouterOptions options;
  options.listen = "127.0.0.1:0";
  options.model_path = testing::kTestModel;
  options.pool.static_workers = {"127.0.0.1:1"};
  options.tls.cert_path = Cert("server.pem");
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
  EXPECT_TRUE(absl::IsInvalidArgument(router.status())) << router.status();
  EXPECT_NE(router.status().message().find("--tls-key"), std::string::npos);
  options.tls.key_path = Cert("missing.key");
  router = RouterServer::Start(options);
  EXPECT_TRUE(absl::IsNotFound(router.status())) << router.status();
  EXPECT_NE(router.status().message().find("missing.key"), std::string::npos);
  options.tls = {};
  options.worker_tls.ca_path = Cert("server.ext");  // not PEM
  router = RouterServer::Start(options);
  EXPECT_TRUE(absl::IsInvalidArgument(router.status())) << router.status();
  EXPECT_NE(router.status().message().find("--worker-ca"), std::string::npos);
  options.worker_tls = {};
  options.api_keys_path = Cert("none.txt");
  router = RouterServer::Start(options);
  EXPECT_TRUE(absl::IsNotFound(router.status())) << router.status();
  EXPECT_NE(router.status().message().find("api-keys: "), std::string::npos);
}

// A router process with API keys and the HTTP front.
struct KeyedRouter {
  Spawned worker;
  Spawned router;
  int http_port = 0;
};

std::string WriteKeys(const std::string& text) {
  const std::string path = Certs::Get().Path(absl::StrCat("keys-", std::rand(), ".txt"));
  std::ofstream(path) << text;
  return path;
}

constexpr char kKeys[] =
    "# test keys\n"
    "sk-alpha-key-1 alpha 1\n"
    "sk-alpha-key-2 alpha\n"
    "sk-beta-key-01 beta\n";

ClientOptions WithKey(const std::string& key) {
  ClientOptions options;
  options.api_key = key;
  options.max_attempts = 1;
  return options;
}

TEST_F(SecurityTest, ApiKeysAreCheckedOnGrpcAndHttp) {
  absl::StatusOr<Spawned> worker = SpawnWorker();
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<Spawned> router = SpawnRouter(
      {worker->address}, {"--api-keys", WriteKeys(kKeys), "--http-listen", "127.0.0.1:0"});
  ASSERT_TRUE(router.ok()) << router.status();
  absl::StatusOr<std::string> http =
      router->process.WaitForLine("kvserve router HTTP (OpenAI API) on ", seconds(30));
  ASSERT_TRUE(http.ok()) << http.status();
  int http_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(http->substr(http->rfind(':') + 1), &http_port));

  // gRPC: missing, malformed and unknown keys.
  ClientOptions none;
  none.max_attempts = 1;
  for (const ClientOptions& options : {none, WithKey("sk-alpha-key-3"), WithKey("sk-beta")}) {
    absl::Status s = TryGenerate(router->address, options);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
    std::unique_ptr<Client> client = *ConnectClient(router->address, options);
    EXPECT_TRUE(absl::IsUnauthenticated(client->ListModels().status()));
    EXPECT_TRUE(absl::IsUnauthenticated(client->Tokenize({.text = "hi"}).status()));
  }
  EXPECT_TRUE(TryGenerate(router->address, WithKey("sk-beta-key-01")).ok());

  // HTTP: the Authorization header.
  httplib::Client web("127.0.0.1", http_port);
  web.set_read_timeout(30, 0);
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4})";
  auto post = [&](const std::string& authorization) {
    httplib::Headers headers;
    if (!authorization.empty()) headers.emplace("Authorization", authorization);
    httplib::Result r = web.Post("/v1/completions", headers, body, "application/json");
    return r ? r->status : -1;
  };
  EXPECT_EQ(post(""), 401);
  EXPECT_EQ(post("Bearer sk-wrong-key-1"), 401);
  EXPECT_EQ(post("Basic sk-beta-key-01"), 401);
  EXPECT_EQ(post("Bearer sk-beta-key-01"), 200);
  httplib::Result models = web.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  httplib::Result health = web.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);

  EXPECT_TRUE(testing::WaitPoolFree(worker->address, seconds(5)).ok());
}

// Per-key limits, with an in-process router and HTTP front (so the key's open calls can be
// observed) over a worker process paused with SIGSTOP (so calls stay open however fast the
// model is).
TEST_F(SecurityTest, PerKeyConcurrencyLimitsOnGrpcAndHttp) {
  absl::StatusOr<Spawned> worker = SpawnWorker();
  ASSERT_TRUE(worker.ok()) << worker.status();
  RouterOptions options;
  options.listen = "127.0.0.1:0";
  options.model_path = testing::kTestModel;
  options.pool.static_workers = {worker->address};
  options.pool.probe_interval = absl::Hours(1);  // a paused worker stays admitted
  options.api_keys_path = WriteKeys(kKeys);
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
  ASSERT_TRUE(router.ok()) << router.status();
  HttpServerOptions http_options;
  http_options.listen = "127.0.0.1:0";
  HttpServerDeps deps;
  deps.channel = (*router)->InProcessChannel();
  deps.tokenizer = &(*router)->tokenizer();
  deps.model_name = (*router)->model_name();
  absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(http_options, deps);
  ASSERT_TRUE(http.ok()) << http.status();
  ApiKeyGuard& guard = *(*router)->api_keys();
  const auth::ApiKey& alpha1_key = *guard.keys().Find("sk-alpha-key-1");
  const auth::ApiKey& alpha2_key = *guard.keys().Find("sk-alpha-key-2");
  const std::string address = absl::StrCat("127.0.0.1:", (*router)->port());
  std::unique_ptr<Client> alpha1 = *ConnectClient(address, WithKey("sk-alpha-key-1"));
  std::unique_ptr<Client> alpha2 = *ConnectClient(address, WithKey("sk-alpha-key-2"));

  ASSERT_EQ(::kill(worker->process.pid(), SIGSTOP), 0);
  absl::StatusOr<Completion> held = absl::UnknownError("not run");
  std::thread held_thread([&] { held = alpha1->GenerateSync(Greedy(Prompt(9, 8), 8)); });
  ASSERT_TRUE(testing::WaitUntil([&] { return guard.in_flight(alpha1_key) == 1; }, seconds(10)));

  // sk-alpha-key-1 (max_concurrent 1) is at its limit.
  absl::StatusOr<Completion> second = alpha1->GenerateSync(Greedy(Prompt(9, 8), 4));
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  EXPECT_EQ(RetryAfter(second.status()), absl::Milliseconds(500));
  httplib::Client web("127.0.0.1", (*http)->port());
  web.set_read_timeout(30, 0);
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4})";
  httplib::Result limited = web.Post(
      "/v1/completions", {{"Authorization", "Bearer sk-alpha-key-1"}}, body, "application/json");
  ASSERT_TRUE(limited);
  EXPECT_EQ(limited->status, 429);
  EXPECT_EQ(limited->get_header_value("Retry-After"), "1");
  // Another key of the same tenant has its own limit: admitted (and waits for the worker).
  absl::StatusOr<Completion> other = absl::UnknownError("not run");
  std::thread other_thread([&] { other = alpha2->GenerateSync(Greedy(Prompt(19, 8), 4)); });
  ASSERT_TRUE(testing::WaitUntil([&] { return guard.in_flight(alpha2_key) == 1; }, seconds(10)));

  ASSERT_EQ(::kill(worker->process.pid(), SIGCONT), 0);
  held_thread.join();
  other_thread.join();
  EXPECT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(other.ok()) << other.status();
  // The slot is free again once the call ended.
  ASSERT_TRUE(testing::WaitUntil([&] { return guard.in_flight(alpha1_key) == 0; }, seconds(10)));
  EXPECT_TRUE(TryGenerate(address, WithKey("sk-alpha-key-1")).ok());
  httplib::Result served = web.Post("/v1/completions", {{"Authorization", "Bearer sk-alpha-key-1"}},
                                    body, "application/json");
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200);
  (*http)->Shutdown();
  (*router)->Shutdown();
  EXPECT_TRUE(testing::WaitPoolFree(worker->address, seconds(5)).ok());
}

// cached_prompt_tokens of one greedy request with `key` (and `salt`).
int64_t Cached(Client& client, const std::vector<TokenId>& prompt, const std::string& salt = "") {
  GenerateParams params = Greedy(prompt, 2);
  params.cache_salt = salt;
  absl::StatusOr<Completion> c = client.GenerateSync(params);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? c->samples[0].usage.cached_prompt_tokens : -1;
}

TEST_F(SecurityTest, TenantsNeverShareCachedPrefixBlocks) {
  absl::StatusOr<Spawned> worker = SpawnWorker();
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string keys = WriteKeys(kKeys);
  // 80 tokens: five full 16-token blocks.
  const std::vector<TokenId> p = Prompt(21, 80);
  {
    absl::StatusOr<Spawned> router = SpawnRouter({worker->address}, {"--api-keys", keys});
    ASSERT_TRUE(router.ok()) << router.status();
    std::unique_ptr<Client> alpha1 = *ConnectClient(router->address, WithKey("sk-alpha-key-1"));
    std::unique_ptr<Client> alpha2 = *ConnectClient(router->address, WithKey("sk-alpha-key-2"));
    std::unique_ptr<Client> beta = *ConnectClient(router->address, WithKey("sk-beta-key-01"));
    EXPECT_EQ(Cached(*alpha1, p), 0);
    EXPECT_GE(Cached(*alpha2, p), 64) << "same tenant, other key: shares the prefix";
    EXPECT_EQ(Cached(*beta, p), 0) << "another tenant must not hit alpha's blocks";
    EXPECT_GE(Cached(*beta, p), 64) << "beta's own blocks are reused";
    EXPECT_EQ(Cached(*alpha1, p, "salt-x"), 0) << "the client's salt still separates";
    EXPECT_GE(Cached(*alpha2, p, "salt-x"), 64);
    router->process.Stop(seconds(1));
  }
  // The operator's opt-out: tenants share again.
  const std::vector<TokenId> q = Prompt(77, 80);
  absl::StatusOr<Spawned> router =
      SpawnRouter({worker->address}, {"--api-keys", keys, "--no-tenant-cache-isolation"});
  ASSERT_TRUE(router.ok()) << router.status();
  std::unique_ptr<Client> alpha1 = *ConnectClient(router->address, WithKey("sk-alpha-key-1"));
  std::unique_ptr<Client> beta = *ConnectClient(router->address, WithKey("sk-beta-key-01"));
  EXPECT_EQ(Cached(*alpha1, q), 0);
  EXPECT_GE(Cached(*beta, q), 64);
  EXPECT_TRUE(testing::WaitPoolFree(worker->address, seconds(5)).ok());
}

}  // namespace
}  // namespace kvserve
