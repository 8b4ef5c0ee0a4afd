#include "worker/tp/tp_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/tp/nccl_group.h"

namespace kvserve {

void ShardedKvCache::CopyBlock(int64_t src, int64_t dst) {
  for (auto& cache : ranks_) cache->CopyBlock(src, dst);
}

absl::Status ShardedKvCache::FinishCopies() const {
  for (const auto& cache : ranks_) {
    if (absl::Status s = cache->FinishCopies(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

int64_t ShardedKvCache::BlockBytes() const {
  int64_t total = 0;
  for (const auto& cache : ranks_) total += cache->BlockBytes();
  return total;
}

absl::Status ShardedKvCache::ReadBlock(int64_t block, uint8_t* dst) const {
  for (const auto& cache : ranks_) {
    if (absl::Status s = cache->ReadBlock(block, dst); !s.ok()) return s;
    dst += cache->BlockBytes();
  }
  return absl::OkStatus();
}

absl::Status ShardedKvCache::WriteBlock(int64_t block, const uint8_t* src) {
  for (auto& cache : ranks_) {
    if (absl::Status s = cache->WriteBlock(block, src); !s.ok()) return s;
    src += cache->BlockBytes();
  }
  return absl::OkStatus();
}

void UseDeviceRanks(TensorParallelOptions* options, const BackendOptions& base,
                    std::unique_ptr<Backend> first) {
  auto opened = std::make_shared<std::unique_ptr<Backend>>(std::move(first));
  options->make_backend = [opened, base](int rank) -> absl::StatusOr<std::unique_ptr<Backend>> {
    if (rank == 0 && *opened != nullptr) return std::move(*opened);
    BackendOptions backend_options = base;
    backend_options.device_index = rank;
    absl::StatusOr<std::unique_ptr<Backend>> b = LoadCudaBackend(backend_options);
    if (!b.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " needs CUDA device ", rank, ": ", b.status().message()));
    }
    return b;
  };
  const bool simulator = base.simulator;
  options->make_communicators = [simulator](int tp_size) {
    return CreateNcclGroup(tp_size, simulator);
  };
  options->stage_links = NcclStageLinks(options->tp_size, simulator);
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

  const bool device = static_cast<bool>(options.make_backend);
  if (device && tp > 1 && !options.make_communicators) {
    return absl::InvalidArgumentError(
        "device tensor-parallel ranks need make_communicators (the CPU group cannot reach "
        "device memory)");
  }
  std::unique_ptr<TensorParallelModel> model(new TensorParallelModel(weights));
  if (tp > 1 && !device) {
    absl::StatusOr<std::unique_ptr<CpuCommGroup>> group = CpuCommGroup::Create(tp);
    if (!group.ok()) return group.status();
    model->group_ = std::move(*group);
  } else if (tp > 1) {
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> comms =
        options.make_communicators(tp);
    if (!comms.ok()) return comms.status();
    if (static_cast<int>(comms->size()) != tp) {
      return absl::InternalError(
          absl::StrCat("make_communicators gave ", comms->size(), " communicators for ", tp));
    }
    model->device_comms_ = std::move(*comms);
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
    if (device) {
      absl::StatusOr<std::unique_ptr<Backend>> backend = options.make_backend(r);
      if (!backend.ok()) return backend.status();
      rank->backend = std::move(*backend);
    } else {
      rank->pool = std::make_unique<cpu::ThreadPool>(threads_per_rank);
    }
    AllReduceFn all_reduce;
    bool enqueues = false;
    if (tp > 1) {
      rank->comm = device ? model->device_comms_[r].get() : model->group_->communicator(r);
      Communicator* comm = rank->comm;
      void* stream = rank->backend != nullptr ? rank->backend->native_stream() : nullptr;
      if (stream != nullptr && comm->enqueues_on_stream()) {
        // NCCL on the rank's own stream: no host synchronisation inside a step.
        all_reduce = [comm, stream](float* data, int64_t n) {
          return comm->EnqueueAllReduceSum(data, n, stream);
        };
        enqueues = true;
      } else {
        all_reduce = [comm](float* data, int64_t n) { return comm->AllReduceSum(data, n); };
      }
    }
    absl::StatusOr<std::unique_ptr<LlamaModel>> llama = LlamaModel::Create(
        rank->weights, rank->pool.get(), std::move(all_reduce), rank->backend.get(), enqueues);
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
        KvCache::Create(rank->weights->config, num_blocks, block_size, dtype,
                        rank->backend.get());
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
                                          float* logits, const StageIo& io) {
  const int tp = tp_size();
  if (cache.tp_size() != tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache has ", cache.tp_size(), " ranks, the model ", tp));
  }
  if (tp == 1) {
    StageIo own = io;
    own.link = ranks_[0]->link.get();
    return ranks_[0]->model->Forward(batch, cache.rank(0), logits, own);
  }
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the tensor-parallel group is down after an earlier failure: ", broken_.ToString()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch_ = &batch;
    cache_ = &cache;
    io_ = io;
    pending_ = tp - 1;
    ++step_;
  }
  start_cv_.notify_all();
  RunRank(0, logits, io.output);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    batch_ = nullptr;
    cache_ = nullptr;
  }
  // Every rank has returned: nobody is inside a collective, so a CPU group's abort can be
  // cleared.
  if (group_ != nullptr && group_->aborted()) group_->Reset();
  absl::Status result;
  for (const auto& rank : ranks_) {
    if (rank->status.ok()) continue;
    // Report the rank that failed, not the ones it unblocked.
    if (result.ok() || (absl::IsAborted(result) && !absl::IsAborted(rank->status))) {
      result = rank->status;
    }
  }
  // INVALID_ARGUMENT is a bad batch every rank refused before any collective: nothing to abort.
  if (!result.ok() && group_ == nullptr && !absl::IsInvalidArgument(result) &&
      !SendFailedAfterCollectives(result)) {
    broken_ = result;
  }
  return result;
}

bool TensorParallelModel::SendFailedAfterCollectives(const absl::Status& status) const {
  return weights_->config.first_stage() && IsStageLinkError(status);
}

absl::Status TensorParallelModel::EnableDecodeGraphs(const DecodeGraphOptions& options) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (absl::Status s = ranks_[r]->model->EnableDecodeGraphs(options); !s.ok()) {
      DisableDecodeGraphs();
      return r == 0 ? s : absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void TensorParallelModel::DisableDecodeGraphs() {
  for (auto& rank : ranks_) rank->model->DisableDecodeGraphs();
}

bool TensorParallelModel::decode_graphs_enabled() const {
  for (const auto& rank : ranks_) {
    if (!rank->model->decode_graphs_enabled()) return false;
  }
  return true;
}

std::string TensorParallelModel::decode_graph_error() const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::string& e = ranks_[r]->model->decode_graph_error();
    if (!e.empty()) return absl::StrCat("rank ", r, ": ", e);
  }
  return "";
}

DecodeGraphStats TensorParallelModel::decode_graph_stats(int r) const {
  return ranks_[r]->model->decode_graph_stats();
}

absl::Status TensorParallelModel::SetStageLinks(std::vector<std::shared_ptr<StageLink>> links) {
  if (!links.empty() && links.size() != ranks_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(links.size(), " stage links for ", ranks_.size(), " ranks"));
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r]->link = links.empty() ? nullptr : std::move(links[r]);
  }
  return absl::OkStatus();
}

void TensorParallelModel::RunRank(int r, float* logits, float* stage_output) {
  Rank& rank = *ranks_[r];
  rank.status = rank.model->Forward(*batch_, cache_->rank(r), logits,
                                    StageIo{io_.input, stage_output, rank.link.get()});
  // Every rank checks the same batch the same way, so a refused batch (INVALID_ARGUMENT) stops
  // all of them before their first collective; anything else may leave the others waiting.
  if (!rank.status.ok() && !absl::IsInvalidArgument(rank.status) &&
      !SendFailedAfterCollectives(rank.status)) {
    rank.comm->Abort();
  }
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
    RunRank(r, nullptr, nullptr);
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --pending_ == 0;
    }
    if (last) done_cv_.notify_one();
  }
}

}  // namespace kvserve
