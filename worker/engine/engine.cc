#include "worker/engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "kernels/cpu/cpu_isa.h"
#include "worker/planner/capacity_planner.h"
#include "worker/tp/shard.h"

namespace kvserve {

/// A request inside the engine: its samples and where their output goes.
struct RequestState {
  EngineRequest request;
  /// Owner of the request's staged KV blocks (KvTransferSource).
  int64_t serial = 0;
  std::shared_ptr<RequestStream> stream;
  std::vector<std::unique_ptr<Sequence>> sequences;
  /// The compiled EngineRequest::constraint; null when there is none.
  std::shared_ptr<const constraint::CompiledConstraint> constraint;
  bool forked = false;
  int32_t samples_unfinished = 0;
  // Metrics timestamps (epoch: not reached yet).
  std::chrono::steady_clock::time_point arrival{};
  std::chrono::steady_clock::time_point first_scheduled{};
  std::chrono::steady_clock::time_point first_token{};
  std::chrono::steady_clock::time_point last_token{};
};

namespace {

// Decode batches above this run eagerly: bigger graphs cost capture time and memory for steps
// whose launch overhead is small next to their work anyway.
constexpr int32_t kMaxDecodeGraphBatch = 512;

// Bytes of `w` on a device backend with FP8 weights (BackendOptions::fp8_weights): each float
// layer matrix but the routers (kept as stored) at one byte a weight plus a 4-byte scale a row;
// the rest as stored.
int64_t Fp8WeightBytes(const ModelWeights& w) {
  std::set<const void*> routers;
  for (const LayerWeights& l : w.layers) routers.insert(l.router.data);
  int64_t total = w.TotalBytes();
  w.ForEachLayerTensor([&](const TensorView& t) {
    if (t.shape.size() == 2 && routers.count(t.data) == 0 &&
        (t.dtype == DType::kF32 || t.dtype == DType::kF16 || t.dtype == DType::kBF16)) {
      total -= t.nbytes() - t.shape[0] * (t.shape[1] + 4);
    }
  });
  return total;
}

// What the capacity planner needs to know of a loaded model: its shapes, and its bytes as the
// backend holds them.
ModelSpec SpecOf(const ModelWeights& w, bool fp8_weights) {
  const ModelConfig& c = w.config;
  ModelSpec spec;
  spec.model_type = c.architecture;
  spec.source = w.source_path;
  spec.num_layers = c.num_layers;
  spec.hidden_size = c.hidden_size;
  spec.num_heads = c.num_heads;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.intermediate_size = c.intermediate_size;
  spec.vocab_size = c.vocab_size;
  spec.tie_word_embeddings = c.tie_word_embeddings;
  spec.qkv_bias = c.qkv_bias;
  spec.o_bias = c.o_bias;
  spec.qk_norm = c.qk_norm;
  spec.max_position_embeddings = c.max_position_embeddings;
  spec.sliding_window = c.sliding_window;
  spec.moe.num_routed_experts = c.num_experts;
  spec.moe.num_shared_experts = c.n_shared_experts;
  spec.moe.moe_intermediate_size = c.moe_intermediate_size;
  spec.moe.num_experts_per_tok = c.num_experts_per_tok;
  spec.moe.first_k_dense_replace = c.first_k_dense_replace;
  spec.moe.moe_layer_freq = c.moe_layer_freq;
  spec.moe.router_bias = c.moe_topk == MoeTopk::kNoAuxTc;
  spec.mla.kv_lora_rank = c.kv_lora_rank;
  spec.mla.q_lora_rank = c.q_lora_rank;
  spec.mla.qk_rope_head_dim = c.qk_rope_head_dim;
  spec.mla.qk_nope_head_dim = c.qk_nope_head_dim;
  spec.mla.v_head_dim = c.v_head_dim;
  ShardedSizes bytes;
  bytes.replicated = fp8_weights ? Fp8WeightBytes(w) : w.TotalBytes();  // one rank holds all
  spec.tensor_bytes = bytes;
  return spec;
}

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// MemAvailable of /proc/meminfo in bytes, 0 when unknown.
int64_t AvailableMemoryBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  int64_t kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long long v = 0;
    if (std::sscanf(line, "MemAvailable: %lld kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

int64_t SystemMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? int64_t{pages} * page_size : 0;
}

}  // namespace

int64_t DefaultKvBudget(int64_t full_bytes, int64_t available_bytes, bool host_pool) {
  int64_t budget = std::min<int64_t>(full_bytes, int64_t{4} << 30);
  if (host_pool && available_bytes > 0) budget = std::min(budget, available_bytes / 2);
  return budget;
}

absl::StatusOr<int64_t> Engine::PoolBlocks(const ModelWeights& weights,
                                           const EngineOptions& options, bool host_pool,
                                           int activation_bytes) {
  if (options.num_kv_blocks > 0) return options.num_kv_blocks;
  const ModelConfig& config = weights.config;
  const ModelSpec spec = SpecOf(weights, options.fp8_weights && !host_pool);
  int64_t budget = options.kv_cache_memory;
  if (budget == 0 && options.gpu_memory_utilization > 0) {
    PlanOptions plan;
    plan.gpu_memory_bytes =
        options.device_memory > 0 ? options.device_memory : SystemMemoryBytes();
    plan.gpu_memory_utilization = options.gpu_memory_utilization;
    if (options.device_memory_per_rank) plan.tp = options.tensor_parallel_size;
    plan.kv_dtype = options.kv_cache_dtype;
    plan.block_size = options.block_size;
    plan.max_num_batched_tokens = options.scheduler.max_num_batched_tokens;
    plan.max_num_seqs = options.scheduler.max_num_seqs;
    plan.activation_bytes = activation_bytes;
    absl::StatusOr<Plan> p = PlanCapacity(spec, plan);
    if (!p.ok()) return p.status();
    return p->chosen().num_kv_blocks;
  }
  if (budget == 0) {
    absl::StatusOr<int64_t> per_token =
        KvBytesPerToken(spec, options.kv_cache_dtype, options.tensor_parallel_size);
    if (!per_token.ok()) return per_token.status();
    const int64_t full =
        int64_t{options.scheduler.max_num_seqs} * config.max_position_embeddings * *per_token *
        options.tensor_parallel_size;
    budget = DefaultKvBudget(full, AvailableMemoryBytes(), host_pool);
  }
  absl::StatusOr<int64_t> blocks =
      KvBlocksForBudget(spec, options.kv_cache_dtype, options.tensor_parallel_size,
                        options.block_size, budget / options.tensor_parallel_size);
  if (!blocks.ok()) return blocks.status();
  if (*blocks < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV budget of ", budget, " bytes holds ", *blocks,
        " blocks; need at least 2 (one is reserved)"));
  }
  return *blocks;
}

absl::Status EngineOptions::Validate() const {
  if (block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("block_size must be in [1, 1024], got ",
                                                   block_size));
  }
  if (num_kv_blocks < 0) return absl::InvalidArgumentError("num_kv_blocks must be >= 0");
  if (kv_cache_memory < 0) return absl::InvalidArgumentError("kv_cache_memory must be >= 0");
  if (!(gpu_memory_utilization >= 0.0 && gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_memory_utilization must be in [0, 1], got ", gpu_memory_utilization));
  }
  if (max_n <= 0) return absl::InvalidArgumentError("max_n must be positive");
  if (kv_offload.enabled() && !scheduler.enable_prefix_caching) {
    return absl::InvalidArgumentError(
        "--kv-offload-memory and --kv-disk-dir keep prefix-cache blocks: they need prefix caching "
        "(drop --no-prefix-caching)");
  }
  if (pipeline != nullptr && kv_offload.enabled()) {
    return absl::InvalidArgumentError(
        "--kv-offload-memory and --kv-disk-dir are not available to pipeline groups yet (each "
        "block's K/V is spread over the stages)");
  }
  if (tensor_parallel_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel_size (--tp) must be >= 1, got ",
                                                   tensor_parallel_size));
  }
  return scheduler.Validate();
}

Engine::Engine(const LoadedModel* model, const EngineOptions& options)
    : model_(model), options_(options) {}

DecodeGraphOptions Engine::DecodeGraphOptionsFor(const ModelWeights& weights) const {
  DecodeGraphOptions graphs;
  graphs.max_batch = std::min(options_.scheduler.max_num_seqs, kMaxDecodeGraphBatch);
  graphs.max_context_len = weights.config.max_position_embeddings;
  graphs.block_table_stride =
      (graphs.max_context_len + options_.block_size - 1) / options_.block_size;
  return graphs;
}

absl::Status Engine::CreateModel() {
  const ModelWeights& weights = *model_->weights;
  EngineOptions sizing = options_;
  if (options_.device != DeviceChoice::kCpu) {
    BackendOptions backend_options;
    backend_options.enable_graphs = options_.cuda_graphs;
    backend_options.keep_f32_weights = options_.keep_f32_weights;
    backend_options.fp8_weights = options_.fp8_weights;
    // kAuto comes back as the CPU backend (having said why) when CUDA is unusable.
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        CreateBackend(options_.device, backend_options, nullptr);
    if (!backend.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device ", std::string(DeviceChoiceName(options_.device)), ": ",
                       backend.status().message()));
    }
    if (!(*backend)->host_memory()) backend_ = std::move(*backend);
  }
  if (options_.fp8_weights && backend_ == nullptr) {
    return absl::InvalidArgumentError(
        "--quantization fp8 runs on CUDA devices (sm_89 or newer); this engine runs on the CPU "
        "(--device cpu, or --device auto without a usable GPU)");
  }
  // The planner sizes a device pool from the memory free on the device before the weights land
  // (it subtracts the weights and the activation peak itself).
  if (backend_ != nullptr && sizing.gpu_memory_utilization > 0 && sizing.device_memory == 0) {
    absl::StatusOr<std::pair<int64_t, int64_t>> memory = backend_->MemoryInfo();
    if (!memory.ok()) return memory.status();
    sizing.device_memory = memory->first;
  }
  const bool host_pool = backend_ == nullptr;  // the KV pool lives in host memory
  // The planner's activation buffers in the backend's activation dtype (bf16 on CUDA).
  const int activation_bytes =
      backend_ != nullptr && backend_->activation_dtype() == DType::kBF16 ? 2 : 4;
  const ModelWeights* own = &weights;
  if (options_.pipeline != nullptr) {
    // A pipeline leader runs stage 0's layers; its pool is sized for them.
    const StageLayers& layers = options_.pipeline->stages().front();
    absl::StatusOr<std::unique_ptr<ModelWeights>> stage =
        StageWeights(weights, layers.first, layers.count);
    if (!stage.ok()) return stage.status();
    stage_weights_ = std::move(*stage);
    own = stage_weights_.get();
  }
  if (backend_ == nullptr || options_.tensor_parallel_size > 1 || options_.pipeline != nullptr) {
    TensorParallelOptions tp_options;
    tp_options.tp_size = options_.tensor_parallel_size;
    tp_options.num_threads = options_.num_threads;
    if (backend_ != nullptr) {
      // CUDA ranks: rank r on device r (rank 0 keeps the backend opened above), NCCL between
      // them. The engine keeps no backend of its own then.
      BackendOptions rank_options;
      rank_options.enable_graphs = options_.cuda_graphs;
      rank_options.keep_f32_weights = options_.keep_f32_weights;
      rank_options.fp8_weights = options_.fp8_weights;
      rank_options.simulator = options_.device == DeviceChoice::kCudaSim;
      UseDeviceRanks(&tp_options, rank_options, std::move(backend_));
      device_name_ = options_.device == DeviceChoice::kCudaSim ? "cuda-sim" : "cuda";
      // Each GPU holds a 1/tp shard of the weights and of every KV block.
      sizing.device_memory_per_rank = true;
    }
    absl::StatusOr<std::unique_ptr<TensorParallelModel>> llama =
        TensorParallelModel::Create(own, tp_options);
    if (!llama.ok()) return llama.status();
    llama_ = std::move(*llama);
    absl::StatusOr<int64_t> num_blocks = PoolBlocks(*own, sizing, host_pool, activation_bytes);
    if (!num_blocks.ok()) return num_blocks.status();
    if (options_.pipeline != nullptr) {
      // Every stage holds the pool's blocks for its own layers, on memory like the leader's:
      // the group gets what the stage that fits the fewest blocks can hold (the one with the
      // most layers or the largest weights), as `kvserve plan --pp` reports.
      for (const StageLayers& layers : options_.pipeline->stages()) {
        absl::StatusOr<std::unique_ptr<ModelWeights>> stage =
            StageWeights(weights, layers.first, layers.count);
        if (!stage.ok()) return stage.status();
        absl::StatusOr<int64_t> blocks = PoolBlocks(**stage, sizing, host_pool, activation_bytes);
        if (!blocks.ok()) return blocks.status();
        num_blocks = std::min(*num_blocks, *blocks);
      }
    }
    absl::StatusOr<std::unique_ptr<ShardedKvCache>> cache =
        llama_->CreateKvCache(*num_blocks, options_.block_size, options_.kv_cache_dtype);
    if (!cache.ok()) return cache.status();
    cache_ = std::move(*cache);
    num_kv_blocks_ = *num_blocks;
    if (!host_pool && options_.cuda_graphs && options_.pipeline == nullptr) {
      // NCCL ranks enqueue their all-reduce on their own streams: their decode steps replay too.
      if (absl::Status s = llama_->EnableDecodeGraphs(DecodeGraphOptionsFor(*own)); !s.ok()) {
        logging::Log(
            logging::LogLevel::kWarning, "engine",
            absl::StrCat("decode steps run without CUDA graphs: ", std::string(s.message())));
      }
    }
    if (options_.pipeline != nullptr) {
      if (tp_options.stage_links && options_.pipeline_device_hand_over) {
        options_.pipeline->EnableDeviceHandOver(options_.tensor_parallel_size, device_name_,
                                                tp_options.stage_links);
      }
      options_.pipeline->SetKvPool(*num_blocks, options_.block_size, options_.kv_cache_dtype);
      pipeline_losses_seen_ = options_.pipeline->losses();
    }
    return absl::OkStatus();
  }
  device_name_ = options_.device == DeviceChoice::kCudaSim ? "cuda-sim" : "cuda";
  absl::StatusOr<int64_t> num_blocks =
      PoolBlocks(weights, sizing, /*host_pool=*/false, activation_bytes);
  if (!num_blocks.ok()) return num_blocks.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> llama =
      LlamaModel::Create(&weights, nullptr, nullptr, backend_.get());
  if (!llama.ok()) return llama.status();
  device_model_ = std::move(*llama);
  if (options_.device_sampling) device_sampler_ = std::make_unique<DeviceSampler>(backend_.get());
  if (options_.cuda_graphs && backend_->supports_graphs()) {
    if (absl::Status s = device_model_->EnableDecodeGraphs(DecodeGraphOptionsFor(weights));
        !s.ok()) {
      logging::Log(logging::LogLevel::kWarning, "engine",
                   absl::StrCat("decode steps run without CUDA graphs: ", std::string(s.message())));
    }
  }
  absl::StatusOr<std::unique_ptr<KvCache>> cache =
      KvCache::Create(weights.config, *num_blocks, options_.block_size, options_.kv_cache_dtype,
                      backend_.get());
  if (!cache.ok()) return cache.status();
  device_cache_ = std::move(*cache);
  num_kv_blocks_ = *num_blocks;
  return absl::OkStatus();
}

void Engine::DescribeKvPool() {
  KvBlockAccess& access = block_access_;
  std::string layout;
  const ModelConfig& config = model_->config();
  auto describe = [&](const KvCache& rank0, int tp) {
    return KvLayoutDescription(config.num_layers, rank0.layout().num_kv_heads,
                               rank0.layout().head_dim, config.kv_cache_has_v(),
                               std::string(KvCacheDTypeName(options_.kv_cache_dtype)),
                               options_.block_size, tp, access.block_bytes);
  };
  if (device_cache_ != nullptr) {
    KvCache* cache = device_cache_.get();
    access.block_bytes = cache->BlockBytes();
    access.read = [cache](BlockId b, uint8_t* dst) { return cache->ReadBlock(b, dst); };
    access.write = [cache](BlockId b, const uint8_t* src) { return cache->WriteBlock(b, src); };
    access.finish = [cache] { return cache->FinishCopies(); };
    access.host_memory = cache->backend();
    layout = describe(*cache, 1);
  } else {
    ShardedKvCache* cache = cache_.get();
    access.block_bytes = cache->BlockBytes();
    access.read = [cache](BlockId b, uint8_t* dst) { return cache->ReadBlock(b, dst); };
    access.write = [cache](BlockId b, const uint8_t* src) { return cache->WriteBlock(b, src); };
    access.finish = [cache] { return cache->FinishCopies(); };
    access.host_memory = cache->rank(0).backend();
    layout = describe(cache->rank(0), cache->tp_size());
    if (options_.pipeline != nullptr) {
      // This process holds stage 0's part of each block only: no block leaves or enters whole.
      auto refuse = [](BlockId) {
        return absl::FailedPreconditionError(
            "KV blocks of a pipeline group are spread over its stages and cannot be moved");
      };
      access.read = [refuse](BlockId b, uint8_t*) { return refuse(b); };
      access.write = [refuse](BlockId b, const uint8_t*) { return refuse(b); };
      absl::StrAppend(&layout, " pp=", DescribeStageLayers(options_.pipeline->stages()));
    }
  }
  kv_layout_ = std::move(layout);
}

const KvTierIdentity& Engine::kv_identity() const {
  std::call_once(kv_identity_once_, [this] {
    // Blocks moving between workers must also have been computed by the same kernels, or the
    // receiver's tokens could differ from its own computation's in the last bits.
    kv_identity_ = KvTierIdentity{
        ModelWeightsFingerprint(*model_->weights),
        absl::StrCat(kv_layout_, " compute=", device_name_,
                     device_name_ == "cpu"
                         ? absl::StrCat("/", std::string(cpu::CpuIsaName(cpu::ActiveCpuIsa())))
                         : std::string())};
  });
  return kv_identity_;
}

absl::Status Engine::CreateOffloader() {
  DescribeKvPool();
  if (options_.kv_offload.enabled()) {
    // The disk tier's identity leaves the compute path out: a restart on the same machine
    // computes the same bytes.
    const KvTierIdentity disk_identity{ModelWeightsFingerprint(*model_->weights), kv_layout_};
    absl::StatusOr<std::unique_ptr<KvOffloader>> offloader =
        KvOffloader::Create(options_.kv_offload, block_access_, disk_identity);
    if (!offloader.ok()) return offloader.status();
    offloader_ = std::move(*offloader);
  }
  transfer_ = std::make_unique<KvTransferSource>(block_access_, offloader_.get());
  kv_->SetBlockSource(transfer_.get(), /*record_stored=*/offloader_ != nullptr);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const LoadedModel* model,
                                                       const EngineOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<Engine> engine(new Engine(model, options));
  const ModelConfig& config = model->config();
  if (absl::Status s = engine->CreateModel(); !s.ok()) return s;

  KvManagerOptions kv_options;
  kv_options.num_blocks = static_cast<int32_t>(engine->num_kv_blocks_);
  kv_options.block_size = options.block_size;
  kv_options.enable_prefix_caching = options.scheduler.enable_prefix_caching;
  kv_options.sliding_window = config.sliding_window;
  absl::StatusOr<KvManager> kv = KvManager::Create(kv_options);
  if (!kv.ok()) return kv.status();
  engine->kv_ = std::make_unique<KvManager>(std::move(*kv));
  if (absl::Status s = engine->CreateOffloader(); !s.ok()) return s;
  engine->scheduler_ = std::make_unique<Scheduler>(options.scheduler, engine->kv_.get());
  engine->stop_token_ids_ = model->StopTokenIds();
  engine->PublishStats();
  if (options.num_threads != 1) {
    engine->sampling_pool_ = std::make_unique<cpu::ThreadPool>(options.num_threads);
  }
  if (options.run_loop_thread) engine->thread_ = std::thread([e = engine.get()] { e->Loop(); });
  return engine;
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Exports still queued answer with what the pool holds (the loop is gone, so no step races).
  RunTasks();
  for (auto& s : subscribers_) s->Close();
  for (auto& s : new_subscribers_) s->Close();
  // Requests still queued or running end with CANCELLED so no reader waits forever.
  for (auto& state : inbox_) {
    for (int i = 0; i < state->request.n; ++i) {
      RequestOutput out;
      out.sample_index = i;
      out.finished = true;
      out.status = absl::CancelledError("engine shut down");
      state->stream->Push(std::move(out));
    }
  }
  std::vector<RequestState*> live;
  for (auto& [id, state] : requests_) live.push_back(state.get());
  for (RequestState* state : live) AbortRequest(state, absl::CancelledError("engine shut down"));
}

void Engine::ExportKvBlocks(std::vector<BlockKey> keys, int32_t first_block, int64_t max_bytes,
                            std::function<void(std::vector<KvBlockPayload>)> done) {
  auto task = [this, keys = std::move(keys), first_block, max_bytes, done = std::move(done)] {
    std::vector<KvBlockPayload> blocks =
        transfer_->Export(kv_->pool(), keys, first_block, max_bytes);
    {
      // Counted before the blocks leave: whoever receives them then sees the export in stats()
      // (the loop's own PublishStats could otherwise come after the receiver has finished).
      std::lock_guard<std::mutex> lock(mu_);
      stats_.kv_transfer = transfer_->stats();
    }
    done(std::move(blocks));
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void Engine::RunTasks() {
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
}

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(EngineRequest request) {
  const ModelConfig& config = model_->config();
  if (request.prompt_ids.empty()) return absl::InvalidArgumentError("prompt is empty");
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_ids.size());
  if (prompt_len >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", prompt_len,
                                                   " tokens; the model's context is ",
                                                   config.max_position_embeddings));
  }
  for (const KvBlockPayload& b : request.kv_blocks) {
    if (static_cast<int64_t>(b.bytes.size()) != kv_block_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("kv_blocks: block ", b.index, " has ",
                                                     b.bytes.size(), " bytes; a block has ",
                                                     kv_block_bytes()));
    }
  }
  for (TokenId id : request.prompt_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids: id ", id,
                                                     " is outside the vocabulary of ",
                                                     config.vocab_size));
    }
  }
  if (request.n < 1 || request.n > options_.max_n) {
    return absl::InvalidArgumentError(absl::StrCat("n must be in [1, ", options_.max_n, "], got ",
                                                   request.n));
  }
  if (absl::Status s = request.params.Validate(config.vocab_size); !s.ok()) return s;
  if (request.params.max_tokens > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be at most the model's context of ",
                     config.max_position_embeddings, " tokens, got ", request.params.max_tokens));
  }
  // The prompt plus the first generated token must fit in the pool on its own.
  const int64_t needed = (prompt_len + 1 + options_.block_size - 1) / options_.block_size;
  const int64_t usable = num_kv_blocks_ - 1;
  if (needed > usable) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt of ", prompt_len, " tokens needs ", needed, " KV blocks; the pool has ", usable));
  }
  std::shared_ptr<const constraint::CompiledConstraint> compiled;
  if (request.constraint.active()) {
    if (model_->tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "constrained decoding needs the model's tokenizer, and this model has none");
    }
    absl::StatusOr<std::shared_ptr<const constraint::CompiledConstraint>> c =
        constraint_compiler_.Compile(request.constraint);
    if (!c.ok()) return c.status();
    compiled = std::move(*c);
    std::call_once(token_trie_once_, [this] {
      token_trie_ = constraint::TokenTrie::FromTokenizer(*model_->tokenizer);
    });
  }
  auto state = std::make_unique<RequestState>();
  state->constraint = std::move(compiled);
  state->stream = std::make_shared<RequestStream>(request.n);
  state->samples_unfinished = request.n;
  state->request = std::move(request);
  state->arrival = Clock::now();
  std::shared_ptr<RequestStream> stream = state->stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return absl::UnavailableError("engine is shutting down");
    if (draining_) return absl::UnavailableError("worker is draining: not accepting requests");
    if (options_.pipeline != nullptr && !options_.pipeline->formed()) {
      return absl::UnavailableError(options_.pipeline->NotFormedReason());
    }
    if (!live_ids_.emplace(state->request.request_id, true).second) {
      return absl::AlreadyExistsError(absl::StrCat("request_id '", state->request.request_id,
                                                   "' is already running"));
    }
    inbox_.push_back(std::move(state));
  }
  cv_.notify_all();
  return stream;
}

void Engine::Abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(request_id);
  }
  cv_.notify_all();
}

void Engine::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Engine::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_ids_.empty();
}

void Engine::SetObserver(std::shared_ptr<EngineObserver> observer) {
  std::lock_guard<std::mutex> lock(mu_);
  shared_observer_ = std::move(observer);
}

std::shared_ptr<KvEventStream> Engine::SubscribeKvEvents() {
  auto stream = std::make_shared<KvEventStream>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    new_subscribers_.push_back(stream);
  }
  cv_.notify_all();
  return stream;
}

void Engine::PublishKvEvents() {
  std::vector<std::shared_ptr<KvEventStream>> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(new_subscribers_);
  }
  std::vector<KvEvent> events = kv_->TakeEvents();
  if (offloader_ != nullptr) {
    std::vector<KvEvent> tiers = offloader_->TakeEvents();
    events.insert(events.end(), tiers.begin(), tiers.end());
  }
  if (!events.empty()) {
    std::erase_if(subscribers_, [&](const std::shared_ptr<KvEventStream>& s) {
      return !s->Push(KvEventBatch{false, events});
    });
  }
  for (auto& s : fresh) {
    // The snapshot is taken on the loop thread, so it and the deltas after it are consistent.
    KvEventBatch snapshot{true, {}};
    const BlockPool& pool = kv_->pool();
    for (BlockId b = 1; b <= pool.capacity(); ++b) {
      if (std::optional<BlockKey> key = pool.key(b)) {
        snapshot.events.push_back({KvEvent::Type::kStored, *key});
      }
    }
    if (offloader_ != nullptr) offloader_->AppendSnapshot(&snapshot.events);
    if (s->Push(std::move(snapshot))) subscribers_.push_back(std::move(s));
  }
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::Loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        return stop_ || !inbox_.empty() || !aborts_.empty() || !new_subscribers_.empty() ||
               !tasks_.empty() || scheduler_->num_running() + scheduler_->num_waiting() > 0;
      });
      if (stop_) return;
    }
    RunTasks();
    // Before new requests join: they must not be failed for a loss they never saw.
    if (options_.pipeline != nullptr) HandlePipelineLoss();
    DrainInbox();
    if (scheduler_->num_running() + scheduler_->num_waiting() > 0) Step();
    PublishKvEvents();
    PublishStats();
  }
}

bool Engine::StepOnce() {
  const Clock::time_point start = Clock::now();
  RunTasks();
  if (options_.pipeline != nullptr) HandlePipelineLoss();
  DrainInbox();
  const bool busy = scheduler_->num_running() + scheduler_->num_waiting() > 0;
  if (busy) Step();
  PublishKvEvents();
  if (busy) step_seconds_ += SecondsBetween(start, Clock::now());
  PublishStats();
  return busy;
}

void Engine::DrainInbox() {
  std::vector<std::unique_ptr<RequestState>> incoming;
  std::vector<std::string> aborts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(inbox_);
    aborts.swap(aborts_);
    observer_ = shared_observer_;
  }
  for (auto& state : incoming) {
    const EngineRequest& r = state->request;
    auto seq = std::make_unique<Sequence>();
    seq->id = next_seq_id_++;
    seq->request = state.get();
    seq->tokens = r.prompt_ids;
    seq->cache_salt = r.cache_salt;
    seq->num_prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
    Sequence* raw = seq.get();
    state->sequences.push_back(std::move(seq));
    state->serial = next_request_serial_++;
    if (!state->request.kv_blocks.empty()) {
      transfer_->Stage(state->serial, std::move(state->request.kv_blocks));
      state->request.kv_blocks.clear();
    }
    const std::string id = r.request_id;
    requests_[id] = std::move(state);
    scheduler_->AddWaiting(raw);
  }
  // An aborted request's samples may be in a step in flight: let those steps land first.
  if (!aborts.empty()) CompleteAll();
  for (const std::string& id : aborts) {
    auto it = requests_.find(id);
    if (it != requests_.end()) {
      AbortRequest(it->second.get(), absl::CancelledError(absl::StrCat("request '", id, "' aborted")));
    }
  }
}

void Engine::HandlePipelineLoss() {
  const uint64_t losses = options_.pipeline->losses();
  if (losses == pipeline_losses_seen_) return;
  pipeline_losses_seen_ = losses;
  // Steps in flight fail with the stage (their requests end first).
  CompleteAll();
  std::vector<RequestState*> live;
  for (auto& [id, state] : requests_) live.push_back(state.get());
  for (RequestState* state : live) {
    AbortRequest(state, absl::UnavailableError(
                            "a pipeline stage of this worker's group was lost; retry the request"));
  }
  pipeline_copies_.clear();
  const int32_t forgotten = kv_->ResetPrefixCache();
  logging::Log(logging::LogLevel::kWarning, "engine",
               "pipeline stage lost: requests failed, prefix cache forgotten",
               {{"requests", static_cast<int64_t>(live.size())}, {"cached_blocks", forgotten}});
}

void Engine::Step() {
  const bool pipelined = options_.pipeline != nullptr;
  SchedulerOutput out = scheduler_->Schedule(pipelined ? MicroBatchLimit() : INT32_MAX);
  for (const BlockCopy& copy : kv_->TakeCopies()) {
    if (device_cache_ != nullptr) {
      device_cache_->CopyBlock(copy.src, copy.dst);
    } else {
      cache_->CopyBlock(copy.src, copy.dst);
      if (pipelined) pipeline_copies_.push_back(copy);
    }
  }
  if (out.scheduled.empty()) {
    // Everything runnable is in flight: wait for the oldest step.
    if (!in_flight_.empty()) {
      CompleteOldest();
      return;
    }
    // Nothing runs and the oldest waiting sequence does not fit in an empty pool: it grew past
    // the pool's capacity (its output is kept). End it rather than spin.
    if (scheduler_->num_running() == 0 && scheduler_->front_waiting() != nullptr) {
      RequestOutput final_output;
      final_output.finish_reason = FinishReason::kLength;
      FinishSequence(scheduler_->front_waiting(), std::move(final_output));
    }
    return;
  }
  Launch(std::move(out));
  // One step at a time in one process; a pipeline keeps one micro-batch per stage in flight, so
  // the leader computes one while the stages compute the others.
  const size_t depth = pipelined ? options_.pipeline->stages().size() : 1;
  while (in_flight_.size() >= depth) CompleteOldest();
}

int32_t Engine::MicroBatchLimit() const {
  // Split what can run now evenly over the micro-batch slots still free.
  const int32_t depth = static_cast<int32_t>(options_.pipeline->stages().size());
  const int32_t slots = std::max(1, depth - static_cast<int32_t>(in_flight_.size()));
  const int32_t admissible =
      std::min(scheduler_->num_waiting(),
               std::max(0, options_.scheduler.max_num_seqs - scheduler_->num_running()));
  const int32_t ready = scheduler_->num_schedulable() + admissible;
  return std::max(1, (ready + slots - 1) / slots);
}

void Engine::Launch(SchedulerOutput out) {
  const bool pipelined = options_.pipeline != nullptr;
  Flight f;
  f.out = std::move(out);
  builder_.Clear();
  const Clock::time_point step_start = Clock::now();
  for (const ScheduledSequence& s : f.out.scheduled) {
    Sequence* seq = s.seq;
    f.metrics.num_tokens += s.num_tokens;
    if (seq->num_computed < seq->num_prompt_tokens) {
      f.prompt_tokens += std::min(s.num_tokens, seq->num_prompt_tokens - seq->num_computed);
    }
    if (seq->request->first_scheduled == Clock::time_point{}) {
      seq->request->first_scheduled = step_start;
    }
    std::span<const TokenId> tokens(seq->tokens.data() + seq->num_computed, s.num_tokens);
    builder_.AddSequence(tokens, seq->num_computed, kv_->BlockTable(seq->id), options_.block_size,
                         s.wants_logits);
    if (s.wants_logits) f.sampled.push_back(seq);
    seq->in_flight = pipelined;
  }
  // The logits stay on the device when any row can be sampled there; only the rows of the
  // requests the device sampler cannot serve come to the host (one vocabulary row each).
  if (device_sampler_ != nullptr) {
    for (size_t i = 0; i < f.sampled.size(); ++i) {
      if (!DeviceSampleable(f.sampled[i])) f.host_rows.push_back(static_cast<int64_t>(i));
    }
    f.device_sampling = f.host_rows.size() < f.sampled.size();
    if (!f.device_sampling) f.host_rows.clear();  // every row: the plain host path
  }
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  f.logits.resize((f.device_sampling ? f.host_rows.size() : f.sampled.size()) * vocab);
  const Clock::time_point forward_start = Clock::now();
  const ForwardBatch batch = builder_.Build();
  if (f.device_sampling) {
    f.status = device_model_->ForwardKeepingLogits(batch, *device_cache_);
  } else if (device_model_ != nullptr) {
    f.status = device_model_->Forward(batch, *device_cache_, f.logits.data());
  } else if (pipelined && options_.pipeline->device_hand_over()) {
    // Every stage gets the step first, so that stage 1 waits for this stage's hand-over while
    // this stage computes it; the hand-over then goes device to device.
    std::vector<std::shared_ptr<StageLink>> links;
    const uint64_t formation = options_.pipeline->LeaderLinks(&links);
    if (formation != links_formation_) {
      links_formation_ = formation;
      f.status = llama_->SetStageLinks(std::move(links));
    }
    if (f.status.ok()) {
      f.remote = options_.pipeline->SubmitStages(batch, pipeline_copies_, {});
      f.status = llama_->Forward(batch, *cache_, nullptr, StageIo{});
    }
    pipeline_copies_.clear();
  } else if (pipelined) {
    // Stage 0 here; the hand-over and the block copies go on to the other stages.
    hand_over_.resize(static_cast<size_t>(
        StageIoFloats(static_cast<int64_t>(batch.tokens.size()), model_->config().hidden_size)));
    f.status = llama_->Forward(batch, *cache_, nullptr, StageIo{nullptr, hand_over_.data()});
    if (f.status.ok())
      f.remote = options_.pipeline->SubmitStages(batch, pipeline_copies_, hand_over_);
    // Sent with this step, or lost with the stage that should have applied them.
    pipeline_copies_.clear();
  } else {
    f.status = llama_->Forward(batch, *cache_, f.logits.data());
  }
  f.forward_seconds = SecondsBetween(forward_start, Clock::now());
  if (pipelined) local_stage_seconds_ += f.forward_seconds;
  in_flight_.push_back(std::move(f));
}

void Engine::CompleteAll() {
  while (!in_flight_.empty()) CompleteOldest();
}

void Engine::CompleteOldest() {
  Flight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  step_metrics_ = std::move(f.metrics);
  in_step_ = true;
  absl::Status status = f.status;
  if (status.ok() && f.remote != nullptr) {
    const Clock::time_point wait_start = Clock::now();
    status = options_.pipeline->AwaitStages(*f.remote, f.logits.data());
    f.forward_seconds += SecondsBetween(wait_start, Clock::now());
  }
  for (const ScheduledSequence& s : f.out.scheduled) s.seq->in_flight = false;
  FinishStep(f, status);
  ++num_steps_;
  if (observer_ != nullptr) observer_->OnStep(step_metrics_);
  // The step's final outputs go out only now, so that a reader who sees its request finish also
  // sees the step's tokens in the metrics.
  in_step_ = false;
  for (auto& [stream, output] : finished_outputs_) stream->Push(std::move(output));
  finished_outputs_.clear();
  if (options_.check_invariants) CheckInvariants();
}

void Engine::FinishStep(Flight& f, const absl::Status& status) {
  const SchedulerOutput& out = f.out;
  const double forward = f.forward_seconds;
  forward_seconds_ += forward;
  // Steps that computed a few prompt tokens among decodes say little about prefill speed
  // (they would understate it): only those with at least four blocks' worth count.
  if (f.prompt_tokens >= 4 * options_.block_size) {
    prefill_tokens_ += f.prompt_tokens;
    prefill_seconds_ += forward;
  }
  if (!graph_failure_logged_) {
    const std::string error = device_model_ != nullptr ? device_model_->decode_graph_error()
                              : llama_ != nullptr      ? llama_->decode_graph_error()
                                                       : std::string();
    if (!error.empty()) {
      graph_failure_logged_ = true;
      logging::Log(logging::LogLevel::kWarning, "engine",
                   absl::StrCat("CUDA graphs switched off, decode steps run eagerly: ", error));
    }
  }
  if (!status.ok()) {
    // A failed forward pass is a bug (inputs were validated); fail the requests involved. In a
    // pipeline the steps behind it fail with it (a lost stage fails them all), and a request
    // may have samples in several of them: end them all first.
    std::vector<RequestState*> failed;
    auto add = [&failed](const SchedulerOutput& o) {
      for (const ScheduledSequence& s : o.scheduled) {
        auto* state = s.seq->request;
        if (std::find(failed.begin(), failed.end(), state) == failed.end()) failed.push_back(state);
      }
    };
    add(out);
    while (!in_flight_.empty()) {
      Flight g = std::move(in_flight_.front());
      in_flight_.pop_front();
      if (g.status.ok() && g.remote != nullptr) {
        (void)options_.pipeline->AwaitStages(*g.remote, g.logits.data());
      }
      for (const ScheduledSequence& s : g.out.scheduled) s.seq->in_flight = false;
      add(g.out);
    }
    // A lost pipeline stage is the group's outage, not a bug: UNAVAILABLE, so the router
    // retries elsewhere (HandlePipelineLoss fails the rest before the next step).
    const absl::Status reason =
        absl::IsUnavailable(status)
            ? absl::UnavailableError(std::string(status.message()))
            : absl::InternalError(absl::StrCat("forward pass failed: ", status.message()));
    for (RequestState* state : failed) AbortRequest(state, reason);
    return;
  }
  scheduler_->OnStepDone(out);
  // The blocks this step filled are final: copy them down before any later step can reuse them.
  if (offloader_ != nullptr) offloader_->Offload(kv_->TakeStoredBlocks());
  // Every token of the step is out at the same moment.
  step_time_ = Clock::now();
  // Which sequence samples from which logits row (forks share the prompt's row). With device
  // sampling, the rows the device cannot sample come to the host first.
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  absl::Status host_copy;
  std::vector<int64_t> host_index(f.sampled.size(), -1);  // row -> its place in f.logits
  if (f.device_sampling) {
    for (size_t k = 0; k < f.host_rows.size(); ++k) {
      host_index[static_cast<size_t>(f.host_rows[k])] = static_cast<int64_t>(k);
      if (host_copy.ok()) {
        host_copy = backend_->CopyToHost(f.logits.data() + k * vocab,
                                         device_model_->device_logits() + f.host_rows[k] * vocab,
                                         vocab * sizeof(float));
      }
    }
  } else {
    for (size_t i = 0; i < f.sampled.size(); ++i) host_index[i] = static_cast<int64_t>(i);
  }
  std::vector<PendingSample> pending;
  for (size_t i = 0; i < f.sampled.size(); ++i) {
    Sequence* seq = f.sampled[i];
    std::span<const float> logits;
    if (host_index[i] >= 0) {
      logits = std::span<const float>(f.logits.data() + host_index[i] * vocab, vocab);
    }
    const int64_t row = static_cast<int64_t>(i);
    auto* state = seq->request;
    if (!state->forked && state->request.n > 1) ForkSamples(seq);
    if (state->forked && seq->sample_index == 0 && seq->num_output_tokens() == 0) {
      // All samples of the request start from the prompt's last logits.
      for (auto& sibling : state->sequences) pending.push_back({sibling.get(), logits, row});
    } else {
      pending.push_back({seq, logits, row});
    }
  }
  std::vector<PendingSample*> on_device, on_host;
  for (PendingSample& p : pending) {
    if (host_index[static_cast<size_t>(p.row)] >= 0) {
      on_host.push_back(&p);
    } else {
      on_device.push_back(&p);
    }
  }
  if (!host_copy.ok()) {
    for (PendingSample* p : on_host) {
      p->result = absl::InternalError(
          absl::StrCat("copying logits from the device: ", host_copy.message()));
    }
    on_host.clear();
  }
  if (!on_device.empty()) SampleOnDevice(on_device);
  if (!on_host.empty()) SampleAll(on_host);
  for (PendingSample& p : pending) Emit(p);
}

void Engine::SampleAll(std::span<PendingSample* const> pending) {
  for (PendingSample* p : pending) {
    if (!p->seq->sampler.has_value()) InitSampling(p->seq);
  }
  auto sample = [&pending](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      PendingSample& p = *pending[i];
      Sequence* seq = p.seq;
      if (seq->status != Sequence::Status::kRunning || !seq->sampler.has_value()) continue;
      std::span<const TokenId> prompt(seq->tokens.data(), seq->num_prompt_tokens);
      std::span<const TokenId> output(seq->tokens.data() + seq->num_prompt_tokens,
                                      seq->num_output_tokens());
      if (seq->constraint != nullptr) {
        const Clock::time_point mask_start = Clock::now();
        const constraint::TokenBitmask& allowed = seq->constraint->Allowed();
        p.constraint_seconds = SecondsBetween(mask_start, Clock::now());
        if (std::none_of(allowed.begin(), allowed.end(), [](uint64_t w) { return w != 0; })) {
          p.result = absl::InvalidArgumentError(seq->constraint->EmptyMaskReason());
          continue;
        }
        p.result = seq->sampler->Sample(p.logits, prompt, output, allowed);
      } else {
        p.result = seq->sampler->Sample(p.logits, prompt, output);
      }
    }
  };
  // Each sequence's sampler is touched by exactly one thread and draws from its own RNG, so
  // sampling in parallel gives the same tokens as sampling in order. Small vocabularies are not
  // worth the hand-off.
  const int64_t n = static_cast<int64_t>(pending.size());
  if (sampling_pool_ != nullptr && n > 1 &&
      n * model_->config().vocab_size >= options_.parallel_sampling_min_logits) {
    sampling_pool_->ParallelFor(n, 1, sample);
  } else {
    sample(0, n);
  }
  for (const PendingSample* p : pending) constraint_seconds_ += p->constraint_seconds;
}

bool Engine::DeviceSampleable(const Sequence* seq) const {
  const RequestState* state = seq->request;
  return state->constraint == nullptr &&
         DeviceSampler::RowParams(state->request.params, model_->config().vocab_size).has_value();
}

void Engine::SampleOnDevice(std::span<PendingSample* const> pending) {
  for (PendingSample* p : pending) {
    if (!p->seq->sampler.has_value()) InitSampling(p->seq);
  }
  // One kernel row per live sequence; forks of one request read the same logits row. Each
  // non-greedy row takes its uniform from its own sampler's RNG here, in place of the draw
  // Sampler::Sample would make.
  const int32_t vocab = model_->config().vocab_size;
  std::vector<SampleRowParams> rows;
  std::vector<PendingSample*> owners;
  for (PendingSample* pp : pending) {
    PendingSample& p = *pp;
    Sequence* seq = p.seq;
    if (seq->status != Sequence::Status::kRunning || !seq->sampler.has_value()) continue;
    const SamplingParams& params = seq->request->request.params;
    std::optional<SampleRowParams> row = DeviceSampler::RowParams(params, vocab);
    if (!row.has_value()) {  // Launch checked every sampled sequence: a bug
      p.result = absl::InternalError("device sampling was chosen for a request it cannot serve");
      continue;
    }
    row->row = p.row;
    if (!params.IsGreedy()) row->uniform = seq->sampler->NextUniform();
    rows.push_back(*row);
    owners.push_back(&p);
  }
  std::vector<int32_t> tokens(rows.size());
  const absl::Status status =
      device_sampler_->Sample(device_model_->device_logits(), vocab, rows, tokens);
  for (size_t i = 0; i < owners.size(); ++i) {
    if (!status.ok()) {
      owners[i]->result = absl::InternalError(absl::StrCat("device sampling: ", status.message()));
    } else if (tokens[i] < 0) {
      // What Sampler::Sample answers for such logits (it checks them before drawing).
      owners[i]->result = absl::InvalidArgumentError(
          "logits hold NaN or +inf, or are all -inf (sampled on the device)");
    } else {
      owners[i]->result = SampleResult{.token = tokens[i]};
      ++device_sampled_tokens_;
      ++step_metrics_.device_sampled_tokens;
    }
  }
}

void Engine::ForkSamples(Sequence* parent) {
  auto* state = parent->request;
  state->forked = true;
  for (int32_t i = 1; i < state->request.n; ++i) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->sample_index = i;
    child->request = parent->request;
    child->tokens = parent->tokens;
    child->cache_salt = parent->cache_salt;
    child->num_prompt_tokens = parent->num_prompt_tokens;
    child->num_computed = parent->num_computed;
    child->num_cached_prompt_tokens = parent->num_cached_prompt_tokens;
    child->admitted_before = true;
    child->peak_kv_blocks = parent->peak_kv_blocks;
    kv_->Fork(parent->id, child->id);
    scheduler_->AddRunning(child.get());
    state->sequences.push_back(std::move(child));
  }
}

void Engine::InitSampling(Sequence* seq) {
  auto* state = seq->request;
  const EngineRequest& r = state->request;
  SamplingParams params = r.params;
  // Samples of one request draw from different streams of the same seed.
  if (params.seed.has_value()) params.seed = *params.seed + seq->sample_index;
  absl::StatusOr<Sampler> sampler = Sampler::Create(params, model_->config().vocab_size);
  StopCheckerOptions stop_options;
  stop_options.eos_token_ids = stop_token_ids_;
  stop_options.prompt_tokens = seq->num_prompt_tokens;
  stop_options.max_total_tokens = model_->config().max_position_embeddings;
  absl::StatusOr<StopChecker> stop = StopChecker::Create(r.params, stop_options);
  if (!sampler.ok() || !stop.ok()) {
    AbortRequest(state, !sampler.ok() ? sampler.status() : stop.status());
    return;
  }
  seq->sampler.emplace(std::move(*sampler));
  seq->stop.emplace(std::move(*stop));
  if (state->constraint != nullptr) {
    // With ignore_eos, EOS never ends the output, so it is never allowed either.
    seq->constraint = std::make_unique<constraint::ConstraintState>(
        state->constraint, token_trie_,
        r.params.ignore_eos ? std::span<const TokenId>()
                            : std::span<const TokenId>(stop_token_ids_));
  }
  seq->detokenizer = std::make_unique<IncrementalDecoder>(
      *model_->tokenizer, DecodeOptions{.skip_special_tokens = true});
  seq->detokenizer->SetPrompt(std::span<const TokenId>(seq->tokens.data(), seq->num_prompt_tokens));
}

void Engine::Emit(PendingSample& p) {
  Sequence* seq = p.seq;
  // A sample of a request that failed or was aborted earlier in this step.
  if (seq->status != Sequence::Status::kRunning || !seq->sampler.has_value()) return;
  auto* state = seq->request;
  const EngineRequest& r = state->request;
  absl::StatusOr<SampleResult>& sample = p.result;
  if (!sample.ok()) {
    AbortRequest(state, sample.status());
    return;
  }
  const TokenId token = sample->token;
  if (seq->constraint != nullptr) {
    const Clock::time_point accept_start = Clock::now();
    const absl::Status s = seq->constraint->Accept(token);
    constraint_seconds_ += SecondsBetween(accept_start, Clock::now());
    if (!s.ok()) {
      // The mask only lets through tokens the parser takes: this is a bug.
      AbortRequest(state, absl::InternalError(absl::StrCat("constrained decoding: ", s.message())));
      return;
    }
  }
  seq->tokens.push_back(token);
  RecordToken(seq);
  RequestOutput msg;
  msg.sample_index = seq->sample_index;
  msg.token_ids.push_back(token);
  if (r.params.logprobs >= 0) msg.logprobs.push_back(*sample);
  absl::StatusOr<std::string> piece = seq->detokenizer->Add(token);
  StopDecision decision = seq->stop->Append(token, piece.ok() ? *piece : std::string());
  msg.text = std::move(decision.text);
  if (!decision.finished() && seq->constraint != nullptr && seq->constraint->Complete()) {
    // The constrained output is complete and nothing may follow: stop without spending a step
    // on the only token left (EOS).
    msg.text += seq->stop->held_back();
    msg.text += seq->detokenizer->Finish();
    decision.finish_reason = FinishReason::kStop;
  }
  if (!decision.finished()) {
    state->stream->Push(std::move(msg));
    return;
  }
  if (decision.finish_reason == FinishReason::kLength) msg.text += seq->detokenizer->Finish();
  msg.finish_reason = decision.finish_reason;
  msg.stop_string = decision.stop_string;
  FinishSequence(seq, std::move(msg));
}

void Engine::FinishSequence(Sequence* seq, RequestOutput final_output) {
  RequestState* state = seq->request;
  scheduler_->Remove(seq);
  final_output.sample_index = seq->sample_index;
  final_output.finished = true;
  final_output.usage.prompt_tokens = seq->num_prompt_tokens;
  final_output.usage.cached_prompt_tokens = seq->num_cached_prompt_tokens;
  final_output.usage.completion_tokens = seq->num_output_tokens();
  final_output.usage.peak_kv_blocks = seq->peak_kv_blocks;
  std::vector<RequestOutput> outputs;
  outputs.push_back(std::move(final_output));
  --state->samples_unfinished;
  if (!state->forked && state->request.n > 1) {
    // The request ended before its samples were forked off: they end the same way.
    for (int32_t i = 1; i < state->request.n; ++i) {
      RequestOutput out;
      out.sample_index = i;
      out.finished = true;
      out.finish_reason = outputs[0].finish_reason;
      outputs.push_back(std::move(out));
    }
    state->samples_unfinished = 0;
  }
  std::shared_ptr<RequestStream> stream = state->stream;
  if (state->samples_unfinished == 0) {
    ++num_finished_;
    ReportFinished(state, outputs.back().finish_reason, absl::StatusCode::kOk);
    ForgetRequest(state);
  }
  // Readers that see a request finish also see the pool without its blocks.
  PublishStats();
  for (RequestOutput& out : outputs) {
    if (in_step_) {
      finished_outputs_.emplace_back(stream, std::move(out));
    } else {
      stream->Push(std::move(out));
    }
  }
}

void Engine::ForgetRequest(RequestState* state) {
  transfer_->Release(state->serial);
  const std::string id = state->request.request_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ids_.erase(id);
  }
  requests_.erase(id);
}

void Engine::AbortRequest(RequestState* state, absl::Status status) {
  std::vector<RequestOutput> outputs;
  for (auto& seq : state->sequences) {
    if (seq->status == Sequence::Status::kFinished) continue;
    scheduler_->Remove(seq.get());
    RequestOutput out;
    out.sample_index = seq->sample_index;
    out.finished = true;
    out.status = status;
    outputs.push_back(std::move(out));
  }
  // Samples never forked.
  for (int32_t i = static_cast<int32_t>(state->sequences.size()); i < state->request.n; ++i) {
    RequestOutput out;
    out.sample_index = i;
    out.finished = true;
    out.status = status;
    outputs.push_back(std::move(out));
  }
  std::shared_ptr<RequestStream> stream = state->stream;
  ReportFinished(state, FinishReason::kNone, status.code());
  ForgetRequest(state);
  PublishStats();
  for (RequestOutput& out : outputs) stream->Push(std::move(out));
}

void Engine::RecordToken(Sequence* seq) {
  RequestState* state = seq->request;
  ++step_metrics_.generation_tokens;
  if (state->first_token == Clock::time_point{}) {
    state->first_token = step_time_;
    step_metrics_.time_to_first_token_seconds.push_back(SecondsBetween(state->arrival, step_time_));
    step_metrics_.prompt_tokens += seq->num_prompt_tokens;
  }
  if (seq->last_token_time != Clock::time_point{}) {
    step_metrics_.inter_token_latency_seconds.push_back(
        SecondsBetween(seq->last_token_time, step_time_));
  }
  seq->last_token_time = step_time_;
  state->last_token = step_time_;
}

void Engine::ReportFinished(RequestState* state, FinishReason reason, absl::StatusCode code) {
  if (observer_ == nullptr) return;
  const Clock::time_point now = Clock::now();
  constexpr Clock::time_point kUnset{};
  RequestMetrics m;
  m.request_id = state->request.request_id;
  m.finish_reason = reason;
  m.status_code = code;
  m.prompt_tokens = static_cast<int32_t>(state->request.prompt_ids.size());
  for (const auto& seq : state->sequences) m.generation_tokens += seq->num_output_tokens();
  m.e2e_seconds = SecondsBetween(state->arrival, now);
  if (state->first_scheduled != kUnset) {
    m.queue_seconds = SecondsBetween(state->arrival, state->first_scheduled);
    if (state->first_token != kUnset) {
      m.prefill_seconds = SecondsBetween(state->first_scheduled, state->first_token);
      m.decode_seconds = SecondsBetween(state->first_token, state->last_token);
    }
  }
  observer_->OnRequestFinished(m);
}

void Engine::CheckInvariants() {
  auto record = [this](std::string message) {
    if (invariant_violations_++ == 0) first_violation_ = std::move(message);
  };
  if (absl::Status s = kv_->CheckInvariants(); !s.ok()) record(std::string(s.message()));
  for (const Sequence* seq : scheduler_->running()) {
    if (seq->in_flight) continue;  // its slots are being written
    const int32_t unused = kv_->NumSlots(seq->id) - seq->num_computed;
    if (unused < 0 || unused > options_.block_size - 1) {
      record(absl::StrCat("sequence ", seq->id, " has ", unused, " allocated but unused slots"));
    }
  }
}

void Engine::PublishStats() {
  const KvManager::Stats kv = kv_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_running = scheduler_->num_running();
  stats_.num_waiting = scheduler_->num_waiting();
  stats_.total_blocks = kv.total_blocks;
  stats_.used_blocks = kv.used_blocks;
  stats_.cached_free_blocks = kv.cached_free_blocks;
  stats_.free_blocks = kv.free_blocks;
  stats_.prefix_query_tokens = kv.prefix_query_tokens;
  stats_.prefix_hit_tokens = kv.prefix_hit_tokens;
  stats_.prefix_restored_tokens = kv.prefix_restored_tokens;
  if (offloader_ != nullptr) stats_.kv_tiers = offloader_->stats();
  stats_.kv_transfer = transfer_->stats();
  stats_.prefill_tokens_per_second =
      prefill_seconds_ > 0 ? prefill_tokens_ / prefill_seconds_ : 0.0;
  stats_.num_preemptions = scheduler_->num_preemptions();
  stats_.num_steps = num_steps_;
  stats_.num_finished_requests = num_finished_;
  stats_.invariant_violations = invariant_violations_;
  stats_.step_seconds = step_seconds_;
  stats_.forward_seconds = forward_seconds_;
  stats_.local_stage_seconds = local_stage_seconds_;
  stats_.constraint_seconds = constraint_seconds_;
  stats_.device_sampled_tokens = device_sampled_tokens_;
  stats_.first_violation = first_violation_;
}

}  // namespace kvserve
