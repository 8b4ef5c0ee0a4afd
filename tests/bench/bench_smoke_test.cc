// CI smoke of `kvserve bench` against `kvserve up`: a local cluster (router + 2 workers on
// stories260K) is loaded for 10 s; the JSON report must parse and every request must succeed.
// No timing assertions.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/child_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using std::chrono::seconds;

// Runs `command` through the shell; returns its stdout and sets `*exit_code`.
std::string RunCommand(const std::string& command, int* exit_code) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *exit_code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  *exit_code = pclose(pipe);
  return out;
}

TEST(BenchSmokeTest, BenchAgainstKvserveUpSucceedsEveryRequest) {
  absl::StatusOr<cli::ChildProcess> up = cli::ChildProcess::Spawn(
      {KVSERVE_BINARY, "up", "--listen", "127.0.0.1:0", "--workers", "2", "--model",
       KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf"});
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<std::string> workers = up->WaitForLine("kvserve up: workers ", seconds(60));
  ASSERT_TRUE(workers.ok()) << workers.status();
  absl::StatusOr<std::string> serving = up->WaitForLine("kvserve up: serving on ", seconds(60));
  ASSERT_TRUE(serving.ok()) << serving.status();
  const std::string endpoint = std::vector<std::string>(absl::StrSplit(*serving, ' '))[0];
  std::string worker_list;
  for (absl::string_view w : absl::StrSplit(*workers, ", ")) {
    absl::StrAppend(&worker_list, worker_list.empty() ? "" : ",", w);
  }

  int exit_code = 0;
  const std::string out = RunCommand(
      absl::StrCat(KVSERVE_BINARY, " bench --endpoint ", endpoint, " --workers ", worker_list,
                   " --duration 10 --concurrency 4 --workload shared-prefix --json"),
      &exit_code);
  up->Stop(seconds(10));
  ASSERT_EQ(exit_code, 0) << out;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(out)) << out;
  ASSERT_EQ(j["runs"].size(), 1u) << out;
  const nlohmann::json& run = j["runs"][0];
  EXPECT_EQ(run["failed"], 0) << run.dump(2);
  EXPECT_TRUE(run["errors"].empty()) << run.dump(2);
  EXPECT_GT(run["succeeded"].get<int64_t>(), 0);
  EXPECT_EQ(run["succeeded"], run["requests"]);
  EXPECT_GT(run["output_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(run["ttft_ms"]["count"], run["succeeded"]);
  EXPECT_EQ(run["worker_kv"].size(), 2u);
  const double hit = run["prefix_hit_rate"].get<double>();
  EXPECT_TRUE(hit >= 0.0 && hit <= 1.0) << hit;
}

}  // namespace
}  // namespace kvserve
