#ifndef KVSERVE_TESTS_WORKER_MODEL_HF_CONFIG_UTIL_H_
#define KVSERVE_TESTS_WORKER_MODEL_HF_CONFIG_UTIL_H_

// Reading and rewriting a Hugging Face directory's config.json, for the model-family tests that
// load a synthesized model with changed keys.

#include <string>

#include "common/gguf/gguf_writer.h"
#include "common/io/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve::testing_model {

inline nlohmann::json ReadConfig(const std::string& hf_dir) {
  return nlohmann::json::parse(*ReadFileToString(hf_dir + "/config.json"));
}

inline void WriteConfig(const std::string& hf_dir, const nlohmann::json& j) {
  ASSERT_TRUE(WriteStringToFile(hf_dir + "/config.json", j.dump()).ok());
}

}  // namespace kvserve::testing_model

#endif  // KVSERVE_TESTS_WORKER_MODEL_HF_CONFIG_UTIL_H_
