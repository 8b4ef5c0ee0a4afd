#include "worker/loader/model_loader.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf/gguf_file.h"
#include "kernels/cpu/convert.h"
#include "nlohmann/json.hpp"
#include "worker/loader/hf_config.h"
#include "worker/loader/safetensors_file.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

/// A tensor as found in some file, shape outermost first.
struct RawTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  /// The file holding it, for error messages.
  std::string file;
};

using TensorTable = std::unordered_map<std::string, RawTensor>;

/// The roles of a decoder layer's tensors, named per format by a LayerNamer.
enum class Role {
  kAttnNorm,
  kWq,
  kWk,
  kWv,
  kBq,
  kBk,
  kBv,
  kWo,
  kBo,
  kQNorm,
  kKNorm,
  kFfnNorm,
  kGate,
  kUp,
  kDown,
  // Multi-head latent attention (DeepSeek).
  kQA,
  kQANorm,
  kQB,
  kKvA,
  kKvANorm,
  kKvB,
  // The router's per-expert score-correction bias (DeepSeek-V3), named by an ExpertNamer.
  kRouterBias,
};
using LayerNamer = std::function<std::string(int layer, Role role)>;
/// Names a mixture-of-experts tensor: with `expert` kRouter the router (kGate) or its bias
/// (kRouterBias), with kShared the shared experts' kGate, kUp or kDown matrix, else that routed
/// expert's.
using ExpertNamer =
    std::function<std::string(const std::string& arch, int layer, int expert, Role role)>;
constexpr int kRouter = -1;
constexpr int kShared = -2;

/// Tensor names of one file format.
struct NameScheme {
  std::string embedding;
  std::string final_norm;
  std::string output;
  std::string rope_freqs;  // empty: the format has none
  LayerNamer layer;
  /// Per-expert tensor names (Hugging Face); empty for GGUF, whose experts are stacked.
  ExpertNamer expert;
};

/// GGUF's mixture-of-experts tensors (llama.cpp's names): the router `blk.N.ffn_gate_inp` and
/// the experts stacked into one 3-D tensor per role (kGate, kUp, kDown), [experts, rows, cols]
/// outermost first.
std::string GgufRouterName(int layer) {
  return absl::StrCat("blk.", layer, ".ffn_gate_inp.weight");
}
std::string GgufStackedExpertName(int layer, Role role) {
  const char* suffix = role == Role::kGate ? "gate" : role == Role::kUp ? "up" : "down";
  return absl::StrCat("blk.", layer, ".ffn_", suffix, "_exps.weight");
}

/// Hugging Face names of Mixtral's (block_sparse_moe.gate, experts.J.w1/w3/w2), Qwen3-MoE's and
/// DeepSeek's (mlp.gate, experts.J.gate_proj/up_proj/down_proj; DeepSeek also
/// mlp.gate.e_score_correction_bias and mlp.shared_experts.*) router and expert matrices.
std::string HfExpertName(const std::string& arch, int layer, int expert, Role role) {
  const bool mixtral = arch == "mixtral";
  const std::string p =
      absl::StrCat("model.layers.", layer, mixtral ? ".block_sparse_moe." : ".mlp.");
  if (expert == kRouter) {
    return p + (role == Role::kRouterBias ? "gate.e_score_correction_bias" : "gate.weight");
  }
  const std::string e =
      expert == kShared ? p + "shared_experts." : absl::StrCat(p, "experts.", expert, ".");
  switch (role) {
    case Role::kGate:
      return e + (mixtral ? "w1.weight" : "gate_proj.weight");
    case Role::kUp:
      return e + (mixtral ? "w3.weight" : "up_proj.weight");
    case Role::kDown:
      return e + (mixtral ? "w2.weight" : "down_proj.weight");
    default:
      return std::string();
  }
}

NameScheme HfNames() {
  return NameScheme{"model.embed_tokens.weight",
                    "model.norm.weight",
                    "lm_head.weight",
                    "",
                    [](int i, Role r) {
                      const std::string p = absl::StrCat("model.layers.", i, ".");
                      switch (r) {
                        case Role::kAttnNorm:
                          return p + "input_layernorm.weight";
                        case Role::kWq:
                          return p + "self_attn.q_proj.weight";
                        case Role::kWk:
                          return p + "self_attn.k_proj.weight";
                        case Role::kWv:
                          return p + "self_attn.v_proj.weight";
                        case Role::kBq:
                          return p + "self_attn.q_proj.bias";
                        case Role::kBk:
                          return p + "self_attn.k_proj.bias";
                        case Role::kBv:
                          return p + "self_attn.v_proj.bias";
                        case Role::kWo:
                          return p + "self_attn.o_proj.weight";
                        case Role::kBo:
                          return p + "self_attn.o_proj.bias";
                        case Role::kQNorm:
                          return p + "self_attn.q_norm.weight";
                        case Role::kKNorm:
                          return p + "self_attn.k_norm.weight";
                        case Role::kFfnNorm:
                          return p + "post_attention_layernorm.weight";
                        case Role::kGate:
                          return p + "mlp.gate_proj.weight";
                        case Role::kUp:
                          return p + "mlp.up_proj.weight";
                        case Role::kDown:
                          return p + "mlp.down_proj.weight";
                        case Role::kQA:
                          return p + "self_attn.q_a_proj.weight";
                        case Role::kQANorm:
                          return p + "self_attn.q_a_layernorm.weight";
                        case Role::kQB:
                          return p + "self_attn.q_b_proj.weight";
                        case Role::kKvA:
                          return p + "self_attn.kv_a_proj_with_mqa.weight";
                        case Role::kKvANorm:
                          return p + "self_attn.kv_a_layernorm.weight";
                        case Role::kKvB:
                          return p + "self_attn.kv_b_proj.weight";
                        case Role::kRouterBias:
                          break;
                      }
                      return std::string();
                    },
                    HfExpertName};
}

NameScheme GgufNames() {
  return NameScheme{"token_embd.weight",
                    "output_norm.weight",
                    "output.weight",
                    "rope_freqs.weight",
                    [](int i, Role r) {
                      const std::string p = absl::StrCat("blk.", i, ".");
                      switch (r) {
                        case Role::kAttnNorm:
                          return p + "attn_norm.weight";
                        case Role::kWq:
                          return p + "attn_q.weight";
                        case Role::kWk:
                          return p + "attn_k.weight";
                        case Role::kWv:
                          return p + "attn_v.weight";
                        case Role::kBq:
                          return p + "attn_q.bias";
                        case Role::kBk:
                          return p + "attn_k.bias";
                        case Role::kBv:
                          return p + "attn_v.bias";
                        case Role::kWo:
                          return p + "attn_output.weight";
                        case Role::kBo:
                          return p + "attn_output.bias";
                        case Role::kQNorm:
                          return p + "attn_q_norm.weight";
                        case Role::kKNorm:
                          return p + "attn_k_norm.weight";
                        case Role::kFfnNorm:
                          return p + "ffn_norm.weight";
                        case Role::kGate:
                          return p + "ffn_gate.weight";
                        case Role::kUp:
                          return p + "ffn_up.weight";
                        case Role::kDown:
                          return p + "ffn_down.weight";
                        case Role::kQA:
                          return p + "attn_q_a.weight";
                        case Role::kQANorm:
                          return p + "attn_q_a_norm.weight";
                        case Role::kQB:
                          return p + "attn_q_b.weight";
                        case Role::kKvA:
                          return p + "attn_kv_a_mqa.weight";
                        case Role::kKvANorm:
                          return p + "attn_kv_a_norm.weight";
                        case Role::kKvB:
                          return p + "attn_kv_b.weight";
                        case Role::kRouterBias:
                          break;
                      }
                      return std::string();
                    },
                    nullptr};
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

/// Turns RawTensors into TensorViews inside one ModelWeights, checking shapes and dtypes.
class Binder {
 public:
  Binder(const TensorTable& table, std::string source, ModelWeights* weights)
      : table_(table), source_(std::move(source)), weights_(weights) {}

  /// A matmul weight or the embedding: any dtype, zero-copy unless misaligned.
  absl::Status Matrix(const std::string& name, std::vector<int64_t> expected, TensorView* out) {
    absl::StatusOr<const RawTensor*> t = Lookup(name, expected);
    if (!t.ok()) return t.status();
    const RawTensor& r = **t;
    const int64_t block = DTypeBlockElems(r.dtype);
    if (DTypeIsQuantized(r.dtype) && (r.shape.size() != 2 || r.shape[1] % block != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.file, ": tensor '", name, "' of type ", std::string(DTypeName(r.dtype)),
          " must be 2-D with a row length that is a multiple of its ", block, "-element block"));
    }
    absl::StatusOr<const void*> data = AlignedData(r, r.data, r.nbytes);
    if (!data.ok()) return data.status();
    *out = TensorView{r.name, r.dtype, r.shape, *data};
    return absl::OkStatus();
  }

  /// A norm weight, bias or rope_freqs: converted to an owned F32 buffer.
  absl::Status Vector(const std::string& name, std::vector<int64_t> expected, TensorView* out) {
    absl::StatusOr<const RawTensor*> t = Lookup(name, expected);
    if (!t.ok()) return t.status();
    const RawTensor& r = **t;
    if (DTypeIsQuantized(r.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(r.file, ": tensor '", name, "' has type ",
                                                     std::string(DTypeName(r.dtype)),
                                                     "; expected f32, f16 or bf16"));
    }
    const int64_t n = expected[0];
    auto* dst = reinterpret_cast<float*>(weights_->Allocate(n * 4));
    if (dst == nullptr) return OutOfMemory(r, n * 4);
    for (int64_t i = 0; i < n; ++i) {
      if (r.dtype == DType::kF32) {
        std::memcpy(&dst[i], r.data + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, r.data + 2 * i, 2);
        dst[i] = r.dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
      }
    }
    *out = TensorView{r.name, DType::kF32, r.shape, dst};
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const { return table_.count(name) != 0; }

  /// kv_b_proj ([heads * (nope + v), rank], per head W_UK then W_UV) rebuilt in f32 from the
  /// split layout: k_b [heads, rank, nope] (W_UK^T per head) and v_b [heads, v, rank].
  absl::Status JoinKvB(const std::string& k_name, const std::string& v_name, int64_t heads,
                       int64_t nope, int64_t v, int64_t rank, TensorView* out) {
    absl::StatusOr<const RawTensor*> k = Lookup(k_name, {heads, rank, nope});
    if (!k.ok()) return k.status();
    absl::StatusOr<const RawTensor*> vt = Lookup(v_name, {heads, v, rank});
    if (!vt.ok()) return vt.status();
    for (const RawTensor* r : {*k, *vt}) {
      if (DTypeIsQuantized(r->dtype) && r->shape[2] % DTypeBlockElems(r->dtype) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            r->file, ": tensor '", r->name, "' of type ", std::string(DTypeName(r->dtype)),
            " must have a row length that is a multiple of its block"));
      }
    }
    const int64_t rows = heads * (nope + v);
    auto* dst = reinterpret_cast<float*>(weights_->Allocate(rows * rank * 4));
    if (dst == nullptr) return OutOfMemory(**k, rows * rank * 4);
    std::vector<float> row(static_cast<size_t>(std::max(nope, rank)));
    const int64_t k_row = DTypeRowBytes((*k)->dtype, nope);
    const int64_t v_row = DTypeRowBytes((*vt)->dtype, rank);
    for (int64_t h = 0; h < heads; ++h) {
      float* head = dst + h * (nope + v) * rank;
      for (int64_t r = 0; r < rank; ++r) {  // k_b row r of head h is column r of W_UK
        cpu::ConvertRowToF32((*k)->data + (h * rank + r) * k_row, (*k)->dtype, nope, row.data());
        for (int64_t j = 0; j < nope; ++j) head[j * rank + r] = row[j];
      }
      for (int64_t i = 0; i < v; ++i) {
        cpu::ConvertRowToF32((*vt)->data + (h * v + i) * v_row, (*vt)->dtype, rank,
                             head + (nope + i) * rank);
      }
    }
    *out = TensorView{absl::StrCat(k_name, "+", v_name), DType::kF32, {rows, rank}, dst};
    return absl::OkStatus();
  }

  /// Expert `expert` of a stacked [experts, rows, cols] tensor as a [rows, cols] matrix view.
  absl::Status StackedMatrix(const std::string& name, std::vector<int64_t> expected, int expert,
                             TensorView* out) {
    absl::StatusOr<const RawTensor*> t = Lookup(name, expected);
    if (!t.ok()) return t.status();
    const RawTensor& r = **t;
    const int64_t rows = r.shape[1], cols = r.shape[2];
    const int64_t block = DTypeBlockElems(r.dtype);
    if (DTypeIsQuantized(r.dtype) && cols % block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.file, ": tensor '", name, "' of type ", std::string(DTypeName(r.dtype)),
          " must have a row length that is a multiple of its ", block, "-element block"));
    }
    const int64_t bytes = rows * DTypeRowBytes(r.dtype, cols);
    absl::StatusOr<const void*> data = AlignedData(r, r.data + expert * bytes, bytes);
    if (!data.ok()) return data.status();
    *out = TensorView{absl::StrCat(r.name, "[", expert, "]"), r.dtype, {rows, cols}, *data};
    return absl::OkStatus();
  }

 private:
  /// `data` (`bytes` of tensor `r`) itself, or an owned copy when it is not aligned for `r.dtype`
  /// (safetensors offsets need not be; quantized blocks hold fp16 fields at even offsets, read
  /// with memcpy, so they need 2-byte alignment); RESOURCE_EXHAUSTED when the copy cannot be
  /// made.
  absl::StatusOr<const void*> AlignedData(const RawTensor& r, const uint8_t* data, uint64_t bytes) {
    const uintptr_t need = DTypeIsQuantized(r.dtype) ? 2 : DTypeBlockBytes(r.dtype);
    if (reinterpret_cast<uintptr_t>(data) % need == 0) return data;
    uint8_t* copy = weights_->Allocate(static_cast<int64_t>(bytes));
    if (copy == nullptr) return OutOfMemory(r, static_cast<int64_t>(bytes));
    std::memcpy(copy, data, bytes);
    return copy;
  }

  static absl::Status OutOfMemory(const RawTensor& r, int64_t bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(r.file, ": out of memory for ", bytes, " bytes of tensor '", r.name, "'"));
  }

  absl::StatusOr<const RawTensor*> Lookup(const std::string& name,
                                          const std::vector<int64_t>& expected) const {
    auto it = table_.find(name);
    if (it == table_.end()) {
      return absl::NotFoundError(absl::StrCat(source_, ": missing tensor '", name, "'"));
    }
    const RawTensor& r = it->second;
    if (r.shape != expected) {
      return absl::InvalidArgumentError(absl::StrCat(r.file, ": tensor '", name, "' has shape ",
                                                     ShapeString(r.shape), ", expected ",
                                                     ShapeString(expected)));
    }
    return &r;
  }

  const TensorTable& table_;
  std::string source_;
  ModelWeights* weights_;
};

/// A shape error of an attention tensor, with the config numbers its shape comes from (a wrong
/// or missing `head_dim` shows up here first).
absl::Status WithHeadShapeHint(const absl::Status& s, Role role, const ModelConfig& c) {
  if (s.code() != absl::StatusCode::kInvalidArgument) return s;
  if (c.is_mla() && role != Role::kAttnNorm && role != Role::kFfnNorm && role != Role::kGate &&
      role != Role::kUp && role != Role::kDown) {
    return absl::InvalidArgumentError(absl::StrCat(
        s.message(), " (num_attention_heads ", c.num_heads, ", qk_nope_head_dim ",
        c.qk_nope_head_dim, ", qk_rope_head_dim ", c.qk_rope_head_dim, ", v_head_dim ",
        c.v_head_dim, ", kv_lora_rank ", c.kv_lora_rank, ", q_lora_rank ", c.q_lora_rank, ")"));
  }
  switch (role) {
    case Role::kWq:
    case Role::kBq:
    case Role::kWo:
      return absl::InvalidArgumentError(absl::StrCat(s.message(), " (num_attention_heads ",
                                                     c.num_heads, " x head_dim ", c.head_dim, ")"));
    case Role::kWk:
    case Role::kWv:
    case Role::kBk:
    case Role::kBv:
      return absl::InvalidArgumentError(absl::StrCat(
          s.message(), " (num_key_value_heads ", c.num_kv_heads, " x head_dim ", c.head_dim, ")"));
    case Role::kQNorm:
    case Role::kKNorm:
      return absl::InvalidArgumentError(absl::StrCat(s.message(), " (head_dim ", c.head_dim, ")"));
    default:
      return s;
  }
}

/// Binds layer `layer`'s router and experts (config.num_experts > 0).
absl::Status BindExperts(Binder& b, const NameScheme& names, const ModelConfig& c, int layer,
                         LayerWeights* l) {
  const int64_t hidden = c.hidden_size;
  const int64_t width = c.moe_intermediate_size;
  auto hint = [&c](const absl::Status& s) {
    if (s.code() != absl::StatusCode::kInvalidArgument) return s;
    return absl::InvalidArgumentError(absl::StrCat(s.message(), " (num_experts ", c.num_experts,
                                                   ", expert width ", c.moe_intermediate_size,
                                                   ", hidden_size ", c.hidden_size, ")"));
  };
  const std::string& arch = c.architecture;
  if (!names.expert) {  // GGUF: stacked experts (llama.cpp's names)
    const std::string p = absl::StrCat("blk.", layer, ".");
    if (absl::Status s = b.Matrix(GgufRouterName(layer), {c.num_experts, hidden}, &l->router);
        !s.ok()) {
      return hint(s);
    }
    if (c.moe_topk == MoeTopk::kNoAuxTc) {
      if (absl::Status s = b.Vector(p + "exp_probs_b.bias", {c.num_experts}, &l->router_bias);
          !s.ok()) {
        return hint(s);
      }
    }
    if (c.n_shared_experts > 0) {
      const int64_t shared = int64_t{c.n_shared_experts} * width;
      for (auto [name, shape, out] :
           {std::tuple{"ffn_gate_shexp", std::vector<int64_t>{shared, hidden}, &l->shared.w_gate},
            std::tuple{"ffn_up_shexp", std::vector<int64_t>{shared, hidden}, &l->shared.w_up},
            std::tuple{"ffn_down_shexp", std::vector<int64_t>{hidden, shared},
                       &l->shared.w_down}}) {
        if (absl::Status s = b.Matrix(absl::StrCat(p, name, ".weight"), shape, out); !s.ok()) {
          return hint(s);
        }
      }
    }
    l->experts.resize(c.num_experts);
    for (int e = 0; e < c.num_experts; ++e) {
      ExpertWeights& x = l->experts[e];
      for (auto [role, rows, cols, out] : {std::tuple{Role::kGate, width, hidden, &x.w_gate},
                                           std::tuple{Role::kUp, width, hidden, &x.w_up},
                                           std::tuple{Role::kDown, hidden, width, &x.w_down}}) {
        if (absl::Status s = b.StackedMatrix(GgufStackedExpertName(layer, role),
                                             {c.num_experts, rows, cols}, e, out);
            !s.ok()) {
          return hint(s);
        }
      }
    }
    return absl::OkStatus();
  }
  if (absl::Status s = b.Matrix(names.expert(arch, layer, kRouter, Role::kGate),
                                {c.num_experts, hidden}, &l->router);
      !s.ok()) {
    return hint(s);
  }
  if (c.moe_topk == MoeTopk::kNoAuxTc) {
    if (absl::Status s = b.Vector(names.expert(arch, layer, kRouter, Role::kRouterBias),
                                  {c.num_experts}, &l->router_bias);
        !s.ok()) {
      return hint(s);
    }
  }
  if (c.n_shared_experts > 0) {
    const int64_t shared = int64_t{c.n_shared_experts} * width;
    for (auto [role, shape, out] :
         {std::tuple{Role::kGate, std::vector<int64_t>{shared, hidden}, &l->shared.w_gate},
          std::tuple{Role::kUp, std::vector<int64_t>{shared, hidden}, &l->shared.w_up},
          std::tuple{Role::kDown, std::vector<int64_t>{hidden, shared}, &l->shared.w_down}}) {
      if (absl::Status s = b.Matrix(names.expert(arch, layer, kShared, role), shape, out);
          !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat(s.message(), " (n_shared_experts ", c.n_shared_experts,
                                         " x expert width ", width, ")"));
      }
    }
  }
  l->experts.resize(c.num_experts);
  for (int e = 0; e < c.num_experts; ++e) {
    ExpertWeights& x = l->experts[e];
    for (auto [role, shape, out] :
         {std::tuple{Role::kGate, std::vector<int64_t>{width, hidden}, &x.w_gate},
          std::tuple{Role::kUp, std::vector<int64_t>{width, hidden}, &x.w_up},
          std::tuple{Role::kDown, std::vector<int64_t>{hidden, width}, &x.w_down}}) {
      if (absl::Status s = b.Matrix(names.expert(arch, layer, e, role), shape, out); !s.ok()) {
        return hint(s);
      }
    }
  }
  return absl::OkStatus();
}

/// Fills every view of `w` (whose config is set) from `table` using `names`.
absl::Status BindAll(const TensorTable& table, const NameScheme& names, const std::string& source,
                     ModelWeights* w) {
  const ModelConfig& c = w->config;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t inter = c.intermediate_size;
  const int64_t vocab = c.vocab_size;
  Binder b(table, source, w);
  if (absl::Status s = b.Matrix(names.embedding, {vocab, hidden}, &w->token_embedding); !s.ok()) {
    return s;
  }
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w->layers[i];
    const LayerNamer& n = names.layer;
    struct Item {
      Role role;
      std::vector<int64_t> shape;
      TensorView* out;
      bool matrix;
    };
    std::vector<Item> items = {{Role::kAttnNorm, {hidden}, &l.attn_norm, false},
                               {Role::kFfnNorm, {hidden}, &l.ffn_norm, false}};
    if (c.is_mla()) {
      const int64_t heads = c.num_heads;
      const int64_t rank = c.kv_lora_rank;
      if (c.q_lora_rank > 0) {
        items.push_back({Role::kQA, {c.q_lora_rank, hidden}, &l.wq_a, true});
        items.push_back({Role::kQANorm, {c.q_lora_rank}, &l.q_a_norm, false});
        items.push_back({Role::kQB, {q_dim, c.q_lora_rank}, &l.wq_b, true});
      } else {
        items.push_back({Role::kWq, {q_dim, hidden}, &l.wq, true});
      }
      items.push_back({Role::kKvA, {rank + c.qk_rope_head_dim, hidden}, &l.wkv_a, true});
      items.push_back({Role::kKvANorm, {rank}, &l.kv_a_norm, false});
      const std::string k_b = absl::StrCat("blk.", i, ".attn_k_b.weight");
      const std::string v_b = absl::StrCat("blk.", i, ".attn_v_b.weight");
      if (!b.Has(n(i, Role::kKvB)) && b.Has(k_b) && b.Has(v_b)) {
        // Newer llama.cpp files split kv_b_proj per head into W_UK^T and W_UV.
        if (absl::Status s =
                b.JoinKvB(k_b, v_b, heads, c.qk_nope_head_dim, c.v_head_dim, rank, &l.wkv_b);
            !s.ok()) {
          return WithHeadShapeHint(s, Role::kKvB, c);
        }
      } else {
        items.push_back(
            {Role::kKvB, {heads * (c.qk_nope_head_dim + c.v_head_dim), rank}, &l.wkv_b, true});
      }
      items.push_back({Role::kWo, {hidden, heads * c.v_head_dim}, &l.wo, true});
    } else {
      items.push_back({Role::kWq, {q_dim, hidden}, &l.wq, true});
      items.push_back({Role::kWk, {kv_dim, hidden}, &l.wk, true});
      items.push_back({Role::kWv, {kv_dim, hidden}, &l.wv, true});
      items.push_back({Role::kWo, {hidden, q_dim}, &l.wo, true});
    }
    if (!c.is_moe_layer(i)) {
      items.push_back({Role::kGate, {inter, hidden}, &l.w_gate, true});
      items.push_back({Role::kUp, {inter, hidden}, &l.w_up, true});
      items.push_back({Role::kDown, {hidden, inter}, &l.w_down, true});
    }
    if (c.qkv_bias) {
      items.push_back({Role::kBq, {q_dim}, &l.bq, false});
      items.push_back({Role::kBk, {kv_dim}, &l.bk, false});
      items.push_back({Role::kBv, {kv_dim}, &l.bv, false});
    }
    if (c.o_bias) items.push_back({Role::kBo, {hidden}, &l.bo, false});
    if (c.qk_norm) {
      items.push_back({Role::kQNorm, {c.head_dim}, &l.q_norm, false});
      items.push_back({Role::kKNorm, {c.head_dim}, &l.k_norm, false});
    }
    for (const Item& it : items) {
      const std::string name = n(i, it.role);
      absl::Status s =
          it.matrix ? b.Matrix(name, it.shape, it.out) : b.Vector(name, it.shape, it.out);
      if (!s.ok()) return WithHeadShapeHint(s, it.role, c);
    }
    if (c.is_moe_layer(i)) {
      if (absl::Status s = BindExperts(b, names, c, i, &l); !s.ok()) return s;
    }
  }
  if (absl::Status s = b.Vector(names.final_norm, {hidden}, &w->final_norm); !s.ok()) return s;
  if (c.tie_word_embeddings) {
    w->output = w->token_embedding;
  } else if (absl::Status s = b.Matrix(names.output, {vocab, hidden}, &w->output); !s.ok()) {
    return s;
  }
  if (!names.rope_freqs.empty() && b.Has(names.rope_freqs)) {
    if (absl::Status s = b.Vector(names.rope_freqs, {c.head_dim / 2}, &w->rope_freqs); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGguf(const std::string& path) {
  absl::StatusOr<GgufFile> gguf = GgufFile::Open(path);
  if (!gguf.ok()) return gguf.status();
  if (!gguf->Has("tokenizer.ggml.tokens")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no tokenizer in GGUF metadata (tokenizer.ggml.tokens)"));
  }
  auto w = std::make_unique<ModelWeights>();
  absl::StatusOr<ModelConfig> config = ModelConfigFromGguf(*gguf);
  if (!config.ok()) return config.status();
  w->config = *std::move(config);
  w->format = "gguf";
  w->source_path = path;
  TensorTable table;
  for (const GgufTensorInfo& t : gguf->tensors()) {
    std::optional<DType> dtype = DTypeFromGgml(t.type);
    if (!dtype.has_value()) continue;  // the parser admits only the types above
    RawTensor r{t.name, *dtype,   std::vector<int64_t>(t.dims.rbegin(), t.dims.rend()),
                t.data, t.nbytes, path};
    table.emplace(t.name, std::move(r));
  }
  if (absl::Status s = BindAll(table, GgufNames(), path, w.get()); !s.ok()) return s;
  w->files.push_back(std::move(*gguf).TakeFile());
  return w;
}

/// Reads model.safetensors.index.json: tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ReadShardIndex(const std::string& index_path) {
  absl::StatusOr<std::string> text = ReadFileToString(index_path);
  if (!text.ok()) return text.status();
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", what));
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*text);
  } catch (const std::exception& e) {
    return error(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return error("no 'weight_map' object");
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      return error(absl::StrCat("weight_map entry '", name, "' is not a string"));
    const std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
      return error(
          absl::StrCat("weight_map entry '", name, "' names an invalid shard '", file, "'"));
    }
    map[name] = file;
  }
  return map;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHfDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "tokenizer.json", ec)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": missing tokenizer.json"));
  }
  absl::StatusOr<ModelConfig> config = LoadHfConfig(dir);
  if (!config.ok()) return config.status();
  auto w = std::make_unique<ModelWeights>();
  w->config = *std::move(config);
  w->format = "safetensors";
  w->source_path = dir;

  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();
  std::vector<SafetensorsFile> files;
  TensorTable table;
  auto add = [&table](const SafetensorsTensor& t, const std::string& file) {
    table.emplace(t.name, RawTensor{t.name, t.dtype, t.shape, t.data, t.nbytes(), file});
  };
  std::string source;
  if (fs::exists(index_path, ec)) {
    source = index_path;
    absl::StatusOr<std::map<std::string, std::string>> index = ReadShardIndex(index_path);
    if (!index.ok()) return index.status();
    std::map<std::string, size_t> shard_slot;  // shard file name -> index into files
    for (const auto& [name, shard] : *index) {
      auto [it, inserted] = shard_slot.emplace(shard, files.size());
      if (inserted) {
        absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open((fs::path(dir) / shard).string());
        if (!f.ok()) {
          return absl::Status(f.status().code(), absl::StrCat(index_path, ": cannot load shard '",
                                                              shard, "': ", f.status().message()));
        }
        files.push_back(*std::move(f));
      }
      const SafetensorsFile& f = files[it->second];
      const SafetensorsTensor* t = f.Find(name);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            f.path(), ": tensor '", name, "' is listed in ", index_path, " but not in the shard"));
      }
      add(*t, f.path());
    }
  } else if (fs::exists(single_path, ec)) {
    source = single_path;
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(single_path);
    if (!f.ok()) return f.status();
    files.push_back(*std::move(f));
    for (const SafetensorsTensor& t : files.back().tensors()) add(t, single_path);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  if (absl::Status s = BindAll(table, HfNames(), source, w.get()); !s.ok()) return s;
  for (SafetensorsFile& f : files) w->files.push_back(std::move(f).TakeFile());
  return w;
}

}  // namespace

// The GGUF tensor types kvserve loads, and the dtype each loads as.
constexpr std::pair<GgmlType, DType> kGgmlDTypes[] = {
    {GgmlType::kF32, DType::kF32},   {GgmlType::kF16, DType::kF16},
    {GgmlType::kBF16, DType::kBF16}, {GgmlType::kQ8_0, DType::kQ8_0},
    {GgmlType::kQ4_0, DType::kQ4_0}, {GgmlType::kQ4_1, DType::kQ4_1},
    {GgmlType::kQ5_0, DType::kQ5_0}, {GgmlType::kQ5_1, DType::kQ5_1},
    {GgmlType::kQ4_K, DType::kQ4_K}, {GgmlType::kQ5_K, DType::kQ5_K},
    {GgmlType::kQ6_K, DType::kQ6_K},
};

std::optional<DType> DTypeFromGgml(GgmlType t) {
  for (const auto& [ggml, dtype] : kGgmlDTypes) {
    if (ggml == t) return dtype;
  }
  return std::nullopt;
}

GgmlType GgmlTypeOf(DType d) {
  for (const auto& [ggml, dtype] : kGgmlDTypes) {
    if (dtype == d) return ggml;
  }
  return GgmlType::kF32;  // every DType is in the table (model_loader_test checks)
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (fs::is_directory(st)) return LoadHfDir(path);
  return LoadGguf(path);
}

}  // namespace kvserve
