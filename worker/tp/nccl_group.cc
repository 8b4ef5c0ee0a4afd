#include "worker/tp/nccl_group.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"

namespace kvserve {

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(int num_devices,
                                                                           bool simulator) {
  if (num_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL group needs at least one device, got ", num_devices));
  }
  absl::StatusOr<void*> symbol = CudaLibrarySymbol("kvserve_create_nccl_group", simulator);
  if (!symbol.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "NCCL is not available (", std::string(symbol.status().message()), ")"));
  }
  using CreateGroupFn = int (*)(int, Communicator**, char*, size_t);
  std::vector<Communicator*> raw(static_cast<size_t>(num_devices), nullptr);
  char error[512] = {0};
  if (reinterpret_cast<CreateGroupFn>(*symbol)(num_devices, raw.data(), error, sizeof(error)) !=
      1) {
    return absl::UnavailableError(absl::StrCat("NCCL group of ", num_devices, ": ", error));
  }
  std::vector<std::unique_ptr<Communicator>> group;
  for (Communicator* c : raw) group.emplace_back(c);
  return group;
}

}  // namespace kvserve
