#include "worker/planner/byte_size.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve {

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  const absl::string_view trimmed =
      absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  size_t digits = 0;
  while (digits < trimmed.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(trimmed[digits])) ||
          trimmed[digits] == '.')) {
    ++digits;
  }
  const auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid memory size \"", std::string(text), "\": ", why));
  };
  double number = 0;
  if (digits == 0 || !absl::SimpleAtod(trimmed.substr(0, digits), &number)) {
    return error("expected a number such as 80GiB, 141GB or 85899345920");
  }
  const std::string unit =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(digits)));
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1},      {"b", 1},        {"kb", 1e3},     {"mb", 1e6},     {"gb", 1e9},
      {"tb", 1e12}, {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = number * scale;
    if (!(bytes < 0x1p62)) return error("too large");
    if (unit.empty() || unit == "b") {
      if (number != std::floor(number)) return error("a byte count must be whole");
    }
    return static_cast<int64_t>(std::llround(bytes));
  }
  return error("unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (std::llabs(bytes) < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (unit < 3 && std::fabs(value) >= 1024) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

}  // namespace kvserve
