#include "worker/pp/step_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvserve {

static_assert(std::endian::native == std::endian::little,
              "hand-overs travel as the host's f32 bytes: little-endian hosts only");

void EncodeStep(const ForwardBatch& b, std::span<const BlockCopy> copies, v1::PipelineStep* msg) {
  msg->mutable_tokens()->Assign(b.tokens.begin(), b.tokens.end());
  msg->mutable_positions()->Assign(b.positions.begin(), b.positions.end());
  msg->mutable_slot_mapping()->Assign(b.slot_mapping.begin(), b.slot_mapping.end());
  msg->mutable_q_start()->Assign(b.q_start.begin(), b.q_start.end());
  msg->mutable_q_len()->Assign(b.q_len.begin(), b.q_len.end());
  msg->mutable_context_len()->Assign(b.context_len.begin(), b.context_len.end());
  const int64_t table = static_cast<int64_t>(b.q_start.size()) * b.block_table_stride;
  msg->mutable_block_tables()->Assign(b.block_tables, b.block_tables + table);
  msg->set_block_table_stride(b.block_table_stride);
  msg->mutable_logits_rows()->Assign(b.logits_rows.begin(), b.logits_rows.end());
  msg->clear_copies();
  for (const BlockCopy& c : copies) {
    v1::StageBlockCopy* out = msg->add_copies();
    out->set_src(c.src);
    out->set_dst(c.dst);
  }
}

absl::StatusOr<ForwardBatch> DecodeStep(const v1::PipelineStep& msg) {
  const int tokens = msg.tokens_size();
  const int seqs = msg.q_start_size();
  if (msg.positions_size() != tokens || msg.slot_mapping_size() != tokens) {
    return absl::InvalidArgumentError("pipeline step: positions/slot_mapping differ from tokens");
  }
  if (msg.q_len_size() != seqs || msg.context_len_size() != seqs) {
    return absl::InvalidArgumentError("pipeline step: per-sequence arrays differ in size");
  }
  if (msg.block_table_stride() < 0 ||
      msg.block_tables_size() != int64_t{seqs} * msg.block_table_stride()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline step: ", msg.block_tables_size(), " block-table entries for ", seqs,
                     " sequences of stride ", msg.block_table_stride()));
  }
  ForwardBatch b;
  b.tokens = std::span<const TokenId>(msg.tokens().data(), tokens);
  b.positions = std::span<const int32_t>(msg.positions().data(), tokens);
  b.slot_mapping = std::span<const int64_t>(msg.slot_mapping().data(), tokens);
  b.q_start = std::span<const int32_t>(msg.q_start().data(), seqs);
  b.q_len = std::span<const int32_t>(msg.q_len().data(), seqs);
  b.context_len = std::span<const int32_t>(msg.context_len().data(), seqs);
  b.block_tables = msg.block_tables().data();
  b.block_table_stride = msg.block_table_stride();
  b.logits_rows = std::span<const int32_t>(msg.logits_rows().data(), msg.logits_rows_size());
  return b;
}

void FloatsToBytes(std::span<const float> floats, std::string* bytes) {
  bytes->resize(floats.size_bytes());
  if (!floats.empty()) std::memcpy(bytes->data(), floats.data(), floats.size_bytes());
}

absl::Status BytesToFloats(const std::string& bytes, int64_t count, const char* what,
                           float* floats) {
  if (static_cast<int64_t>(bytes.size()) != count * int64_t{sizeof(float)}) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", bytes.size(), " bytes, expected ", count, " floats"));
  }
  if (count > 0) std::memcpy(floats, bytes.data(), bytes.size());
  return absl::OkStatus();
}

}  // namespace kvserve
