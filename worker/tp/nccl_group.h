#ifndef KVSERVE_WORKER_TP_NCCL_GROUP_H_
#define KVSERVE_WORKER_TP_NCCL_GROUP_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tp/communicator.h"
#include "worker/tp/stage_link.h"

namespace kvserve {

/// NCCL communicators for CUDA devices 0..num_devices-1 of this process, rank r's at index r
/// (worker/tp/nccl_communicator.h, reached through libkvserve_cuda.so so that no program links
/// NCCL; with `simulator`, through libkvserve_cuda_sim.so and the simulator's NCCL). UNAVAILABLE
/// naming the reason when the CUDA library, NCCL or the devices are missing.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(int num_devices,
                                                                           bool simulator = false);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_TP_NCCL_GROUP_H_
