#include "common/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "common/tokenizer/utf8.h"

namespace kvserve {
namespace {

// Highest code point the map uses: 0x100 + 68 - 1.
constexpr char32_t kMaxMapped = 0x143;

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_text;
  std::array<int16_t, kMaxMapped + 1> char_to_byte;

  ByteLevelTables() {
    char_to_byte.fill(-1);
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      utf8::Append(cp, &byte_to_text[b]);
      char_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

// Immutable after construction (thread-safe static initialisation).
const ByteLevelTables& Tables() {
  static const ByteLevelTables* const tables = new ByteLevelTables();
  return *tables;
}

}  // namespace

void BytesToByteLevel(std::string_view bytes, std::string* out) {
  const ByteLevelTables& t = Tables();
  for (const char c : bytes) out->append(t.byte_to_text[static_cast<unsigned char>(c)]);
}

bool ByteLevelToBytes(std::string_view token, std::string* out) {
  const ByteLevelTables& t = Tables();
  size_t pos = 0;
  while (pos < token.size()) {
    const size_t len = utf8::SequenceLength(token, pos);
    if (len == 0) return false;
    const char32_t cp = utf8::Decode(token, pos, len);
    if (cp > kMaxMapped || t.char_to_byte[cp] < 0) return false;
    out->push_back(static_cast<char>(t.char_to_byte[cp]));
    pos += len;
  }
  return true;
}

}  // namespace kvserve
