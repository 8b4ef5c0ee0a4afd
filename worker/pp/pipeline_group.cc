#include "worker/pp/pipeline_group.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "worker/pp/step_codec.h"
#include "worker/server/grpc_status.h"

namespace kvserve {
namespace {

std::string DescribeStage(int rank, const StageLayers& layers) {
  return absl::StrCat("stage ", rank, " (layers ", layers.first, "..", layers.end() - 1, ")");
}

}  // namespace

/// The kvserve.v1.Pipeline service: one Join call per stage, held by a thread of the server's
/// pool for the stage's lifetime (a group has a handful of stages).
class PipelineGroup::Service final : public v1::Pipeline::Service {
 public:
  explicit Service(PipelineGroup* group) : group_(group) {}

  grpc::Status Join(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::LeaderMessage, v1::StageMessage>* stream) override {
    v1::StageMessage in;
    if (!stream->Read(&in)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the stage left before joining");
    }
    if (!in.has_join()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the first message of Pipeline/Join must be a join");
    }
    auto conn = std::make_shared<Connection>();
    conn->context = context;
    conn->stream = stream;
    absl::StatusOr<v1::StageAssignment> assignment = group_->Admit(conn, in.join());
    if (!assignment.ok()) return ToGrpcStatus(assignment.status());
    v1::LeaderMessage out;
    *out.mutable_assignment() = *assignment;
    if (!stream->Write(out)) {
      group_->Drop(conn, "its connection closed before it got its assignment");
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection lost");
    }
    if (!stream->Read(&in) || !in.has_ready()) {
      group_->Drop(conn, "it left before it was ready");
      group_->AwaitNoWriter(*conn);
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no ready message");
    }
    group_->MarkReady(conn);
    while (stream->Read(&in)) {
      if (in.has_result()) {
        group_->Deliver(conn, std::move(*in.mutable_result()));
      } else if (in.has_connected()) {
        group_->MarkConnected(conn, in.connected().formation());
      } else {
        group_->Drop(conn, "it sent a message other than a step result or connected");
        group_->AwaitNoWriter(*conn);
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "only step results and connected are expected after ready");
      }
    }
    group_->Drop(conn, "its connection closed");
    group_->AwaitNoWriter(*conn);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the leader dropped this stage");
  }

 private:
  PipelineGroup* group_;
};

absl::StatusOr<std::unique_ptr<PipelineGroup>> PipelineGroup::Create(PipelineGroupOptions options) {
  if (options.stages.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline group needs at least 2 stages, got ", options.stages.size()));
  }
  if (options.hidden_size <= 0 || options.vocab_size <= 0) {
    return absl::InvalidArgumentError("PipelineGroup: hidden_size and vocab_size must be positive");
  }
  if (options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--pp-step-timeout must be positive");
  }
  return std::unique_ptr<PipelineGroup>(new PipelineGroup(std::move(options)));
}

PipelineGroup::PipelineGroup(PipelineGroupOptions options)
    : options_(std::move(options)), service_(std::make_unique<Service>(this)) {
  members_.resize(options_.stages.size());
  watchdog_ = std::thread([this] { Watchdog(); });
}

PipelineGroup::~PipelineGroup() {
  Shutdown();
  if (watchdog_.joinable()) watchdog_.join();
}

grpc::Service* PipelineGroup::service() { return service_.get(); }

void PipelineGroup::SetFormedCallback(std::function<void(bool)> callback) {
  std::lock_guard<std::mutex> notifying(notify_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  formed_callback_ = std::move(callback);
  notified_formed_ = FormedLocked();
}

void PipelineGroup::Shutdown() {
  std::vector<std::shared_ptr<Connection>> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    members = members_;
  }
  cv_.notify_all();
  for (const auto& conn : members) {
    if (conn != nullptr) Drop(conn, "the leader is shutting down");
  }
}

PipelineGroupStats PipelineGroup::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PipelineGroupStats s = stats_;
  s.stages = static_cast<int32_t>(options_.stages.size());
  s.stages_ready = 1;
  for (size_t r = 1; r < members_.size(); ++r) {
    if (members_[r] != nullptr && members_[r]->ready) ++s.stages_ready;
  }
  s.in_flight = static_cast<int64_t>(flights_.size());
  return s;
}

void PipelineGroup::SetKvPool(int64_t num_blocks, int32_t block_size, KvCacheDType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_set_ = true;
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  kv_dtype_ = dtype;
}

void PipelineGroup::EnableDeviceHandOver(int tp_size, std::string device, StageLinkFactory links) {
  std::lock_guard<std::mutex> lock(mu_);
  device_ = static_cast<bool>(links);
  tp_size_ = tp_size;
  device_name_ = std::move(device);
  link_factory_ = std::move(links);
}

bool PipelineGroup::device_hand_over() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_;
}

uint64_t PipelineGroup::LeaderLinks(std::vector<std::shared_ptr<StageLink>>* links) const {
  std::lock_guard<std::mutex> lock(mu_);
  *links = links_;
  return links_.empty() ? 0 : formation_;
}

bool PipelineGroup::AllReadyLocked() const {
  for (size_t r = 1; r < members_.size(); ++r) {
    if (members_[r] == nullptr || !members_[r]->ready) return false;
  }
  return true;
}

bool PipelineGroup::FormedLocked() const {
  if (shut_down_ || !AllReadyLocked()) return false;
  if (!device_) return true;
  if (links_.empty()) return false;
  for (size_t r = 1; r < members_.size(); ++r) {
    if (members_[r]->connected != formation_) return false;
  }
  return true;
}

bool PipelineGroup::formed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return FormedLocked();
}

std::string PipelineGroup::NotFormedReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return "the pipeline group is shutting down";
  std::string waiting;
  for (size_t r = 1; r < members_.size(); ++r) {
    if (members_[r] != nullptr && members_[r]->ready) continue;
    absl::StrAppend(&waiting, waiting.empty() ? "" : ", ",
                    DescribeStage(static_cast<int>(r), options_.stages[r]),
                    members_[r] != nullptr ? " (joined, loading)" : "");
  }
  if (!waiting.empty()) return absl::StrCat("the pipeline group is waiting for ", waiting);
  if (FormedLocked()) return "";
  return absl::StrCat("the pipeline group is connecting its stages' devices (formation ",
                      formation_, ")");
}

uint64_t PipelineGroup::losses() const { return losses_.load(); }

void PipelineGroup::NotifyFormed() {
  // One notifier at a time, each reporting the state it reads: the last call reports the
  // latest state, whatever order concurrent changes took.
  std::lock_guard<std::mutex> notifying(notify_mu_);
  std::function<void(bool)> callback;
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now = FormedLocked();
    callback = formed_callback_;
  }
  if (now == notified_formed_) return;
  notified_formed_ = now;
  if (callback) callback(now);
}

absl::StatusOr<v1::StageAssignment> PipelineGroup::Admit(const std::shared_ptr<Connection>& conn,
                                                         const v1::StageJoin& join) {
  const int pp = static_cast<int>(options_.stages.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return absl::UnavailableError("the leader is shutting down");
  if (!pool_set_) return absl::UnavailableError("the leader is still starting; join again");
  if (join.pp_size() != pp) {
    return absl::InvalidArgumentError(absl::StrCat("the stage runs with --pp ", join.pp_size(),
                                                   "; the leader's group has ", pp, " stages"));
  }
  if (join.model_fingerprint_hi() != options_.model_fingerprint.hi ||
      join.model_fingerprint_lo() != options_.model_fingerprint.lo) {
    return absl::FailedPreconditionError(
        "the stage loaded another model than the leader (model fingerprints differ)");
  }
  if (device_ && (join.tp_size() != tp_size_ || join.device() != device_name_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the group hands over device to device: every stage must run --device ", device_name_,
        " --tp ", tp_size_, " like the leader; this stage runs --device ", join.device(), " --tp ",
        join.tp_size()));
  }
  int rank = join.requested_rank();
  if (rank == -1) {
    for (int r = 1; r < pp && rank == -1; ++r) {
      if (members_[r] == nullptr) rank = r;
    }
    if (rank == -1) {
      return absl::AlreadyExistsError(
          absl::StrCat("every stage of the group (1..", pp - 1, ") is taken"));
    }
  } else if (rank < 1 || rank >= pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pp-rank ", rank, " is outside 1..", pp - 1, " (rank 0 is the leader)"));
  } else if (members_[rank] != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("stage ", rank, " is already held by ", members_[rank]->name));
  }
  conn->rank = rank;
  conn->name = join.name().empty() ? conn->context->peer() : join.name();
  members_[rank] = conn;
  ++stats_.joins;
  const StageLayers& layers = options_.stages[rank];
  logging::Log(logging::LogLevel::kInfo, "pipeline", "stage joined",
               {{"stage", rank},
                {"name", conn->name},
                {"first_layer", layers.first},
                {"layers", layers.count}});
  v1::StageAssignment a;
  a.set_rank(rank);
  a.set_pp_size(pp);
  a.set_first_layer(layers.first);
  a.set_num_layers(layers.count);
  a.set_num_blocks(num_blocks_);
  a.set_block_size(block_size_);
  a.set_kv_cache_dtype(std::string(KvCacheDTypeName(kv_dtype_)));
  a.set_device_hand_over(device_);
  return a;
}

void PipelineGroup::MarkReady(const std::shared_ptr<Connection>& conn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->lost || members_[conn->rank] != conn) return;
    conn->ready = true;
  }
  logging::Log(logging::LogLevel::kInfo, "pipeline", "stage ready",
               {{"stage", conn->rank}, {"name", conn->name}});
  NotifyFormed();
  Connect();
}

void PipelineGroup::Connect() {
  const int pp = static_cast<int>(options_.stages.size());
  uint64_t formation = 0;
  std::vector<std::shared_ptr<Connection>> members;
  StageLinkFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!device_ || shut_down_ || connecting_ || !AllReadyLocked()) return;
    connecting_ = true;
    formation = ++formation_;
    members.assign(members_.begin() + 1, members_.end());
    factory = link_factory_;
  }
  std::string failure;
  absl::StatusOr<std::string> id = factory.new_id();
  if (!id.ok()) failure = std::string(id.status().message());
  if (failure.empty()) {
    v1::LeaderMessage msg;
    msg.mutable_connect()->set_formation(formation);
    msg.mutable_connect()->set_link_id(*id);
    msg.mutable_connect()->set_open_timeout_ms(absl::ToInt64Milliseconds(options_.step_timeout));
    // Every stage opens its links while the leader opens its own: NCCL's init waits for all.
    for (const auto& conn : members) {
      if (!Write(conn, msg)) break;  // dropped, which voids this formation
    }
  }
  absl::StatusOr<std::vector<std::shared_ptr<StageLink>>> links;
  if (failure.empty()) {
    links = factory.open(*id, pp, 0, options_.step_timeout);
    if (!links.ok()) failure = std::string(links.status().message());
  }
  bool formed_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    connecting_ = false;
    if (failure.empty() && formation == formation_ && !shut_down_) {
      links_ = std::move(*links);
      formed_now = true;
    } else if (links.ok() && !links->empty()) {
      (*links)[0]->Abort();  // a stage was lost meanwhile: this formation is void
    }
  }
  if (!failure.empty()) {
    // The stages' links cannot form without the leader's: start over with fresh joins.
    logging::Log(logging::LogLevel::kError, "pipeline", "cannot open the leader's links",
                 {{"formation", static_cast<int64_t>(formation)}, {"reason", failure}});
    for (const auto& conn : members) {
      Drop(conn, absl::StrCat("the leader could not open its links: ", failure), true);
    }
    return;
  }
  if (formed_now) {
    logging::Log(logging::LogLevel::kInfo, "pipeline", "leader's links open",
                 {{"formation", static_cast<int64_t>(formation)}});
    NotifyFormed();
  }
}

void PipelineGroup::MarkConnected(const std::shared_ptr<Connection>& conn, uint64_t formation) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->lost || members_[conn->rank] != conn) return;
    conn->connected = formation;
  }
  NotifyFormed();
}

void PipelineGroup::Deliver(const std::shared_ptr<Connection>& conn, v1::StepResult result) {
  const int pp = static_cast<int>(options_.stages.size());
  const bool last = conn->rank == pp - 1;
  std::shared_ptr<Flight> next;
  std::string failure;
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->lost) return;
    auto it = flights_.find(result.step());
    std::vector<int>* pending = it == flights_.end() ? nullptr : &it->second->pending;
    auto mine = pending == nullptr ? std::vector<int>::iterator()
                                   : std::find(pending->begin(), pending->end(), conn->rank);
    if (pending == nullptr || mine == pending->end()) {
      failure = absl::StrCat("it answered step ", result.step(), ", which it was not computing");
    } else if (result.code() != 0) {
      // Its K/V may be half written: drop it so it rejoins clean.
      failure = absl::StrCat("it failed a step: ", result.message());
    } else if (device_ && !last && !result.output().empty()) {
      failure = "it answered with a hand-over where the group hands over device to device";
    } else {
      std::shared_ptr<Flight> flight = it->second;
      pending->erase(mine);
      stats_.bytes_received += static_cast<int64_t>(result.output().size());
      if (!device_ && !last) {
        // Host hand-over: on to the next stage.
        next = flight;
        next->stage = conn->rank + 1;
        next->pending = {next->stage};
        next->deadline = absl::Now() + options_.step_timeout;
        stats_.bytes_sent += static_cast<int64_t>(result.output().size());
        next->msg.mutable_step()->set_hand_over(std::move(*result.mutable_output()));
      } else {
        if (last) flight->logits = std::move(*result.mutable_output());
        flight->deadline = absl::Now() + options_.step_timeout;
        // With a device hand-over stages answer in any order (each over its own stream).
        if (pending->empty()) {
          flights_.erase(it);
          flight->done = true;
          finished = true;
          ++stats_.steps;
          stats_.remote_seconds += absl::ToDoubleSeconds(absl::Now() - flight->start);
        }
      }
    }
  }
  if (!failure.empty()) {
    Drop(conn, failure);
  } else if (next != nullptr) {
    cv_.notify_all();  // its new deadline, before a write that may block
    Send(next);
  } else if (finished) {
    cv_.notify_all();
  }
}

void PipelineGroup::Drop(const std::shared_ptr<Connection>& conn, const std::string& reason,
                         bool regroup) {
  std::vector<std::shared_ptr<Connection>> others;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->lost) return;
    conn->lost = true;
    conn->lost_reason = reason;
    if (conn->rank >= 0 && members_[conn->rank] == conn) {
      members_[conn->rank] = nullptr;
      if (!regroup) {
        ++stats_.losses;
        losses_.fetch_add(1);
      }
      if (device_) {
        // The formation's links die with this stage: abort the leader's (the engine may be
        // waiting in one), void a formation in progress, and let every stage join again.
        if (!links_.empty()) links_[0]->Abort();
        links_.clear();
        ++formation_;
        // The others go now, under this lock, so that nothing they still send (an answer to
        // a step that failed here) counts as a loss of their own.
        for (size_t r = 1; r < members_.size(); ++r) {
          const std::shared_ptr<Connection> other = members_[r];
          if (other == nullptr) continue;
          other->lost = true;
          other->lost_reason =
              absl::StrCat("the group forms again: stage ", conn->rank, " left (", reason, ")");
          members_[r] = nullptr;
          other->context->TryCancel();  // safe under the lock, as for `conn` below
          others.push_back(other);
        }
      }
      // Every step in flight needs this stage (or its K/V): they all fail.
      const absl::Status failed = absl::UnavailableError(
          absl::StrCat(DescribeStage(conn->rank, options_.stages[conn->rank]),
                       " of the pipeline group was lost: ", reason));
      for (auto& [id, flight] : flights_) {
        flight->done = true;
        flight->status = failed;
      }
      flights_.clear();
    }
    // Unblocks the call's reads and writes. Under the lock: the call's handler cannot return
    // (and free the context) before this Drop is done, since its own Drop takes the lock.
    conn->context->TryCancel();
  }
  cv_.notify_all();
  if (conn->rank >= 0) {
    logging::Log(logging::LogLevel::kWarning, "pipeline",
                 regroup ? "stage regrouped" : "stage lost",
                 {{"stage", conn->rank}, {"name", conn->name}, {"reason", reason}});
  }
  for (const auto& other : others) {
    logging::Log(logging::LogLevel::kWarning, "pipeline", "stage regrouped",
                 {{"stage", other->rank}, {"name", other->name}, {"reason", other->lost_reason}});
  }
  NotifyFormed();
}

void PipelineGroup::AwaitNoWriter(const Connection& conn) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return conn.writers == 0; });
}

void PipelineGroup::Watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shut_down_) {
    // Sleeps until the earliest deadline; a new flight's write wakes it (Write notifies cv_), and
    // a deadline only ever moves later otherwise, so waking early just recomputes.
    absl::Time earliest = absl::InfiniteFuture();
    for (const auto& [id, flight] : flights_) {
      if (!flight->pending.empty()) earliest = std::min(earliest, flight->deadline);
    }
    if (earliest == absl::InfiniteFuture()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, absl::ToChronoTime(earliest + absl::Milliseconds(1)));
    }
    if (shut_down_) break;
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Connection>> late;
    for (const auto& [id, flight] : flights_) {
      if (flight->pending.empty()) continue;
      const std::shared_ptr<Connection>& conn = members_[flight->pending.front()];
      if (now > flight->deadline && conn != nullptr &&
          std::find(late.begin(), late.end(), conn) == late.end()) {
        late.push_back(conn);
      }
    }
    if (late.empty()) continue;
    lock.unlock();
    for (const auto& conn : late) {
      Drop(conn, absl::StrCat("it did not answer a step within ",
                              absl::FormatDuration(options_.step_timeout), " (--pp-step-timeout)"));
    }
    lock.lock();
  }
}

bool PipelineGroup::Write(const std::shared_ptr<Connection>& conn, const v1::LeaderMessage& msg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->lost) return false;
    ++conn->writers;
  }
  // This stream's only writer (see the class comment); the Join handler waits for it to return
  // before it ends the call (AwaitNoWriter).
  const bool sent = conn->stream->Write(msg);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --conn->writers;
  }
  cv_.notify_all();
  if (!sent) Drop(conn, "its connection closed");
  return sent;
}

void PipelineGroup::Send(const std::shared_ptr<Flight>& flight) {
  std::vector<std::shared_ptr<Connection>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (flight->done) return;
    for (int stage : flight->pending) {
      const std::shared_ptr<Connection>& conn = members_[stage];
      if (conn == nullptr || !conn->ready || conn->lost) {
        flights_.erase(flight->id);
        flight->done = true;
        flight->status =
            absl::UnavailableError(absl::StrCat(DescribeStage(stage, options_.stages[stage]),
                                                " of the pipeline group is not connected"));
        targets.clear();
        break;
      }
      targets.push_back(conn);
    }
  }
  if (targets.empty()) {
    cv_.notify_all();
    return;
  }
  for (const auto& conn : targets) {
    if (!Write(conn, flight->msg)) return;  // dropped: the flight failed with the stage
  }
}

std::shared_ptr<PipelineFlight> PipelineGroup::SubmitStages(const ForwardBatch& batch,
                                                            std::span<const BlockCopy> copies,
                                                            std::span<const float> hand_over) {
  auto flight = std::make_shared<Flight>();
  flight->logits_floats = static_cast<int64_t>(batch.logits_rows.size()) * options_.vocab_size;
  v1::PipelineStep* step = flight->msg.mutable_step();
  EncodeStep(batch, copies, step);
  FloatsToBytes(hand_over, step->mutable_hand_over());
  int64_t expected = StageIoFloats(static_cast<int64_t>(batch.tokens.size()), options_.hidden_size);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_) {
      expected = 0;
      if (!FormedLocked()) {
        // Not formed: the engine's links are gone or were never open.
        flight->done = true;
        flight->status = absl::UnavailableError(
            "the pipeline group is not formed (a stage is missing or connecting)");
        return flight;
      }
      for (int r = 1; r < static_cast<int>(options_.stages.size()); ++r) {
        flight->pending.push_back(r);
      }
    } else {
      flight->pending = {1};
    }
    if (static_cast<int64_t>(hand_over.size()) != expected) {
      flight->done = true;
      flight->status = absl::InternalError(
          absl::StrCat("pipeline hand-over of ", hand_over.size(), " floats, expected ", expected));
      return flight;
    }
    flight->id = ++next_step_;
    step->set_step(flight->id);
    flight->start = absl::Now();
    flight->deadline = flight->start + options_.step_timeout;
    flights_[flight->id] = flight;
    stats_.max_in_flight = std::max<int64_t>(stats_.max_in_flight, flights_.size());
    stats_.block_copies += static_cast<int64_t>(copies.size());
    stats_.bytes_sent += static_cast<int64_t>(step->hand_over().size());
  }
  cv_.notify_all();  // the watchdog learns the new deadline before a write that may block
  Send(flight);
  return flight;
}

absl::Status PipelineGroup::AwaitStages(PipelineFlight& handle, float* logits) {
  auto& flight = static_cast<Flight&>(handle);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return flight.done; });
  if (!flight.status.ok()) return flight.status;
  return BytesToFloats(flight.logits, flight.logits_floats, "pipeline logits", logits);
}

}  // namespace kvserve
