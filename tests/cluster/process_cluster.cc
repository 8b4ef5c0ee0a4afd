#include "tests/cluster/process_cluster.h"

#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/worker.grpc.pb.h"

namespace kvserve::testing {

const char kTestModel[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";

namespace {

absl::StatusOr<Spawned> SpawnAndWait(std::vector<std::string> argv, const std::string& line) {
  absl::StatusOr<cli::ChildProcess> process = cli::ChildProcess::Spawn(argv);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> address = process->WaitForLine(line, std::chrono::seconds(60));
  if (!address.ok()) return address.status();
  return Spawned{*std::move(process), *std::move(address)};
}

}  // namespace

absl::StatusOr<Spawned> SpawnWorker(const std::vector<std::string>& extra,
                                    const std::string& listen) {
  std::vector<std::string> argv = {KVSERVE_BINARY,    "worker", "--model",   kTestModel,
                                   "--listen",        listen,   "--threads", "1",
                                   "--num-kv-blocks", "512"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return SpawnAndWait(std::move(argv), "kvserve worker listening on ");
}

absl::StatusOr<Spawned> SpawnRouter(const std::vector<std::string>& workers,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {KVSERVE_BINARY, "router",    "--listen",
                                   "127.0.0.1:0",  "--workers", absl::StrJoin(workers, ","),
                                   "--model",      kTestModel};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return SpawnAndWait(std::move(argv), "kvserve router listening on ");
}

absl::StatusOr<int> UsedBlocks(const std::string& address,
                               std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  auto stub = v1::Worker::NewStub(grpc::CreateChannel(address, credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::LoadReport report;
  grpc::Status s = stub->GetLoad(&ctx, v1::GetLoadRequest(), &report);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  if (report.running_requests() != 0 || report.waiting_requests() != 0) {
    return -1 - static_cast<int>(report.running_requests() + report.waiting_requests());
  }
  return static_cast<int>(report.used_blocks());
}

absl::Status WaitPoolFree(const std::string& address, std::chrono::milliseconds limit,
                          std::shared_ptr<grpc::ChannelCredentials> credentials) {
  absl::StatusOr<int> used = absl::UnknownError("not probed");
  const bool freed = WaitUntil(
      [&] {
        used = UsedBlocks(address, credentials);
        return used.ok() && *used == 0;
      },
      limit);
  if (freed) return absl::OkStatus();
  if (!used.ok()) return used.status();
  return absl::DeadlineExceededError(
      absl::StrCat(address, *used < 0 ? " still runs requests: " : " still holds blocks: ", *used));
}

bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    // The polling interval of a bounded wait on another process's state.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

long RssKib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    long kib = -1;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    return absl::SimpleAtoi(digits, &kib) ? kib : -1;
  }
  return -1;
}

std::vector<TokenId> Prompt(TokenId first, int length) {
  std::vector<TokenId> ids;
  for (int i = 0; i < length; ++i) ids.push_back(static_cast<TokenId>(first + (i * 7) % 200));
  return ids;
}

GenerateParams Greedy(std::vector<TokenId> prompt, uint32_t max_tokens) {
  GenerateParams p;
  p.prompt_token_ids = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

absl::StatusOr<std::unique_ptr<Client>> ConnectClient(const std::string& address,
                                                      ClientOptions options) {
  options.default_deadline = absl::Seconds(60);
  return Client::Connect(address, options);
}

}  // namespace kvserve::testing
