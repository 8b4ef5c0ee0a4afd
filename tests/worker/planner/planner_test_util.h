#ifndef KVSERVE_TESTS_WORKER_PLANNER_PLANNER_TEST_UTIL_H_
#define KVSERVE_TESTS_WORKER_PLANNER_PLANNER_TEST_UTIL_H_

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve::planner_testing {

/// A fresh, empty directory for the running test, inside its scratch directory (unique to this
/// process and test, removed when the test ends).
inline std::string MakeTestDir() {
  const std::filesystem::path dir = test_util::ScratchPath("planner");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

/// Writes `text` to `path`.
inline void WriteText(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  ASSERT_TRUE(out.good()) << path;
}

/// Writes a safetensors file: the 8-byte little-endian header length, `header_json`, then
/// `data_bytes` zero bytes.
inline void WriteSafetensors(const std::string& path, const std::string& header_json,
                             size_t data_bytes) {
  std::string bytes(8, '\0');
  uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes += header_json;
  bytes.append(data_bytes, '\0');
  WriteText(path, bytes);
}

/// The stories260K Hugging Face directory shared by all sessions.
inline std::string Stories260KDir() {
  return std::string(KVSERVE_SHARED_DIR) + "/models/stories260K-hf";
}
inline std::string Stories260KGguf() {
  return std::string(KVSERVE_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
}

}  // namespace kvserve::planner_testing

#endif  // KVSERVE_TESTS_WORKER_PLANNER_PLANNER_TEST_UTIL_H_
