#include "worker/tp/tp_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {

void ShardedKvCache::CopyBlock(int64_t src, int64_t dst) {
  for (auto& cache : ranks_) cache->CopyBlock(src, dst);
}

absl::StatusOr<std::unique_ptr<TensorParallelModel>> TensorParallelModel::Create(
    const ModelWeights* weights, const TensorParallelOptions& options) {
  if (weights == nullptr) return absl::InvalidArgumentError("TensorParallelModel: no weights");
  const int tp = options.tp_size;
  if (tp < 1 || tp > 256) {
    return absl::InvalidArgumentError(absl::StrCat("--tp must be in [1, 256], got ", tp));
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads must be >= 0, got ", options.num_threads));
  }
  const int total_threads =
      options.num_threads > 0 ? options.num_threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads_per_rank = std::max(1, total_threads / tp);

  std::unique_ptr<TensorParallelModel> model(new TensorParallelModel(weights));
  if (tp > 1) {
    absl::StatusOr<std::unique_ptr<CpuCommGroup>> group = CpuCommGroup::Create(tp);
    if (!group.ok()) return group.status();
    model->group_ = std::move(*group);
  }
  for (int r = 0; r < tp; ++r) {
    auto rank = std::make_unique<Rank>();
    absl::StatusOr<ShardPlan> plan = PlanShard(*weights, r, tp);
    if (!plan.ok()) return plan.status();
    rank->plan = *plan;
    if (tp == 1) {
      rank->weights = weights;
    } else {
      absl::StatusOr<std::unique_ptr<ModelWeights>> shard = ShardWeights(*weights, r, tp);
      if (!shard.ok()) return shard.status();
      rank->shard = std::move(*shard);
      rank->weights = rank->shard.get();
    }
    rank->pool = std::make_unique<cpu::ThreadPool>(threads_per_rank);
    AllReduceFn all_reduce;
    if (tp > 1) {
      Communicator* comm = model->group_->communicator(r);
      all_reduce = [comm](float* data, int64_t n) { return comm->AllReduceSum(data, n); };
    }
    absl::StatusOr<std::unique_ptr<LlamaModel>> llama =
        LlamaModel::Create(rank->weights, rank->pool.get(), std::move(all_reduce));
    if (!llama.ok()) return llama.status();
    rank->model = std::move(*llama);
    model->ranks_.push_back(std::move(rank));
  }
  for (int r = 1; r < tp; ++r) {
    TensorParallelModel* m = model.get();
    model->ranks_[r]->thread = std::thread([m, r] { m->RankLoop(r); });
  }
  return model;
}

TensorParallelModel::~TensorParallelModel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& rank : ranks_) {
    if (rank->thread.joinable()) rank->thread.join();
  }
}

absl::StatusOr<std::unique_ptr<ShardedKvCache>> TensorParallelModel::CreateKvCache(
    int64_t num_blocks, int64_t block_size, KvCacheDType dtype) const {
  std::unique_ptr<ShardedKvCache> cache(new ShardedKvCache());
  for (const auto& rank : ranks_) {
    absl::StatusOr<std::unique_ptr<KvCache>> c =
        KvCache::Create(rank->weights->config, num_blocks, block_size, dtype);
    if (!c.ok()) return c.status();
    cache->ranks_.push_back(std::move(*c));
  }
  return cache;
}

int64_t TensorParallelModel::KvBytesPerToken(KvCacheDType dtype) const {
  int64_t bytes = 0;
  for (const auto& rank : ranks_) bytes += KvCache::BytesPerToken(rank->weights->config, dtype);
  return bytes;
}

absl::Status TensorParallelModel::Forward(const ForwardBatch& batch, ShardedKvCache& cache,
                                          float* logits) {
  const int tp = tp_size();
  if (cache.tp_size() != tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache has ", cache.tp_size(), " ranks, the model ", tp));
  }
  if (tp == 1) return ranks_[0]->model->Forward(batch, cache.rank(0), logits);
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_ = &batch;
    cache_ = &cache;
    pending_ = tp - 1;
    ++step_;
  }
  start_cv_.notify_all();
  RunRank(0, logits);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    batch_ = nullptr;
    cache_ = nullptr;
  }
  // Every rank has returned: nobody is inside a collective, so an abort can be cleared.
  if (group_->aborted()) group_->Reset();
  absl::Status result;
  for (const auto& rank : ranks_) {
    if (rank->status.ok()) continue;
    // Report the rank that failed, not the ones it unblocked.
    if (result.ok() || (absl::IsAborted(result) && !absl::IsAborted(rank->status))) {
      result = rank->status;
    }
  }
  return result;
}

void TensorParallelModel::RunRank(int r, float* logits) {
  Rank& rank = *ranks_[r];
  rank.status = rank.model->Forward(*batch_, cache_->rank(r), logits);
  if (!rank.status.ok()) group_->Abort();
}

void TensorParallelModel::RankLoop(int r) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || step_ != seen; });
      if (stop_) return;
      seen = step_;
    }
    RunRank(r, nullptr);
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --pending_ == 0;
    }
    if (last) done_cv_.notify_one();
  }
}

}  // namespace kvserve
