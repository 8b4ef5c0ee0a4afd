// Pipeline-parallel model groups as real processes on loopback. A `kvserve worker --pp P` leader
// (stage 0) and P-1 `kvserve worker --pp-leader` stage processes must give the greedy tokens of
// one plain `kvserve worker`, one request at a time and eight at once, and hand every KV block
// back to the leader's pool. A stage killed or hung mid-stream fails the group's streams with
// UNAVAILABLE (not a hang) and takes the leader's health to NOT_SERVING; the restarted or resumed
// stage rejoins and the tokens are the reference's again. A stage outlives a restart of its
// leader; one asking for a taken rank waits and takes it over when it frees. Stages and layer
// splits that cannot form a group are refused, naming the numbers.
//
// Waits are on streams or bounded polls of another process's state; nothing sleeps to let
// something happen.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/cluster/process_cluster.h"
#include "tests/test_util/held_port.h"
#include "tests/worker/model/golden.h"

namespace kvserve {
namespace {

using std::chrono::seconds;
using testing::ConnectClient;
using testing::Greedy;
using testing::Prompt;
using testing::Spawned;
using testing::SpawnStage;
using testing::SpawnWorker;
using testing::WaitHealth;
using testing::WaitPoolFree;

// A bound on a stage joining (or rejoining) its leader until the leader reports SERVING: a stage
// dials again every second and loads a 1 MB model, so it only catches a group that never forms.
constexpr seconds kFormBound(20);
// A bound on the leader's health reflecting a loss it has already reported to a stream.
constexpr seconds kHealthBound(10);
// A bound on the leader's pool emptying once its requests have ended.
constexpr seconds kPoolBound(10);

// The single-process worker every group is compared with, shared by every test.
class ReferenceWorker : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<Spawned> worker = SpawnWorker();
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::make_unique<Spawned>(*std::move(worker));
    client_ = *ConnectClient(worker_->address);
  }
  void TearDown() override {
    client_.reset();
    worker_.reset();
  }
  static Client& client() { return *client_; }

 private:
  static std::unique_ptr<Spawned> worker_;
  static std::unique_ptr<Client> client_;
};
std::unique_ptr<Spawned> ReferenceWorker::worker_;
std::unique_ptr<Client> ReferenceWorker::client_;
[[maybe_unused]] ::testing::Environment* const kReference =
    ::testing::AddGlobalTestEnvironment(new ReferenceWorker);

std::vector<TokenId> TokensOf(const absl::StatusOr<Completion>& completion) {
  if (!completion.ok() || completion->samples.empty()) return {};
  return completion->samples[0].token_ids;
}

// The reference worker's tokens for `params`.
std::vector<TokenId> Want(const GenerateParams& params) {
  absl::StatusOr<Completion> want = ReferenceWorker::client().GenerateSync(params);
  EXPECT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(TokensOf(want).size(), params.max_tokens);
  return TokensOf(want);
}

// A client that makes one attempt per call, so it sees the group's UNAVAILABLE itself.
std::unique_ptr<Client> ConnectOnce(const std::string& address) {
  ClientOptions options;
  options.max_attempts = 1;
  return *ConnectClient(address, options);
}

// A leader and its stage processes.
struct Group {
  Spawned leader;
  std::vector<Spawned> stages;
};

// A leader with `leader_flags` on `listen`, one stage per entry of `stage_flags`, and a wait
// until the leader's health says the group serves.
absl::StatusOr<Group> StartGroup(const std::vector<std::string>& leader_flags,
                                 const std::vector<std::vector<std::string>>& stage_flags,
                                 const std::string& listen = "127.0.0.1:0") {
  absl::StatusOr<Spawned> leader = SpawnWorker(leader_flags, listen);
  if (!leader.ok()) return leader.status();
  Group group{*std::move(leader), {}};
  for (const std::vector<std::string>& flags : stage_flags) {
    absl::StatusOr<Spawned> stage = SpawnStage(group.leader.address, flags);
    if (!stage.ok()) return stage.status();
    group.stages.push_back(*std::move(stage));
  }
  if (!WaitHealth(group.leader.address, true, kFormBound)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the group of ", group.leader.address, " did not report SERVING"));
  }
  return group;
}

// Prompts inside one 16-token block (3), of exactly one (16), one past it (17), and of several
// blocks and a partial one (50, 100), each continued past further block boundaries.
std::vector<GenerateParams> PromptCases() {
  std::vector<GenerateParams> cases;
  for (int length : {3, 16, 17, 50, 100}) {
    cases.push_back(Greedy(Prompt(static_cast<TokenId>(5 + length), length), 40));
  }
  return cases;
}

// Every prompt case and the stories260K golden prompts, one at a time: the group gives the
// reference worker's tokens (and llama2.c's for the golden prompts).
void ExpectReferenceTokens(Client& group, const std::string& when) {
  for (const GenerateParams& params : PromptCases()) {
    absl::StatusOr<Completion> got = group.GenerateSync(params);
    ASSERT_TRUE(got.ok()) << when << ", prompt of " << params.prompt_token_ids.size() << ": "
                          << got.status();
    EXPECT_EQ(TokensOf(got), Want(params))
        << when << ", prompt of " << params.prompt_token_ids.size();
  }
  for (const testing_golden::GoldenCase& c : testing_golden::LoadStoriesGolden().cases) {
    const GenerateParams params =
        Greedy(c.prompt_ids, static_cast<uint32_t>(c.generated_ids.size()));
    absl::StatusOr<Completion> got = group.GenerateSync(params);
    ASSERT_TRUE(got.ok()) << when << ", '" << c.prompt << "': " << got.status();
    EXPECT_EQ(TokensOf(got), c.generated_ids) << when << ", '" << c.prompt << "'";
    EXPECT_EQ(TokensOf(got), Want(params)) << when << ", '" << c.prompt << "'";
  }
}

// Blocks shared on the leader, whose K/V the stages must hold too: a prompt computed again from
// the prefix cache, and three greedy samples forked off one prompt whose last block is partial
// (copied on the first write, a copy each stage must make in its own pool). Every sample gives
// the reference's tokens of the prompt alone.
void ExpectSharedBlocksGiveReferenceTokens(Client& group) {
  const GenerateParams repeated = Greedy(Prompt(70, 40), 30);
  const std::vector<TokenId> want = Want(repeated);
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<Completion> got = group.GenerateSync(repeated);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(TokensOf(got), want) << "round " << round;
    if (round == 1) {
      EXPECT_EQ(got->samples[0].usage.cached_prompt_tokens, 32u);
    }
  }
  GenerateParams forked = Greedy(Prompt(80, 37), 30);
  const std::vector<TokenId> want_forked = Want(forked);
  forked.n = 3;
  absl::StatusOr<Completion> got = group.GenerateSync(forked);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->samples.size(), 3u);
  for (const CompletionSample& sample : got->samples) {
    EXPECT_EQ(sample.token_ids, want_forked) << "sample " << sample.index;
  }
}

// Eight requests of different lengths at once (batched by the leader, so its steps carry
// several sequences through every stage): each gives the reference's tokens.
void ExpectConcurrentReferenceTokens(Client& group) {
  constexpr int kRequests = 8;
  std::vector<GenerateParams> params;
  std::vector<std::vector<TokenId>> want;
  for (int i = 0; i < kRequests; ++i) {
    params.push_back(Greedy(Prompt(static_cast<TokenId>(60 + 11 * i), 5 + 23 * i),
                            static_cast<uint32_t>(24 + 8 * i)));
    want.push_back(Want(params.back()));
  }
  std::vector<absl::StatusOr<Completion>> got(kRequests, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { got[i] = group.GenerateSync(params[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(got[i].ok()) << "concurrent request " << i << ": " << got[i].status();
    EXPECT_EQ(TokensOf(got[i]), want[i]) << "concurrent request " << i;
  }
}

// A long request and what it streamed before it ended.
struct Interrupted {
  absl::Status status;
  std::vector<TokenId> streamed;
  absl::Duration after_fault;  // from the fault to the end of the call
};

// Streams `params` and runs `fault` on the first chunk, so the fault lands while the request
// still has most of its tokens to go. The call's `deadline` turns a hang into DEADLINE_EXCEEDED.
Interrupted StreamWithFault(Client& client, const GenerateParams& params,
                            const std::function<void()>& fault, absl::Duration deadline) {
  Interrupted result;
  absl::Time fault_at = absl::InfiniteFuture();
  CallOptions call;
  call.deadline = deadline;
  result.status = client.Generate(
      params,
      [&](const GenerateChunk& chunk) {
        if (fault_at == absl::InfiniteFuture()) {
          fault();
          fault_at = absl::Now();
        }
        result.streamed.insert(result.streamed.end(), chunk.token_ids.begin(),
                               chunk.token_ids.end());
      },
      call);
  result.after_fault = absl::Now() - fault_at;
  return result;
}

// The stream ended UNAVAILABLE partway, and what it streamed is the reference's beginning.
void ExpectInterrupted(const Interrupted& got, const std::vector<TokenId>& want) {
  EXPECT_TRUE(absl::IsUnavailable(got.status)) << got.status;
  EXPECT_LT(got.streamed.size(), want.size());
  ASSERT_LE(got.streamed.size(), want.size());
  EXPECT_EQ(got.streamed, std::vector<TokenId>(want.begin(), want.begin() + got.streamed.size()));
}

// While a stage is missing the leader refuses new requests, naming the stage.
void ExpectRefusedForStageOne(Client& client) {
  absl::StatusOr<Completion> refused = client.GenerateSync(Greedy(Prompt(3, 10), 4));
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("waiting for stage 1"), std::string::npos)
      << refused.status();
}

struct Layout {
  const char* name;
  std::vector<std::string> leader;
  std::vector<std::vector<std::string>> stages;
};

class PipelineLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(PipelineLayoutTest, GivesTheTokensOfOneWorkerAndFreesEveryBlock) {
  absl::StatusOr<Group> group = StartGroup(GetParam().leader, GetParam().stages);
  ASSERT_TRUE(group.ok()) << group.status();
  for (const Spawned& stage : group->stages) {
    EXPECT_TRUE(WaitHealth(stage.address, true, kHealthBound)) << "stage " << stage.address;
  }
  std::unique_ptr<Client> client = *ConnectClient(group->leader.address);
  ExpectReferenceTokens(*client, "one at a time");
  ExpectSharedBlocksGiveReferenceTokens(*client);
  ExpectConcurrentReferenceTokens(*client);
  EXPECT_TRUE(WaitPoolFree(group->leader.address, kPoolBound).ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineLayoutTest,
                         ::testing::Values(Layout{"TwoStagesTp1", {"--pp", "2"}, {{"--pp", "2"}}},
                                           Layout{"TwoStagesTp2",
                                                  {"--pp", "2", "--tp", "2", "--threads", "2"},
                                                  {{"--pp", "2", "--tp", "2", "--threads", "2"}}},
                                           Layout{"ThreeStages",
                                                  {"--pp", "3", "--pp-layers", "1,2,2"},
                                                  {{"--pp", "3"}, {"--pp", "3"}}}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

TEST(PipelineClusterTest, StageKilledMidStreamFailsTheStreamAndItsRestartRejoins) {
  const std::vector<std::string> stage_flags = {"--pp", "2", "--pp-rank", "1"};
  absl::StatusOr<Group> group = StartGroup({"--pp", "2"}, {stage_flags});
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string leader = group->leader.address;
  std::unique_ptr<Client> client = ConnectOnce(leader);

  // A cached prompt: the group's prefix cache works, and must be forgotten with the stage.
  const GenerateParams cached = Greedy(Prompt(21, 64), 8);
  ASSERT_TRUE(client->GenerateSync(cached).ok());
  absl::StatusOr<Completion> warm = client->GenerateSync(cached);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_GE(warm->samples[0].usage.cached_prompt_tokens, 48u);
  EXPECT_EQ(TokensOf(warm), Want(cached));

  const GenerateParams long_request = Greedy(Prompt(7, 20), 400);
  const std::vector<TokenId> want = Want(long_request);
  Spawned& stage = group->stages[0];
  const Interrupted got = StreamWithFault(
      *client, long_request, [&] { EXPECT_EQ(::kill(stage.process.pid(), SIGKILL), 0); },
      absl::Seconds(10));
  std::printf("stage SIGKILL: stream ended %s after %zu tokens, %.3f s after the kill\n",
              absl::StatusCodeToString(got.status.code()).c_str(), got.streamed.size(),
              absl::ToDoubleSeconds(got.after_fault));
  ExpectInterrupted(got, want);
  stage.process.Stop(seconds(5));  // reaps it

  EXPECT_TRUE(WaitHealth(leader, false, kHealthBound));
  ExpectRefusedForStageOne(*client);
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok()) << "blocks of the failed stream";

  absl::StatusOr<Spawned> restarted = SpawnStage(leader, stage_flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(WaitHealth(leader, true, kFormBound)) << "the restarted stage did not rejoin";
  EXPECT_TRUE(WaitHealth(restarted->address, true, kHealthBound));
  // The restarted stage holds no K/V of the old one: the leader must compute the prompt again.
  absl::StatusOr<Completion> cold = client->GenerateSync(cached);
  ASSERT_TRUE(cold.ok()) << cold.status();
  EXPECT_EQ(cold->samples[0].usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(TokensOf(cold), TokensOf(warm));
  ExpectReferenceTokens(*client, "after the stage restarted");
  EXPECT_EQ(TokensOf(client->GenerateSync(long_request)), want);
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok());
}

// Stages on (simulated) CUDA devices hand over device to device: NCCL send/recv between the
// processes' GPUs, with the simulator's NCCL between real processes. The group gives the
// reference's tokens (f32 weights, so the device computes what the CPU does); a stage killed
// mid-stream fails the stream with UNAVAILABLE rather than leaving the leader's device waiting,
// and the group forms again with fresh links when it restarts.
TEST(PipelineClusterTest, CudaStagesHandOverOverNcclAndSurviveAKilledStage) {
  const std::vector<std::string> device = {"--device", "cuda-sim", "--keep-f32-weights"};
  std::vector<std::string> leader_flags = {"--pp", "2"};
  std::vector<std::string> stage_flags = {"--pp", "2", "--pp-rank", "1"};
  leader_flags.insert(leader_flags.end(), device.begin(), device.end());
  stage_flags.insert(stage_flags.end(), device.begin(), device.end());
  absl::StatusOr<Group> group = StartGroup(leader_flags, {stage_flags});
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string leader = group->leader.address;
  std::unique_ptr<Client> client = ConnectOnce(leader);
  const testing_golden::StoriesGolden all = testing_golden::LoadStoriesGolden();
  ASSERT_GE(all.cases.size(), 2u);
  const testing_golden::GoldenCase& golden = all.cases[0];
  constexpr size_t kTokens = 16;
  const GenerateParams first = Greedy(golden.prompt_ids, kTokens);
  const std::vector<TokenId> want_first(golden.generated_ids.begin(),
                                        golden.generated_ids.begin() + kTokens);
  absl::StatusOr<Completion> got = client->GenerateSync(first);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(TokensOf(got), want_first);
  // Two at once: two micro-batches in flight through the links.
  const GenerateParams second = Greedy(all.cases[1].prompt_ids, 12);
  const std::vector<TokenId> want_second(all.cases[1].generated_ids.begin(),
                                         all.cases[1].generated_ids.begin() + 12);
  absl::StatusOr<Completion> a = absl::UnknownError("not run");
  absl::StatusOr<Completion> b = absl::UnknownError("not run");
  std::thread other([&] { b = client->GenerateSync(second); });
  a = client->GenerateSync(first);
  other.join();
  EXPECT_EQ(TokensOf(a), want_first) << a.status();
  EXPECT_EQ(TokensOf(b), want_second) << b.status();

  const GenerateParams long_request = Greedy(Prompt(7, 20), 200);
  Spawned& stage = group->stages[0];
  const Interrupted cut = StreamWithFault(
      *client, long_request, [&] { EXPECT_EQ(::kill(stage.process.pid(), SIGKILL), 0); },
      absl::Seconds(30));
  std::printf("CUDA stage SIGKILL: stream ended %s after %zu tokens, %.3f s after the kill\n",
              absl::StatusCodeToString(cut.status.code()).c_str(), cut.streamed.size(),
              absl::ToDoubleSeconds(cut.after_fault));
  EXPECT_TRUE(absl::IsUnavailable(cut.status)) << cut.status;
  stage.process.Stop(seconds(5));
  EXPECT_TRUE(WaitHealth(leader, false, kHealthBound));
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok()) << "blocks of the failed stream";

  absl::StatusOr<Spawned> restarted = SpawnStage(leader, stage_flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(WaitHealth(leader, true, kFormBound)) << "the restarted stage did not rejoin";
  got = client->GenerateSync(first);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(TokensOf(got), want_first) << "after the stage restarted";
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok());
}

// A stage whose devices cannot hold the group's KV pool for its layers exits at once, naming the
// sizes and what to change, rather than joining again and again.
TEST(PipelineClusterTest, AStageThatCannotHoldTheKvPoolExitsNamingTheSizes) {
  // 20000 blocks of 16 tokens: 246 MB of f32 K/V for stories260K's 3 leader layers, 164 MB for
  // stage 1's 2; the stage's simulated device has 96 MiB.
  absl::StatusOr<Spawned> leader = SpawnWorker(
      {"--pp", "2", "--device", "cuda-sim", "--keep-f32-weights", "--num-kv-blocks", "20000"});
  ASSERT_TRUE(leader.ok()) << leader.status();
  ::setenv("KVSERVE_SIM_DEVICE_MEMORY", "96MiB", 1);  // inherited by the stage only
  testing::ExitedRun small = testing::RunKvserve(
      {"worker", "--model", testing::kTestModel, "--listen", "127.0.0.1:0", "--threads", "1",
       "--pp", "2", "--device", "cuda-sim", "--keep-f32-weights", "--pp-leader", leader->address},
      seconds(60));
  ::unsetenv("KVSERVE_SIM_DEVICE_MEMORY");
  EXPECT_NE(small.exit_code, 0);
  EXPECT_NE(small.exit_code, 124) << "the stage kept trying";
  for (const char* text : {"cannot hold the group's KV pool", "20000 blocks", "--num-kv-blocks"}) {
    EXPECT_NE(small.stderr_text.find(text), std::string::npos)
        << text << " in: " << small.stderr_text;
  }
  EXPECT_FALSE(WaitHealth(leader->address, true, std::chrono::milliseconds(200)));
}

TEST(PipelineClusterTest, HungStageIsDroppedAfterTheStepTimeoutAndRejoinsOnSigcont) {
  absl::StatusOr<Group> group =
      StartGroup({"--pp", "2", "--pp-step-timeout", "2"}, {{"--pp", "2"}});
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string leader = group->leader.address;
  std::unique_ptr<Client> client = ConnectOnce(leader);
  Spawned& stage = group->stages[0];

  const GenerateParams long_request = Greedy(Prompt(9, 30), 400);
  const std::vector<TokenId> want = Want(long_request);
  const Interrupted got = StreamWithFault(
      *client, long_request, [&] { EXPECT_EQ(::kill(stage.process.pid(), SIGSTOP), 0); },
      absl::Seconds(15));
  std::printf("stage SIGSTOP: stream ended %s after %zu tokens, %.3f s after the stop: %s\n",
              absl::StatusCodeToString(got.status.code()).c_str(), got.streamed.size(),
              absl::ToDoubleSeconds(got.after_fault), std::string(got.status.message()).c_str());
  ExpectInterrupted(got, want);
  EXPECT_NE(got.status.message().find("--pp-step-timeout"), std::string::npos) << got.status;
  EXPECT_TRUE(WaitHealth(leader, false, kHealthBound));
  ExpectRefusedForStageOne(*client);
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok()) << "blocks of the failed stream";

  // Resumed, the stage finds its call cancelled and joins again with a fresh pool.
  ASSERT_EQ(::kill(stage.process.pid(), SIGCONT), 0);
  ASSERT_TRUE(WaitHealth(leader, true, kFormBound)) << "the resumed stage did not rejoin";
  EXPECT_TRUE(WaitHealth(stage.address, true, kHealthBound));
  ExpectReferenceTokens(*client, "after SIGCONT");
  EXPECT_EQ(TokensOf(client->GenerateSync(long_request)), want);
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok());
}

TEST(PipelineClusterTest, StageRejoinsALeaderRestartedOnItsPort) {
  // The test holds the leader's port (SO_REUSEPORT, never listening) so that the restarted
  // leader can bind it again while no other test takes it; meanwhile the stage's dials are
  // refused.
  test_util::HeldPort port(test_util::PortSharing::kReusePort);
  absl::StatusOr<Group> group = StartGroup({"--pp", "2"}, {{"--pp", "2"}}, port.address());
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string leader = group->leader.address;
  ASSERT_EQ(leader, port.address());
  const std::string stage = group->stages[0].address;
  EXPECT_TRUE(WaitHealth(stage, true, kHealthBound));
  {
    std::unique_ptr<Client> client = *ConnectClient(leader);
    const GenerateParams params = Greedy(Prompt(33, 40), 30);
    EXPECT_EQ(TokensOf(client->GenerateSync(params)), Want(params));
  }

  ASSERT_EQ(::kill(group->leader.process.pid(), SIGKILL), 0);
  group->leader.process.Stop(seconds(5));  // reaps it
  EXPECT_TRUE(WaitHealth(stage, false, kHealthBound)) << "the stage did not notice its leader died";
  int status = 0;
  EXPECT_FALSE(group->stages[0].process.Exited(&status)) << "the stage exited: " << status;

  absl::StatusOr<Spawned> restarted = SpawnWorker({"--pp", "2"}, leader);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(WaitHealth(leader, true, kFormBound)) << "the stage did not join the new leader";
  EXPECT_TRUE(WaitHealth(stage, true, kHealthBound));
  std::unique_ptr<Client> client = *ConnectClient(leader);
  ExpectReferenceTokens(*client, "after the leader restarted");
  ExpectConcurrentReferenceTokens(*client);
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok());
}

TEST(PipelineClusterTest, StagesAndLayerSplitsThatCannotFormTheGroupAreRefused) {
  absl::StatusOr<Spawned> leader = SpawnWorker({"--pp", "2"});
  ASSERT_TRUE(leader.ok()) << leader.status();
  // Bounds on a refused process's exit; one still running then is killed (exit code 124).
  constexpr seconds kExitBound(30);
  const std::vector<std::string> stage = {"worker",   "--model",     testing::kTestModel,
                                          "--listen", "127.0.0.1:0", "--threads",
                                          "1",        "--pp-leader", leader->address};
  auto with = [&](std::vector<std::string> flags) {
    std::vector<std::string> args = stage;
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  };

  // The leader's group has 2 stages; this one runs with --pp 3.
  testing::ExitedRun wrong_pp = testing::RunKvserve(with({"--pp", "3"}), kExitBound);
  EXPECT_NE(wrong_pp.exit_code, 0);
  EXPECT_NE(wrong_pp.exit_code, 124) << "the refused stage kept running";
  EXPECT_NE(wrong_pp.stderr_text.find("--pp 3"), std::string::npos) << wrong_pp.stderr_text;
  EXPECT_NE(wrong_pp.stderr_text.find("2 stages"), std::string::npos) << wrong_pp.stderr_text;

  // A group of 2 has stage 1 only.
  testing::ExitedRun wrong_rank =
      testing::RunKvserve(with({"--pp", "2", "--pp-rank", "5"}), kExitBound);
  EXPECT_NE(wrong_rank.exit_code, 0);
  EXPECT_NE(wrong_rank.exit_code, 124) << "the refused stage kept running";
  EXPECT_NE(wrong_rank.stderr_text.find("--pp-rank 5"), std::string::npos)
      << wrong_rank.stderr_text;
  EXPECT_NE(wrong_rank.stderr_text.find("1..1"), std::string::npos) << wrong_rank.stderr_text;

  // Neither refused stage took a place: a good one forms the group.
  absl::StatusOr<Spawned> good = SpawnStage(leader->address, {"--pp", "2"});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(WaitHealth(leader->address, true, kFormBound));

  // stories260K has 5 layers; 4 + 4 is 8.
  testing::ExitedRun wrong_split =
      testing::RunKvserve({"worker", "--model", testing::kTestModel, "--listen", "127.0.0.1:0",
                           "--pp", "2", "--pp-layers", "4,4"},
                          kExitBound);
  EXPECT_NE(wrong_split.exit_code, 0);
  EXPECT_NE(wrong_split.exit_code, 124) << "the leader with a bad split kept running";
  // The error's line (log lines before it carry digits of their own).
  const std::string& text = wrong_split.stderr_text;
  const size_t at = text.find("--pp-layers");
  ASSERT_NE(at, std::string::npos) << text;
  const size_t begin = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
  const std::string line = text.substr(begin, text.find('\n', at) - begin);
  for (const char* number : {"4,4", "8", "5"}) {
    EXPECT_NE(line.find(number), std::string::npos) << number << " in: " << line;
  }
}

TEST(PipelineClusterTest, StageForATakenRankWaitsAndTakesOverWhenTheRankFrees) {
  absl::StatusOr<Group> group = StartGroup({"--pp", "2"}, {{"--pp", "2", "--pp-rank", "1"}});
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string leader = group->leader.address;
  // ALREADY_EXISTS is not a refusal for good: the second stage keeps dialling.
  absl::StatusOr<Spawned> second = SpawnStage(leader, {"--pp", "2", "--pp-rank", "1"});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(testing::HealthServing(second->address).value_or(true), false);

  ASSERT_EQ(::kill(group->stages[0].process.pid(), SIGKILL), 0);
  group->stages[0].process.Stop(seconds(5));  // reaps it
  ASSERT_TRUE(WaitHealth(second->address, true, kFormBound))
      << "the second stage did not take over";
  ASSERT_TRUE(WaitHealth(leader, true, kHealthBound));
  std::unique_ptr<Client> client = *ConnectClient(leader);
  const GenerateParams params = Greedy(Prompt(44, 50), 30);
  EXPECT_EQ(TokensOf(client->GenerateSync(params)), Want(params));
  EXPECT_TRUE(WaitPoolFree(leader, kPoolBound).ok());
}

}  // namespace
}  // namespace kvserve
