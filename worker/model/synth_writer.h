#ifndef KVSERVE_WORKER_MODEL_SYNTH_WRITER_H_
#define KVSERVE_WORKER_MODEL_SYNTH_WRITER_H_

// Writes a random-weight Llama or Qwen3 model (worker/model/synthetic_model.h) to disk, as a GGUF
// file and as a Hugging Face directory, each with a working tokenizer, for benchmarks at realistic
// shapes.
//
// The tokenizer: a SentencePiece-style BPE vocabulary trained at write time on a small built-in
// English text: <unk> <s> </s>, the 256 byte-fallback tokens <0x00>..<0xFF>, the characters of
// the text, then one piece per BPE merge (score = -id, so earlier merges win), then unused
// padding pieces "<unused_N>" up to the vocabulary size. The GGUF file carries it as a
// `tokenizer.ggml.model = "llama"` vocabulary (tokens, scores, token types); tokenizer.json
// carries the same pieces as a byte-fallback BPE model whose merges are every split of a piece
// into two pieces of the vocabulary, ordered by the merged piece's score (the SentencePiece to
// Hugging Face conversion), so both files encode text to the same ids.
//
// Layout: for a llama model, GGUF stores q/k rows in Meta's interleaved-pair RoPE order; the
// Hugging Face copy permutes each head's q/k rows for `rotate_half` (new row h*d + j*d/2 + k =
// old row h*d + 2k + j), as Hugging Face's Llama converter does, so both give the same logits.
// A qwen3 model (GGUF architecture "qwen3", config.json model_type "qwen3") keeps its rows in
// rotate_half order in both files, as llama.cpp's Qwen converter does, and carries the per-head
// q/k norm weights (attn_q_norm / self_attn.q_norm, and k). Mixture-of-experts models carry
// Mixtral's block_sparse_moe or Qwen3-MoE's mlp router and expert names in the Hugging Face copy;
// in GGUF (llama.cpp's layout: Mixtral as architecture "llama" with expert_count, Qwen3-MoE as
// "qwen3moe") the router is ffn_gate_inp and each layer's experts are stacked per role into
// ffn_gate_exps / ffn_up_exps / ffn_down_exps. DeepSeek models (deepseek_v2, deepseek_v3) keep
// their rope part pair-interleaved in both files; their GGUF is llama.cpp's deepseek2 (kv_b_proj
// whole as attn_kv_b, shared experts ffn_*_shexp, the V3 router bias exp_probs_b).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {

/// Which files WriteSynthModel produces.
enum class SynthFormat { kGguf, kHf, kBoth };

/// Parses "gguf", "hf" or "both".
absl::StatusOr<SynthFormat> ParseSynthFormat(const std::string& name);

/// What to write and where.
struct SynthWriteOptions {
  SyntheticModelOptions model;
  /// Output directory (created if missing): the GGUF file goes to `out_dir`/model.gguf, the
  /// Hugging Face directory to `out_dir`/hf.
  std::string out_dir;
  SynthFormat format = SynthFormat::kBoth;
  /// When set, also writes the model's dequantized twin to this GGUF path: the same model with
  /// every matrix stored as f32 holding exactly the values the quantized blocks decode to
  /// (DequantizedTwin), so its logits are the reference for the quantized file's.
  std::string dequantized_twin_path;
};

/// The paths written (empty when that format was not asked for).
struct SynthOutputs {
  std::string gguf_path;
  std::string hf_dir;
  std::string dequantized_twin_path;
  /// Parameters of the model (tied output counted once).
  int64_t num_params = 0;
  /// Number of real (non-padding) pieces of the tokenizer.
  int num_real_tokens = 0;
};

/// Smallest vocabulary the built-in tokenizer needs (specials, bytes and its characters).
int SynthMinVocabSize();

/// Checks the shape against what the writers and loaders accept; errors name the flag
/// (e.g. "--kv-heads 3 must divide --heads 8").
absl::Status ValidateSynthOptions(const SynthWriteOptions& options);

/// Builds the model with MakeSyntheticModel and writes it. Quantized weights (q8_0, q4_0, the
/// K-quants, ...) exist in GGUF only: asking for a Hugging Face copy of them is an
/// INVALID_ARGUMENT error.
absl::StatusOr<SynthOutputs> WriteSynthModel(const SynthWriteOptions& options);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_SYNTH_WRITER_H_
