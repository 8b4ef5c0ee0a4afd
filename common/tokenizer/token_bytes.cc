#include "common/tokenizer/token_bytes.h"

#include <optional>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace kvserve {
namespace {

// "<0xAB>" -> 0xAB.
std::optional<uint8_t> ByteFallbackValue(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return std::nullopt;
    }
  }
  return static_cast<uint8_t>(value);
}

}  // namespace

std::string TokenBytesMidText(const Tokenizer& tokenizer, TokenId id) {
  const std::string_view piece = tokenizer.IdToPiece(id);
  if (std::optional<uint8_t> b = ByteFallbackValue(piece); b.has_value()) {
    return std::string(1, static_cast<char>(*b));
  }
  // Decoding a token twice shows what it adds after other text: decoders only treat the first
  // token of a text differently (SentencePiece drops its leading space).
  const TokenId twice[] = {id, id};
  absl::StatusOr<std::string> one = tokenizer.Decode(std::span<const TokenId>(twice, 1));
  absl::StatusOr<std::string> two = tokenizer.Decode(twice);
  if (!one.ok() || !two.ok()) return {};
  std::string text = two->starts_with(*one) ? two->substr(one->size()) : *one;
  if (text.find(utf8::kReplacement) != std::string::npos &&
      piece.find(utf8::kReplacement) == std::string_view::npos) {
    // Part of a UTF-8 character: only its raw bytes mean anything (byte-level vocabularies).
    std::string raw;
    if (!ByteLevelToBytes(piece, &raw)) return {};
    return raw;
  }
  return text;
}

}  // namespace kvserve
