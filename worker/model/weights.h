#ifndef KVSERVE_WORKER_MODEL_WEIGHTS_H_
#define KVSERVE_WORKER_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/io/anonymous_memory.h"
#include "common/io/mapped_file.h"
#include "kernels/dtype.h"
#include "worker/model/model_config.h"

namespace kvserve {

/// A read-only view of one weight tensor. `shape` is outermost first, PyTorch style: a linear
/// layer's weight is [out_features, in_features], row-major, rows contiguous (GGUF lists dims
/// innermost first; loaders reverse them). `data` points into a MappedFile or an owned buffer held
/// by the ModelWeights that owns this view. A default-constructed view (data == nullptr) means
/// "absent" (e.g. no bias).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  bool present() const { return data != nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  /// Bytes of the innermost row.
  int64_t row_bytes() const { return shape.empty() ? 0 : DTypeRowBytes(dtype, shape.back()); }
  int64_t nbytes() const { return shape.empty() ? 0 : row_bytes() * (numel() / shape.back()); }
};

/// One expert of a mixture-of-experts MLP: a SwiGLU MLP of width config.moe_intermediate_size.
struct ExpertWeights {
  TensorView w_gate;  // [moe_intermediate, hidden] (Mixtral w1)
  TensorView w_up;    // [moe_intermediate, hidden] (Mixtral w3)
  TensorView w_down;  // [hidden, moe_intermediate] (Mixtral w2)
};

/// One decoder layer. Norm weights and biases are always F32 (loaders convert them).
struct LayerWeights {
  TensorView attn_norm;  // [hidden]
  TensorView wq;         // [heads * head_dim, hidden] (MLA with q_lora_rank 0: q_proj)
  TensorView wk;         // [kv_heads * head_dim, hidden]
  TensorView wv;         // [kv_heads * head_dim, hidden]
  TensorView bq, bk, bv; // [out] when config.qkv_bias, else absent
  TensorView wo;         // [hidden, heads * head_dim] (MLA: [hidden, heads * v_head_dim])
  TensorView bo;         // [hidden] when config.o_bias, else absent
  TensorView q_norm;     // [head_dim] when config.qk_norm, else absent
  TensorView k_norm;     // [head_dim] when config.qk_norm, else absent
  TensorView ffn_norm;   // [hidden]
  // Dense MLP; absent in a mixture-of-experts layer.
  TensorView w_gate;     // [intermediate, hidden]
  TensorView w_up;       // [intermediate, hidden]
  TensorView w_down;     // [hidden, intermediate]
  // Mixture of experts (config.is_moe_layer); absent / empty in a dense layer.
  TensorView router;                   // [num_experts, hidden]
  std::vector<ExpertWeights> experts;  // num_experts of them
  TensorView router_bias;  // [num_experts] f32, DeepSeek-V3 e_score_correction_bias, or absent
  ExpertWeights shared;    // DeepSeek shared experts, [n_shared * moe_intermediate] wide, or absent
  // Multi-head latent attention (config.is_mla()); wk, wv absent. With heads = num_heads,
  // qk = qk_nope_head_dim + qk_rope_head_dim, r = kv_lora_rank:
  TensorView wq_a;       // [q_lora_rank, hidden] (q_lora_rank > 0; else wq is [heads * qk, hidden])
  TensorView q_a_norm;   // [q_lora_rank]
  TensorView wq_b;       // [heads * qk, q_lora_rank]
  TensorView wkv_a;      // [r + qk_rope_head_dim, hidden] (kv_a_proj_with_mqa)
  TensorView kv_a_norm;  // [r]
  TensorView wkv_b;      // [heads * (qk_nope_head_dim + v_head_dim), r]: per head W_UK then W_UV
};

/// A loaded model: its config, views of every weight, and the storage those views point into.
struct ModelWeights {
  ModelConfig config;
  /// Where the weights came from ("gguf" or "safetensors") and the path given to the loader.
  std::string format;
  std::string source_path;
  TensorView token_embedding;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // [hidden], F32
  /// [vocab, hidden]; the same view as token_embedding when the embedding is tied.
  TensorView output;
  /// Optional F32 [head_dim / 2] per-frequency divisors (GGUF `rope_freqs.weight`, written by
  /// converters that bake llama3 rope scaling into the file); absent otherwise.
  TensorView rope_freqs;

  /// Storage the views point into; never resized after the views are made.
  std::vector<MappedFile> files;
  std::vector<AnonymousMemory> owned_buffers;

  /// `bytes` zero bytes owned by owned_buffers (on huge pages where the kernel offers them, as
  /// decode streams weights best from), or nullptr when the memory is not there.
  uint8_t* Allocate(int64_t bytes);

  /// Total bytes of all weight tensors (tied output counted once).
  int64_t TotalBytes() const;
  /// Calls fn(tensor) for every present tensor of the decoder layers (norms, attention, MLP,
  /// router, shared and routed experts), layer by layer, in a fixed order.
  void ForEachLayerTensor(const std::function<void(const TensorView&)>& fn) const;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_WEIGHTS_H_
