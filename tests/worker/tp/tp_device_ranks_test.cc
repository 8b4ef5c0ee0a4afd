// Tensor parallelism over injected backends and communicators: the path the engine takes for
// CUDA ranks (TensorParallelOptions::make_backend = a CUDA device per rank, make_communicators =
// NCCL), exercised here with CPU backends and forwarding communicators over an in-process
// group. Checks the wiring (every rank gets its own backend and communicator, greedy tokens
// equal the reference) and the failure rule of a group that cannot be re-armed: after a rank
// fails mid-step, every rank is released and later steps fail fast instead of hanging.

#include <algorithm>
#include <atomic>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/worker/model/golden.h"
#include "worker/model/batch_builder.h"
#include "worker/model/loaded_model.h"
#include "worker/tp/cpu_communicator.h"
#include "worker/tp/nccl_group.h"
#include "worker/tp/tp_model.h"

namespace kvserve {
namespace {

using testing_golden::kStoriesGguf;
using testing_golden::LoadStoriesGolden;

constexpr int kBlockSize = 16;

// What the injected factories did, shared with the test.
struct Injected {
  std::atomic<int> backends{0};
  std::atomic<int> all_reduces{0};
  std::atomic<int> aborts{0};
  int fail_rank = -1;      // this rank's all-reduce number `fail_at` fails with UNAVAILABLE
  int fail_at = -1;
  std::unique_ptr<CpuCommGroup> group;
};

// A communicator that owns nothing: forwards to a CpuCommGroup rank and counts, like an NCCL
// communicator handed over by CreateNcclGroup.
class ForwardingCommunicator final : public Communicator {
 public:
  ForwardingCommunicator(Injected* injected, int rank)
      : injected_(injected), inner_(injected->group->communicator(rank)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(float* data, int64_t n) override {
    ++injected_->all_reduces;
    if (rank() == injected_->fail_rank && calls_++ == injected_->fail_at) {
      return absl::UnavailableError("injected: link to the peer GPU lost");
    }
    return inner_->AllReduceSum(data, n);
  }
  absl::Status AllGather(const float* send, int64_t n, float* recv) override {
    return inner_->AllGather(send, n, recv);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort() override {
    ++injected_->aborts;
    inner_->Abort();
  }

 private:
  Injected* injected_;
  Communicator* inner_;
  int calls_ = 0;
};

std::unique_ptr<TensorParallelModel> MakeDeviceTp(const ModelWeights* weights, int tp,
                                                  Injected* injected) {
  TensorParallelOptions options;
  options.tp_size = tp;
  options.make_backend = [injected](int) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ++injected->backends;
    return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(nullptr));
  };
  options.make_communicators =
      [injected](int size) -> absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> {
    absl::StatusOr<std::unique_ptr<CpuCommGroup>> group = CpuCommGroup::Create(size);
    if (!group.ok()) return group.status();
    injected->group = std::move(*group);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < size; ++r) {
      comms.push_back(std::make_unique<ForwardingCommunicator>(injected, r));
    }
    return comms;
  };
  absl::StatusOr<std::unique_ptr<TensorParallelModel>> m =
      TensorParallelModel::Create(weights, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Table(int64_t blocks) {
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 1);
  return table;
}

TEST(TpDeviceRanksTest, InjectedRanksGiveTheReferenceTokens) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  const auto golden = LoadStoriesGolden();
  const auto& c = golden.cases[0];
  Injected injected;
  auto tp = MakeDeviceTp(model.weights.get(), 2, &injected);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(injected.backends.load(), 2);
  const int64_t blocks = model.config().max_position_embeddings / kBlockSize + 1;
  auto cache = *tp->CreateKvCache(blocks, kBlockSize);
  const std::vector<int32_t> table = Table(blocks - 1);
  BatchBuilder builder;
  std::vector<float> logits(model.config().vocab_size);
  std::vector<TokenId> tokens = c.prompt_ids;
  int32_t pos = 0;
  std::vector<TokenId> out;
  for (size_t i = 0; i < 48; ++i) {
    builder.Clear();
    std::span<const TokenId> feed(tokens.data() + pos, tokens.size() - pos);
    builder.AddSequence(feed, pos, table, kBlockSize, true);
    ASSERT_TRUE(tp->Forward(builder.Build(), *cache, logits.data()).ok());
    pos = static_cast<int32_t>(tokens.size());
    out.push_back(static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) -
                                       logits.begin()));
    tokens.push_back(out.back());
  }
  EXPECT_TRUE(std::equal(out.begin(), out.end(), c.generated_ids.begin()));
  // Two all-reduces per layer per step on each of the two ranks.
  EXPECT_EQ(injected.all_reduces.load(), 48 * 2 * 2 * model.config().num_layers);
  EXPECT_EQ(injected.aborts.load(), 0);
}

TEST(TpDeviceRanksTest, AFailedRankReleasesTheOthersAndLaterStepsFailFast) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  Injected injected;
  injected.fail_rank = 1;
  injected.fail_at = 3;  // the second layer's MLP all-reduce of the first step
  auto tp = MakeDeviceTp(model.weights.get(), 2, &injected);
  ASSERT_NE(tp, nullptr);
  auto cache = *tp->CreateKvCache(8, kBlockSize);
  const std::vector<int32_t> table = Table(4);
  BatchBuilder builder;
  const TokenId prompt[] = {1, 403, 407};
  builder.AddSequence(prompt, 0, table, kBlockSize, true);
  std::vector<float> logits(model.config().vocab_size);
  absl::Status s = tp->Forward(builder.Build(), *cache, logits.data());
  // The failing rank's error, not rank 0's ABORTED.
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("link to the peer GPU lost"), std::string::npos) << s;
  EXPECT_GE(injected.aborts.load(), 1);
  // The group is down for good: fail fast, naming the first error.
  s = tp->Forward(builder.Build(), *cache, logits.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("link to the peer GPU lost"), std::string::npos) << s;
}

TEST(TpDeviceRanksTest, ABadBatchDoesNotTakeTheGroupDown) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  Injected injected;
  auto tp = MakeDeviceTp(model.weights.get(), 2, &injected);
  ASSERT_NE(tp, nullptr);
  auto cache = *tp->CreateKvCache(8, kBlockSize);
  const std::vector<int32_t> table = Table(4);
  BatchBuilder builder;
  const TokenId bad[] = {1, 100000};
  builder.AddSequence(bad, 0, table, kBlockSize, true);
  std::vector<float> logits(model.config().vocab_size);
  EXPECT_TRUE(absl::IsInvalidArgument(tp->Forward(builder.Build(), *cache, logits.data())));
  EXPECT_EQ(injected.aborts.load(), 0);
  builder.Clear();
  const TokenId good[] = {1, 403};
  builder.AddSequence(good, 0, table, kBlockSize, true);
  EXPECT_TRUE(tp->Forward(builder.Build(), *cache, logits.data()).ok());
}

TEST(TpDeviceRanksTest, DeviceRanksNeedCommunicatorsAndFactoryErrorsSurface) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  TensorParallelOptions options;
  options.tp_size = 2;
  options.make_backend = [](int) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(nullptr));
  };
  absl::StatusOr<std::unique_ptr<TensorParallelModel>> m =
      TensorParallelModel::Create(model.weights.get(), options);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  options.make_communicators = [](int) -> absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> {
    return absl::UnavailableError("no NCCL here");
  };
  m = TensorParallelModel::Create(model.weights.get(), options);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  options.make_communicators = [](int n) { return CreateNcclGroup(n); };
  options.make_backend = [](int rank) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", rank));
  };
  // Without a GPU the NCCL group (or the backends) cannot be made; either way Create says so
  // instead of crashing.
  m = TensorParallelModel::Create(model.weights.get(), options);
  EXPECT_FALSE(m.ok());
}

}  // namespace
}  // namespace kvserve
