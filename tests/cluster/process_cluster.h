#ifndef KVSERVE_TESTS_CLUSTER_PROCESS_CLUSTER_H_
#define KVSERVE_TESTS_CLUSTER_PROCESS_CLUSTER_H_

// Helpers for tests that run real `kvserve worker` / `kvserve router` processes on loopback.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli/child_process.h"
#include "client/sdk/client.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace kvserve::testing {

/// The test model (stories260K GGUF from the shared directory).
extern const char kTestModel[];

/// A spawned process and the address it printed on its "listening on" line.
struct Spawned {
  cli::ChildProcess process;
  std::string address;
};

/// `kvserve worker --model <test model> --listen <listen> --threads 1 --num-kv-blocks 512`
/// plus `extra` (which may set --threads or --num-kv-blocks itself); waits for its address.
absl::StatusOr<Spawned> SpawnWorker(const std::vector<std::string>& extra = {},
                                    const std::string& listen = "127.0.0.1:0");
/// A pipeline stage: `kvserve worker --model <test model> --listen 127.0.0.1:0 --threads 1
/// --pp-leader <leader_address>` plus `extra` (which may set --threads itself); waits for its
/// "kvserve pipeline stage listening on" line. `address` is where it serves grpc.health.v1.
absl::StatusOr<Spawned> SpawnStage(const std::string& leader_address,
                                   const std::vector<std::string>& extra = {});
/// `kvserve router --listen 127.0.0.1:0 --workers <workers> --model <test model>` plus `extra`.
absl::StatusOr<Spawned> SpawnRouter(const std::vector<std::string>& workers,
                                    const std::vector<std::string>& extra = {});

/// kvserve.v1.Worker/GetLoad of `address` (plaintext unless `credentials` are given).
absl::StatusOr<int> UsedBlocks(const std::string& address,
                               std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
/// Polls GetLoad until the worker runs nothing and holds no KV block, up to `limit`.
absl::Status WaitPoolFree(const std::string& address, std::chrono::milliseconds limit,
                          std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
/// grpc.health.v1 Check of the server's overall health (service "") at `address`: true for
/// SERVING, false for any other status, or the call's error (2 s deadline).
absl::StatusOr<bool> HealthServing(const std::string& address);
/// Polls HealthServing until it answers `serving`, up to `limit`; returns whether it did.
bool WaitHealth(const std::string& address, bool serving, std::chrono::milliseconds limit);
/// Polls `condition` every 10 ms until it holds or `limit` passes; returns whether it held.
bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds limit);

/// How a process run to its end exited.
struct ExitedRun {
  /// The exit code; 124 when it was killed for outliving its limit, -1 when it could not run.
  int exit_code = -1;
  std::string stderr_text;
};
/// Runs `kvserve <args>` until it exits, killing it after `limit`; its stdout is discarded.
ExitedRun RunKvserve(const std::vector<std::string>& args, std::chrono::seconds limit);

/// Resident set size of a process in KiB (/proc/PID/status VmRSS), or -1.
long RssKib(pid_t pid);

/// A deterministic prompt of `length` token ids starting from `first`.
std::vector<TokenId> Prompt(TokenId first, int length);
/// A greedy request that ignores EOS, so it runs exactly `max_tokens` steps.
GenerateParams Greedy(std::vector<TokenId> prompt, uint32_t max_tokens);
/// A client with a 60 s default deadline (10 s connect timeout) plus `options`' security.
absl::StatusOr<std::unique_ptr<Client>> ConnectClient(const std::string& address,
                                                      ClientOptions options = {});

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_CLUSTER_PROCESS_CLUSTER_H_
