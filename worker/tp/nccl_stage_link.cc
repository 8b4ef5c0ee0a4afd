// NCCL flavour of StageLink (worker/tp/stage_link.h). Compiled into libkvserve_cuda.so and
// libkvserve_cuda_sim.so only, beside nccl_communicator.cc; programs reach it through the C entry
// points at the end (NcclStageLinks in nccl_group.cc), so that no program links NCCL.
//
// A formation of a pipeline group is one communicator of pp * tp ranks: rank stage * tp + t is
// tensor-parallel rank t of stage `stage`, on device t of its process. Rank t talks only to rank
// t of the neighbouring stages. Each link has its own stream; a transfer is enqueued there and
// waited for before the call returns, like the tensor-parallel collectives
// (nccl_communicator.cc), so the caller's compute stream needs no event.
//
// The communicators are non-blocking (ncclConfig_t::blocking = 0): a blocking
// ncclCommInitRank waits for every rank with no time limit, so a stage that died while the
// group formed would hold the others for good. Instead the init is polled up to a deadline and
// aborted past it; and since calls on a non-blocking communicator may return ncclInProgress,
// each transfer polls the communicator's state before waiting for its stream.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/tp/stage_link.h"

namespace kvserve {
namespace {

// What the links of one process and formation share, for Abort. A link holds `mu` shared from
// its aborted check until its transfer is enqueued, and Abort holds it exclusively, so no link
// passes the check and then uses a communicator that Abort freed. The wait happens outside the
// lock: Abort can end it.
struct Formation {
  std::shared_mutex mu;
  std::vector<ncclComm_t> comms;
  bool aborted = false;  // under mu
};

class NcclStageLink final : public StageLink {
 public:
  NcclStageLink(std::shared_ptr<Formation> formation, int device, ncclComm_t comm,
                cudaStream_t stream, int prev, int next)
      : formation_(std::move(formation)),
        device_(device),
        comm_(comm),
        stream_(stream),
        prev_(prev),
        next_(next) {}

  ~NcclStageLink() override {
    cudaSetDevice(device_);
    bool aborted;
    {
      std::shared_lock<std::shared_mutex> lock(formation_->mu);
      aborted = formation_->aborted;
    }
    if (!aborted) ncclCommDestroy(comm_);  // an aborted one was freed by ncclCommAbort
    cudaStreamDestroy(stream_);
  }

  absl::Status Recv(float* data, int64_t n) override {
    if (prev_ < 0) return absl::FailedPreconditionError("the first stage receives no hand-over");
    return Transfer("ncclRecv", [&] {
      return ncclRecv(data, static_cast<size_t>(n), ncclFloat, prev_, comm_, stream_);
    });
  }

  absl::Status Send(const float* data, int64_t n) override {
    if (next_ < 0) return absl::FailedPreconditionError("the last stage sends no hand-over");
    return Transfer("ncclSend", [&] {
      return ncclSend(data, static_cast<size_t>(n), ncclFloat, next_, comm_, stream_);
    });
  }

  void Abort() override {
    std::unique_lock<std::shared_mutex> lock(formation_->mu);
    if (formation_->aborted) return;
    formation_->aborted = true;
    for (ncclComm_t comm : formation_->comms) ncclCommAbort(comm);
  }

 private:
  template <typename Call>
  absl::Status Transfer(const char* what, const Call& call) {
    {
      std::shared_lock<std::shared_mutex> lock(formation_->mu);
      if (formation_->aborted) return Aborted();
      cudaSetDevice(device_);
      const ncclResult_t r = call();
      if (r != ncclSuccess && r != ncclInProgress) {
        return StageLinkError(absl::StrCat("pipeline hand-over: ", what, ": ",
                                           ncclGetErrorString(r), " ", ncclGetLastError(comm_)));
      }
    }
    // Non-blocking: the op may still be on its way to the stream.
    while (true) {
      std::shared_lock<std::shared_mutex> lock(formation_->mu);
      if (formation_->aborted) return Aborted();
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
      lock.unlock();
      std::this_thread::yield();
    }
    const cudaError_t err = cudaStreamSynchronize(stream_);
    std::shared_lock<std::shared_mutex> lock(formation_->mu);
    // Aborted while in flight: the data is incomplete.
    if (formation_->aborted) return Aborted();
    if (err != cudaSuccess) {
      return StageLinkError(
          absl::StrCat("pipeline hand-over: ", what, ": ", cudaGetErrorString(err)));
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async != ncclSuccess) {
      return StageLinkError(absl::StrCat("pipeline hand-over: ", what, ": ",
                                         ncclGetErrorString(async), " ", ncclGetLastError(comm_)));
    }
    return absl::OkStatus();
  }

  static absl::Status Aborted() {
    return StageLinkError("pipeline hand-over aborted: the group lost a stage");
  }

  std::shared_ptr<Formation> formation_;
  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int prev_;  // peer ranks in the formation's communicator; -1: none
  int next_;
};

void SetError(char* error, size_t error_size, const std::string& message) {
  std::snprintf(error, error_size, "%s", message.c_str());
}

}  // namespace
}  // namespace kvserve

// C entry points (kernels/backend.h: CudaLibrarySymbol).

/// Writes a new formation id (an ncclUniqueId, NCCL_UNIQUE_ID_BYTES) to `out`.
extern "C" __attribute__((visibility("default"))) int kvserve_nccl_stage_link_id(
    char* out, size_t out_size, char* error, size_t error_size) {
  if (out_size < sizeof(ncclUniqueId)) {
    kvserve::SetError(error, error_size, "id buffer too small");
    return 0;
  }
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    kvserve::SetError(error, error_size, absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
    return 0;
  }
  std::memcpy(out, &id, sizeof(id));
  return static_cast<int>(sizeof(id));
}

/// Opens this process's `tp_size` links (devices 0..tp_size-1) of formation `id` as stage
/// `stage` of `pp_size`, into `out` (the caller owns them).
extern "C" __attribute__((visibility("default"))) int kvserve_open_nccl_stage_links(
    const char* id_bytes, size_t id_size, int pp_size, int stage, int tp_size, double timeout_s,
    kvserve::StageLink** out, char* error, size_t error_size) {
  using kvserve::SetError;
  if (id_size != sizeof(ncclUniqueId)) {
    SetError(error, error_size,
             absl::StrCat("a formation id has ", sizeof(ncclUniqueId), " bytes, got ", id_size));
    return 0;
  }
  if (pp_size < 2 || stage < 0 || stage >= pp_size || tp_size < 1) {
    SetError(error, error_size,
             absl::StrCat("bad layout: stage ", stage, " of ", pp_size, ", tp ", tp_size));
    return 0;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < tp_size) {
    SetError(
        error, error_size,
        absl::StrCat("links for tp ", tp_size, " need as many CUDA devices; ", count, " usable"));
    return 0;
  }
  ncclUniqueId id;
  std::memcpy(&id, id_bytes, sizeof(id));
  const int nranks = pp_size * tp_size;
  auto formation = std::make_shared<kvserve::Formation>();
  formation->comms.assign(static_cast<size_t>(tp_size), nullptr);
  // One thread initialises every local rank: NCCL needs them in one group call. Non-blocking,
  // so a rank that never comes ends in the deadline below rather than a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  auto abort_all = [&] {
    for (ncclComm_t comm : formation->comms) {
      if (comm != nullptr) ncclCommAbort(comm);
    }
  };
  ncclResult_t r = ncclGroupStart();
  for (int t = 0; t < tp_size && (r == ncclSuccess || r == ncclInProgress); ++t) {
    cudaSetDevice(t);
    r = ncclCommInitRankConfig(&formation->comms[static_cast<size_t>(t)], nranks, id,
                               stage * tp_size + t, &config);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  // Whatever the group call said, the communicators' own states tell when the init is done.
  if (r == ncclSuccess) r = ncclInProgress;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (r == ncclInProgress) {
    r = ncclSuccess;
    for (ncclComm_t comm : formation->comms) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q =
          comm == nullptr ? ncclInternalError : ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclInProgress) {
        r = ncclInProgress;
      } else if (state != ncclSuccess) {
        r = state;
        break;
      }
    }
    if (r != ncclInProgress) break;
    if (std::chrono::steady_clock::now() > deadline) {
      abort_all();
      SetError(error, error_size,
               absl::StrCat("opening stage ", stage, "'s links timed out after ", timeout_s,
                            " s: not every rank of the ", pp_size, " stages joined the formation"));
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess) {
    abort_all();
    SetError(error, error_size,
             absl::StrCat("ncclCommInitRankConfig (", nranks, " ranks, stage ", stage,
                          "): ", ncclGetErrorString(r)));
    return 0;
  }
  std::vector<std::unique_ptr<kvserve::StageLink>> links;
  for (int t = 0; t < tp_size; ++t) {
    cudaSetDevice(t);
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      cudaGetLastError();
      // Links made so far free their communicators; abort the rest.
      for (size_t u = links.size(); u < formation->comms.size(); ++u) {
        ncclCommAbort(formation->comms[u]);
      }
      SetError(error, error_size, absl::StrCat("cannot create a stream on device ", t));
      return 0;
    }
    const int prev = stage > 0 ? (stage - 1) * tp_size + t : -1;
    const int next = stage + 1 < pp_size ? (stage + 1) * tp_size + t : -1;
    links.push_back(std::make_unique<kvserve::NcclStageLink>(
        formation, t, formation->comms[static_cast<size_t>(t)], stream, prev, next));
  }
  for (int t = 0; t < tp_size; ++t) out[t] = links[static_cast<size_t>(t)].release();
  return 1;
}
