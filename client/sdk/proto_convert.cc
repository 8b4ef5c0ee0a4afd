#include "client/sdk/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvserve::sdk_internal {
namespace {

// Copies token ids into a repeated uint32 field; a negative id is an error naming `field`.
absl::Status CopyTokenIds(const std::vector<TokenId>& ids, const char* field,
                          google::protobuf::RepeatedField<uint32_t>* out) {
  out->Reserve(static_cast<int>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: token id ", ids[i], " is negative"));
    }
    out->Add(static_cast<uint32_t>(ids[i]));
  }
  return absl::OkStatus();
}

CompletionFinishReason FromProto(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return CompletionFinishReason::kStop;
    case v1::FINISH_REASON_LENGTH:
      return CompletionFinishReason::kLength;
    case v1::FINISH_REASON_ABORT:
      return CompletionFinishReason::kAbort;
    default:
      return CompletionFinishReason::kUnspecified;
  }
}

CompletionLogprobs FromProto(const v1::Logprobs& lp) {
  CompletionLogprobs out;
  out.token_id = static_cast<TokenId>(lp.token_id());
  out.logprob = lp.logprob();
  out.top.reserve(lp.top_size());
  for (const v1::TokenLogprob& t : lp.top()) {
    out.top.push_back({static_cast<TokenId>(t.token_id()), t.logprob()});
  }
  return out;
}

}  // namespace

absl::Status ToProto(const GenerateParams& params, v1::GenerateRequest* out) {
  const bool has_text = !params.prompt.empty();
  const bool has_ids = !params.prompt_token_ids.empty();
  if (has_text == has_ids) {
    return absl::InvalidArgumentError("prompt, prompt_token_ids: exactly one of them must be set");
  }
  out->set_model(params.model);
  out->set_prompt(params.prompt);
  if (absl::Status s = CopyTokenIds(params.prompt_token_ids, "prompt_token_ids",
                                    out->mutable_prompt_token_ids());
      !s.ok()) {
    return s;
  }
  out->set_max_tokens(params.max_tokens);
  const GenerateSampling& in = params.sampling;
  v1::SamplingParams* sampling = out->mutable_sampling();
  if (in.temperature) sampling->set_temperature(*in.temperature);
  if (in.top_p) sampling->set_top_p(*in.top_p);
  sampling->set_top_k(in.top_k);
  sampling->set_min_p(in.min_p);
  if (in.repetition_penalty) sampling->set_repetition_penalty(*in.repetition_penalty);
  sampling->set_presence_penalty(in.presence_penalty);
  sampling->set_frequency_penalty(in.frequency_penalty);
  if (in.seed) sampling->set_seed(*in.seed);
  for (const std::string& s : params.stop) out->add_stop(s);
  if (absl::Status s =
          CopyTokenIds(params.stop_token_ids, "stop_token_ids", out->mutable_stop_token_ids());
      !s.ok()) {
    return s;
  }
  out->set_ignore_eos(params.ignore_eos);
  out->set_n(params.n);
  if (params.logprobs) out->set_logprobs(*params.logprobs);
  out->set_cache_salt(params.cache_salt);
  out->set_request_id(params.request_id);
  if (params.add_special_tokens) out->set_add_special_tokens(*params.add_special_tokens);
  out->set_include_stop_str_in_output(params.include_stop_str_in_output);
  switch (params.constraint.kind) {
    case OutputConstraint::Kind::kJsonSchema:
      out->set_json_schema(params.constraint.text);
      break;
    case OutputConstraint::Kind::kJsonObject:
      out->set_json_object(true);
      break;
    case OutputConstraint::Kind::kRegex:
      out->set_regex(params.constraint.text);
      break;
    case OutputConstraint::Kind::kGrammar:
      out->set_grammar(params.constraint.text);
      break;
    case OutputConstraint::Kind::kNone:
      break;
  }
  return absl::OkStatus();
}

GenerateChunk FromProto(const v1::GenerateResponse& response) {
  GenerateChunk chunk;
  chunk.request_id = response.request_id();
  chunk.index = response.index();
  chunk.token_ids.assign(response.token_ids().begin(), response.token_ids().end());
  chunk.text = response.text();
  chunk.logprobs.reserve(response.logprobs_size());
  for (const v1::Logprobs& lp : response.logprobs()) chunk.logprobs.push_back(FromProto(lp));
  chunk.finish_reason = FromProto(response.finish_reason());
  chunk.stop_reason = response.stop_reason();
  if (response.has_usage()) {
    const v1::Usage& u = response.usage();
    chunk.usage = CompletionUsage{.prompt_tokens = u.prompt_tokens(),
                                  .completion_tokens = u.completion_tokens(),
                                  .cached_prompt_tokens = u.cached_prompt_tokens(),
                                  .peak_kv_blocks = u.peak_kv_blocks()};
  }
  chunk.worker = response.worker();
  return chunk;
}

void AppendChunk(const GenerateChunk& chunk, Completion* completion) {
  if (completion->request_id.empty()) completion->request_id = chunk.request_id;
  if (completion->worker.empty()) completion->worker = chunk.worker;
  if (chunk.index >= completion->samples.size()) {
    const size_t old_size = completion->samples.size();
    completion->samples.resize(chunk.index + 1);
    for (size_t i = old_size; i < completion->samples.size(); ++i) {
      completion->samples[i].index = static_cast<uint32_t>(i);
    }
  }
  CompletionSample& s = completion->samples[chunk.index];
  s.token_ids.insert(s.token_ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  s.text += chunk.text;
  s.logprobs.insert(s.logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
  if (chunk.finish_reason != CompletionFinishReason::kUnspecified) {
    s.finish_reason = chunk.finish_reason;
  }
  if (!chunk.stop_reason.empty()) s.stop_reason = chunk.stop_reason;
  if (chunk.usage) s.usage = *chunk.usage;
}

void ToProto(const TokenizeParams& params, v1::TokenizeRequest* out) {
  out->set_model(params.model);
  out->set_text(params.text);
  if (params.add_special_tokens) out->set_add_special_tokens(*params.add_special_tokens);
}

absl::Status ToProto(const DetokenizeParams& params, v1::DetokenizeRequest* out) {
  out->set_model(params.model);
  out->set_skip_special_tokens(params.skip_special_tokens);
  return CopyTokenIds(params.token_ids, "token_ids", out->mutable_token_ids());
}

}  // namespace kvserve::sdk_internal
