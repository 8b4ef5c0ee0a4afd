#include "worker/pp/stage_runner.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "kvserve/v1/pipeline.grpc.pb.h"
#include "worker/kv/kv_offload.h"
#include "worker/pp/step_codec.h"
#include "worker/tp/shard.h"

namespace kvserve {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "stage";
  return name;
}

}  // namespace

PipelineStageRunner::PipelineStageRunner(const ModelWeights* weights, PipelineStageOptions options)
    : weights_(weights), options_(std::move(options)) {}

PipelineStageRunner::~PipelineStageRunner() { Stop(); }

void PipelineStageRunner::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

PipelineStageStats PipelineStageRunner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

absl::Status PipelineStageRunner::Run() {
  if (options_.pp_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pp-leader needs --pp of at least 2, got ", options_.pp_size));
  }
  if (options_.requested_rank != -1 &&
      (options_.requested_rank < 1 || options_.requested_rank >= options_.pp_size)) {
    return absl::InvalidArgumentError(absl::StrCat("--pp-rank ", options_.requested_rank,
                                                   " is outside 1..", options_.pp_size - 1,
                                                   " (rank 0 is the leader)"));
  }
  while (true) {
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return absl::OkStatus();
      context_ = &context;
    }
    absl::Status s = Session(&context);
    {
      std::lock_guard<std::mutex> lock(mu_);
      context_ = nullptr;
      if (stopped_) return absl::OkStatus();
    }
    if (ready_callback_) ready_callback_(false);
    if (absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) return s;
    logging::Log(logging::LogLevel::kWarning, "pipeline", "not part of the group; joining again",
                 {{"leader", options_.leader}, {"reason", std::string(s.message())}});
    absl::SleepFor(options_.retry_interval);
  }
}

absl::Status PipelineStageRunner::Session(grpc::ClientContext* context) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT_MAX);
  args.SetMaxSendMessageSize(INT_MAX);
  // Notice a leader that vanished without closing the connection.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options_.leader, credentials, args);
  std::unique_ptr<v1::Pipeline::Stub> stub = v1::Pipeline::NewStub(channel);
  std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::LeaderMessage>> stream =
      stub->Join(context);
  auto ended = [&](const std::string& what) {
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    const std::string detail = status.ok() ? what : status.error_message();
    return absl::Status(status.ok() ? absl::StatusCode::kUnavailable
                                    : static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("leader ", options_.leader, ": ", detail));
  };

  v1::StageMessage out;
  v1::StageJoin* join = out.mutable_join();
  join->set_requested_rank(options_.requested_rank);
  join->set_pp_size(options_.pp_size);
  const BlockKey fingerprint = ModelWeightsFingerprint(*weights_);
  join->set_model_fingerprint_hi(fingerprint.hi);
  join->set_model_fingerprint_lo(fingerprint.lo);
  join->set_name(options_.name.empty() ? HostName() : options_.name);
  join->set_tp_size(options_.tensor_parallel.tp_size);
  join->set_device(options_.device);
  v1::LeaderMessage in;
  if (!stream->Write(out) || !stream->Read(&in)) return ended("no assignment");
  if (!in.has_assignment()) return ended("the leader's first message is not an assignment");
  const v1::StageAssignment a = in.assignment();  // a copy: `in` is reused for the steps
  const std::optional<KvCacheDType> dtype = KvCacheDTypeFromName(a.kv_cache_dtype());
  if (!dtype.has_value() || a.num_blocks() < 2 || a.block_size() < 1 ||
      a.pp_size() != options_.pp_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "leader ", options_.leader, " sent an unusable assignment: ", a.ShortDebugString()));
  }
  const StageLinkFactory& link_factory = options_.tensor_parallel.stage_links;
  if (a.device_hand_over() && !link_factory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "leader ", options_.leader,
        " hands over device to device (NCCL); this stage has no device links (--device ",
        options_.device, ")"));
  }
  absl::StatusOr<std::unique_ptr<ModelWeights>> stage =
      StageWeights(*weights_, a.first_layer(), a.num_layers());
  if (!stage.ok()) return stage.status();
  absl::StatusOr<std::unique_ptr<TensorParallelModel>> model =
      TensorParallelModel::Create(stage->get(), options_.tensor_parallel);
  if (absl::IsResourceExhausted(model.status())) {
    // Joining again would fail the same way: end here.
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", a.rank(), " cannot hold its layers ", a.first_layer(), "..",
                     a.first_layer() + a.num_layers() - 1, " (", model.status().message(),
                     "); split the layers otherwise (--pp-layers) or give this stage more memory"));
  }
  if (!model.ok()) return model.status();
  absl::StatusOr<std::unique_ptr<ShardedKvCache>> cache =
      (*model)->CreateKvCache(a.num_blocks(), a.block_size(), *dtype);
  if (absl::IsResourceExhausted(cache.status())) {
    // Joining again would fail the same way: end here, saying what to change. The pool is the
    // leader's size (every stage holds the same block ids for its layers).
    const int64_t bytes =
        (*model)->KvBytesPerToken(*dtype) * a.num_blocks() * int64_t{a.block_size()};
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", a.rank(), " cannot hold the group's KV pool for its layers ", a.first_layer(),
        "..", a.first_layer() + a.num_layers() - 1, ": ", a.num_blocks(), " blocks of ",
        a.block_size(), " tokens, ", bytes, " bytes over its ranks (", cache.status().message(),
        "); give the leader a smaller pool (--kv-cache-memory or --num-kv-blocks, sized for the "
        "stage with the least memory: kvserve plan --pp) or this stage more memory"));
  }
  if (!cache.ok()) return cache.status();
  rank_.store(a.rank());
  const bool last = a.first_layer() + a.num_layers() == weights_->config.num_layers;
  const int64_t hidden = weights_->config.hidden_size;
  const int64_t vocab = weights_->config.vocab_size;
  out.Clear();
  out.mutable_ready()->set_kv_bytes((*model)->KvBytesPerToken(*dtype) * a.num_blocks() *
                                    a.block_size());
  if (!stream->Write(out)) return ended("the leader closed the call before this stage was ready");
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.joins;
  }
  logging::Log(logging::LogLevel::kInfo, "pipeline", "stage ready",
               {{"leader", options_.leader},
                {"stage", a.rank()},
                {"first_layer", a.first_layer()},
                {"layers", a.num_layers()},
                {"kv_blocks", a.num_blocks()}});
  if (ready_callback_) ready_callback_(true);

  // The call's reader: queues the leader's messages, and when the call ends aborts the links
  // (a forward pass may be waiting for a peer that is gone).
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<v1::LeaderMessage> queue;
  bool call_ended = false;
  std::vector<std::shared_ptr<StageLink>> links;  // guarded by queue_mu
  std::thread reader([&] {
    v1::LeaderMessage m;
    while (stream->Read(&m)) {
      std::lock_guard<std::mutex> lock(queue_mu);
      queue.push_back(std::move(m));
      queue_cv.notify_one();
    }
    std::lock_guard<std::mutex> lock(queue_mu);
    call_ended = true;
    if (!links.empty()) links[0]->Abort();
    queue_cv.notify_one();
  });
  std::string why = "the leader ended the call";
  std::vector<float> input;
  std::vector<float> output;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(queue_mu);
      queue_cv.wait(lock, [&] { return call_ended || !queue.empty(); });
      if (queue.empty()) break;
      in = std::move(queue.front());
      queue.pop_front();
    }
    out.Clear();
    if (in.has_connect()) {
      if (!a.device_hand_over()) {
        why = "the leader sent a connect to a stage with a host hand-over";
        break;
      }
      // A new formation: the old links (if any) are dead already.
      absl::StatusOr<std::vector<std::shared_ptr<StageLink>>> opened = link_factory.open(
          in.connect().link_id(), a.pp_size(), a.rank(),
          absl::Milliseconds(std::max<int64_t>(in.connect().open_timeout_ms(), 1000)));
      if (!opened.ok()) {
        why = std::string(opened.status().message());
        break;
      }
      if (absl::Status s = (*model)->SetStageLinks(*opened); !s.ok()) {
        why = std::string(s.message());
        break;
      }
      {
        std::lock_guard<std::mutex> lock(queue_mu);
        links = std::move(*opened);
        if (call_ended) links[0]->Abort();
      }
      out.mutable_connected()->set_formation(in.connect().formation());
      if (!stream->Write(out)) break;
      logging::Log(
          logging::LogLevel::kInfo, "pipeline", "stage links open",
          {{"stage", a.rank()}, {"formation", static_cast<int64_t>(in.connect().formation())}});
      continue;
    }
    if (!in.has_step()) {
      why = "the leader sent something other than a step";
      break;
    }
    const v1::PipelineStep& step = in.step();
    v1::StepResult* result = out.mutable_result();
    result->set_step(step.step());
    const absl::Time busy_from = absl::Now();
    absl::Status s;
    absl::StatusOr<ForwardBatch> batch = DecodeStep(step);
    if (!batch.ok()) s = batch.status();
    const int64_t tokens = batch.ok() ? static_cast<int64_t>(batch->tokens.size()) : 0;
    if (s.ok()) {
      for (const v1::StageBlockCopy& c : step.copies()) {
        if (c.src() < 1 || c.dst() < 1 || c.src() >= a.num_blocks() || c.dst() >= a.num_blocks()) {
          s = absl::InvalidArgumentError(
              absl::StrCat("block copy ", c.src(), " -> ", c.dst(), " outside the pool"));
          break;
        }
        (*cache)->CopyBlock(c.src(), c.dst());
      }
    }
    if (s.ok() && !a.device_hand_over()) {
      input.resize(static_cast<size_t>(StageIoFloats(tokens, hidden)));
      s = BytesToFloats(step.hand_over(), static_cast<int64_t>(input.size()), "hand-over",
                        input.data());
    }
    if (s.ok()) {
      // With a device hand-over the links carry it (SetStageLinks) and only logits come back.
      const size_t hand_over_floats =
          a.device_hand_over() ? 0 : static_cast<size_t>(StageIoFloats(tokens, hidden));
      const size_t out_floats =
          last ? batch->logits_rows.size() * static_cast<size_t>(vocab) : hand_over_floats;
      output.resize(out_floats);
      s = (*model)->Forward(
          *batch, **cache, last ? output.data() : nullptr,
          StageIo{input.data(), last || a.device_hand_over() ? nullptr : output.data()});
      if (s.ok()) FloatsToBytes(output, result->mutable_output());
    }
    if (!s.ok()) {
      result->set_code(static_cast<int>(s.code()));
      result->set_message(std::string(s.message()));
    }
    const double busy = absl::ToDoubleSeconds(absl::Now() - busy_from);
    if (!stream->Write(out)) break;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.busy_seconds += busy;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu);
    if (!links.empty()) links[0]->Abort();
    if (!call_ended) context->TryCancel();  // this side ends the call: wake the reader
  }
  reader.join();
  (void)(*model)->SetStageLinks({});
  return ended(why);
}

}  // namespace kvserve
