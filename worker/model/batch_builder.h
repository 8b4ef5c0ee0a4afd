#ifndef KVSERVE_WORKER_MODEL_BATCH_BUILDER_H_
#define KVSERVE_WORKER_MODEL_BATCH_BUILDER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/token.h"
#include "worker/model/llama_model.h"

namespace kvserve {

/// Owns the arrays behind a ForwardBatch. Add the new tokens of each sequence, then call
/// Build(); the returned view stays valid until the next Clear() or AddSequence().
class BatchBuilder {
 public:
  void Clear();

  /// Adds `tokens` of one sequence at positions [start, start + tokens.size()); `block_table`
  /// lists the sequence's physical blocks and must cover every position up to the last new one.
  /// When `want_logits`, the last new token's logits are requested.
  void AddSequence(std::span<const TokenId> tokens, int32_t start,
                   std::span<const int32_t> block_table, int64_t block_size, bool want_logits);

  /// Lays the block tables out as one padded matrix and returns the batch.
  ForwardBatch Build();

  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_logits_rows() const { return static_cast<int64_t>(logits_rows_.size()); }

 private:
  std::vector<TokenId> tokens_;
  std::vector<int32_t> positions_;
  std::vector<int64_t> slots_;
  std::vector<int32_t> q_start_, q_len_, context_len_, logits_rows_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> table_matrix_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_MODEL_BATCH_BUILDER_H_
