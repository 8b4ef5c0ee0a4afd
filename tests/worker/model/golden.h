#ifndef KVSERVE_TESTS_WORKER_MODEL_GOLDEN_H_
#define KVSERVE_TESTS_WORKER_MODEL_GOLDEN_H_

#include <fstream>
#include <string>
#include <vector>

#include "common/token.h"
#include "nlohmann/json.hpp"

namespace kvserve::testing_golden {

inline const char kStoriesGguf[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";
inline const char kStoriesHf[] = KVSERVE_SHARED_DIR "/models/stories260K-hf";

struct GoldenCase {
  std::string prompt;
  std::vector<TokenId> prompt_ids;
  std::vector<TokenId> generated_ids;
  std::string text;
};

struct StoriesGolden {
  std::vector<GoldenCase> cases;
  std::vector<TokenId> probe_prompt_ids;
  std::vector<float> probe_logits;
};

/// Reads ../shared/models/stories260K/golden.json (reference outputs of llama2.c).
inline StoriesGolden LoadStoriesGolden() {
  std::ifstream in(KVSERVE_SHARED_DIR "/models/stories260K/golden.json");
  nlohmann::json j = nlohmann::json::parse(in);
  StoriesGolden g;
  for (const auto& c : j["cases"]) {
    g.cases.push_back({c["prompt"].get<std::string>(), c["prompt_token_ids"].get<std::vector<TokenId>>(),
                       c["generated_token_ids"].get<std::vector<TokenId>>(),
                       c["text"].get<std::string>()});
  }
  g.probe_prompt_ids = j["logits_probe"]["prompt_token_ids"].get<std::vector<TokenId>>();
  g.probe_logits = j["logits_probe"]["logits"].get<std::vector<float>>();
  return g;
}

}  // namespace kvserve::testing_golden

#endif  // KVSERVE_TESTS_WORKER_MODEL_GOLDEN_H_
