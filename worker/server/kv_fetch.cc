#include "worker/server/kv_fetch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_hash/block_hash.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

// Weight of the newest measurement in a peer's bandwidth average.
constexpr double kBandwidthSmoothing = 0.3;

}  // namespace

absl::StatusOr<KvTransferMode> ParseKvTransferMode(const std::string& name) {
  if (name == "auto") return KvTransferMode::kAuto;
  if (name == "always") return KvTransferMode::kAlways;
  if (name == "never") return KvTransferMode::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv-transfer must be auto, always or never, got '", name, "'"));
}

void KvFetchHandle::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

/// One FetchKvBlocks call; deletes itself when it ends. Counted in the fetcher's live calls until
/// then (token_).
class KvFetchCall final : public grpc::ClientReadReactor<v1::KvBlockData> {
 public:
  KvFetchCall(LiveCalls::Token token, KvFetcher* fetcher, std::string peer,
              v1::FetchKvBlocksRequest request, std::vector<BlockKey> expected, int32_t first_block,
              int64_t block_bytes, std::shared_ptr<KvFetchHandle> handle,
              std::function<void(KvFetchResult)> done)
      : token_(std::move(token)),
        fetcher_(fetcher),
        peer_(std::move(peer)),
        request_(std::move(request)),
        expected_(std::move(expected)),
        first_block_(first_block),
        block_bytes_(block_bytes),
        done_(std::move(done)),
        handle_(std::move(handle)) {}

  void Start(v1::Worker::Stub* stub, std::chrono::milliseconds timeout) {
    context_.set_deadline(std::chrono::system_clock::now() + timeout);
    {
      // A cancel before the call starts takes effect when it does.
      std::lock_guard<std::mutex> lock(handle_->mu_);
      handle_->context_ = &context_;
      if (handle_->cancelled_) context_.TryCancel();
    }
    start_ = Clock::now();
    stub->async()->FetchKvBlocks(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const size_t i = result_.blocks.size();
    std::string problem;
    if (i >= expected_.size()) {
      problem = absl::StrCat("peer sent more blocks than the ", expected_.size(), " asked for");
    } else if (message_.index() != static_cast<uint32_t>(first_block_ + static_cast<int32_t>(i))) {
      problem = absl::StrCat("peer sent block ", message_.index(), " where block ",
                             first_block_ + static_cast<int32_t>(i), " was due");
    } else if (message_.key().hi() != expected_[i].hi || message_.key().lo() != expected_[i].lo) {
      problem =
          absl::StrCat("block ", message_.index(), " has another chain hash than this prompt's");
    } else if (static_cast<int64_t>(message_.data().size()) != block_bytes_) {
      problem = absl::StrCat("block ", message_.index(), " has ", message_.data().size(),
                             " bytes; a block has ", block_bytes_);
    }
    if (!problem.empty()) {
      // Stop here: what arrived before stays usable.
      problem_ = absl::DataLossError(absl::StrCat("FetchKvBlocks from ", peer_, ": ", problem));
      context_.TryCancel();
      return;
    }
    KvBlockPayload p;
    p.index = static_cast<int32_t>(message_.index());
    p.key = expected_[i];
    p.bytes = std::move(*message_.mutable_data());
    result_.bytes += static_cast<int64_t>(p.bytes.size());
    result_.blocks.push_back(std::move(p));
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(handle_->mu_);
      handle_->context_ = nullptr;
    }
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (!problem_.ok()) {
      result_.status = problem_;
    } else if (!status.ok()) {
      result_.status =
          absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                       absl::StrCat("FetchKvBlocks from ", peer_, ": ", status.error_message()));
    }
    fetcher_->Record(peer_, result_);
    done_(std::move(result_));
    delete this;
  }

 private:
  LiveCalls::Token token_;  // first: destroyed after context_
  KvFetcher* fetcher_;
  const std::string peer_;
  const v1::FetchKvBlocksRequest request_;
  const std::vector<BlockKey> expected_;
  const int32_t first_block_;
  const int64_t block_bytes_;
  std::function<void(KvFetchResult)> done_;
  std::shared_ptr<KvFetchHandle> handle_;
  grpc::ClientContext context_;
  v1::KvBlockData message_;
  KvFetchResult result_;
  absl::Status problem_;
  Clock::time_point start_;
};

KvFetcher::KvFetcher(const Engine* engine, KvTransferOptions options,
                     std::function<void(const KvFetchResult&)> on_pull)
    : engine_(engine), options_(std::move(options)), on_pull_(std::move(on_pull)) {
  if (options_.credentials == nullptr) options_.credentials = grpc::InsecureChannelCredentials();
}

double KvFetcher::Bandwidth(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = bandwidth_.find(peer);
  return it != bandwidth_.end() ? it->second : options_.assumed_bandwidth;
}

bool KvFetcher::ShouldPull(const std::string& peer, int64_t num_blocks) const {
  if (num_blocks <= 0) return false;
  switch (options_.mode) {
    case KvTransferMode::kNever:
      return false;
    case KvTransferMode::kAlways:
      return true;
    case KvTransferMode::kAuto:
      break;
  }
  const double prefill_rate = engine_->stats().prefill_tokens_per_second;
  if (prefill_rate <= 0) return true;  // nothing measured yet: try the pull, and measure it
  const double bytes = static_cast<double>(num_blocks) * engine_->kv_block_bytes();
  const double pull = options_.fixed_cost_seconds + bytes / std::max(Bandwidth(peer), 1.0);
  const double compute =
      static_cast<double>(num_blocks) * engine_->options().block_size / prefill_rate;
  return pull < compute;
}

std::shared_ptr<v1::Worker::Stub> KvFetcher::StubFor(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<v1::Worker::Stub>& stub = stubs_[peer];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    // One message per block: room for the largest block plus framing.
    const int64_t limit = std::max<int64_t>(engine_->kv_block_bytes() + (1 << 20), 4 << 20);
    args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(limit, INT32_MAX)));
    stub = v1::Worker::NewStub(grpc::CreateCustomChannel(peer, options_.credentials, args));
  }
  return stub;
}

void KvFetcher::Record(const std::string& peer, const KvFetchResult& result) {
  if (result.status.ok() && result.bytes > 0 && result.seconds > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    const double measured = static_cast<double>(result.bytes) / result.seconds;
    auto [it, fresh] = bandwidth_.emplace(peer, measured);
    if (!fresh) it->second += kBandwidthSmoothing * (measured - it->second);
  }
  if (on_pull_) on_pull_(result);
}

void KvFetcher::Fetch(const std::string& peer, std::span<const TokenId> tokens,
                      const std::string& cache_salt, int32_t first_block, int32_t end_block,
                      std::shared_ptr<KvFetchHandle> handle,
                      std::function<void(KvFetchResult)> done) {
  const int32_t bs = engine_->options().block_size;
  std::vector<BlockKey> keys = HashFullBlocks(tokens, bs, cache_salt);
  end_block = std::min<int32_t>(end_block, static_cast<int32_t>(keys.size()));
  if (first_block < 0 || first_block >= end_block) {
    done(KvFetchResult());
    return;
  }
  std::vector<BlockKey> expected(keys.begin() + first_block, keys.begin() + end_block);
  v1::FetchKvBlocksRequest request;
  // The holder needs the tokens up to the last block asked for, no more.
  for (int64_t i = 0; i < int64_t{end_block} * bs; ++i) {
    request.add_token_ids(static_cast<uint32_t>(tokens[static_cast<size_t>(i)]));
  }
  request.set_cache_salt(cache_salt);
  request.set_first_block(static_cast<uint32_t>(first_block));
  request.set_max_blocks(static_cast<uint32_t>(end_block - first_block));
  const KvTierIdentity& identity = engine_->kv_identity();
  request.mutable_identity()->mutable_model()->set_hi(identity.model.hi);
  request.mutable_identity()->mutable_model()->set_lo(identity.model.lo);
  request.mutable_identity()->set_layout(identity.layout);
  std::shared_ptr<v1::Worker::Stub> stub = StubFor(peer);
  auto* call =
      new KvFetchCall(calls_.Track(), this, peer, std::move(request), std::move(expected),
                      first_block, engine_->kv_block_bytes(), std::move(handle), std::move(done));
  call->Start(stub.get(), options_.timeout);
}

}  // namespace kvserve
