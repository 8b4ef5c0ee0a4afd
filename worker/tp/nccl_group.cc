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

namespace kvserve {

StageLinkFactory NcclStageLinks(int tp_size, bool simulator) {
  StageLinkFactory factory;
  factory.new_id = [simulator]() -> absl::StatusOr<std::string> {
    absl::StatusOr<void*> symbol = CudaLibrarySymbol("kvserve_nccl_stage_link_id", simulator);
    if (!symbol.ok()) {
      return absl::UnavailableError(absl::StrCat("NCCL stage links are not available (",
                                                 std::string(symbol.status().message()), ")"));
    }
    using IdFn = int (*)(char*, size_t, char*, size_t);
    char id[512] = {0};
    char error[512] = {0};
    const int size = reinterpret_cast<IdFn>(*symbol)(id, sizeof(id), error, sizeof(error));
    if (size <= 0) return absl::UnavailableError(absl::StrCat("pipeline formation id: ", error));
    return std::string(id, static_cast<size_t>(size));
  };
  factory.open =
      [tp_size, simulator](
          const std::string& id, int pp_size, int stage,
          absl::Duration timeout) -> absl::StatusOr<std::vector<std::shared_ptr<StageLink>>> {
    absl::StatusOr<void*> symbol = CudaLibrarySymbol("kvserve_open_nccl_stage_links", simulator);
    if (!symbol.ok()) {
      return absl::UnavailableError(absl::StrCat("NCCL stage links are not available (",
                                                 std::string(symbol.status().message()), ")"));
    }
    using OpenFn = int (*)(const char*, size_t, int, int, int, double, StageLink**, char*, size_t);
    std::vector<StageLink*> raw(static_cast<size_t>(tp_size), nullptr);
    char error[512] = {0};
    if (reinterpret_cast<OpenFn>(*symbol)(id.data(), id.size(), pp_size, stage, tp_size,
                                          absl::ToDoubleSeconds(timeout), raw.data(), error,
                                          sizeof(error)) != 1) {
      return absl::UnavailableError(
          absl::StrCat("pipeline links of stage ", stage, " over NCCL: ", error));
    }
    std::vector<std::shared_ptr<StageLink>> links;
    for (StageLink* link : raw) links.emplace_back(link);
    return links;
  };
  return factory;
}

}  // namespace kvserve
