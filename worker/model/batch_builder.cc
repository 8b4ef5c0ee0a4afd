#include "worker/model/batch_builder.h"

#include <algorithm>

namespace kvserve {

void BatchBuilder::Clear() {
  tokens_.clear();
  positions_.clear();
  slots_.clear();
  q_start_.clear();
  q_len_.clear();
  context_len_.clear();
  logits_rows_.clear();
  tables_.clear();
}

void BatchBuilder::AddSequence(std::span<const TokenId> tokens, int32_t start,
                               std::span<const int32_t> block_table, int64_t block_size,
                               bool want_logits) {
  q_start_.push_back(static_cast<int32_t>(tokens_.size()));
  q_len_.push_back(static_cast<int32_t>(tokens.size()));
  context_len_.push_back(start + static_cast<int32_t>(tokens.size()));
  for (size_t j = 0; j < tokens.size(); ++j) {
    const int64_t pos = start + static_cast<int64_t>(j);
    tokens_.push_back(tokens[j]);
    positions_.push_back(static_cast<int32_t>(pos));
    const int64_t index = pos / block_size;
    // A table too short for the position maps to slot -1, which the model rejects.
    slots_.push_back(index < static_cast<int64_t>(block_table.size())
                         ? int64_t{block_table[index]} * block_size + pos % block_size
                         : -1);
  }
  if (want_logits) logits_rows_.push_back(static_cast<int32_t>(tokens_.size()) - 1);
  tables_.emplace_back(block_table.begin(), block_table.end());
}

ForwardBatch BatchBuilder::Build() {
  size_t stride = 1;
  for (const auto& t : tables_) stride = std::max(stride, t.size());
  table_matrix_.assign(stride * tables_.size(), 0);
  for (size_t s = 0; s < tables_.size(); ++s) {
    std::copy(tables_[s].begin(), tables_[s].end(), table_matrix_.begin() + s * stride);
  }
  ForwardBatch b;
  b.tokens = tokens_;
  b.positions = positions_;
  b.slot_mapping = slots_;
  b.q_start = q_start_;
  b.q_len = q_len_;
  b.context_len = context_len_;
  b.block_tables = table_matrix_.data();
  b.block_table_stride = static_cast<int64_t>(stride);
  b.logits_rows = logits_rows_;
  return b;
}

}  // namespace kvserve
