#include "worker/constraint/constraint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/constraint/gbnf.h"
#include "worker/constraint/json_schema.h"
#include "worker/constraint/regex_grammar.h"
#include "worker/constraint/tool_call_grammar.h"

namespace kvserve::constraint {

std::string_view ConstraintSpec::KindName() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kJsonSchema:
      return "json_schema";
    case Kind::kJsonObject:
      return "json_object";
    case Kind::kRegex:
      return "regex";
    case Kind::kGrammar:
      return "grammar";
    case Kind::kToolCalls:
      return "tool_calls";
  }
  return "none";
}

std::shared_ptr<const TokenBitmask> CompiledConstraint::Mask(GrammarMatcher& matcher,
                                                             const TokenTrie& trie) const {
  // Masks depend on the vocabulary too: the trie's address is part of the key.
  std::string key(reinterpret_cast<const char*>(&trie), sizeof(&trie));
  key += matcher.StateKey();
  {
    absl::MutexLock lock(&mu_);
    if (auto it = masks_.find(key); it != masks_.end()) {
      ++hits_;
      return it->second;
    }
    ++misses_;
  }
  auto mask = std::make_shared<TokenBitmask>();
  matcher.FillTokenMask(trie, mask.get());
  if (matcher.overflowed()) return mask;  // empty; not a property of the state, not cached
  absl::MutexLock lock(&mu_);
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  masks_.emplace(std::move(key), mask);
  return mask;
}

uint64_t CompiledConstraint::mask_hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

uint64_t CompiledConstraint::mask_misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

absl::StatusOr<std::shared_ptr<const CompiledConstraint>> ConstraintCompiler::Compile(
    const ConstraintSpec& spec) {
  if (!spec.active()) return std::shared_ptr<const CompiledConstraint>();
  const std::string key = absl::StrCat(std::string(spec.KindName()), ":", spec.text);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  absl::StatusOr<Grammar> grammar;
  switch (spec.kind) {
    case ConstraintSpec::Kind::kJsonSchema: {
      nlohmann::ordered_json schema =
          nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) {
        return absl::InvalidArgumentError("json schema: the schema is not valid JSON");
      }
      grammar = JsonSchemaGrammar(schema);
      break;
    }
    case ConstraintSpec::Kind::kJsonObject:
      grammar = JsonObjectGrammar();
      break;
    case ConstraintSpec::Kind::kRegex:
      grammar = RegexGrammar(spec.text);
      break;
    case ConstraintSpec::Kind::kGrammar:
      grammar = GbnfGrammar(spec.text);
      break;
    case ConstraintSpec::Kind::kToolCalls: {
      const nlohmann::ordered_json tools =
          nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (tools.is_discarded()) return absl::InvalidArgumentError("tool_calls: not valid JSON");
      grammar = ToolCallGrammar(tools);
      break;
    }
    case ConstraintSpec::Kind::kNone:
      break;
  }
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<const CompiledConstraint>(
      std::make_shared<const Grammar>(std::move(*grammar)));
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledConstraint>(compiled);
}

ConstraintState::ConstraintState(std::shared_ptr<const CompiledConstraint> constraint,
                                 std::shared_ptr<const TokenTrie> trie,
                                 std::span<const TokenId> eos_ids)
    : constraint_(std::move(constraint)),
      trie_(std::move(trie)),
      eos_ids_(eos_ids.begin(), eos_ids.end()),
      matcher_(constraint_->grammar()) {}

const TokenBitmask& ConstraintState::Allowed() {
  std::shared_ptr<const TokenBitmask> mask = constraint_->Mask(matcher_, *trie_);
  allowed_ = *mask;
  if (matcher_.CanEnd()) {
    for (TokenId id : eos_ids_) {
      if (id >= 0 && id < trie_->vocab_size()) {
        allowed_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      }
    }
  }
  return allowed_;
}

absl::Status ConstraintState::Accept(TokenId token) {
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    if (matcher_.CanEnd()) return absl::OkStatus();
    return absl::InvalidArgumentError("end of sequence before the constrained output is complete");
  }
  if (token < 0 || token >= trie_->vocab_size() || trie_->bytes(token).empty() ||
      !matcher_.Advance(trie_->bytes(token))) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " does not continue the constrained output"));
  }
  return absl::OkStatus();
}

std::string ConstraintState::EmptyMaskReason() const {
  if (matcher_.overflowed()) {
    return absl::StrCat("the constraint's grammar is too ambiguous to follow (more than ",
                        GrammarMatcher::kMaxLeaves, " parses at once)");
  }
  return "no token of the vocabulary can continue the constrained output";
}

}  // namespace kvserve::constraint
