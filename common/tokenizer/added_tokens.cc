#include "common/tokenizer/added_tokens.h"

#include <algorithm>

namespace kvserve {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Letters, digits, '_' and any non-ASCII byte count as word characters for single_word.
bool IsWordByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || (u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') ||
         u == '_';
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens) {
    if (!t.content.empty()) tokens_.push_back(t);
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
        static_cast<int>(i));
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [this](int a, int b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

std::vector<TextSection> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<TextSection> sections;
  size_t last_end = 0;  // end of the previous token match
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* found = nullptr;
    for (const int index : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = tokens_[index];
      if (text.substr(i).starts_with(t.content)) {
        if (t.single_word) {
          const size_t end = i + t.content.size();
          if ((i > 0 && IsWordByte(text[i - 1])) || (end < text.size() && IsWordByte(text[end]))) {
            continue;
          }
        }
        found = &t;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    size_t start = i;
    size_t end = i + found->content.size();
    if (found->lstrip) {
      while (start > last_end && IsSpace(text[start - 1])) --start;
    }
    if (found->rstrip) {
      while (end < text.size() && IsSpace(text[end])) ++end;
    }
    if (start > last_end) sections.push_back({text.substr(last_end, start - last_end), kNoToken});
    sections.push_back({text.substr(start, end - start), found->id});
    last_end = end;
    i = end;
  }
  if (last_end < text.size()) sections.push_back({text.substr(last_end), kNoToken});
  return sections;
}

}  // namespace kvserve
