#include "common/tokenizer_loader/tokenizer_loader.h"

#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_vocab_reader.h"

namespace kvserve {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    if (!fs::exists(json, ec)) {
      return absl::NotFoundError(absl::StrCat(path, ": missing tokenizer.json"));
    }
    return Tokenizer::FromJsonFile(json.string());
  }
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (fs::path(path).extension() == ".json") return Tokenizer::FromJsonFile(path);
  absl::StatusOr<GgufFile> gguf = GgufFile::Open(path);
  if (!gguf.ok()) return gguf.status();
  absl::StatusOr<GgufVocab> vocab = ReadGgufVocab(*gguf);
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGgufVocab(*vocab);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

}  // namespace kvserve
