#include "common/tokenizer/utf8.h"

namespace kvserve::utf8 {
namespace {

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Number of bytes of the longest prefix of s[pos..] that could still begin a well-formed
// sequence (the "maximal subpart"); at least 1.
size_t MaximalSubpart(std::string_view s, size_t pos) {
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t i = 1;
  for (; i <= need && pos + i < s.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(s[pos + i]);
    if (i == 1 ? (b < lo || b > hi) : !IsContinuation(b)) break;
  }
  return i;
}

}  // namespace

size_t SequenceLength(std::string_view s, size_t pos) {
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return 1;
  size_t need;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
  } else {
    return 0;
  }
  return MaximalSubpart(s, pos) == need + 1 ? need + 1 : 0;
}

size_t FindInvalid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t len = SequenceLength(s, pos);
    if (len == 0) return pos;
    pos += len;
  }
  return s.size();
}

std::string ToValidLossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = SequenceLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
    } else {
      out.append(kReplacement);
      pos += MaximalSubpart(bytes, pos);
    }
  }
  return out;
}

char32_t Decode(std::string_view s, size_t pos, size_t len) {
  const auto b = [&](size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[pos + i]));
  };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void Append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace kvserve::utf8
