// `kvserve tokenize`: encode text with a model's tokenizer.

#include <cstdio>
#include <memory>
#include <string>

#include "client/cli/command.h"
#include "common/tokenizer_loader/tokenizer_loader.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  bool no_special = false;
  bool json = false;
};

int RunTokenize(const TokenizeOptions& opts) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(opts.tokenizer);
  if (!tokenizer.ok()) return ReportError("tokenize", tokenizer.status());
  absl::StatusOr<std::vector<TokenId>> ids =
      (*tokenizer)->Encode(opts.text, {.add_special_tokens = !opts.no_special});
  if (!ids.ok()) return ReportError("tokenize", ids.status());
  if (opts.json) {
    nlohmann::json out = {{"token_ids", *ids}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  for (TokenId id : *ids) {
    const std::string_view piece = (*tokenizer)->IdToPiece(id);
    std::printf("%d\t%.*s\n", id, static_cast<int>(piece.size()), piece.data());
  }
  return 0;
}

}  // namespace

Command AddTokenizeCommand(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand("tokenize", "Encode text into token ids.");
  sub->add_option("--tokenizer", opts->tokenizer,
                  "tokenizer.json, a model directory holding one, or a GGUF file")
      ->required();
  sub->add_option("--text", opts->text, "Text to encode")->required();
  sub->add_flag("--no-special", opts->no_special,
                "Do not add the tokenizer's special tokens (e.g. BOS)");
  sub->add_flag("--json", opts->json, "Print {\"token_ids\": [...]} instead of one id per line");
  return {sub, [opts] { return RunTokenize(*opts); }};
}

}  // namespace kvserve::cli
