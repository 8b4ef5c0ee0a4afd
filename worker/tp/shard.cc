#include "worker/tp/shard.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

std::string TensorName(const TensorView& t, int layer, const char* field) {
  return t.name.empty() ? absl::StrCat("layer ", layer, " ", field) : t.name;
}

absl::Status CheckShape(const TensorView& t, int layer, const char* field, int64_t rows,
                        int64_t cols) {
  if (!t.present() || t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols) {
    std::string got = "absent";
    if (t.present()) {
      got = "[";
      for (size_t i = 0; i < t.shape.size(); ++i) absl::StrAppend(&got, i ? ", " : "", t.shape[i]);
      got += "]";
    }
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ", TensorName(t, layer, field),
                                                   " has shape ", got, ", expected [", rows, ", ",
                                                   cols, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckBias(const TensorView& t, int layer, const char* field, int64_t n) {
  if (!t.present()) return absl::OkStatus();
  if (t.dtype != DType::kF32 || t.shape.size() != 1 || t.shape[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ", TensorName(t, layer, field),
                                                   " must be an f32 vector of ", n, " elements"));
  }
  return absl::OkStatus();
}

// Rows [begin, end) of a 2-D tensor, or elements [begin, end) of a 1-D one: a view.
TensorView RowSlice(const TensorView& t, int64_t begin, int64_t end) {
  if (!t.present()) return t;
  TensorView v = t;
  v.shape[0] = end - begin;
  const int64_t unit_bytes = t.shape.size() == 1 ? DTypeRowBytes(t.dtype, 1) : t.row_bytes();
  v.data = static_cast<const uint8_t*>(t.data) + begin * unit_bytes;
  return v;
}

// Columns [begin, end) of a 2-D tensor, copied into a buffer owned by `shard` (a view when the
// range is the whole row). The caller has checked that begin and end are on block boundaries.
absl::StatusOr<TensorView> ColumnSlice(const TensorView& t, int64_t begin, int64_t end,
                                       ModelWeights& shard) {
  if (begin == 0 && end == t.shape[1]) return t;
  TensorView v = t;
  v.shape[1] = end - begin;
  const int64_t rows = t.shape[0];
  const int64_t src_row = t.row_bytes();
  const int64_t dst_row = v.row_bytes();
  const int64_t offset = DTypeRowBytes(t.dtype, begin);
  uint8_t* buf = shard.Allocate(rows * dst_row);
  if (buf == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("tensor parallel: out of memory copying ",
                                                     rows * dst_row, " bytes of ", t.name));
  }
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(buf + r * dst_row, src + r * src_row + offset, dst_row);
  }
  v.data = buf;
  return v;
}

absl::Status CheckColumnCut(const TensorView& t, int layer, const char* field, int64_t begin,
                            int64_t end, int tp) {
  const int64_t block = DTypeBlockElems(t.dtype);
  for (int64_t cut : {begin, end}) {
    if (cut % block != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor parallel ", tp, ": ", TensorName(t, layer, field), " (",
                       std::string(DTypeName(t.dtype)), ") would be split at column ", cut,
                       ", inside a ", block, "-element quantization block"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardPlan> PlanShard(const ModelWeights& weights, int rank, int tp) {
  const ModelConfig& c = weights.config;
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp, " < 1"));
  if (rank < 0 || rank >= tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel rank ", rank, " outside [0, ", tp, ")"));
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (static_cast<int>(weights.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ", weights.layers.size(),
                                                   " layers loaded, config says ", c.num_layers));
  }
  if (c.num_heads % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel size ", tp, " does not divide num_heads ", c.num_heads));
  }
  ShardPlan plan;
  plan.rank = rank;
  plan.tp = tp;
  const int heads_per_rank = c.num_heads / tp;
  plan.q_head_begin = rank * heads_per_rank;
  plan.q_head_end = plan.q_head_begin + heads_per_rank;
  if (c.is_mla()) {
    // One latent row per token, replicated: every rank reads "kv head" 0.
    plan.kv_head_begin = 0;
    plan.kv_head_end = 1;
    plan.kv_replicated = tp > 1;
  } else if (c.num_kv_heads % tp == 0) {
    const int kv_per_rank = c.num_kv_heads / tp;
    plan.kv_head_begin = rank * kv_per_rank;
    plan.kv_head_end = plan.kv_head_begin + kv_per_rank;
  } else if (tp % c.num_kv_heads == 0) {
    // tp / kv ranks share each kv head; rank r's query heads all belong to kv head r * kv / tp.
    plan.kv_head_begin = rank * c.num_kv_heads / tp;
    plan.kv_head_end = plan.kv_head_begin + 1;
    plan.kv_replicated = true;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel size ", tp, " and num_kv_heads ", c.num_kv_heads,
                     ": one must divide the other to distribute the kv heads"));
  }

  // MLP rows go in units of the down projection's quantization block so its column cut is legal.
  // A mixture-of-experts model cuts every expert at the same rows of its own width.
  int64_t dense_unit = 1, expert_unit = 1, shared_unit = 1;
  bool has_dense = false;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    if (!c.is_moe_layer(l)) {
      has_dense = true;
      dense_unit = std::max(dense_unit, DTypeBlockElems(w.w_down.dtype));
      continue;
    }
    for (const ExpertWeights& e : w.experts) {
      expert_unit = std::max(expert_unit, DTypeBlockElems(e.w_down.dtype));
    }
    if (w.shared.w_down.present()) {
      shared_unit = std::max(shared_unit, DTypeBlockElems(w.shared.w_down.dtype));
    }
  }
  // Rank `rank`'s rows of a `width`-row MLP cut in `unit`s.
  auto split = [&](int64_t width, int64_t unit, const std::string& width_name, int64_t* begin,
                   int64_t* end) -> absl::Status {
    if (width % unit != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor parallel: ", width_name, " ", width,
                                                     " is not a multiple of ", unit,
                                                     "-element quantization blocks"));
    }
    const int64_t units = width / unit;
    if (units < tp) {
      return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp, " exceeds the ",
                                                     units, " splittable MLP blocks of ", unit,
                                                     " rows (", width_name, " ", width, ")"));
    }
    *begin = units * rank / tp * unit;
    *end = units * (rank + 1) / tp * unit;
    return absl::OkStatus();
  };
  if (has_dense) {
    if (absl::Status s = split(c.intermediate_size, dense_unit, "intermediate_size",
                               &plan.ffn_begin, &plan.ffn_end);
        !s.ok()) {
      return s;
    }
  }
  const bool moe = c.is_moe();
  const int64_t width = c.moe_intermediate_size;
  const int64_t shared_width = int64_t{c.n_shared_experts} * c.moe_intermediate_size;
  if (moe) {
    if (absl::Status s = split(width, expert_unit, "moe_intermediate_size", &plan.expert_begin,
                               &plan.expert_end);
        !s.ok()) {
      return s;
    }
    if (shared_width > 0) {
      if (absl::Status s =
              split(shared_width, shared_unit, "n_shared_experts x moe_intermediate_size",
                    &plan.shared_begin, &plan.shared_end);
          !s.ok()) {
        return s;
      }
    }
  }

  const int64_t hd = c.head_dim;
  const int64_t h = c.hidden_size;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    const int64_t q_dim = int64_t{c.num_heads} * hd;
    const int64_t kv_dim = int64_t{c.num_kv_heads} * hd;
    std::vector<absl::Status> mlp;
    if (c.is_moe_layer(l)) {
      mlp.push_back(CheckShape(w.router, l, "router", c.num_experts, h));
      if (shared_width > 0) {
        mlp.push_back(CheckShape(w.shared.w_gate, l, "shared w_gate", shared_width, h));
        mlp.push_back(CheckShape(w.shared.w_up, l, "shared w_up", shared_width, h));
        mlp.push_back(CheckShape(w.shared.w_down, l, "shared w_down", h, shared_width));
        mlp.push_back(CheckColumnCut(w.shared.w_down, l, "shared w_down", plan.shared_begin,
                                     plan.shared_end, tp));
      }
      if (static_cast<int>(w.experts.size()) != c.num_experts) {
        mlp.push_back(absl::InvalidArgumentError(
            absl::StrCat("tensor parallel: layer ", l, " has ", w.experts.size(),
                         " experts, config says ", c.num_experts)));
      }
      for (const ExpertWeights& e : w.experts) {
        mlp.push_back(CheckShape(e.w_gate, l, "expert w_gate", width, h));
        mlp.push_back(CheckShape(e.w_up, l, "expert w_up", width, h));
        mlp.push_back(CheckShape(e.w_down, l, "expert w_down", h, width));
        mlp.push_back(
            CheckColumnCut(e.w_down, l, "expert w_down", plan.expert_begin, plan.expert_end, tp));
      }
    } else {
      const int64_t dense = c.intermediate_size;
      mlp = {CheckShape(w.w_gate, l, "w_gate", dense, h), CheckShape(w.w_up, l, "w_up", dense, h),
             CheckShape(w.w_down, l, "w_down", h, dense),
             CheckColumnCut(w.w_down, l, "w_down", plan.ffn_begin, plan.ffn_end, tp)};
    }
    for (const absl::Status& s : mlp) {
      if (!s.ok()) return s;
    }
    if (c.is_mla()) {
      const int64_t v_cols = int64_t{c.num_heads} * c.v_head_dim;
      for (absl::Status s : {CheckColumnCut(w.wo, l, "wo", plan.q_head_begin * c.v_head_dim,
                                            plan.q_head_end * c.v_head_dim, tp),
                             CheckShape(w.wo, l, "wo", h, v_cols)}) {
        if (!s.ok()) return s;
      }
      continue;  // the model checks the latent projections' shapes
    }
    for (absl::Status s :
         {CheckShape(w.wq, l, "wq", q_dim, h), CheckShape(w.wk, l, "wk", kv_dim, h),
          CheckShape(w.wv, l, "wv", kv_dim, h), CheckShape(w.wo, l, "wo", h, q_dim),
          CheckBias(w.bq, l, "bq", q_dim), CheckBias(w.bk, l, "bk", kv_dim),
          CheckBias(w.bv, l, "bv", kv_dim), CheckBias(w.bo, l, "bo", h),
          CheckBias(w.q_norm, l, "q_norm", hd), CheckBias(w.k_norm, l, "k_norm", hd),
          CheckColumnCut(w.wo, l, "wo", plan.q_head_begin * hd, plan.q_head_end * hd, tp)}) {
      if (!s.ok()) return s;
    }
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ShardWeights(const ModelWeights& weights, int rank,
                                                           int tp) {
  absl::StatusOr<ShardPlan> plan = PlanShard(weights, rank, tp);
  if (!plan.ok()) return plan.status();
  const ModelConfig& c = weights.config;
  const int64_t hd = c.head_dim;

  auto shard = std::make_unique<ModelWeights>();
  shard->config = c;
  shard->config.num_heads = plan->q_head_end - plan->q_head_begin;
  // MLA's kv heads play no part (the cache holds one latent row); keep them dividing the heads.
  shard->config.num_kv_heads =
      c.is_mla() ? shard->config.num_heads : plan->kv_head_end - plan->kv_head_begin;
  if (c.is_moe()) {
    shard->config.moe_intermediate_size = static_cast<int>(plan->expert_end - plan->expert_begin);
    // Shared experts keep their own cut (the model reads their width from the weights).
  }
  if (plan->ffn_end > plan->ffn_begin) {
    shard->config.intermediate_size = static_cast<int>(plan->ffn_end - plan->ffn_begin);
  }
  shard->format = weights.format;
  shard->source_path = weights.source_path;
  shard->token_embedding = weights.token_embedding;
  shard->final_norm = weights.final_norm;
  shard->output = weights.output;
  shard->rope_freqs = weights.rope_freqs;

  const int64_t q_begin = plan->q_head_begin * hd, q_end = plan->q_head_end * hd;
  const int64_t kv_begin = plan->kv_head_begin * hd, kv_end = plan->kv_head_end * hd;
  shard->layers.resize(weights.layers.size());
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& w = weights.layers[l];
    LayerWeights& s = shard->layers[l];
    s.attn_norm = w.attn_norm;
    s.ffn_norm = w.ffn_norm;
    // q/k norms act per head, so every rank holds them whole.
    s.q_norm = w.q_norm;
    s.k_norm = w.k_norm;
    // The output bias is added once: by rank 0, whose partial projection the all-reduce sums
    // with the others'.
    if (rank == 0) s.bo = w.bo;
    s.wq = RowSlice(w.wq, q_begin, q_end);
    s.bq = RowSlice(w.bq, q_begin, q_end);
    s.wk = RowSlice(w.wk, kv_begin, kv_end);
    s.bk = RowSlice(w.bk, kv_begin, kv_end);
    s.wv = RowSlice(w.wv, kv_begin, kv_end);
    s.bv = RowSlice(w.bv, kv_begin, kv_end);
    s.w_gate = RowSlice(w.w_gate, plan->ffn_begin, plan->ffn_end);
    s.w_up = RowSlice(w.w_up, plan->ffn_begin, plan->ffn_end);
    if (!c.is_mla()) {
      absl::StatusOr<TensorView> wo = ColumnSlice(w.wo, q_begin, q_end, *shard);
      if (!wo.ok()) return wo.status();
      s.wo = std::move(*wo);
    } else {
      // Heads split q (or q_b) and kv_b rows and o columns; the latent side is replicated.
      const int64_t qk = c.head_dim;
      const int64_t kv_b = c.qk_nope_head_dim + c.v_head_dim;
      s.wq = RowSlice(w.wq, plan->q_head_begin * qk, plan->q_head_end * qk);
      s.wq_a = w.wq_a;
      s.q_a_norm = w.q_a_norm;
      s.wq_b = RowSlice(w.wq_b, plan->q_head_begin * qk, plan->q_head_end * qk);
      s.wkv_a = w.wkv_a;
      s.kv_a_norm = w.kv_a_norm;
      s.wkv_b = RowSlice(w.wkv_b, plan->q_head_begin * kv_b, plan->q_head_end * kv_b);
      absl::StatusOr<TensorView> o = ColumnSlice(w.wo, plan->q_head_begin * c.v_head_dim,
                                                 plan->q_head_end * c.v_head_dim, *shard);
      if (!o.ok()) return o.status();
      s.wo = std::move(*o);
    }
    // An MLP split by rows of its width: gate and up rows, down columns.
    auto split_mlp = [&shard](const TensorView& gate, const TensorView& up, const TensorView& down,
                              int64_t begin, int64_t end, ExpertWeights* out) -> absl::Status {
      out->w_gate = RowSlice(gate, begin, end);
      out->w_up = RowSlice(up, begin, end);
      absl::StatusOr<TensorView> d = ColumnSlice(down, begin, end, *shard);
      if (!d.ok()) return d.status();
      out->w_down = std::move(*d);
      return absl::OkStatus();
    };
    if (c.is_moe_layer(static_cast<int>(l))) {
      // The router is replicated (every rank routes alike); each expert splits like a dense MLP.
      s.router = w.router;
      s.router_bias = w.router_bias;
      s.experts.resize(w.experts.size());
      for (size_t e = 0; e < w.experts.size(); ++e) {
        const ExpertWeights& x = w.experts[e];
        if (absl::Status st = split_mlp(x.w_gate, x.w_up, x.w_down, plan->expert_begin,
                                        plan->expert_end, &s.experts[e]);
            !st.ok()) {
          return st;
        }
      }
      if (w.shared.w_gate.present()) {
        if (absl::Status st = split_mlp(w.shared.w_gate, w.shared.w_up, w.shared.w_down,
                                        plan->shared_begin, plan->shared_end, &s.shared);
            !st.ok()) {
          return st;
        }
      }
      continue;
    }
    absl::StatusOr<TensorView> down = ColumnSlice(w.w_down, plan->ffn_begin, plan->ffn_end, *shard);
    if (!down.ok()) return down.status();
    s.w_down = std::move(*down);
  }
  return shard;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> StageWeights(const ModelWeights& weights, int first,
                                                           int count) {
  const ModelConfig& c = weights.config;
  if (c.total_layers != 0) {
    return absl::InvalidArgumentError("StageWeights: the weights are already a pipeline stage");
  }
  if (static_cast<int>(weights.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("StageWeights: ", weights.layers.size(),
                                                   " layers loaded, config says ", c.num_layers));
  }
  if (first < 0 || count < 1 || first + count > c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stage layers [", first, ", ",
                                                   first + count, ") fall outside the model's ",
                                                   c.num_layers, " layers"));
  }
  auto stage = std::make_unique<ModelWeights>();
  stage->config = c;
  stage->config.num_layers = count;
  stage->config.layer_offset = first;
  stage->config.total_layers = c.num_layers;
  stage->format = weights.format;
  stage->source_path = weights.source_path;
  stage->layers.assign(weights.layers.begin() + first, weights.layers.begin() + first + count);
  stage->rope_freqs = weights.rope_freqs;
  const bool tied = weights.output.data == weights.token_embedding.data;
  if (stage->config.first_stage() || (stage->config.last_stage() && tied)) {
    stage->token_embedding = weights.token_embedding;
  }
  if (stage->config.last_stage()) {
    stage->final_norm = weights.final_norm;
    stage->output = weights.output;
  }
  return stage;
}

}  // namespace kvserve
