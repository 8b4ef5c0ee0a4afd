#include "worker/model/synth_writer.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/gguf/gguf_writer.h"
#include "nlohmann/json.hpp"
#include "worker/loader/model_loader.h"
#include "worker/loader/safetensors_writer.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// The text the tokenizer's merges are learned from (written for this purpose).
constexpr char kTrainingText[] =
    "The old lighthouse keeper walked down to the harbor every morning before the sun came up. "
    "He liked the quiet of the water and the sound of the boats as they knocked against the "
    "pier. One morning he found a small girl sitting on the steps with a basket of apples. "
    "She said that her name was Mia and that she was waiting for her father, who had gone out "
    "with the fishing boats the night before. The keeper sat down next to her and they watched "
    "the light turn from grey to gold. When the first boat came around the rocks, Mia stood up "
    "and waved both of her hands. Her father waved back, and the keeper smiled, because the "
    "sea had been kind that night. Every story about the sea is a story about waiting. People "
    "wait for the tide, for the wind, for the weather to change, and for the ones they love to "
    "come home. A server that answers many requests at once is waiting too: it waits for the "
    "memory to bring the weights, for the next token, and for the next request in the queue. "
    "We measure how long the first token takes, how long each later token takes, and how many "
    "tokens come out of the machine every second. We share the cache between requests that "
    "start with the same words, so the second request with the same system prompt does not "
    "compute those words again. It is a simple idea, and it saves a lot of time when many "
    "people ask questions that begin with the same long instructions. Then the keeper went "
    "back up the hill, and Mia and her father walked home with the basket of apples.";

constexpr const char* kSpecials[] = {"<unk>", "<s>", "</s>"};
constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary
// GGUF token types.
constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUnused = 5,
                  kTypeByte = 6;

struct Piece {
  std::string text;
  float score = 0.0f;
  int32_t type = kTypeNormal;
};

// The printable ASCII characters and U+2581: every piece is built from these.
std::vector<std::string> Alphabet() {
  std::vector<std::string> chars = {kSpace};
  for (char c = '!'; c <= '~'; ++c) chars.emplace_back(1, c);
  return chars;
}

// Learns BPE merges on kTrainingText (words prefixed with U+2581, no merge across words), most
// frequent pair first, ties broken by the pair's text; stops at `max_new` pieces or when no pair
// occurs twice. Returns the new pieces in merge order.
std::vector<std::string> LearnMerges(int max_new, const std::map<std::string, int>& known) {
  std::map<std::string, int> word_counts;
  for (absl::string_view w : absl::StrSplit(kTrainingText, ' ', absl::SkipEmpty())) {
    ++word_counts[absl::StrCat(kSpace, w)];
  }
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [word, count] : word_counts) {
    std::vector<std::string> symbols = {kSpace};
    for (size_t i = sizeof(kSpace) - 1; i < word.size(); ++i) symbols.emplace_back(1, word[i]);
    words.emplace_back(std::move(symbols), count);
  }
  std::vector<std::string> pieces;
  std::map<std::string, int> seen = known;
  while (static_cast<int>(pieces.size()) < max_new) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        pair_counts[{symbols[i], symbols[i + 1]}] += count;
      }
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const std::string merged = best->first + best->second;
    const auto [left, right] = *best;
    for (auto& [symbols, count] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(symbols[i]);
        }
      }
      symbols = std::move(out);
    }
    if (seen.emplace(merged, 0).second) pieces.push_back(merged);
  }
  return pieces;
}

// The whole vocabulary, `vocab_size` pieces; `*num_real` counts the non-padding ones.
std::vector<Piece> BuildVocab(int vocab_size, int* num_real) {
  std::vector<Piece> vocab;
  vocab.push_back({kSpecials[0], 0.0f, kTypeUnknown});
  vocab.push_back({kSpecials[1], 0.0f, kTypeControl});
  vocab.push_back({kSpecials[2], 0.0f, kTypeControl});
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab.push_back({name, 0.0f, kTypeByte});
  }
  std::map<std::string, int> known;
  for (const std::string& c : Alphabet()) {
    known[c] = static_cast<int>(vocab.size());
    vocab.push_back({c, -static_cast<float>(vocab.size()), kTypeNormal});
  }
  for (const std::string& p : LearnMerges(vocab_size - static_cast<int>(vocab.size()), known)) {
    vocab.push_back({p, -static_cast<float>(vocab.size()), kTypeNormal});
  }
  *num_real = static_cast<int>(vocab.size());
  for (int i = 0; static_cast<int>(vocab.size()) < vocab_size; ++i) {
    vocab.push_back({absl::StrCat("<unused_", i, ">"), 0.0f, kTypeUnused});
  }
  return vocab;
}

// Hugging Face merges for a SentencePiece vocabulary: every split of a normal piece into two
// normal pieces, ordered by the merged piece's score (descending), then by the parts' ids.
std::vector<std::string> DeriveMerges(const std::vector<Piece>& vocab) {
  std::unordered_map<std::string, int> ids;
  for (int i = 0; i < static_cast<int>(vocab.size()); ++i) {
    if (vocab[i].type == kTypeNormal) ids.emplace(vocab[i].text, i);
  }
  std::vector<std::tuple<float, int, int, std::string>> merges;  // (-score, left, right, text)
  for (const Piece& p : vocab) {
    if (p.type != kTypeNormal) continue;
    for (size_t cut = 1; cut < p.text.size(); ++cut) {
      if ((static_cast<unsigned char>(p.text[cut]) & 0xC0) == 0x80) continue;  // inside a char
      auto l = ids.find(p.text.substr(0, cut));
      auto r = ids.find(p.text.substr(cut));
      if (l == ids.end() || r == ids.end()) continue;
      merges.emplace_back(-p.score, l->second, r->second, absl::StrCat(l->first, " ", r->first));
    }
  }
  std::sort(merges.begin(), merges.end());
  std::vector<std::string> out;
  for (auto& m : merges) out.push_back(std::move(std::get<3>(m)));
  return out;
}

// llama.cpp's LLAMA_FTYPE numbers for general.file_type (a uniform K-quant is its "_S" type).
uint32_t GgufFileType(DType d, WeightMix mix) {
  const bool medium = mix == WeightMix::kKQuantMedium;
  switch (d) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ8_0:
      return 7;
    case DType::kQ5_0:
      return 8;
    case DType::kQ5_1:
      return 9;
    case DType::kQ4_K:
      return medium ? 15 : 14;
    case DType::kQ5_K:
      return medium ? 17 : 16;
    case DType::kQ6_K:
      return 18;
    case DType::kBF16:
      return 32;
    case DType::kF8E4M3:  // made at load (BackendOptions::fp8_weights), never written
      return 0;
  }
  return 0;
}

absl::string_view Bytes(const TensorView& t) {
  return absl::string_view(static_cast<const char*>(t.data), static_cast<size_t>(t.nbytes()));
}

// All named weights of the model, in file order, with their GGUF and HF names.
struct NamedTensor {
  const TensorView* view;
  std::string gguf_name;
  std::string hf_name;
  /// Heads whose rows are permuted for rotate_half in the HF copy; 0 for none.
  int rope_heads = 0;
};

std::vector<NamedTensor> NameTensors(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  std::vector<NamedTensor> out;
  out.push_back({&w.token_embedding, "token_embd.weight", "model.embed_tokens.weight"});
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const std::string g = absl::StrCat("blk.", l, ".");
    const std::string h = absl::StrCat("model.layers.", l, ".");
    out.push_back({&lw.attn_norm, g + "attn_norm.weight", h + "input_layernorm.weight"});
    // Interleaved (GGUF llama) q/k rows are permuted for the HF copy; rotate_half ones (qwen3)
    // are stored as they are in both files.
    if (c.is_mla()) {
      // DeepSeek's checkpoints keep the rope part pair-interleaved: stored as it is.
      const std::string a = h + "self_attn.";
      if (c.q_lora_rank > 0) {
        out.push_back({&lw.wq_a, g + "attn_q_a.weight", a + "q_a_proj.weight"});
        out.push_back({&lw.q_a_norm, g + "attn_q_a_norm.weight", a + "q_a_layernorm.weight"});
        out.push_back({&lw.wq_b, g + "attn_q_b.weight", a + "q_b_proj.weight"});
      } else {
        out.push_back({&lw.wq, g + "attn_q.weight", a + "q_proj.weight"});
      }
      out.push_back({&lw.wkv_a, g + "attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight"});
      out.push_back({&lw.kv_a_norm, g + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight"});
      out.push_back({&lw.wkv_b, g + "attn_kv_b.weight", a + "kv_b_proj.weight"});
      out.push_back({&lw.wo, g + "attn_output.weight", a + "o_proj.weight"});
    } else {
      const bool permute = c.rope_style == RopeStyle::kInterleaved;
      out.push_back(
          {&lw.wq, g + "attn_q.weight", h + "self_attn.q_proj.weight", permute ? c.num_heads : 0});
      out.push_back({&lw.wk, g + "attn_k.weight", h + "self_attn.k_proj.weight",
                     permute ? c.num_kv_heads : 0});
      out.push_back({&lw.wv, g + "attn_v.weight", h + "self_attn.v_proj.weight"});
      out.push_back({&lw.wo, g + "attn_output.weight", h + "self_attn.o_proj.weight"});
    }
    if (c.qk_norm) {
      out.push_back({&lw.q_norm, g + "attn_q_norm.weight", h + "self_attn.q_norm.weight"});
      out.push_back({&lw.k_norm, g + "attn_k_norm.weight", h + "self_attn.k_norm.weight"});
    }
    out.push_back({&lw.ffn_norm, g + "ffn_norm.weight", h + "post_attention_layernorm.weight"});
    if (c.is_moe_layer(l)) {
      // Hugging Face: Mixtral's block_sparse_moe.experts.J.w1/w3/w2, Qwen3-MoE's and DeepSeek's
      // mlp.experts.J.gate_proj/up_proj/down_proj, DeepSeek's mlp.gate.e_score_correction_bias
      // and mlp.shared_experts.* (DeepSeek is written as Hugging Face only). GGUF stacks each
      // layer's experts per role (WriteGguf), so the per-expert entries have no GGUF name.
      const bool mixtral = c.architecture == "mixtral";
      const std::string m = h + (mixtral ? "block_sparse_moe." : "mlp.");
      out.push_back({&lw.router, g + "ffn_gate_inp.weight", m + "gate.weight"});
      if (lw.router_bias.present()) {
        out.push_back(
            {&lw.router_bias, g + "exp_probs_b.bias", m + "gate.e_score_correction_bias"});
      }
      if (lw.shared.w_gate.present()) {
        const std::string s = m + "shared_experts.";
        out.push_back({&lw.shared.w_gate, g + "ffn_gate_shexp.weight", s + "gate_proj.weight"});
        out.push_back({&lw.shared.w_up, g + "ffn_up_shexp.weight", s + "up_proj.weight"});
        out.push_back({&lw.shared.w_down, g + "ffn_down_shexp.weight", s + "down_proj.weight"});
      }
      for (size_t e = 0; e < lw.experts.size(); ++e) {
        const ExpertWeights& x = lw.experts[e];
        const std::string he = absl::StrCat(m, "experts.", e, ".");
        out.push_back({&x.w_gate, "", he + (mixtral ? "w1" : "gate_proj") + ".weight"});
        out.push_back({&x.w_up, "", he + (mixtral ? "w3" : "up_proj") + ".weight"});
        out.push_back({&x.w_down, "", he + (mixtral ? "w2" : "down_proj") + ".weight"});
      }
      continue;
    }
    out.push_back({&lw.w_gate, g + "ffn_gate.weight", h + "mlp.gate_proj.weight"});
    out.push_back({&lw.w_up, g + "ffn_up.weight", h + "mlp.up_proj.weight"});
    out.push_back({&lw.w_down, g + "ffn_down.weight", h + "mlp.down_proj.weight"});
  }
  out.push_back({&w.final_norm, "output_norm.weight", "model.norm.weight"});
  if (!c.tie_word_embeddings) out.push_back({&w.output, "output.weight", "lm_head.weight"});
  return out;
}

absl::Status WriteGguf(const ModelWeights& w, const std::vector<Piece>& vocab, uint32_t file_type,
                       const std::string& path) {
  const ModelConfig& c = w.config;
  GgufWriter g;
  // llama.cpp's architecture names: Mixtral is "llama" with experts, Qwen3-MoE "qwen3moe".
  const std::string arch = c.architecture == "mixtral"     ? "llama"
                           : c.architecture == "qwen3_moe" ? "qwen3moe"
                           : c.is_mla()                    ? "deepseek2"
                                                           : c.architecture;
  auto key = [&arch](const char* suffix) { return absl::StrCat(arch, ".", suffix); };
  auto u32 = [](int v) { return static_cast<uint32_t>(v); };
  g.SetString("general.architecture", arch);
  g.SetString("general.name", "kvserve-synth");
  g.SetU32("general.file_type", file_type);
  g.SetU32("general.quantization_version", 2);
  g.SetU32(key("vocab_size"), u32(c.vocab_size));
  g.SetU32(key("context_length"), u32(c.max_position_embeddings));
  g.SetU32(key("embedding_length"), u32(c.hidden_size));
  g.SetU32(key("block_count"), u32(c.num_layers));
  g.SetU32(key("feed_forward_length"), u32(c.intermediate_size));
  g.SetU32(key("rope.dimension_count"), u32(c.rotary_dim()));
  g.SetU32(key("attention.head_count"), u32(c.num_heads));
  g.SetU32(key("attention.head_count_kv"), u32(c.num_kv_heads));
  if (c.is_mla()) {
    // llama.cpp's deepseek2 keys, with kv_b_proj whole (attn_kv_b) as its earlier converters
    // write it.
    g.SetU32(key("attention.key_length"), u32(c.head_dim));
    g.SetU32(key("attention.value_length"), u32(c.v_head_dim));
    g.SetU32(key("attention.kv_lora_rank"), u32(c.kv_lora_rank));
    if (c.q_lora_rank > 0) g.SetU32(key("attention.q_lora_rank"), u32(c.q_lora_rank));
    g.SetU32(key("leading_dense_block_count"), u32(c.first_k_dense_replace));
    g.SetU32(key("expert_shared_count"), u32(c.n_shared_experts));
    g.SetU32(key("expert_feed_forward_length"), u32(c.moe_intermediate_size));
    g.SetF32(key("expert_weights_scale"), c.routed_scaling_factor);
    g.SetBool(key("expert_weights_norm"), c.norm_topk_prob);
    g.SetU32(key("expert_gating_func"), c.moe_scoring == MoeScoring::kSigmoid ? 2 : 1);
    g.SetU32(key("expert_group_count"), u32(c.n_group));
    g.SetU32(key("expert_group_used_count"), u32(c.topk_group));
  } else if (arch != "llama" || c.head_dim * c.num_heads != c.hidden_size) {
    g.SetU32(key("attention.key_length"), u32(c.head_dim));
    g.SetU32(key("attention.value_length"), u32(c.head_dim));
  }
  g.SetF32(key("attention.layer_norm_rms_epsilon"), c.rms_norm_eps);
  g.SetF32(key("rope.freq_base"), c.rope_theta);
  if (c.is_moe()) {
    g.SetU32(key("expert_count"), u32(c.num_experts));
    g.SetU32(key("expert_used_count"), u32(c.num_experts_per_tok));
    if (arch == "qwen3moe") {
      g.SetU32(key("expert_feed_forward_length"), u32(c.moe_intermediate_size));
    }
    if (!c.norm_topk_prob && !c.is_mla()) g.SetBool(key("expert_weights_norm"), false);
  }
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (const Piece& p : vocab) {
    tokens.push_back(p.text);
    scores.push_back(p.score);
    types.push_back(p.type);
  }
  g.SetString("tokenizer.ggml.model", "llama");
  g.SetStringArray("tokenizer.ggml.tokens", tokens);
  g.SetF32Array("tokenizer.ggml.scores", scores);
  g.SetI32Array("tokenizer.ggml.token_type", types);
  g.SetU32("tokenizer.ggml.unknown_token_id", 0);
  g.SetU32("tokenizer.ggml.bos_token_id", 1);
  g.SetU32("tokenizer.ggml.eos_token_id", 2);
  g.SetBool("tokenizer.ggml.add_bos_token", true);
  g.SetBool("tokenizer.ggml.add_eos_token", false);
  g.SetBool("tokenizer.ggml.add_space_prefix", true);
  for (const NamedTensor& t : NameTensors(w)) {
    if (t.gguf_name.empty()) continue;  // an expert: stacked below
    std::vector<int64_t> dims(t.view->shape.rbegin(), t.view->shape.rend());
    g.AddTensor(t.gguf_name, GgmlTypeOf(t.view->dtype), std::move(dims), Bytes(*t.view));
  }
  // Each layer's experts, one [experts, rows, cols] tensor per role (GGUF dims innermost first).
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    if (lw.experts.empty()) continue;
    for (auto [role, pick] :
         {std::pair{"gate", &ExpertWeights::w_gate}, std::pair{"up", &ExpertWeights::w_up},
          std::pair{"down", &ExpertWeights::w_down}}) {
      const TensorView& first = lw.experts[0].*pick;
      std::string bytes;
      for (const ExpertWeights& x : lw.experts) {
        const absl::string_view b = Bytes(x.*pick);
        bytes.append(b.data(), b.size());
      }
      g.AddTensor(absl::StrCat("blk.", l, ".ffn_", role, "_exps.weight"), GgmlTypeOf(first.dtype),
                  {first.shape[1], first.shape[0], static_cast<int64_t>(lw.experts.size())}, bytes);
    }
  }
  return g.WriteFile(path);
}

// Rows of a [heads * head_dim, in] matrix reordered from interleaved pairs to rotate_half halves.
std::string PermuteForRotateHalf(const TensorView& t, int heads) {
  const int64_t row_bytes = t.row_bytes();
  const int64_t head_dim = t.shape[0] / heads;
  const std::string_view src(static_cast<const char*>(t.data), t.nbytes());
  std::string out(src.size(), '\0');
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t k = 0; k < head_dim / 2; ++k) {
        const int64_t dst = h * head_dim + j * (head_dim / 2) + k;
        const int64_t from = h * head_dim + 2 * k + j;
        out.replace(dst * row_bytes, row_bytes, src.substr(from * row_bytes, row_bytes));
      }
    }
  }
  return out;
}

std::string TorchDtype(DType d) {
  switch (d) {
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "float32";
  }
}

ojson AddedToken(int id, const std::string& content) {
  return ojson{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
               {"rstrip", false}, {"normalized", false}, {"special", true}};
}

ojson TokenizerJson(const std::vector<Piece>& vocab) {
  ojson added = ojson::array();
  for (int i = 0; i < 3; ++i) added.push_back(AddedToken(i, kSpecials[i]));
  ojson normalizer = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", kSpace}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}};
  auto special = [](const char* id, int type_id) {
    return ojson{{"SpecialToken", {{"id", id}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* id, int type_id) {
    return ojson{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  ojson post = {
      {"type", "TemplateProcessing"},
      {"single", {special("<s>", 0), sequence("A", 0)}},
      {"pair", {special("<s>", 0), sequence("A", 0), special("<s>", 1), sequence("B", 1)}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  ojson decoder = {{"type", "Sequence"},
                   {"decoders",
                    {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}},
                     {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  ojson vocab_map = ojson::object();
  for (int i = 0; i < static_cast<int>(vocab.size()); ++i) vocab_map[vocab[i].text] = i;
  ojson model = {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", "<unk>"},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", true},
                 {"byte_fallback", true},
                 {"ignore_merges", false},
                 {"vocab", std::move(vocab_map)},
                 {"merges", DeriveMerges(vocab)}};
  return ojson{{"version", "1.0"},       {"truncation", nullptr},    {"padding", nullptr},
               {"added_tokens", added},  {"normalizer", normalizer}, {"pre_tokenizer", nullptr},
               {"post_processor", post}, {"decoder", decoder},       {"model", model}};
}

ojson TokenizerConfigJson(int max_len) {
  ojson decoder = ojson::object();
  for (int i = 0; i < 3; ++i) {
    ojson t = AddedToken(i, kSpecials[i]);
    t.erase("id");
    decoder[std::to_string(i)] = t;
  }
  return ojson{{"add_bos_token", true},
               {"add_eos_token", false},
               {"added_tokens_decoder", decoder},
               {"bos_token", "<s>"},
               {"clean_up_tokenization_spaces", false},
               {"eos_token", "</s>"},
               {"legacy", false},
               {"model_max_length", max_len},
               {"pad_token", nullptr},
               {"tokenizer_class", "LlamaTokenizer"},
               {"unk_token", "<unk>"}};
}

// config.json's architectures[0] for each architecture the synthesizer writes.
const char* HfClassName(const std::string& arch) {
  if (arch == "deepseek_v2") return "DeepseekV2ForCausalLM";
  if (arch == "deepseek_v3") return "DeepseekV3ForCausalLM";
  if (arch == "qwen3") return "Qwen3ForCausalLM";
  if (arch == "mixtral") return "MixtralForCausalLM";
  if (arch == "qwen3_moe") return "Qwen3MoeForCausalLM";
  return "LlamaForCausalLM";
}

ojson ConfigJson(const ModelConfig& c, DType dtype) {
  const bool qwen3 = c.architecture == "qwen3" || c.architecture == "qwen3_moe";
  // nlohmann::json keeps its keys sorted, as transformers writes config.json.
  nlohmann::json j = {{"architectures", {HfClassName(c.architecture)}},
                      {"attention_bias", false},
                      {"attention_dropout", 0.0},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2},
                      {"head_dim", c.head_dim},
                      {"hidden_act", "silu"},
                      {"hidden_size", c.hidden_size},
                      {"initializer_range", 0.02},
                      {"intermediate_size", c.intermediate_size},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"model_type", c.architecture},
                      {"num_attention_heads", c.num_heads},
                      {"num_hidden_layers", c.num_layers},
                      {"num_key_value_heads", c.num_kv_heads},
                      {"rms_norm_eps", c.rms_norm_eps},
                      {"rope_scaling", nullptr},
                      {"rope_theta", c.rope_theta},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"torch_dtype", TorchDtype(dtype)},
                      {"use_cache", true},
                      {"vocab_size", c.vocab_size}};
  if (c.is_mla()) {
    // modeling_deepseek.py's keys; no head_dim (the heads' widths are stated per part).
    const bool v3 = c.architecture == "deepseek_v3";
    j.erase("head_dim");
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["q_lora_rank"] = c.q_lora_rank > 0 ? nlohmann::json(c.q_lora_rank) : nlohmann::json();
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["n_routed_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["n_shared_experts"] = c.n_shared_experts;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["moe_layer_freq"] = c.moe_layer_freq;
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["scoring_func"] = v3 ? "sigmoid" : "softmax";
    j["topk_method"] = v3                                     ? "noaux_tc"
                       : c.moe_topk == MoeTopk::kGroupLimited ? "group_limited_greedy"
                                                              : "greedy";
    j["aux_loss_alpha"] = 0.001;
    j["seq_aux"] = true;
    j["ep_size"] = 1;
    if (v3) j["num_nextn_predict_layers"] = 0;
  } else if (c.architecture == "mixtral") {
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.02;
    j["sliding_window"] = nullptr;
  } else if (qwen3) {
    j["max_window_layers"] = c.num_layers;
    j["sliding_window"] = nullptr;
    j["use_sliding_window"] = false;
    if (c.is_moe()) {
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = nlohmann::json::array();
      j["output_router_logits"] = false;
      j["router_aux_loss_coef"] = 0.001;
    }
  } else {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  return ojson::parse(j.dump());
}

absl::Status WriteJson(const fs::path& path, const ojson& j) {
  return WriteStringToFile(path.string(), j.dump(2) + "\n");
}

absl::Status WriteHf(const ModelWeights& w, const std::vector<Piece>& vocab, DType dtype,
                     const fs::path& dir) {
  const ModelConfig& c = w.config;
  SafetensorsWriter st;
  st.SetMetadata("format", "pt");
  for (const NamedTensor& t : NameTensors(w)) {
    if (t.rope_heads > 0) {
      st.AddTensor(t.hf_name, t.view->dtype, t.view->shape,
                   PermuteForRotateHalf(*t.view, t.rope_heads));
    } else {
      st.AddTensor(t.hf_name, t.view->dtype, t.view->shape, Bytes(*t.view));
    }
  }
  if (absl::Status s = st.WriteFile((dir / "model.safetensors").string()); !s.ok()) return s;
  try {
    const ojson special_map = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
    const ojson generation = {{"bos_token_id", 1}, {"eos_token_id", 2}};
    for (const auto& [name, j] :
         {std::pair<const char*, ojson>{"config.json", ConfigJson(c, dtype)},
          {"generation_config.json", generation},
          {"tokenizer.json", TokenizerJson(vocab)},
          {"tokenizer_config.json", TokenizerConfigJson(c.max_position_embeddings)},
          {"special_tokens_map.json", special_map}}) {
      if (absl::Status s = WriteJson(dir / name, j); !s.ok()) return s;
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(dir.string(), ": writing JSON failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status MakeDir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SynthFormat> ParseSynthFormat(const std::string& name) {
  if (name == "gguf") return SynthFormat::kGguf;
  if (name == "hf") return SynthFormat::kHf;
  if (name == "both") return SynthFormat::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("--format '", name, "' is not one of gguf, hf, both"));
}

int SynthMinVocabSize() { return 3 + 256 + static_cast<int>(Alphabet().size()); }

absl::Status ValidateSynthOptions(const SynthWriteOptions& options) {
  const SyntheticModelOptions& m = options.model;
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const std::pair<const char*, int> positive[] = {{"--layers", m.num_layers},
                                                  {"--hidden", m.hidden_size},
                                                  {"--heads", m.num_heads},
                                                  {"--kv-heads", m.num_kv_heads},
                                                  {"--ffn", m.intermediate_size},
                                                  {"--vocab", m.vocab_size},
                                                  {"--max-position", m.max_position_embeddings}};
  for (const auto& [flag, value] : positive) {
    if (value < 1) return bad(flag, " must be at least 1, got ", value);
  }
  const bool deepseek = m.architecture == "deepseek_v2" || m.architecture == "deepseek_v3";
  const bool moe = m.architecture == "mixtral" || m.architecture == "qwen3_moe" || deepseek;
  if (m.architecture != "llama" && m.architecture != "qwen3" && !moe) {
    return bad("--arch '", m.architecture,
               "' is not one of llama, qwen3, mixtral, qwen3moe, deepseek2, deepseek3");
  }
  if (deepseek) {
    for (const auto& [flag, value] : {std::pair<const char*, int>{"--kv-lora-rank", m.kv_lora_rank},
                                      {"--qk-nope-dim", m.qk_nope_head_dim},
                                      {"--qk-rope-dim", m.qk_rope_head_dim},
                                      {"--v-head-dim", m.v_head_dim},
                                      {"--expert-groups", m.n_group},
                                      {"--topk-groups", m.topk_group},
                                      {"--dense-layers", m.first_k_dense_replace + 1},
                                      {"--shared-experts", m.n_shared_experts + 1},
                                      {"--q-lora-rank", m.q_lora_rank + 1}}) {
      if (value < 1) return bad(flag, " is out of range");
    }
    if (m.qk_rope_head_dim % 2 != 0) {
      return bad("--qk-rope-dim ", m.qk_rope_head_dim, " must be even (RoPE rotates pairs)");
    }
    if (m.num_experts % m.n_group != 0 || m.topk_group > m.n_group) {
      return bad("--expert-groups ", m.n_group, " must divide --experts ", m.num_experts,
                 " and be at least --topk-groups ", m.topk_group);
    }
    if (m.num_experts_per_tok > m.topk_group * (m.num_experts / m.n_group)) {
      return bad("--experts-per-tok ", m.num_experts_per_tok, " exceeds the experts of the ",
                 m.topk_group, " groups a token may use");
    }
    if (m.architecture == "deepseek_v3" && m.num_experts / m.n_group < 2) {
      return bad(
          "deepseek3 routing scores a group by its two best experts: --experts / "
          "--expert-groups must be at least 2");
    }
    if (!(m.routed_scaling_factor > 0.0f)) return bad("--routed-scale must be positive");
  }
  if (moe) {
    if (m.num_experts < 1) return bad("--experts must be at least 1, got ", m.num_experts);
    if (m.num_experts_per_tok < 1 || m.num_experts_per_tok > m.num_experts) {
      return bad("--experts-per-tok ", m.num_experts_per_tok, " must be in [1, --experts ",
                 m.num_experts, "]");
    }
    if (m.moe_intermediate_size < 0) {
      return bad("--expert-ffn must be at least 0, got ", m.moe_intermediate_size);
    }
  }
  if (m.head_dim < 0) return bad("--head-dim must be at least 0, got ", m.head_dim);
  if (deepseek) {
    // Heads are sized by the latent-attention flags.
  } else if (m.head_dim == 0) {
    if (m.hidden_size % m.num_heads != 0) {
      return bad("--heads ", m.num_heads, " must divide --hidden ", m.hidden_size,
                 " (or set --head-dim)");
    }
    if ((m.hidden_size / m.num_heads) % 2 != 0) {
      return bad("head size --hidden / --heads = ", m.hidden_size / m.num_heads,
                 " must be even (RoPE rotates pairs)");
    }
  } else if (m.head_dim % 2 != 0) {
    return bad("--head-dim ", m.head_dim, " must be even (RoPE rotates pairs)");
  }
  if (!deepseek && m.num_heads % m.num_kv_heads != 0) {
    return bad("--kv-heads ", m.num_kv_heads, " must divide --heads ", m.num_heads);
  }
  if (m.vocab_size < SynthMinVocabSize()) {
    return bad("--vocab ", m.vocab_size, " is too small: the tokenizer needs at least ",
               SynthMinVocabSize(), " (3 special + 256 byte tokens + ", Alphabet().size(),
               " characters)");
  }
  // K-quant rows that are not whole 256-element super-blocks are stored as q8_0, so every
  // quantized dtype needs multiples of 32 only.
  const int64_t block = std::min<int64_t>(DTypeBlockElems(m.dtype), 32);
  if (block > 1 && (m.hidden_size % block != 0 || m.intermediate_size % block != 0)) {
    return bad("--dtype ", std::string(DTypeName(m.dtype)),
               " needs --hidden and --ffn to be multiples of ", block, ", got ", m.hidden_size,
               " and ", m.intermediate_size);
  }
  if (block > 1 && m.head_dim > 0 && (int64_t{m.num_heads} * m.head_dim) % block != 0) {
    return bad("--dtype ", std::string(DTypeName(m.dtype)), " needs --heads x --head-dim to be a ",
               "multiple of ", block, ", got ", m.num_heads * m.head_dim);
  }
  if (block > 1 && options.format != SynthFormat::kGguf) {
    return bad("--dtype ", std::string(DTypeName(m.dtype)),
               " exists only in GGUF; use --format gguf (safetensors has no such dtype)");
  }
  if (m.mix == WeightMix::kKQuantMedium && m.dtype != DType::kQ4_K && m.dtype != DType::kQ5_K) {
    return bad("the _m K-quant mix needs q4_k or q5_k weights, got ",
               std::string(DTypeName(m.dtype)));
  }
  if (options.out_dir.empty()) return bad("--out is required");
  return absl::OkStatus();
}

absl::StatusOr<SynthOutputs> WriteSynthModel(const SynthWriteOptions& options) {
  if (absl::Status s = ValidateSynthOptions(options); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = MakeSyntheticModel(options.model);
  if (!weights.ok()) return weights.status();
  SynthOutputs out;
  const std::vector<Piece> vocab = BuildVocab(options.model.vocab_size, &out.num_real_tokens);
  for (const NamedTensor& t : NameTensors(**weights)) out.num_params += t.view->numel();
  const fs::path dir(options.out_dir);
  if (absl::Status s = MakeDir(dir); !s.ok()) return s;
  if (options.format != SynthFormat::kHf) {
    out.gguf_path = (dir / "model.gguf").string();
    const uint32_t file_type = GgufFileType(options.model.dtype, options.model.mix);
    if (absl::Status s = WriteGguf(**weights, vocab, file_type, out.gguf_path); !s.ok()) {
      return s;
    }
  }
  if (!options.dequantized_twin_path.empty()) {
    absl::StatusOr<std::unique_ptr<ModelWeights>> twin = DequantizedTwin(**weights);
    if (!twin.ok()) return twin.status();
    out.dequantized_twin_path = options.dequantized_twin_path;
    if (absl::Status s = WriteGguf(**twin, vocab, GgufFileType(DType::kF32, WeightMix::kUniform),
                                   out.dequantized_twin_path);
        !s.ok()) {
      return s;
    }
  }
  if (options.format != SynthFormat::kGguf) {
    out.hf_dir = (dir / "hf").string();
    if (absl::Status s = MakeDir(out.hf_dir); !s.ok()) return s;
    if (absl::Status s = WriteHf(**weights, vocab, options.model.dtype, out.hf_dir); !s.ok()) {
      return s;
    }
  }
  return out;
}

}  // namespace kvserve
