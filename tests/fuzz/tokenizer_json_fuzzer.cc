// Tokenizer::FromJsonFile over an arbitrary tokenizer.json (written to a private temporary
// directory, without a tokenizer_config.json beside it), then a short encode and decode with
// whatever loaded. Loading may fail; it must never throw (nlohmann::json errors are converted
// to Status inside the loader), crash or hang.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const std::string& JsonPath() {
  static const std::string* path = [] {
    char dir[] = "/tmp/kvserve-fuzz-tokenizer-XXXXXX";
    if (mkdtemp(dir) == nullptr) kvserve::fuzz::Fail("mkdtemp failed");
    auto* p = new std::string(std::string(dir) + "/tokenizer.json");
    static std::string dir_copy = dir;
    std::atexit([] {
      std::remove((dir_copy + "/tokenizer.json").c_str());
      rmdir(dir_copy.c_str());
    });
    return p;
  }();
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = JsonPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) kvserve::fuzz::Fail("cannot write " + path);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) kvserve::fuzz::Fail("short write");
  std::fclose(f);
  absl::StatusOr<std::unique_ptr<kvserve::Tokenizer>> tokenizer =
      kvserve::Tokenizer::FromJsonFile(path);
  if (!tokenizer.ok()) return 0;
  const kvserve::Tokenizer& t = **tokenizer;
  absl::StatusOr<std::vector<kvserve::TokenId>> ids =
      t.Encode("Hello world, 123 \xC3\xA9t\xC3\xA9!");
  if (ids.ok()) {
    for (kvserve::TokenId id : *ids) {
      if (id < 0 || id >= t.vocab_size()) kvserve::fuzz::Fail("Encode gave an id outside vocab");
    }
    (void)t.Decode(*ids);
  }
  std::vector<kvserve::TokenId> all;
  for (int i = 0; i < t.vocab_size() && i < 64; ++i) all.push_back(i);
  (void)t.Decode(all);
  return 0;
}
