// IncrementalDecoder (declared in tokenizer.h).

#include <algorithm>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace kvserve {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

void IncrementalDecoder::SetPrompt(std::span<const TokenId> prompt_ids) {
  // A few tokens of context are enough for every decoder we support (vLLM uses 5 as well).
  constexpr size_t kContextTokens = 5;
  const size_t n = std::min(prompt_ids.size(), kContextTokens);
  std::vector<TokenId> context(prompt_ids.end() - n, prompt_ids.end());
  // A prompt ending inside a UTF-8 sequence (or with invalid ids) gives no usable context.
  absl::StatusOr<std::string> text = tokenizer_->Decode(context, options_);
  if (!text.ok() || text->ends_with(utf8::kReplacement)) context.clear();
  ids_ = std::move(context);
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

absl::StatusOr<std::string> IncrementalDecoder::Add(TokenId id) {
  ids_.push_back(id);
  const std::span<const TokenId> all(ids_);
  absl::StatusOr<std::string> new_text = tokenizer_->Decode(all.subspan(prefix_offset_), options_);
  if (!new_text.ok()) {
    ids_.pop_back();
    return new_text.status();
  }
  // Ids in [prefix, read) decoded without error before, so this cannot fail.
  const std::string prefix_text =
      tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_)
          .value_or("");
  if (new_text->size() <= prefix_text.size() || new_text->ends_with(utf8::kReplacement) ||
      !new_text->starts_with(prefix_text)) {
    return std::string();  // Nothing new yet, or an incomplete character: hold it back.
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text->substr(prefix_text.size());
}

std::string IncrementalDecoder::Finish() {
  const std::span<const TokenId> all(ids_);
  std::string out;
  if (read_offset_ < ids_.size()) {
    const std::string text = tokenizer_->Decode(all.subspan(prefix_offset_), options_).value_or("");
    const std::string prefix_text =
        tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_)
            .value_or("");
    out = text.starts_with(prefix_text) ? text.substr(prefix_text.size()) : text;
  }
  prefix_offset_ = read_offset_ = ids_.size();
  return out;
}

}  // namespace kvserve
