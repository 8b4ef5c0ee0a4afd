// Encode and decode arbitrary bytes with real tokenizers (stories260K-hf's SentencePiece-style
// BPE and GPT-2's byte-level BPE, loaded once). The first input byte picks the tokenizer and the
// options; the rest is text (or, with bit 3 set, little-endian int32 token ids). Properties:
//   - Encode either fails (invalid UTF-8) or gives ids inside the vocabulary, and Decode of
//     those ids succeeds;
//   - GPT-2 without special tokens round-trips: Decode(Encode(text)) == text;
//   - the IncrementalDecoder's outputs plus Finish() equal Decode of the same ids;
//   - Decode of arbitrary ids fails cleanly for ids outside the vocabulary.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvserve {
namespace {

const Tokenizer& Load(const char* path) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromJsonFile(path);
  if (!t.ok()) fuzz::Fail("cannot load " + std::string(path) + ": " + t.status().ToString());
  return *t->release();
}

const Tokenizer& Stories() {
  static const Tokenizer& t = Load(KVSERVE_SHARED_DIR "/models/stories260K-hf/tokenizer.json");
  return t;
}

const Tokenizer& Gpt2() {
  static const Tokenizer& t = Load(KVSERVE_SHARED_DIR "/models/tokenizers/gpt2/tokenizer.json");
  return t;
}

void CheckIncremental(const Tokenizer& t, const std::vector<TokenId>& ids,
                      const DecodeOptions& options) {
  absl::StatusOr<std::string> full = t.Decode(ids, options);
  if (!full.ok()) fuzz::Fail("Decode of in-vocabulary ids failed: " + full.status().ToString());
  IncrementalDecoder decoder(t, options);
  std::string streamed;
  for (TokenId id : ids) {
    absl::StatusOr<std::string> piece = decoder.Add(id);
    if (!piece.ok()) fuzz::Fail("IncrementalDecoder::Add failed: " + piece.status().ToString());
    streamed += *piece;
  }
  streamed += decoder.Finish();
  if (streamed != *full) fuzz::Fail("incremental decode differs from Decode");
}

}  // namespace
}  // namespace kvserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;  // NOLINT: a fuzz entry point outside the namespace
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const bool gpt2 = (mode & 1) != 0;
  const Tokenizer& t = gpt2 ? Gpt2() : Stories();
  EncodeOptions encode;
  encode.add_special_tokens = (mode & 2) != 0;
  DecodeOptions decode;
  decode.skip_special_tokens = (mode & 4) != 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  if ((mode & 8) == 0) {
    absl::StatusOr<std::vector<TokenId>> ids = t.Encode(rest, encode);
    if (!ids.ok()) return 0;
    for (TokenId id : *ids) {
      if (id < 0 || id >= t.vocab_size()) fuzz::Fail("Encode gave an id outside the vocabulary");
    }
    absl::StatusOr<std::string> text = t.Decode(*ids);
    if (!text.ok()) fuzz::Fail("Decode(Encode(text)) failed: " + text.status().ToString());
    if (gpt2 && !encode.add_special_tokens && *text != rest) {
      fuzz::Fail("GPT-2 byte-level BPE did not round-trip");
    }
    CheckIncremental(t, *ids, decode);
    return 0;
  }
  std::vector<TokenId> ids(rest.size() / sizeof(int32_t));
  if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * sizeof(int32_t));
  (void)t.Decode(ids, decode);  // may fail: ids outside the vocabulary
  for (TokenId& id : ids) {
    const int64_t v = static_cast<int64_t>(id) % t.vocab_size();
    id = static_cast<TokenId>(v < 0 ? v + t.vocab_size() : v);
  }
  CheckIncremental(t, ids, decode);
  return 0;
}
