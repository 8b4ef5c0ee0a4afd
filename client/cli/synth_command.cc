// `kvserve synth`: writes a random-weight Llama, Qwen3, Mixtral or Qwen3-MoE model as GGUF and/or
// a Hugging Face directory (the mixture-of-experts ones as a Hugging Face directory only).

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
  std::string dequantized_twin;
};

constexpr char kDTypeChoices[] =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m";

// Sets the weight dtype and mix of `model` from a --dtype name.
absl::Status ParseWeightDType(const std::string& name, SyntheticModelOptions* model) {
  model->mix = WeightMix::kUniform;
  if (name == "q4_k_m" || name == "q5_k_m") {
    model->dtype = name == "q4_k_m" ? DType::kQ4_K : DType::kQ5_K;
    model->mix = WeightMix::kKQuantMedium;
    return absl::OkStatus();
  }
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    if (name == DTypeName(d)) {
      model->dtype = d;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype '", name, "' is not one of ", kDTypeChoices));
}

int RunSynth(const SynthFlags& flags) {
  SynthWriteOptions options;
  options.model = flags.model;
  std::string& arch = options.model.architecture;
  if (arch == "qwen3moe") arch = "qwen3_moe";
  if (arch == "deepseek2") arch = "deepseek_v2";
  if (arch == "deepseek3") arch = "deepseek_v3";
  options.out_dir = flags.out;
  options.dequantized_twin_path = flags.dequantized_twin;
  if (absl::Status s = ParseWeightDType(flags.dtype, &options.model); !s.ok()) {
    return ReportError("synth", s);
  }
  absl::StatusOr<SynthFormat> format = ParseSynthFormat(flags.format);
  if (!format.ok()) return ReportError("synth", format.status());
  options.format = *format;
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(options);
  if (!out.ok()) return ReportError("synth", out.status());
  std::printf(
      "kvserve synth: %s, %.1fM parameters, %s weights, %d-token vocabulary (%d real pieces)\n",
      options.model.architecture.c_str(), static_cast<double>(out->num_params) / 1e6,
      flags.dtype.c_str(), options.model.vocab_size, out->num_real_tokens);
  if (!out->gguf_path.empty()) std::printf("kvserve synth: wrote %s\n", out->gguf_path.c_str());
  if (!out->hf_dir.empty()) std::printf("kvserve synth: wrote %s/\n", out->hf_dir.c_str());
  if (!out->dequantized_twin_path.empty()) {
    std::printf("kvserve synth: wrote %s (dequantized f32 twin)\n",
                out->dequantized_twin_path.c_str());
  }
  return 0;
}

}  // namespace

Command AddSynthCommand(CLI::App& app) {
  auto f = std::make_shared<SynthFlags>();
  SyntheticModelOptions& m = f->model;
  CLI::App* sub = app.add_subcommand(
      "synth",
      "Write a random-weight Llama, Qwen3, Mixtral, Qwen3-MoE or DeepSeek-V2/V3 model (GGUF "
      "and/or Hugging Face directory) for benchmarks and tests.");
  sub->add_option("--arch", m.architecture,
                  "Model family: llama, qwen3 (per-head q/k norms, rotate_half q/k rows), "
                  "mixtral or qwen3moe (mixture of experts), deepseek2 or "
                  "deepseek3 (multi-head latent attention + DeepSeek experts)")
      ->capture_default_str();
  sub->add_option("--kv-lora-rank", m.kv_lora_rank, "Latent KV width (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--q-lora-rank", m.q_lora_rank,
                  "Compressed query width; 0 projects q directly (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--qk-nope-dim", m.qk_nope_head_dim,
                  "Per-head q/k width without RoPE (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--qk-rope-dim", m.qk_rope_head_dim,
                  "Per-head q/k width with RoPE, shared key (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--v-head-dim", m.v_head_dim, "Per-head value width (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--shared-experts", m.n_shared_experts,
                  "Always-active experts per MoE layer (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--dense-layers", m.first_k_dense_replace,
                  "First layers with a dense MLP (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--expert-groups", m.n_group,
                  "Expert groups for group-limited routing (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--topk-groups", m.topk_group,
                  "Groups a token's experts may come from (deepseek2/3)")
      ->capture_default_str();
  sub->add_option("--routed-scale", m.routed_scaling_factor,
                  "routed_scaling_factor of the routed experts' weights (deepseek2/3)")
      ->capture_default_str();
  sub->add_flag(
      "--no-norm-topk", [&m](int64_t) { m.norm_topk_prob = false; },
      "Do not renormalize the top-k routing weights (qwen3moe, deepseek2/3)");
  sub->add_option("--experts", m.num_experts, "Experts per layer (mixtral, qwen3moe)")
      ->capture_default_str();
  sub->add_option("--experts-per-tok", m.num_experts_per_tok,
                  "Experts each token runs (mixtral, qwen3moe)")
      ->capture_default_str();
  sub->add_option("--expert-ffn", m.moe_intermediate_size,
                  "Width of one expert (qwen3moe, deepseek2/3; 0 means --ffn; mixtral's experts "
                  "are --ffn wide)")
      ->capture_default_str();
  sub->add_option("--layers", m.num_layers, "Decoder layers")->capture_default_str();
  sub->add_option("--hidden", m.hidden_size, "Hidden size")->capture_default_str();
  sub->add_option("--heads", m.num_heads, "Attention heads")->capture_default_str();
  sub->add_option("--kv-heads", m.num_kv_heads, "Key/value heads (divides --heads)")
      ->capture_default_str();
  sub->add_option("--head-dim", m.head_dim,
                  "Width of one attention head; 0 means --hidden / --heads")
      ->capture_default_str();
  sub->add_option("--ffn", m.intermediate_size, "MLP intermediate size")->capture_default_str();
  sub->add_option("--vocab", m.vocab_size,
                  absl::StrCat("Vocabulary size (at least ", SynthMinVocabSize(), ")"))
      ->capture_default_str();
  sub->add_option("--max-position", m.max_position_embeddings, "Context length")
      ->capture_default_str();
  sub->add_option("--dtype", f->dtype,
                  absl::StrCat("Weight dtype: ", kDTypeChoices,
                               " (quantized: GGUF only; _m = llama.cpp-style mix with q6_k for "
                               "output and some attn_v/ffn_down; K-quant rows that are not "
                               "multiples of 256 are stored as q8_0)"))
      ->capture_default_str();
  sub->add_option("--seed", m.seed, "Random seed of the weights")->capture_default_str();
  sub->add_flag("--tie-embeddings", m.tie_word_embeddings,
                "Use the token embedding as the output projection");
  sub->add_option("--format", f->format, "gguf (OUT/model.gguf), hf (OUT/hf/) or both")
      ->capture_default_str();
  sub->add_option("--out", f->out, "Output directory")->required();
  sub->add_option("--dequantized-twin", f->dequantized_twin,
                  "Also write this GGUF file: the same model with every matrix stored as f32 "
                  "holding exactly the values the quantized weights decode to");
  return {sub, [f] { return RunSynth(*f); }};
}

}  // namespace kvserve::cli
