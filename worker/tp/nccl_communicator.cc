#include "worker/tp/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {

// What the ranks of one group share: their communicators, for Abort.
struct NcclCommunicator::Group {
  std::mutex mu;
  std::vector<ncclComm_t> comms;
  std::atomic<bool> aborted{false};
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
  // An aborted communicator was freed by ncclCommAbort.
  if (impl_->comm != nullptr && !impl_->group->aborted.load()) ncclCommDestroy(impl_->comm);
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
  auto shared = std::make_shared<Group>();
  shared->comms = comms;
  std::vector<std::unique_ptr<Communicator>> group;
  for (int i = 0; i < num_devices; ++i) {
    auto impl = std::make_unique<Impl>();
    impl->device = i;
    impl->comm = comms[i];
    impl->group = shared;
    cudaSetDevice(i);
    if (cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&impl->scratch, sizeof(float)) != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("cannot set up NCCL rank ", i));
    }
    group.push_back(
        std::unique_ptr<Communicator>(new NcclCommunicator(i, num_devices, std::move(impl))));
  }
  return group;
}

void NcclCommunicator::Abort() {
  Group& g = *impl_->group;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.aborted.exchange(true)) return;
  for (ncclComm_t comm : g.comms) ncclCommAbort(comm);
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t n) {
  if (impl_->group->aborted.load()) return absl::AbortedError("the NCCL group was aborted");
  if (n == 0) return absl::OkStatus();
  cudaSetDevice(impl_->device);
  if (absl::Status s = NcclStatus(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat,
                                                ncclSum, impl_->comm, impl_->stream),
                                  "ncclAllReduce");
      !s.ok()) {
    return s;
  }
  const cudaError_t err = cudaStreamSynchronize(impl_->stream);
  if (err != cudaSuccess) return absl::UnavailableError(cudaGetErrorString(err));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const float* send, int64_t n, float* recv) {
  if (impl_->group->aborted.load()) return absl::AbortedError("the NCCL group was aborted");
  cudaSetDevice(impl_->device);
  if (absl::Status s = NcclStatus(
          ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat, impl_->comm, impl_->stream),
          "ncclAllGather");
      !s.ok()) {
    return s;
  }
  const cudaError_t err = cudaStreamSynchronize(impl_->stream);
  if (err != cudaSuccess) return absl::UnavailableError(cudaGetErrorString(err));
  return absl::OkStatus();
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
