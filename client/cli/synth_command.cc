// `kvserve synth`: writes a random-weight Llama model as GGUF and/or a Hugging Face directory.

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "worker/model/synth_writer.h"

namespace kvserve::cli {
namespace {

struct SynthFlags {
  SyntheticModelOptions model;
  std::string dtype = "f32";
  std::string format = "both";
  std::string out;
};

absl::StatusOr<DType> ParseWeightDType(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype '", name, "' is not one of f32, f16, bf16, q8_0"));
}

int RunSynth(const SynthFlags& flags) {
  SynthWriteOptions options;
  options.model = flags.model;
  options.out_dir = flags.out;
  absl::StatusOr<DType> dtype = ParseWeightDType(flags.dtype);
  if (!dtype.ok()) return ReportError("synth", dtype.status());
  options.model.dtype = *dtype;
  absl::StatusOr<SynthFormat> format = ParseSynthFormat(flags.format);
  if (!format.ok()) return ReportError("synth", format.status());
  options.format = *format;
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(options);
  if (!out.ok()) return ReportError("synth", out.status());
  std::printf("kvserve synth: %.1fM parameters, %s weights, %d-token vocabulary (%d real pieces)\n",
              static_cast<double>(out->num_params) / 1e6, flags.dtype.c_str(),
              options.model.vocab_size, out->num_real_tokens);
  if (!out->gguf_path.empty()) std::printf("kvserve synth: wrote %s\n", out->gguf_path.c_str());
  if (!out->hf_dir.empty()) std::printf("kvserve synth: wrote %s/\n", out->hf_dir.c_str());
  return 0;
}

}  // namespace

Command AddSynthCommand(CLI::App& app) {
  auto f = std::make_shared<SynthFlags>();
  SyntheticModelOptions& m = f->model;
  CLI::App* sub = app.add_subcommand(
      "synth",
      "Write a random-weight Llama model (GGUF and/or Hugging Face directory) for benchmarks.");
  sub->add_option("--layers", m.num_layers, "Decoder layers")->capture_default_str();
  sub->add_option("--hidden", m.hidden_size, "Hidden size")->capture_default_str();
  sub->add_option("--heads", m.num_heads, "Attention heads")->capture_default_str();
  sub->add_option("--kv-heads", m.num_kv_heads, "Key/value heads (divides --heads)")
      ->capture_default_str();
  sub->add_option("--ffn", m.intermediate_size, "MLP intermediate size")->capture_default_str();
  sub->add_option("--vocab", m.vocab_size,
                  absl::StrCat("Vocabulary size (at least ", SynthMinVocabSize(), ")"))
      ->capture_default_str();
  sub->add_option("--max-position", m.max_position_embeddings, "Context length")
      ->capture_default_str();
  sub->add_option("--dtype", f->dtype, "Weight dtype: f32, f16, bf16, q8_0 (GGUF only)")
      ->capture_default_str();
  sub->add_option("--seed", m.seed, "Random seed of the weights")->capture_default_str();
  sub->add_flag("--tie-embeddings", m.tie_word_embeddings,
                "Use the token embedding as the output projection");
  sub->add_option("--format", f->format, "gguf (OUT/model.gguf), hf (OUT/hf/) or both")
      ->capture_default_str();
  sub->add_option("--out", f->out, "Output directory")->required();
  return {sub, [f] { return RunSynth(*f); }};
}

}  // namespace kvserve::cli
