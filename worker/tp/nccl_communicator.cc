#include "worker/tp/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {

// What the ranks of one group share: their communicators, for Abort. A rank holds `mu` shared
// from its aborted check until its collective is enqueued (NCCL calls return once enqueued), and
// Abort holds it exclusively, so no rank can pass the check and then use a communicator that
// Abort freed. Waiting for the collective happens outside the lock: Abort can end it.
struct NcclCommunicator::Group {
  std::shared_mutex mu;
  std::vector<ncclComm_t> comms;
  bool aborted = false;  // under mu
};

struct NcclCommunicator::Impl {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float, for Barrier
  std::shared_ptr<Group> group;
};

namespace {

absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

}  // namespace

NcclCommunicator::NcclCommunicator(int rank, int size, std::unique_ptr<Impl> impl)
    : rank_(rank), size_(size), impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(impl_->device);
  bool aborted;
  {
    std::shared_lock<std::shared_mutex> lock(impl_->group->mu);
    aborted = impl_->group->aborted;
  }
  // An aborted communicator was freed by ncclCommAbort.
  if (impl_->comm != nullptr && !aborted) ncclCommDestroy(impl_->comm);
  if (impl_->scratch != nullptr) cudaFree(impl_->scratch);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> NcclCommunicator::CreateGroup(
    int num_devices) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < num_devices || num_devices < 1) {
    return absl::UnavailableError(absl::StrCat("NCCL group of ", num_devices,
                                               " needs as many CUDA devices; ", count, " usable"));
  }
  std::vector<ncclComm_t> comms(num_devices);
  std::vector<int> devices(num_devices);
  for (int i = 0; i < num_devices; ++i) devices[i] = i;
  if (absl::Status s =
          NcclStatus(ncclCommInitAll(comms.data(), num_devices, devices.data()), "ncclCommInitAll");
      !s.ok()) {
    return s;
  }
  // Each communicator is owned by its rank object from here on, so a failure below frees every
  // one of them (and whatever its rank had set up) on the way out.
  auto shared = std::make_shared<Group>();
  shared->comms = comms;
  std::vector<std::unique_ptr<Communicator>> group;
  std::vector<Impl*> impls;
  for (int i = 0; i < num_devices; ++i) {
    auto impl = std::make_unique<Impl>();
    impl->device = i;
    impl->comm = comms[i];
    impl->group = shared;
    impls.push_back(impl.get());
    group.push_back(
        std::unique_ptr<Communicator>(new NcclCommunicator(i, num_devices, std::move(impl))));
  }
  for (int i = 0; i < num_devices; ++i) {
    Impl& impl = *impls[i];
    cudaSetDevice(i);
    if (cudaStreamCreateWithFlags(&impl.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&impl.scratch, sizeof(float)) != cudaSuccess) {
      cudaGetLastError();  // not sticky: the device is fine, this group is not made
      return absl::UnavailableError(absl::StrCat("cannot set up NCCL rank ", i));
    }
  }
  return group;
}

void NcclCommunicator::Abort() {
  Group& g = *impl_->group;
  std::unique_lock<std::shared_mutex> lock(g.mu);
  if (g.aborted) return;
  g.aborted = true;
  for (ncclComm_t comm : g.comms) ncclCommAbort(comm);
}

// Enqueues `call` (an NCCL collective on this rank's communicator and stream) unless the group was
// aborted, then waits for it outside the lock.
absl::Status NcclCommunicator::Collective(const char* what, const std::function<int()>& call) {
  Group& g = *impl_->group;
  {
    std::shared_lock<std::shared_mutex> lock(g.mu);
    if (g.aborted) return absl::AbortedError("the NCCL group was aborted");
    cudaSetDevice(impl_->device);
    if (absl::Status s = NcclStatus(static_cast<ncclResult_t>(call()), what); !s.ok()) return s;
  }
  const cudaError_t err = cudaStreamSynchronize(impl_->stream);
  if (err != cudaSuccess) return absl::UnavailableError(cudaGetErrorString(err));
  std::shared_lock<std::shared_mutex> lock(g.mu);
  // Aborted while in flight: the result is incomplete.
  if (g.aborted) return absl::AbortedError("the NCCL group was aborted");
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t n) {
  if (n == 0) return absl::OkStatus();
  return Collective("ncclAllReduce", [&]() -> int {
    return ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, impl_->comm,
                         impl_->stream);
  });
}

absl::Status NcclCommunicator::EnqueueAllReduceSum(float* data, int64_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  Group& g = *impl_->group;
  std::shared_lock<std::shared_mutex> lock(g.mu);
  if (g.aborted) return absl::AbortedError("the NCCL group was aborted");
  cudaSetDevice(impl_->device);
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(impl_->comm, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress) {
    return NcclStatus(async, "an earlier NCCL collective");
  }
  return NcclStatus(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum,
                                  impl_->comm, static_cast<cudaStream_t>(stream)),
                    "ncclAllReduce");
}

absl::Status NcclCommunicator::AllGather(const float* send, int64_t n, float* recv) {
  return Collective("ncclAllGather", [&]() -> int {
    return ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat, impl_->comm, impl_->stream);
  });
}

absl::Status NcclCommunicator::Barrier() { return AllReduceSum(impl_->scratch, 1); }

}  // namespace kvserve

// C entry point: fills `out` with `num_devices` new communicators (the caller owns them).
extern "C" __attribute__((visibility("default"))) int kvserve_create_nccl_group(
    int num_devices, kvserve::Communicator** out, char* error, size_t error_size) {
  auto group = kvserve::NcclCommunicator::CreateGroup(num_devices);
  if (!group.ok()) {
    std::snprintf(error, error_size, "%s", std::string(group.status().message()).c_str());
    return 0;
  }
  for (int i = 0; i < num_devices; ++i) out[i] = (*group)[i].release();
  return 1;
}
