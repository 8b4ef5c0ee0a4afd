// Runs `kvserve plan` in-process: parses real command lines and checks the printed output.

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/planner/model_configs.h"
#include "tests/worker/planner/planner_test_util.h"

namespace kvserve::cli {

// main.cc defines this in the binary; the test supplies its own.
int ReportError(std::string_view command, const absl::Status& status) {
  std::fprintf(stderr, "kvserve %.*s: %.*s\n", static_cast<int>(command.size()), command.data(),
               static_cast<int>(status.message().size()), status.message().data());
  return 1;
}

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

Result RunPlan(std::vector<std::string> args) {
  CLI::App app{"test", "kvserve"};
  app.require_subcommand(1);
  Command command = AddPlanCommand(app);
  args.insert(args.begin(), {"kvserve", "plan"});
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  Result result;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    result.err = e.what();
    return result;
  }
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  result.exit_code = command.run();
  result.out = ::testing::internal::GetCapturedStdout();
  result.err = ::testing::internal::GetCapturedStderr();
  return result;
}

TEST(PlanCommandTest, JsonForStories260K) {
  const Result r = RunPlan({"--model", planner_testing::Stories260KDir(), "--gpu-memory", "1GiB",
                            "--json", "--shared-prefix-len", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["kv_bytes_per_token"], 640);
  EXPECT_EQ(out["weight_bytes"], 1040128);
  EXPECT_EQ(out["weight_bytes_exact"], true);
  EXPECT_EQ(out["num_params"], 260032);
  EXPECT_EQ(out["gpu_memory_bytes"], int64_t{1} << 30);
  EXPECT_EQ(out["max_model_len"], 512);
  EXPECT_EQ(out["kv_cache_dtype"], "bf16");
  EXPECT_EQ(out["by_kv_dtype"]["bf16"]["kv_bytes_per_token"], 640);
  EXPECT_EQ(out["by_kv_dtype"]["f32"]["kv_bytes_per_token"], 1280);
  EXPECT_EQ(out["by_kv_dtype"]["int8"]["kv_bytes_per_token"], 480);
  // By hand, with the command's defaults (0.9 utilization, 8192 batched tokens, 256 seqs,
  // 256 MiB workspace):
  //   usable floor(1073741824 × 0.9) = 966367641;
  //   activations: 664 elements per token (residual 64 + normed 64 + q 64 + k 32 + v 32
  //     + attn_out 64 + gate 172 + up 172) × 8192 × 4 = 21757952, logits 256 × 512 × 4 = 524288,
  //     workspace 268435456: 290717696 in all;
  //   KV budget 966367641 − 1040128 − 290717696 = 674609817;
  //   bf16 blocks of 16 × 640 = 10240 bytes: 674609817 / 10240 = 65879.9 → 65879, 1054064 tokens;
  //   512-token sequences need 32 blocks: 65879 / 32 = 2058.7 → 2058; a 100-token shared prefix
  //   holds 6 full blocks once: (65879 − 6) / (32 − 6) = 2533.6 → 2533.
  EXPECT_EQ(out["usable_bytes"], 966367641);
  EXPECT_EQ(out["activation_bytes"], 290717696);
  EXPECT_EQ(out["kv_budget_bytes"], 674609817);
  EXPECT_EQ(out["num_kv_blocks"], 65879);
  EXPECT_EQ(out["kv_tokens"], 1054064);
  EXPECT_EQ(out["max_concurrent_seqs"], 2058);
  EXPECT_EQ(out["max_concurrent_seqs_shared_prefix"], 2533);
}

TEST(PlanCommandTest, JsonChosenDTypeAndTp) {
  const std::string dir = planner_testing::MakeTestDir();
  planner_testing::WriteText(dir + "/config.json", testing_configs::kLlama3_70B);
  const Result r = RunPlan({"--model", dir + "/config.json", "--gpu-memory", "141GB", "--tp", "8",
                            "--kv-cache-dtype", "fp8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["kv_bytes_per_token"], 80 * 2 * 132);
  EXPECT_EQ(out["by_kv_dtype"]["bf16"]["kv_bytes_per_token"], 40960);
  EXPECT_EQ(out["gpu_memory_bytes"], int64_t{141'000'000'000});
  EXPECT_EQ(out["kv_heads_per_gpu"], 1);
}

TEST(PlanCommandTest, TableMarksTheChosenDType) {
  const Result r = RunPlan({"--model", planner_testing::Stories260KGguf(), "--gpu-memory", "1GiB",
                            "--kv-cache-dtype", "int8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("int8*"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("bf16*"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV bytes per token"), std::string::npos) << r.out;
}

TEST(PlanCommandTest, ErrorsAreOneLine) {
  Result r = RunPlan({"--model", planner_testing::Stories260KDir(), "--gpu-memory", "80G"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("kvserve plan: invalid memory size \"80G\""), std::string::npos) << r.err;
  r = RunPlan({"--model", planner_testing::Stories260KDir(), "--gpu-memory", "1MiB"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("weights need"), std::string::npos) << r.err;
  r = RunPlan({"--model", planner_testing::Stories260KDir(), "--kv-cache-dtype", "auto"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown KV cache dtype"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvserve::cli
