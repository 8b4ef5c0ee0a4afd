// The constraint compilers and the matcher on arbitrary input. The first byte picks the kind
// (JSON schema, regular expression, GBNF grammar); the rest is the constraint's text, up to a
// NUL byte, and what follows the NUL is text fed to the matcher. Properties:
//   - compiling either fails with INVALID_ARGUMENT or gives a grammar (never a crash, a hang or
//     unbounded memory);
//   - for a compiled grammar, the token mask over a small vocabulary agrees with feeding each
//     token's bytes to a copy of the matcher, before and after the text is fed.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "worker/constraint/constraint.h"

namespace kvserve {
namespace {

using constraint::ConstraintSpec;

const constraint::TokenTrie& Vocabulary() {
  static const constraint::TokenTrie* trie = [] {
    std::vector<std::pair<TokenId, std::string>> tokens;
    for (int b = 0; b < 128; ++b) tokens.emplace_back(b, std::string(1, static_cast<char>(b)));
    const char* words[] = {"\"", "{\"", "\": ", ", ", "true", "null", "12", "ab", "é", "\xC3",
                           "\xA9", " {", "[]", "},", "\\n", "yes", "no", "::="};
    TokenId id = 128;
    for (const char* w : words) tokens.emplace_back(id++, w);
    return constraint::TokenTrie::FromTokens(id, std::move(tokens)).release();
  }();
  return *trie;
}

void CheckMask(constraint::GrammarMatcher& m) {
  const constraint::TokenTrie& trie = Vocabulary();
  constraint::TokenBitmask mask;
  m.FillTokenMask(trie, &mask);
  // The brute force copies the matcher per token: skip it for huge parser states (the limits
  // themselves are what such inputs test), or an input can take seconds.
  if (m.overflowed() || m.num_nodes() > 20000) return;
  for (TokenId id = 0; id < trie.vocab_size(); ++id) {
    constraint::GrammarMatcher copy = m;
    const bool fits = copy.Advance(trie.bytes(id)) && !copy.overflowed();
    if (fits != constraint::MaskAllows(mask, id)) {
      fuzz::Fail("mask disagrees with the matcher for token " + std::to_string(id));
    }
  }
}

}  // namespace
}  // namespace kvserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvserve::constraint::ConstraintSpec;
  if (size == 0 || size > 4096) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  ConstraintSpec spec;
  spec.kind = data[0] % 3 == 0   ? ConstraintSpec::Kind::kJsonSchema
              : data[0] % 3 == 1 ? ConstraintSpec::Kind::kRegex
                                 : ConstraintSpec::Kind::kGrammar;
  spec.text = std::string(input.substr(0, nul));
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  kvserve::constraint::ConstraintCompiler compiler;
  absl::StatusOr<std::shared_ptr<const kvserve::constraint::CompiledConstraint>> compiled =
      compiler.Compile(spec);
  if (!compiled.ok()) {
    if (compiled.status().code() != absl::StatusCode::kInvalidArgument) {
      kvserve::fuzz::Fail("compile failed with " + compiled.status().ToString());
    }
    return 0;
  }
  // Grammars with many rules make each mask check slow; the parser's limits are what matter.
  if ((*compiled)->grammar()->size() > 20000) return 0;
  kvserve::constraint::GrammarMatcher m((*compiled)->grammar());
  kvserve::CheckMask(m);
  m.Advance(text.substr(0, 64));
  kvserve::CheckMask(m);
  return 0;
}
