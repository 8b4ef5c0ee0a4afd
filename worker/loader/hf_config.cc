#include "worker/loader/hf_config.h"

#include <algorithm>
#include <climits>
#include <exception>
#include <filesystem>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/io/mapped_file.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using nlohmann::json;

/// Typed, defaulted field access on one JSON object; errors start with the file name.
class JsonFields {
 public:
  JsonFields(const json& obj, std::string name) : obj_(obj), name_(std::move(name)) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", what));
  }

  /// The field, or nullptr when absent or null.
  const json* Get(const char* key) const {
    auto it = obj_.find(key);
    return (it == obj_.end() || it->is_null()) ? nullptr : &*it;
  }

  /// An integer that fits in int; `def` when absent or null (error when no default).
  absl::Status Int(const char* key, int* out, std::optional<int> def = std::nullopt) const {
    const json* v = Get(key);
    if (v == nullptr) {
      if (!def.has_value()) return Error(absl::StrCat("missing '", key, "'"));
      *out = *def;
      return absl::OkStatus();
    }
    if (!v->is_number_integer()) {
      return Error(absl::StrCat("'", key, "' must be an integer, got ", v->dump()));
    }
    const int64_t i = v->get<int64_t>();
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT_MAX)) {
      return Error(absl::StrCat("'", key, "' is out of range: ", v->dump()));
    }
    if (i < INT_MIN || i > INT_MAX) return Error(absl::StrCat("'", key, "' is out of range"));
    *out = static_cast<int>(i);
    return absl::OkStatus();
  }

  absl::Status Float(const char* key, float* out, std::optional<float> def = std::nullopt) const {
    const json* v = Get(key);
    if (v == nullptr) {
      if (!def.has_value()) return Error(absl::StrCat("missing '", key, "'"));
      *out = *def;
      return absl::OkStatus();
    }
    if (!v->is_number())
      return Error(absl::StrCat("'", key, "' must be a number, got ", v->dump()));
    *out = v->get<float>();
    return absl::OkStatus();
  }

  absl::Status Bool(const char* key, bool* out, bool def) const {
    const json* v = Get(key);
    if (v == nullptr) {
      *out = def;
      return absl::OkStatus();
    }
    if (!v->is_boolean()) return Error(absl::StrCat("'", key, "' must be true or false"));
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  /// A token id or a list of them (null / absent: nothing added).
  absl::Status TokenIds(const char* key, std::vector<TokenId>* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    auto add = [&](const json& e) -> absl::Status {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) {
        return Error(
            absl::StrCat("'", key, "' must hold non-negative integer ids, got ", e.dump()));
      }
      const TokenId id = static_cast<TokenId>(e.get<int64_t>());
      if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
      return absl::OkStatus();
    };
    if (v->is_array()) {
      for (const json& e : *v) {
        if (absl::Status s = add(e); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    return add(*v);
  }

 private:
  const json& obj_;
  std::string name_;
};

absl::StatusOr<json> ParseObject(absl::string_view text, absl::string_view name) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  return j;
}

/// The Hugging Face model types this loader reads, and their architectures[0] class names.
struct HfArchitecture {
  const char* model_type;
  const char* class_name;
};
constexpr HfArchitecture kHfArchitectures[] = {{"llama", "LlamaForCausalLM"},
                                               {"mistral", "MistralForCausalLM"},
                                               {"qwen2", "Qwen2ForCausalLM"},
                                               {"qwen3", "Qwen3ForCausalLM"},
                                               {"mixtral", "MixtralForCausalLM"},
                                               {"qwen3_moe", "Qwen3MoeForCausalLM"},
                                               {"deepseek_v2", "DeepseekV2ForCausalLM"},
                                               {"deepseek_v3", "DeepseekV3ForCausalLM"}};
constexpr char kSupportedTypes[] =
    "llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v2, deepseek_v3";

/// Reads the mixture-of-experts fields of a mixtral or qwen3_moe config into `c`.
absl::Status ParseMoe(const JsonFields& f, ModelConfig& c) {
  const bool mixtral = c.architecture == "mixtral";
  // Mixtral's experts are as wide as its intermediate_size; Qwen3-MoE states their width.
  if (absl::Status s = f.Int(mixtral ? "num_local_experts" : "num_experts", &c.num_experts);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = f.Int("num_experts_per_tok", &c.num_experts_per_tok); !s.ok()) return s;
  if (mixtral) {
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
    return absl::OkStatus();
  }
  if (absl::Status s = f.Int("moe_intermediate_size", &c.moe_intermediate_size); !s.ok()) return s;
  if (absl::Status s = f.Bool("norm_topk_prob", &c.norm_topk_prob, false); !s.ok()) return s;
  int sparse_step = 1;
  if (absl::Status s = f.Int("decoder_sparse_step", &sparse_step, 1); !s.ok()) return s;
  if (sparse_step != 1) {
    return f.Error(absl::StrCat("'decoder_sparse_step' ", sparse_step,
                                " is not supported (only every layer an MoE layer: 1)"));
  }
  if (const json* dense = f.Get("mlp_only_layers");
      dense != nullptr && !(dense->is_array() && dense->empty())) {
    return f.Error(absl::StrCat("'mlp_only_layers' ", dense->dump(),
                                " is not supported (dense layers among MoE layers)"));
  }
  return absl::OkStatus();
}

/// A string field that must be one of `allowed` (`def` when absent or null).
absl::StatusOr<std::string> OneOf(const JsonFields& f, const char* key, const std::string& def,
                                  std::initializer_list<const char*> allowed) {
  const json* v = f.Get(key);
  if (v == nullptr) return def;
  if (v->is_string()) {
    const std::string got = v->get<std::string>();
    for (const char* a : allowed) {
      if (got == a) return got;
    }
  }
  std::string list;
  for (const char* a : allowed) absl::StrAppend(&list, list.empty() ? "" : ", ", a);
  return f.Error(absl::StrCat("unsupported '", key, "' ", v->dump(), " (supported: ", list, ")"));
}

/// Reads DeepSeek-V2/V3's multi-head latent attention and mixture-of-experts fields into `c`
/// (modeling_deepseek.py's config keys). Each token's experts are scored and picked as that
/// file does: V2 softmax with `greedy` or `group_limited_greedy`, V3 sigmoid with `noaux_tc`.
absl::Status ParseDeepseek(const JsonFields& f, ModelConfig& c) {
  const bool v3 = c.architecture == "deepseek_v3";
  for (auto [key, out] : {std::pair{"kv_lora_rank", &c.kv_lora_rank},
                          std::pair{"qk_nope_head_dim", &c.qk_nope_head_dim},
                          std::pair{"qk_rope_head_dim", &c.qk_rope_head_dim},
                          std::pair{"v_head_dim", &c.v_head_dim}}) {
    if (absl::Status s = f.Int(key, out); !s.ok()) return s;
  }
  if (c.kv_lora_rank <= 0) {
    return f.Error(absl::StrCat("'kv_lora_rank' must be positive, got ", c.kv_lora_rank));
  }
  if (absl::Status s = f.Int("q_lora_rank", &c.q_lora_rank, 0); !s.ok()) return s;
  // The query head is nope + rope wide; a `head_dim` key (transformers sets it to the rope
  // width) plays no part.
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  // The rope part of q and k is stored pair-interleaved (the reference de-interleaves it before
  // rotate_half, which is the interleaved rotation); transformers' `rope_interleave` false
  // means rotate_half on the stored order.
  bool interleave = true;
  if (absl::Status s = f.Bool("rope_interleave", &interleave, true); !s.ok()) return s;
  c.rope_style = interleave ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit;
  bool bias = false;
  if (absl::Status s = f.Bool("attention_bias", &bias, false); !s.ok()) return s;
  if (bias) return f.Error("'attention_bias' true is not supported for deepseek models");

  // Mixture of experts: `n_routed_experts` null means a dense model.
  if (absl::Status s = f.Int("n_routed_experts", &c.num_experts, 0); !s.ok()) return s;
  if (c.num_experts == 0) return absl::OkStatus();
  for (auto [key, out, def] :
       {std::tuple{"num_experts_per_tok", &c.num_experts_per_tok, std::optional<int>()},
        std::tuple{"moe_intermediate_size", &c.moe_intermediate_size, std::optional<int>()},
        std::tuple{"n_shared_experts", &c.n_shared_experts, std::optional<int>(0)},
        std::tuple{"first_k_dense_replace", &c.first_k_dense_replace, std::optional<int>(0)},
        std::tuple{"moe_layer_freq", &c.moe_layer_freq, std::optional<int>(1)},
        std::tuple{"n_group", &c.n_group, std::optional<int>(1)},
        std::tuple{"topk_group", &c.topk_group, std::optional<int>(1)}}) {
    if (absl::Status s = f.Int(key, out, def); !s.ok()) return s;
  }
  if (absl::Status s = f.Bool("norm_topk_prob", &c.norm_topk_prob, v3); !s.ok()) return s;
  if (absl::Status s = f.Float("routed_scaling_factor", &c.routed_scaling_factor, 1.0f); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> scoring =
      OneOf(f, "scoring_func", v3 ? "sigmoid" : "softmax", {v3 ? "sigmoid" : "softmax"});
  if (!scoring.ok()) return scoring.status();
  c.moe_scoring = v3 ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
  absl::StatusOr<std::string> method =
      v3 ? OneOf(f, "topk_method", "noaux_tc", {"noaux_tc"})
         : OneOf(f, "topk_method", "greedy", {"greedy", "group_limited_greedy"});
  if (!method.ok()) return method.status();
  c.moe_topk = *method == "noaux_tc" ? MoeTopk::kNoAuxTc
               : *method == "greedy" ? MoeTopk::kGreedy
                                     : MoeTopk::kGroupLimited;
  // DeepSeek renormalizes only more than one weight, and V2 multiplies by routed_scaling_factor
  // only the weights it does not renormalize.
  if (c.num_experts_per_tok == 1) c.norm_topk_prob = false;
  if (!v3 && c.norm_topk_prob) c.routed_scaling_factor = 1.0f;
  return absl::OkStatus();
}

/// Resolves the architecture from model_type and architectures[0].
absl::StatusOr<std::string> ResolveArchitecture(const JsonFields& f) {
  const json* model_type = f.Get("model_type");
  const json* archs = f.Get("architectures");
  std::optional<std::string> from_type;
  if (model_type != nullptr) {
    if (!model_type->is_string()) return f.Error("'model_type' must be a string");
    from_type = model_type->get<std::string>();
    if (std::none_of(std::begin(kHfArchitectures), std::end(kHfArchitectures),
                     [&](const HfArchitecture& a) { return *from_type == a.model_type; })) {
      return f.Error(absl::StrCat("unsupported architecture '", *from_type,
                                  "' (supported: ", kSupportedTypes, ")"));
    }
  }
  std::optional<std::string> from_archs;
  if (archs != nullptr) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return f.Error("'architectures' must be a non-empty list of strings");
    }
    const std::string a = (*archs)[0].get<std::string>();
    for (const HfArchitecture& known : kHfArchitectures) {
      if (a == known.class_name) from_archs = known.model_type;
    }
    if (!from_archs) {
      return f.Error(
          absl::StrCat("unsupported architecture '", a, "' (supported: ", kSupportedTypes, ")"));
    }
  }
  if (from_type && from_archs && *from_type != *from_archs) {
    return f.Error(absl::StrCat("model_type '", *from_type, "' does not match architectures '",
                                (*archs)[0].get<std::string>(), "'"));
  }
  if (from_type) return *from_type;
  if (from_archs) return *from_archs;
  return f.Error("neither 'model_type' nor 'architectures' is set");
}

absl::Status ParseRopeScaling(const JsonFields& f, absl::string_view config_name,
                              const std::string& arch, RopeScaling* out) {
  const json* rs = f.Get("rope_scaling");
  if (rs == nullptr) return absl::OkStatus();
  if (!rs->is_object()) return f.Error("'rope_scaling' must be an object or null");
  const JsonFields r(*rs, absl::StrCat(config_name, ": rope_scaling"));
  const json* type = r.Get("rope_type");
  if (type == nullptr) type = r.Get("type");
  if (type == nullptr || !type->is_string()) return r.Error("no string 'rope_type' (or 'type')");
  const std::string t = type->get<std::string>();
  if (t == "default") return absl::OkStatus();  // transformers' spelling of "no scaling"
  if (t == "linear") {
    out->type = RopeScaling::Type::kLinear;
    return r.Float("factor", &out->factor);
  }
  if (t == "llama3") {
    out->type = RopeScaling::Type::kLlama3;
    if (absl::Status s = r.Float("factor", &out->factor); !s.ok()) return s;
    if (absl::Status s = r.Float("low_freq_factor", &out->low_freq_factor, 1.0f); !s.ok()) {
      return s;
    }
    if (absl::Status s = r.Float("high_freq_factor", &out->high_freq_factor, 4.0f); !s.ok()) {
      return s;
    }
    return r.Int("original_max_position_embeddings", &out->original_max_position_embeddings, 8192);
  }
  const bool deepseek = arch == "deepseek_v2" || arch == "deepseek_v3";
  if (t == "yarn" && deepseek) {
    out->type = RopeScaling::Type::kYarn;
    for (auto [key, value, def] :
         {std::tuple{"factor", &out->factor, std::optional<float>()},
          std::tuple{"beta_fast", &out->beta_fast, std::optional<float>(32.0f)},
          std::tuple{"beta_slow", &out->beta_slow, std::optional<float>(1.0f)},
          std::tuple{"mscale", &out->mscale, std::optional<float>(1.0f)},
          std::tuple{"mscale_all_dim", &out->mscale_all_dim, std::optional<float>(0.0f)}}) {
      if (absl::Status s = r.Float(key, value, def); !s.ok()) return s;
    }
    if (absl::Status s =
            r.Int("original_max_position_embeddings", &out->original_max_position_embeddings, 4096);
        !s.ok()) {
      return s;
    }
    // cos and sin carry mscale / mscale_all_dim; only the ratio 1 is supported.
    if (YarnMscale(out->factor, out->mscale) != YarnMscale(out->factor, out->mscale_all_dim)) {
      return r.Error(absl::StrCat("yarn 'mscale' ", out->mscale,
                                  " differing from 'mscale_all_dim' ", out->mscale_all_dim,
                                  " is not supported (it scales the rotary part of q and k)"));
    }
    return absl::OkStatus();
  }
  return f.Error(absl::StrCat("unsupported rope_scaling type '", t, "' (supported: linear, llama3",
                              deepseek ? ", yarn" : "", ")"));
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view config_json,
                                          absl::string_view generation_config_json,
                                          absl::string_view config_name) {
  absl::StatusOr<json> j = ParseObject(config_json, config_name);
  if (!j.ok()) return j.status();
  const JsonFields f(*j, std::string(config_name));
  ModelConfig c;
  absl::StatusOr<std::string> arch = ResolveArchitecture(f);
  if (!arch.ok()) return arch.status();
  c.architecture = *arch;
  c.rope_style = RopeStyle::kHalfSplit;

  struct IntField {
    const char* key;
    int* out;
    std::optional<int> def;
  };
  const int default_max_pos = c.architecture == "llama" ? 2048 : 32768;
  for (const IntField& field :
       {IntField{"hidden_size", &c.hidden_size, std::nullopt},
        IntField{"intermediate_size", &c.intermediate_size, std::nullopt},
        IntField{"num_hidden_layers", &c.num_layers, std::nullopt},
        IntField{"num_attention_heads", &c.num_heads, std::nullopt},
        IntField{"vocab_size", &c.vocab_size, std::nullopt},
        IntField{"max_position_embeddings", &c.max_position_embeddings, default_max_pos}}) {
    if (absl::Status s = f.Int(field.key, field.out, field.def); !s.ok()) return s;
  }
  if (absl::Status s = f.Int("num_key_value_heads", &c.num_kv_heads, c.num_heads); !s.ok()) {
    return s;
  }
  const int default_head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  if (absl::Status s = f.Int("head_dim", &c.head_dim, default_head_dim); !s.ok()) return s;
  if (absl::Status s = f.Float("rms_norm_eps", &c.rms_norm_eps, 1e-6f); !s.ok()) return s;
  if (absl::Status s = f.Float("rope_theta", &c.rope_theta, 10000.0f); !s.ok()) return s;
  if (absl::Status s = f.Bool("tie_word_embeddings", &c.tie_word_embeddings, false); !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseRopeScaling(f, config_name, c.architecture, &c.rope_scaling); !s.ok()) {
    return s;
  }
  if (const json* act = f.Get("hidden_act");
      act != nullptr && !(act->is_string() && act->get<std::string>() == "silu")) {
    return f.Error(absl::StrCat("unsupported hidden_act ", act->dump(), " (supported: silu)"));
  }

  if (c.architecture == "llama") {
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      bool bias = false;
      if (absl::Status s = f.Bool(key, &bias, false); !s.ok()) return s;
      if (bias) {
        return f.Error(absl::StrCat("'", key,
                                    "' true is not supported (llama models with "
                                    "biased projections cannot be loaded)"));
      }
    }
  } else if (c.architecture == "mistral") {
    if (absl::Status s = f.Int("sliding_window", &c.sliding_window, 0); !s.ok()) return s;
  } else if (c.architecture == "mixtral") {
    if (absl::Status s = f.Int("sliding_window", &c.sliding_window, 0); !s.ok()) return s;
    if (absl::Status s = ParseMoe(f, c); !s.ok()) return s;
  } else if (c.architecture == "qwen3" || c.architecture == "qwen3_moe") {
    // Qwen3: per-head q/k RMSNorm, an explicit head_dim (read above), and `attention_bias`
    // putting a bias on the q, k, v and o projections alike.
    c.qk_norm = true;
    bool bias = false;
    if (absl::Status s = f.Bool("attention_bias", &bias, false); !s.ok()) return s;
    c.qkv_bias = c.o_bias = bias;
    bool use_sliding = false;
    if (absl::Status s = f.Bool("use_sliding_window", &use_sliding, false); !s.ok()) return s;
    if (use_sliding) {
      return f.Error(
          "'use_sliding_window' true is not supported for qwen3 (its window applies to some "
          "layers only)");
    }
    if (c.architecture == "qwen3_moe") {
      if (absl::Status s = ParseMoe(f, c); !s.ok()) return s;
    }
  } else if (c.architecture == "deepseek_v2" || c.architecture == "deepseek_v3") {
    if (absl::Status s = ParseDeepseek(f, c); !s.ok()) return s;
  } else {  // qwen2
    c.qkv_bias = true;
    bool use_sliding = false;
    if (absl::Status s = f.Bool("use_sliding_window", &use_sliding, false); !s.ok()) return s;
    if (use_sliding) {
      if (absl::Status s = f.Int("sliding_window", &c.sliding_window, 0); !s.ok()) return s;
    }
  }

  std::vector<TokenId> bos;
  if (absl::Status s = f.TokenIds("bos_token_id", &bos); !s.ok()) return s;
  if (absl::Status s = f.TokenIds("eos_token_id", &c.eos_token_ids); !s.ok()) return s;
  if (!generation_config_json.empty()) {
    const std::string gen_name = "generation_config.json";
    absl::StatusOr<json> g = ParseObject(generation_config_json, gen_name);
    if (!g.ok()) return g.status();
    const JsonFields gf(*g, gen_name);
    if (absl::Status s = gf.TokenIds("eos_token_id", &c.eos_token_ids); !s.ok()) return s;
    if (bos.empty()) {
      if (absl::Status s = gf.TokenIds("bos_token_id", &bos); !s.ok()) return s;
    }
  }
  if (bos.size() > 1) return f.Error("'bos_token_id' must be a single id");
  if (!bos.empty()) c.bos_token_id = bos[0];

  if (absl::Status s = c.Validate(); !s.ok()) return f.Error(s.message());
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& dir) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  absl::StatusOr<std::string> text = ReadFileToString(config_path);
  if (!text.ok()) return text.status();
  const std::string gen_path = (std::filesystem::path(dir) / "generation_config.json").string();
  std::string gen_text;
  std::error_code ec;
  if (std::filesystem::exists(gen_path, ec)) {
    absl::StatusOr<std::string> g = ReadFileToString(gen_path);
    if (!g.ok()) return g.status();
    gen_text = *std::move(g);
  }
  absl::StatusOr<ModelConfig> c = ParseHfConfig(*text, gen_text, config_path);
  if (!c.ok() && !gen_text.empty() &&
      absl::StartsWith(c.status().message(), "generation_config.json")) {
    return absl::Status(c.status().code(), absl::StrCat(std::filesystem::path(dir).string(), "/",
                                                        c.status().message()));
  }
  return c;
}

namespace {

/// GGUF metadata reads for ModelConfigFromGguf; errors name the path and key.
class GgufFields {
 public:
  explicit GgufFields(const GgufFile& file) : file_(file) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_.path(), ": ", what));
  }

  /// A uint32-compatible value that fits in int; `def` when absent (error when no default).
  absl::Status Int(const std::string& key, int* out, std::optional<int> def = std::nullopt) const {
    if (!file_.Has(key) && def.has_value()) {
      *out = *def;
      return absl::OkStatus();
    }
    absl::StatusOr<uint32_t> v = file_.GetU32(key);
    if (!v.ok()) return v.status();
    if (*v > static_cast<uint32_t>(INT_MAX)) {
      return Error(absl::StrCat("metadata key '", key, "' value ", *v, " is too large"));
    }
    *out = static_cast<int>(*v);
    return absl::OkStatus();
  }

  absl::Status Float(const std::string& key, float* out, std::optional<float> def) const {
    if (!file_.Has(key) && def.has_value()) {
      *out = *def;
      return absl::OkStatus();
    }
    absl::StatusOr<float> v = file_.GetF32(key);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  }

  /// A special-token id; absent or 0xFFFFFFFF gives nullopt.
  absl::StatusOr<std::optional<TokenId>> TokenIdKey(const std::string& key) const {
    if (!file_.Has(key)) return std::optional<TokenId>();
    absl::StatusOr<uint64_t> v = file_.GetU64(key);
    if (!v.ok()) return v.status();
    if (*v == 0xFFFFFFFFull) return std::optional<TokenId>();
    if (*v > static_cast<uint64_t>(INT32_MAX)) {
      return Error(absl::StrCat("metadata key '", key, "' value ", *v, " is not a token id"));
    }
    return std::optional<TokenId>(static_cast<TokenId>(*v));
  }

 private:
  const GgufFile& file_;
};

absl::Status ReadGgufRopeScaling(const GgufFields& g, const GgufFile& file, const std::string& arch,
                                 RopeScaling* out) {
  const std::string type_key = arch + ".rope.scaling.type";
  const std::string factor_key = arch + ".rope.scaling.factor";
  const std::string linear_key = arch + ".rope.scale_linear";
  std::string type = "none";
  if (file.Has(type_key)) {
    absl::StatusOr<std::string> t = file.GetString(type_key);
    if (!t.ok()) return t.status();
    type = *t;
  } else if (file.Has(linear_key)) {  // older converters
    out->type = RopeScaling::Type::kLinear;
    return g.Float(linear_key, &out->factor, std::nullopt);
  }
  if (type == "none") return absl::OkStatus();
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
    return g.Float(factor_key, &out->factor, std::nullopt);
  }
  return g.Error(absl::StrCat("unsupported ", type_key, " '", type, "' (supported: none, linear)"));
}

/// llama.cpp's deepseek2 keys: latent attention sizes (newer converters put the per-head sizes
/// under key_length_mla / value_length_mla), experts, routing (expert_gating_func 1 softmax, 2
/// sigmoid; expert_weights_norm; expert_weights_scale, applied after any renormalization as
/// llama.cpp does; expert groups when the file has them) and yarn (yarn_log_multiplier is
/// 0.1 x mscale_all_dim).
absl::Status ReadGgufDeepseek(const GgufFields& g, const GgufFile& file, ModelConfig& c) {
  auto key = [](const char* suffix) { return absl::StrCat("deepseek2.", suffix); };
  c.rope_style = RopeStyle::kInterleaved;
  c.num_kv_heads = c.num_heads;
  if (absl::Status s = g.Int(key("attention.kv_lora_rank"), &c.kv_lora_rank); !s.ok()) return s;
  if (absl::Status s = g.Int(key("attention.q_lora_rank"), &c.q_lora_rank, 0); !s.ok()) return s;
  if (absl::Status s = g.Int(key("rope.dimension_count"), &c.qk_rope_head_dim); !s.ok()) return s;
  const bool mla_keys = file.Has(key("attention.key_length_mla"));
  if (absl::Status s =
          g.Int(key(mla_keys ? "attention.key_length_mla" : "attention.key_length"), &c.head_dim);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = g.Int(
          key(mla_keys ? "attention.value_length_mla" : "attention.value_length"), &c.v_head_dim);
      !s.ok()) {
    return s;
  }
  c.qk_nope_head_dim = c.head_dim - c.qk_rope_head_dim;
  if (absl::Status s = g.Int(key("expert_count"), &c.num_experts, 0); !s.ok()) return s;
  int gating = 1;
  if (c.num_experts > 0) {
    for (auto [suffix, out, def] :
         {std::tuple{"expert_used_count", &c.num_experts_per_tok, std::optional<int>()},
          std::tuple{"expert_feed_forward_length", &c.moe_intermediate_size, std::optional<int>()},
          std::tuple{"expert_shared_count", &c.n_shared_experts, std::optional<int>(0)},
          std::tuple{"leading_dense_block_count", &c.first_k_dense_replace, std::optional<int>(0)},
          std::tuple{"expert_gating_func", &gating, std::optional<int>(1)},
          std::tuple{"expert_group_count", &c.n_group, std::optional<int>(1)},
          std::tuple{"expert_group_used_count", &c.topk_group, std::optional<int>(1)}}) {
      if (absl::Status s = g.Int(key(suffix), out, def); !s.ok()) return s;
    }
    if (gating != 1 && gating != 2) {
      return g.Error(absl::StrCat(key("expert_gating_func"), " ", gating,
                                  " is not 1 (softmax) or 2 (sigmoid)"));
    }
    if (absl::Status s = g.Float(key("expert_weights_scale"), &c.routed_scaling_factor, 1.0f);
        !s.ok()) {
      return s;
    }
    c.norm_topk_prob = false;
    if (file.Has(key("expert_weights_norm"))) {
      absl::StatusOr<bool> norm = file.GetBool(key("expert_weights_norm"));
      if (!norm.ok()) return norm.status();
      c.norm_topk_prob = *norm && c.num_experts_per_tok > 1;
    }
  }
  const bool v3 = gating == 2;
  c.architecture = v3 ? "deepseek_v3" : "deepseek_v2";
  c.moe_scoring = v3 ? MoeScoring::kSigmoid : MoeScoring::kSoftmax;
  c.moe_topk = v3 ? MoeTopk::kNoAuxTc : (c.n_group > 1 ? MoeTopk::kGroupLimited : MoeTopk::kGreedy);
  if (file.Has(key("rope.scaling.type"))) {
    absl::StatusOr<std::string> type = file.GetString(key("rope.scaling.type"));
    if (!type.ok()) return type.status();
    if (*type == "yarn") {
      RopeScaling& r = c.rope_scaling;
      r.type = RopeScaling::Type::kYarn;
      float log_mul = 0.0f;
      if (absl::Status s = g.Float(key("rope.scaling.factor"), &r.factor, std::nullopt); !s.ok()) {
        return s;
      }
      if (absl::Status s = g.Int(key("rope.scaling.original_context_length"),
                                 &r.original_max_position_embeddings, 4096);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = g.Float(key("rope.scaling.yarn_log_multiplier"), &log_mul, 0.0f);
          !s.ok()) {
        return s;
      }
      r.mscale = r.mscale_all_dim = log_mul / 0.1f;
    } else if (*type != "none") {
      return g.Error(absl::StrCat("unsupported ", key("rope.scaling.type"), " '", *type,
                                  "' (supported: none, yarn)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file) {
  const GgufFields g(file);
  absl::StatusOr<std::string> arch_name = file.GetString("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  const std::string arch = *arch_name;
  if (arch != "llama" && arch != "qwen3" && arch != "qwen3moe" && arch != "deepseek2") {
    return g.Error(absl::StrCat("unsupported GGUF architecture '", arch,
                                "' (supported: llama, qwen3, qwen3moe, deepseek2)"));
  }
  ModelConfig c;
  c.architecture = arch == "qwen3moe" ? "qwen3_moe" : arch;
  // llama.cpp's converter permutes Llama's HF q/k rows back to Meta's interleaved pairs; it
  // keeps Qwen's rows as they are and runs them with NeoX (rotate_half) RoPE.
  c.rope_style = arch == "llama" ? RopeStyle::kInterleaved : RopeStyle::kHalfSplit;
  auto key = [&arch](const char* suffix) { return absl::StrCat(arch, ".", suffix); };
  for (auto [suffix, out] :
       {std::pair{"context_length", &c.max_position_embeddings},
        std::pair{"embedding_length", &c.hidden_size},
        std::pair{"feed_forward_length", &c.intermediate_size},
        std::pair{"attention.head_count", &c.num_heads}, std::pair{"block_count", &c.num_layers}}) {
    if (absl::Status s = g.Int(key(suffix), out); !s.ok()) return s;
  }
  if (absl::Status s = g.Int(key("attention.head_count_kv"), &c.num_kv_heads, c.num_heads);
      !s.ok()) {
    return s;
  }
  const bool deepseek = arch == "deepseek2";
  if (deepseek) {
    if (absl::Status s = ReadGgufDeepseek(g, file, c); !s.ok()) return s;
  } else {
    const int default_head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
    int rope_dims = 0;
    int value_length = 0;
    if (absl::Status s = g.Int(key("attention.key_length"), &c.head_dim, -1); !s.ok()) return s;
    if (absl::Status s = g.Int(key("attention.value_length"), &value_length, -1); !s.ok()) return s;
    if (absl::Status s = g.Int(key("rope.dimension_count"), &rope_dims, -1); !s.ok()) return s;
    if (c.head_dim < 0) c.head_dim = rope_dims >= 0 ? rope_dims : default_head_dim;
    if (rope_dims >= 0 && rope_dims != c.head_dim) {
      return g.Error(absl::StrCat(key("rope.dimension_count"), " ", rope_dims,
                                  " differs from head_dim ", c.head_dim,
                                  " (partial rotary embeddings are not supported)"));
    }
    if (value_length >= 0 && value_length != c.head_dim) {
      return g.Error(absl::StrCat(key("attention.value_length"), " ", value_length,
                                  " differs from key_length ", c.head_dim,
                                  " (distinct value head sizes are not supported)"));
    }
  }
  if (absl::Status s = g.Float(key("attention.layer_norm_rms_epsilon"), &c.rms_norm_eps, 1e-5f);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = g.Float(key("rope.freq_base"), &c.rope_theta, 10000.0f); !s.ok()) return s;
  if (!deepseek) {
    if (absl::Status s = ReadGgufRopeScaling(g, file, arch, &c.rope_scaling); !s.ok()) return s;
  }
  // Mixture of experts: Mixtral files are architecture "llama" with an expert count (experts as
  // wide as feed_forward_length); qwen3moe states the experts' width. Both renormalize the
  // top-k weights unless the file says otherwise.
  if (absl::Status s = g.Int(key("expert_count"), &c.num_experts, 0); !s.ok()) return s;
  if (deepseek) {
    // Experts read above.
  } else if (c.num_experts > 0) {
    if (arch == "qwen3") {
      return g.Error(absl::StrCat(key("expert_count"), " ", c.num_experts,
                                  ": a qwen3 file with experts (expected architecture qwen3moe)"));
    }
    if (arch == "llama") c.architecture = "mixtral";
    if (absl::Status s = g.Int(key("expert_used_count"), &c.num_experts_per_tok); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            g.Int(key("expert_feed_forward_length"), &c.moe_intermediate_size, c.intermediate_size);
        !s.ok()) {
      return s;
    }
    if (file.Has(key("expert_weights_norm"))) {
      absl::StatusOr<bool> norm = file.GetBool(key("expert_weights_norm"));
      if (!norm.ok()) return norm.status();
      c.norm_topk_prob = *norm;
    }
  } else if (arch == "qwen3moe") {
    return g.Error(absl::StrCat("metadata key '", key("expert_count"), "' is missing"));
  }
  if (arch == "qwen3" || arch == "qwen3moe") {
    c.qk_norm = true;
    // Biases are optional (Qwen3's attention_bias); their presence in layer 0 decides.
    c.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = file.FindTensor("blk.0.attn_output.bias") != nullptr;
  }

  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return g.Error("tensor 'token_embd.weight' is missing");
  if (embd->dims.size() != 2 || embd->dims[1] > INT_MAX) {
    return g.Error("tensor 'token_embd.weight' must be 2-D [hidden, vocab] with a sane vocab");
  }
  c.vocab_size = static_cast<int>(embd->dims[1]);
  c.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;

  absl::StatusOr<std::optional<TokenId>> bos = g.TokenIdKey("tokenizer.ggml.bos_token_id");
  if (!bos.ok()) return bos.status();
  if (bos->has_value()) c.bos_token_id = **bos;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    absl::StatusOr<std::optional<TokenId>> id = g.TokenIdKey(key);
    if (!id.ok()) return id.status();
    if (id->has_value() &&
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), **id) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(**id);
    }
  }
  if (absl::Status s = c.Validate(); !s.ok()) return g.Error(s.message());
  return c;
}

}  // namespace kvserve
