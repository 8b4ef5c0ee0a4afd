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
  // 256 MiB workspace, bf16 activations):
  //   usable floor(1073741824 × 0.9) = 966367641;
  //   activations: 664 elements per token (residual 64 + normed 64 + q 64 + k 32 + v 32
  //     + attn_out 64 + gate 172 + up 172), the residual's 64 in f32 and the other 600 in bf16:
  //     (64 × 4 + 600 × 2) × 8192 = 11927552, logits 256 × 512 × 4 = 524288, workspace
  //     268435456: 280887296 in all;
  //   KV budget 966367641 − 1040128 − 280887296 = 684440217;
  //   bf16 blocks of 16 × 640 = 10240 bytes: 684440217 / 10240 = 66839.9 → 66839, 1069424 tokens;
  //   512-token sequences need 32 blocks: 66839 / 32 = 2088.7 → 2088; a 100-token shared prefix
  //   holds 6 full blocks once: (66839 − 6) / (32 − 6) = 2570.5 → 2570.
  EXPECT_EQ(out["usable_bytes"], 966367641);
  EXPECT_EQ(out["activation_dtype"], "bf16");
  EXPECT_EQ(out["activation_bytes"], 280887296);
  EXPECT_EQ(out["activations"]["f32_elements_per_token"], 64);
  EXPECT_EQ(out["kv_budget_bytes"], 684440217);
  EXPECT_EQ(out["num_kv_blocks"], 66839);
  EXPECT_EQ(out["kv_tokens"], 1069424);
  EXPECT_EQ(out["max_concurrent_seqs"], 2088);
  EXPECT_EQ(out["max_concurrent_seqs_shared_prefix"], 2570);

  // f32 activations: 664 × 8192 × 4 = 21757952 of buffers, 290717696 in all, and a KV budget of
  // 966367641 − 1040128 − 290717696 = 674609817 (65879 blocks).
  const Result f32 = RunPlan({"--model", planner_testing::Stories260KDir(), "--gpu-memory", "1GiB",
                              "--json", "--activation-dtype", "f32"});
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  const nlohmann::json f32_out = nlohmann::json::parse(f32.out);
  EXPECT_EQ(f32_out["activation_bytes"], 290717696);
  EXPECT_EQ(f32_out["kv_budget_bytes"], 674609817);
  EXPECT_EQ(f32_out["num_kv_blocks"], 65879);
  const Result bad =
      RunPlan({"--model", planner_testing::Stories260KDir(), "--activation-dtype", "fp16"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--activation-dtype must be bf16 or f32"), std::string::npos) << bad.err;
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

// Writes `config` as `dir`/`name`.json; returns its path.
std::string WriteConfig(const std::string& dir, const std::string& name, const char* config) {
  const std::string path = dir + "/" + name + ".json";
  planner_testing::WriteText(path, config);
  return path;
}

// DeepSeek-V3 at fp8 over pp 2 × tp 8 on 141 GB GPUs with f32 activations; the figures are
// worked out by hand in capacity_planner_test.cc (PipelinePlanTest.DeepSeekV3TwoStages).
TEST(PlanCommandTest, PipelineTable) {
  const std::string config =
      WriteConfig(planner_testing::MakeTestDir(), "deepseek-v3", testing_configs::kDeepSeekV3);
  const Result r = RunPlan({"--model", config, "--gpu-memory", "141GB", "--tp", "8", "--pp", "2",
                            "--activation-dtype", "f32", "--weight-dtype", "fp8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layout       pp 2 x tp 8 = 16 GPUs, layers 31+30"), std::string::npos)
      << r.out;
  // Stage 0 limits the group (marked *): 147117 bf16 blocks of its 147117 / 147842.
  EXPECT_NE(r.out.find("stage  layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n0 *    0-30 (31) "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n1      31-60 (30) "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" 35712    147117    2353872\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" 34560    147842    2365472\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV blocks (fewest of the stages)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  set by stage"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("hidden-state send/recv buffers 448.00 MiB"), std::string::npos) << r.out;
  // The one-stage header lines are not printed.
  EXPECT_EQ(r.out.find("KV budget    "), std::string::npos) << r.out;
}

TEST(PlanCommandTest, PipelineJson) {
  const std::string config =
      WriteConfig(planner_testing::MakeTestDir(), "deepseek-v3", testing_configs::kDeepSeekV3);
  const Result r =
      RunPlan({"--model", config, "--gpu-memory", "141GB", "--tp", "8", "--pp", "2", "--pp-layers",
               "31,30", "--activation-dtype", "f32", "--weight-dtype", "fp8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["pp"], 2);
  EXPECT_EQ(out["tp"], 8);
  EXPECT_EQ(out["num_gpus"], 16);
  EXPECT_EQ(out["layers_per_stage"], nlohmann::json::array({31, 30}));
  ASSERT_EQ(out["stages"].size(), 2u);
  const nlohmann::json& first = out["stages"][0];
  const nlohmann::json& last = out["stages"][1];
  EXPECT_EQ(first["stage"], 0);
  EXPECT_EQ(first["first_layer"], 0);
  EXPECT_EQ(first["num_layers"], 31);
  EXPECT_EQ(last["first_layer"], 31);
  EXPECT_EQ(last["num_layers"], 30);
  EXPECT_EQ(first["weight_bytes"], 41'066'191'872);
  EXPECT_EQ(last["weight_bytes"], 43'714'165'248);
  EXPECT_EQ(first["activations"]["pipeline_bytes"], 2 * 8192 * 7168 * 4);
  EXPECT_EQ(first["activations"]["logits_bytes"], 0);
  EXPECT_EQ(last["activations"]["logits_bytes"], 256 * 129280 * 4);
  EXPECT_EQ(first["kv_bytes_per_token"], 31 * 576 * 2);
  EXPECT_EQ(last["kv_bytes_per_token"], 30 * 576 * 2);
  EXPECT_EQ(first["num_kv_blocks"], 147117);
  EXPECT_EQ(last["num_kv_blocks"], 147842);
  EXPECT_EQ(last["by_kv_dtype"]["fp8"]["kv_bytes_per_token"], 30 * 580);
  // The group: the fewest blocks, and which stage has them.
  EXPECT_EQ(out["num_kv_blocks"], 147117);
  EXPECT_EQ(out["limiting_stage"], 0);
  EXPECT_EQ(out["kv_tokens"], 147117 * 16);
  EXPECT_EQ(out["max_concurrent_seqs"], 14);
  EXPECT_EQ(out["by_kv_dtype"]["fp8"]["num_kv_blocks"], 292205);
  EXPECT_EQ(out["by_kv_dtype"]["fp8"]["limiting_stage"], 0);
  // Worst-stage per-GPU figures.
  EXPECT_EQ(out["weight_bytes"], 43'714'165'248);
  EXPECT_EQ(out["kv_budget_bytes"], 81'751'120'640);
}

TEST(PlanCommandTest, OneStageJsonIsUnchanged) {
  const Result r = RunPlan({"--model", planner_testing::Stories260KDir(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_FALSE(out.contains("pp"));
  EXPECT_FALSE(out.contains("stages"));
  EXPECT_FALSE(out.contains("limiting_stage"));
  EXPECT_FALSE(out["activations"].contains("pipeline_bytes"));
  // --pp 1 with the one-stage partition is the same plan.
  const Result same = RunPlan(
      {"--model", planner_testing::Stories260KDir(), "--json", "--pp", "1", "--pp-layers", "5"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.out, r.out);
}

TEST(PlanCommandTest, PipelineErrors) {
  const std::string dir = planner_testing::MakeTestDir();
  const std::string deepseek = WriteConfig(dir, "deepseek-v3", testing_configs::kDeepSeekV3);
  Result r = RunPlan({"--model", deepseek, "--tp", "8", "--pp", "62"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("kvserve plan: --pp 62 needs at least one layer per stage; the model has "
                       "61 layers"),
            std::string::npos)
      << r.err;
  r = RunPlan({"--model", deepseek, "--tp", "8", "--pp", "2", "--pp-layers", "30,30"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("kvserve plan: --pp-layers 30,30 adds up to 60 layers; the model has 61"),
            std::string::npos)
      << r.err;
  r = RunPlan({"--model", deepseek, "--tp", "8", "--pp", "3", "--pp-layers", "31,30"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--pp-layers lists 2 stages; --pp is 3"), std::string::npos) << r.err;
  r = RunPlan({"--model", deepseek, "--tp", "8", "--pp", "2", "--pp-layers", "31,thirty"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--pp-layers: 'thirty' is not a positive layer count"), std::string::npos)
      << r.err;
  r = RunPlan({"--model", deepseek, "--tp", "8", "--pp", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("pp must be >= 1 (got 0)"), std::string::npos) << r.err;
  r = RunPlan({"--model", WriteConfig(dir, "qwen2-7b", testing_configs::kQwen2_7B), "--tp", "8",
               "--pp", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tp 8 does not divide num_attention_heads (28)"), std::string::npos)
      << r.err;
  r = RunPlan({"--model", WriteConfig(dir, "llama-3-70b", testing_configs::kLlama3_70B), "--pp",
               "2", "--gpu-memory", "40GiB"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("weights need 65.71 GiB per GPU at stage 0 (layers 0-39) of pp 2 x tp 1"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace kvserve::cli
