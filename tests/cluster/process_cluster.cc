#include "tests/cluster/process_cluster.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/worker.grpc.pb.h"
#include "tests/worker/server/health.grpc.pb.h"

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

// A flag and its value.
struct Flag {
  const char* name;
  const char* value;
};

// `kvserve worker --model <test model> --listen <listen>`, then each of `defaults` that `extra`
// does not set itself (the CLI refuses a flag given twice), then `extra`.
std::vector<std::string> WorkerArgv(const std::string& listen, const std::vector<Flag>& defaults,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {KVSERVE_BINARY, "worker",   "--model",
                                   kTestModel,     "--listen", listen};
  for (const Flag& flag : defaults) {
    const std::string name = flag.name;
    const bool set = std::any_of(extra.begin(), extra.end(), [&](const std::string& arg) {
      return arg == name || arg.rfind(name + "=", 0) == 0;
    });
    if (!set) argv.insert(argv.end(), {flag.name, flag.value});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// `s` quoted for sh.
std::string ShellQuote(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

}  // namespace

absl::StatusOr<Spawned> SpawnWorker(const std::vector<std::string>& extra,
                                    const std::string& listen) {
  return SpawnAndWait(WorkerArgv(listen, {{"--threads", "1"}, {"--num-kv-blocks", "512"}}, extra),
                      "kvserve worker listening on ");
}

absl::StatusOr<Spawned> SpawnStage(const std::string& leader_address,
                                   const std::vector<std::string>& extra) {
  std::vector<std::string> stage_extra = {"--pp-leader", leader_address};
  stage_extra.insert(stage_extra.end(), extra.begin(), extra.end());
  absl::StatusOr<Spawned> stage =
      SpawnAndWait(WorkerArgv("127.0.0.1:0", {{"--threads", "1"}}, stage_extra),
                   "kvserve pipeline stage listening on ");
  // The line goes on: "HOST:PORT (gRPC health only), joining LEADER".
  if (stage.ok()) stage->address = stage->address.substr(0, stage->address.find(' '));
  return stage;
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

absl::StatusOr<bool> HealthServing(const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

bool WaitHealth(const std::string& address, bool serving, std::chrono::milliseconds limit) {
  return WaitUntil(
      [&] {
        absl::StatusOr<bool> now = HealthServing(address);
        return now.ok() && *now == serving;
      },
      limit);
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

ExitedRun RunKvserve(const std::vector<std::string>& args, std::chrono::seconds limit) {
  // coreutils timeout exits 124 when the limit kills the command. stderr goes into the pipe,
  // stdout to /dev/null (in that order of redirections).
  std::string command = absl::StrCat("timeout -k 5 ", limit.count(), " ", KVSERVE_BINARY);
  for (const std::string& arg : args) absl::StrAppend(&command, " ", ShellQuote(arg));
  absl::StrAppend(&command, " 2>&1 >/dev/null");
  ExitedRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    run.stderr_text.append(buffer.data(), n);
  }
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
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
