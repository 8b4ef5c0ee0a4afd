#ifndef KVSERVE_TESTS_COMMON_TOKENIZER_GOLDEN_CASES_H_
#define KVSERVE_TESTS_COMMON_TOKENIZER_GOLDEN_CASES_H_

// Reads the golden tokenizer fixtures in shared/models/tokenizers/*/golden.json.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/token.h"
#include "nlohmann/json.hpp"

namespace kvserve::testing {

/// shared/<relative>.
inline std::string SharedPath(const std::string& relative) {
  return std::string(KVSERVE_SHARED_DIR) + "/" + relative;
}

/// The tokenizer folders with golden files.
inline const std::vector<std::string>& GoldenTokenizers() {
  static const std::vector<std::string> names = {"tinyllama-1.1b-chat-v1.0", "gpt2",
                                                 "smollm2-135m"};
  return names;
}

/// One case of a golden.json (see its "fields" description).
struct GoldenCase {
  int index = 0;
  std::string text;
  std::vector<TokenId> ids_with_special;
  std::vector<TokenId> ids_no_special;
  std::string decoded;
  std::string decoded_skip_special;
};

inline nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

/// All cases of shared/models/tokenizers/<name>/golden.json.
inline std::vector<GoldenCase> ReadGoldenCases(const std::string& name) {
  const nlohmann::json root =
      ReadJsonFile(SharedPath("models/tokenizers/" + name + "/golden.json"));
  std::vector<GoldenCase> cases;
  for (const nlohmann::json& c : root.at("cases")) {
    GoldenCase g;
    g.index = c.at("index").get<int>();
    g.text = c.at("text").get<std::string>();
    g.ids_with_special = c.at("ids_with_special").get<std::vector<TokenId>>();
    g.ids_no_special = c.at("ids_no_special").get<std::vector<TokenId>>();
    g.decoded = c.at("decoded").get<std::string>();
    g.decoded_skip_special = c.at("decoded_skip_special").get<std::string>();
    cases.push_back(std::move(g));
  }
  return cases;
}

/// shared/models/tokenizers/<name>/tokenizer.json.
inline std::string TokenizerJsonPath(const std::string& name) {
  return SharedPath("models/tokenizers/" + name + "/tokenizer.json");
}

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_COMMON_TOKENIZER_GOLDEN_CASES_H_
