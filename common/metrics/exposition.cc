#include "common/metrics/exposition.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/text_serializer.h"

namespace kvserve::metrics {
namespace {

bool IsNameChar(char c, bool first) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
  return alpha || (!first && c >= '0' && c <= '9');
}

std::optional<double> ParseValue(std::string_view text) {
  if (text == "+Inf" || text == "Inf") return std::numeric_limits<double>::infinity();
  if (text == "-Inf") return -std::numeric_limits<double>::infinity();
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) return std::nullopt;
  return value;
}

// Parses one sample line into `out`; returns an error message or "".
std::string ParseLine(std::string_view line, Sample* out) {
  size_t i = 0;
  while (i < line.size() && IsNameChar(line[i], i == 0)) ++i;
  if (i == 0) return "expected a metric name";
  out->name = std::string(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      const size_t key_start = i;
      while (i < line.size() && IsNameChar(line[i], i == key_start)) ++i;
      if (i == key_start) return "expected a label name";
      std::string key(line.substr(key_start, i - key_start));
      if (i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
        return absl::StrCat("label '", key, "': expected =\"");
      }
      i += 2;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\' && i < line.size()) {
          const char e = line[i++];
          value += e == 'n' ? '\n' : e;
        } else {
          value += c;
        }
      }
      if (!closed) return absl::StrCat("label '", key, "': unterminated value");
      out->labels[std::move(key)] = std::move(value);
    }
  }
  while (i < line.size() && line[i] == ' ') ++i;
  std::string_view rest = line.substr(i);
  const size_t space = rest.find(' ');  // an optional timestamp follows
  std::optional<double> value = ParseValue(rest.substr(0, space));
  if (!value) return absl::StrCat("bad sample value '", std::string(rest.substr(0, space)), "'");
  out->value = *value;
  return "";
}

bool Matches(const Sample& sample, std::string_view name,
             const std::map<std::string, std::string>& labels) {
  if (sample.name != name) return false;
  for (const auto& [key, value] : labels) {
    auto it = sample.labels.find(key);
    if (it == sample.labels.end() || it->second != value) return false;
  }
  return true;
}

}  // namespace

std::string RenderText(const prometheus::Collectable& collectable) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collectable.Collect());
  return out.str();
}

absl::StatusOr<std::vector<Sample>> ParseExposition(std::string_view text) {
  std::vector<Sample> samples;
  int line_number = 0;
  for (absl::string_view piece : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    std::string_view line(piece.data(), piece.size());
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    Sample sample;
    if (std::string error = ParseLine(line, &sample); !error.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("exposition line ", line_number, ": ", error, " in '", std::string(line), "'"));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::optional<double> FindSample(const std::vector<Sample>& samples, std::string_view name,
                                 const std::map<std::string, std::string>& labels) {
  for (const Sample& s : samples) {
    if (Matches(s, name, labels)) return s.value;
  }
  return std::nullopt;
}

double SumSamples(const std::vector<Sample>& samples, std::string_view name,
                  const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (const Sample& s : samples) {
    if (Matches(s, name, labels)) sum += s.value;
  }
  return sum;
}

}  // namespace kvserve::metrics
