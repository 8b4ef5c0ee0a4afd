#include "worker/model/weights.h"

#include <utility>

namespace kvserve {

uint8_t* ModelWeights::Allocate(int64_t bytes) {
  AnonymousMemory m;
  if (bytes < 0 || !m.Map(static_cast<size_t>(bytes))) return nullptr;
  uint8_t* p = m.data();
  owned_buffers.push_back(std::move(m));
  return p;
}

int64_t ModelWeights::TotalBytes() const {
  int64_t total = token_embedding.nbytes() + final_norm.nbytes();
  if (output.data != token_embedding.data) total += output.nbytes();
  ForEachLayerTensor([&](const TensorView& t) { total += t.nbytes(); });
  return total;
}

void ModelWeights::ForEachLayerTensor(const std::function<void(const TensorView&)>& fn) const {
  for (const LayerWeights& l : layers) {
    for (const TensorView* t :
         {&l.attn_norm,   &l.wq,           &l.wk,     &l.wv,     &l.bq,          &l.bk,
          &l.bv,          &l.wo,           &l.bo,     &l.q_norm, &l.k_norm,      &l.ffn_norm,
          &l.w_gate,      &l.w_up,         &l.w_down, &l.wq_a,   &l.q_a_norm,    &l.wq_b,
          &l.wkv_a,       &l.kv_a_norm,    &l.wkv_b,  &l.router, &l.router_bias, &l.shared.w_gate,
          &l.shared.w_up, &l.shared.w_down}) {
      if (t->present()) fn(*t);
    }
    for (const ExpertWeights& e : l.experts) {
      for (const TensorView* t : {&e.w_gate, &e.w_up, &e.w_down}) {
        if (t->present()) fn(*t);
      }
    }
  }
}

}  // namespace kvserve
