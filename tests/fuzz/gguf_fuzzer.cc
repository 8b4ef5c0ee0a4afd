// GgufFile::Parse over arbitrary bytes, then everything a loader does with a parsed file: every
// typed getter on every key, every tensor's data range, and the tokenizer built from the GGUF
// vocabulary. A parse may fail; it must never read outside the input or crash.

#include <cstdint>
#include <string>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_vocab_reader.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvserve {
namespace {

void Exercise(const GgufFile& gguf) {
  volatile uint64_t sink = 0;
  for (const auto& [key, value] : gguf.metadata()) {
    sink = sink + value.DebugString().size();
    (void)gguf.GetU32(key);
    (void)gguf.GetU64(key);
    (void)gguf.GetI32(key);
    (void)gguf.GetF32(key);
    (void)gguf.GetBool(key);
    (void)gguf.GetString(key);
    (void)gguf.GetStringArray(key);
    (void)gguf.GetF32Array(key);
    (void)gguf.GetI32Array(key);
    if (gguf.Find(key) == nullptr) fuzz::Fail("Find misses a listed key: " + key);
  }
  for (const GgufTensorInfo& t : gguf.tensors()) {
    if (t.data == nullptr && t.nbytes > 0) fuzz::Fail("tensor without data: " + t.name);
    const uint8_t* begin = gguf.file().data();
    if (t.nbytes > 0 && (t.data < begin || t.data + t.nbytes > begin + gguf.file().size())) {
      fuzz::Fail("tensor data outside the file: " + t.name);
    }
    sink = sink + fuzz::Touch(t.data, t.nbytes) + static_cast<uint64_t>(t.numel());
    if (gguf.FindTensor(t.name) == nullptr) fuzz::Fail("FindTensor misses " + t.name);
  }
  absl::StatusOr<GgufVocab> vocab = ReadGgufVocab(gguf);
  if (!vocab.ok()) return;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGgufVocab(*vocab);
  if (!tokenizer.ok()) return;
  absl::StatusOr<std::vector<TokenId>> ids = (*tokenizer)->Encode("Once upon a time, 42 \xC3\xA9");
  if (ids.ok()) (void)(*tokenizer)->Decode(*ids);
}

}  // namespace
}  // namespace kvserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<kvserve::GgufFile> gguf =
      kvserve::GgufFile::Parse(kvserve::fuzz::MapBytes(data, size));
  if (gguf.ok()) kvserve::Exercise(*gguf);
  return 0;
}
