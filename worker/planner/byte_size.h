#ifndef KVSERVE_WORKER_PLANNER_BYTE_SIZE_H_
#define KVSERVE_WORKER_PLANNER_BYTE_SIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

/// Parses a memory size: a plain byte count ("1073741824") or a number with a unit, decimal
/// units being powers of 1000 and binary ones powers of 1024, case-insensitive and with optional
/// space: "141GB", "80GiB", "1.5 TiB", "512MiB", "64KB", "100B". Bare "G"/"M" are refused as
/// ambiguous. Errors quote the text.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

/// Renders bytes for humans with a binary unit: "512 B", "1.50 KiB", "74.50 GiB".
std::string FormatBytes(int64_t bytes);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_BYTE_SIZE_H_
