#include "worker/server/proto_convert.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

// Proto counts are uint32; the engine takes int32. Values past INT32_MAX saturate, which keeps
// their meaning ("very many") and lets the engine's range checks report them.
int32_t Saturate(uint32_t value) {
  return static_cast<int32_t>(
      std::min<uint32_t>(value, static_cast<uint32_t>(std::numeric_limits<int32_t>::max())));
}

// The tool-call constraint as the JSON spec ToolCallGrammar reads (parameters parsed here, so that
// a schema that is not JSON is refused naming its function).
absl::StatusOr<std::string> ToolCallSpec(const v1::ToolCallConstraint& tools) {
  using json = nlohmann::ordered_json;
  json functions = json::array();
  for (int i = 0; i < tools.functions_size(); ++i) {
    const v1::ToolFunction& f = tools.functions(i);
    json function = {{"name", f.name()}};
    if (!f.parameters().empty()) {
      json parameters = json::parse(f.parameters(), nullptr, /*allow_exceptions=*/false);
      if (parameters.is_discarded()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tool_calls.functions[", i, "].parameters: not valid JSON"));
      }
      function["parameters"] = std::move(parameters);
    }
    functions.push_back(std::move(function));
  }
  const json spec = {{"format", tools.format()},
                     {"functions", std::move(functions)},
                     {"parallel", tools.parallel()}};
  return spec.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<std::vector<TokenId>> PromptIds(const v1::GenerateRequest& request,
                                               const LoadedModel& model) {
  const bool has_text = !request.prompt().empty();
  const bool has_ids = request.prompt_token_ids_size() > 0;
  if (has_text && has_ids) {
    return absl::InvalidArgumentError(
        "prompt and prompt_token_ids are both set; set exactly one of them");
  }
  if (!has_text && !has_ids) {
    return absl::InvalidArgumentError(
        "prompt is empty: set exactly one of prompt and prompt_token_ids");
  }
  const uint32_t vocab = static_cast<uint32_t>(model.config().vocab_size);
  if (has_ids) {
    std::vector<TokenId> ids;
    ids.reserve(static_cast<size_t>(request.prompt_token_ids_size()));
    for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
      const uint32_t id = request.prompt_token_ids(i);
      if (id >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids[", i, "] = ", id,
                                                       " is outside the vocabulary of ", vocab,
                                                       " tokens"));
      }
      ids.push_back(static_cast<TokenId>(id));
    }
    return ids;
  }
  EncodeOptions options;
  options.add_special_tokens =
      request.has_add_special_tokens() ? request.add_special_tokens() : true;
  absl::StatusOr<std::vector<TokenId>> ids = model.tokenizer->Encode(request.prompt(), options);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
  }
  if (ids->empty()) {
    return absl::InvalidArgumentError("prompt encodes to no tokens");
  }
  return ids;
}

}  // namespace

absl::StatusOr<EngineRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                              const LoadedModel& model) {
  absl::StatusOr<std::vector<TokenId>> ids = PromptIds(request, model);
  if (!ids.ok()) return ids.status();
  EngineRequest out;
  out.request_id = request.request_id();
  out.prompt_ids = std::move(*ids);
  out.n = request.n() == 0 ? 1 : Saturate(request.n());
  out.cache_salt = request.cache_salt();

  SamplingParams& p = out.params;
  const v1::SamplingParams& s = request.sampling();
  if (s.has_temperature()) p.temperature = s.temperature();
  if (s.has_top_p()) p.top_p = s.top_p();
  p.top_k = Saturate(s.top_k());
  p.min_p = s.min_p();
  if (s.has_repetition_penalty()) p.repetition_penalty = s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) p.seed = s.seed();
  p.max_tokens = request.max_tokens() == 0 ? kDefaultMaxTokens : Saturate(request.max_tokens());
  // The protobuf runtime refuses invalid UTF-8 in a string field it parses off the wire; this
  // catches requests built in memory, so a stop string can always be compared with decoded text.
  for (int i = 0; i < request.stop_size(); ++i) {
    const size_t bad = utf8::FindInvalid(request.stop(i));
    if (bad != request.stop(i).size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop[", i, "] is not valid UTF-8 (byte ", bad, ")"));
    }
  }
  p.stop.assign(request.stop().begin(), request.stop().end());
  p.stop_token_ids.reserve(static_cast<size_t>(request.stop_token_ids_size()));
  for (uint32_t id : request.stop_token_ids()) p.stop_token_ids.push_back(Saturate(id));
  p.ignore_eos = request.ignore_eos();
  p.include_stop_str_in_output = request.include_stop_str_in_output();
  p.logprobs = request.has_logprobs() ? Saturate(request.logprobs()) : -1;
  using Kind = constraint::ConstraintSpec::Kind;
  switch (request.constraint_case()) {
    case v1::GenerateRequest::kJsonSchema:
      out.constraint = {Kind::kJsonSchema, request.json_schema()};
      break;
    case v1::GenerateRequest::kJsonObject:
      if (!request.json_object()) {
        return absl::InvalidArgumentError("json_object: must be true when set");
      }
      out.constraint = {Kind::kJsonObject, ""};
      break;
    case v1::GenerateRequest::kRegex:
      out.constraint = {Kind::kRegex, request.regex()};
      break;
    case v1::GenerateRequest::kGrammar:
      out.constraint = {Kind::kGrammar, request.grammar()};
      break;
    case v1::GenerateRequest::kToolCalls: {
      absl::StatusOr<std::string> spec = ToolCallSpec(request.tool_calls());
      if (!spec.ok()) return spec.status();
      out.constraint = {Kind::kToolCalls, *std::move(spec)};
      break;
    }
    case v1::GenerateRequest::CONSTRAINT_NOT_SET:
      break;
  }
  return out;
}

v1::FinishReason ToProtoFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToGenerateResponse(const RequestOutput& output, v1::GenerateResponse* response) {
  response->set_index(static_cast<uint32_t>(output.sample_index));
  for (TokenId id : output.token_ids) response->add_token_ids(static_cast<uint32_t>(id));
  response->set_text(output.text);
  for (size_t i = 0; i < output.logprobs.size(); ++i) {
    const SampleResult& r = output.logprobs[i];
    v1::Logprobs* lp = response->add_logprobs();
    lp->set_token_id(static_cast<uint32_t>(r.token));
    lp->set_logprob(r.logprob.value_or(0.0f));
    for (const TokenLogprob& t : r.top_logprobs) {
      v1::TokenLogprob* top = lp->add_top();
      top->set_token_id(static_cast<uint32_t>(t.id));
      top->set_logprob(t.logprob);
    }
  }
  if (!output.finished) return;
  if (output.status.code() == absl::StatusCode::kCancelled) {
    response->set_finish_reason(v1::FINISH_REASON_ABORT);
  } else {
    response->set_finish_reason(ToProtoFinishReason(output.finish_reason));
  }
  response->set_stop_reason(output.stop_string);
  v1::Usage* usage = response->mutable_usage();
  usage->set_prompt_tokens(static_cast<uint32_t>(output.usage.prompt_tokens));
  usage->set_completion_tokens(static_cast<uint32_t>(output.usage.completion_tokens));
  usage->set_cached_prompt_tokens(static_cast<uint32_t>(output.usage.cached_prompt_tokens));
  usage->set_peak_kv_blocks(static_cast<uint32_t>(output.usage.peak_kv_blocks));
}

void ToLoadReport(const EngineStats& stats, int32_t block_size, bool draining,
                  v1::LoadReport* report) {
  report->set_running_requests(static_cast<uint32_t>(stats.num_running));
  report->set_waiting_requests(static_cast<uint32_t>(stats.num_waiting));
  report->set_total_blocks(static_cast<uint32_t>(stats.total_blocks));
  report->set_used_blocks(static_cast<uint32_t>(stats.used_blocks));
  report->set_cached_free_blocks(static_cast<uint32_t>(stats.cached_free_blocks));
  report->set_free_blocks(static_cast<uint32_t>(stats.free_blocks));
  report->set_block_size(static_cast<uint32_t>(block_size));
  report->set_draining(draining);
}

void ToProtoKvEventBatch(const KvEventBatch& batch, v1::KvEventBatch* proto) {
  proto->set_reset(batch.reset);
  for (const KvEvent& e : batch.events) {
    v1::KvEvent* event = proto->add_events();
    event->set_type(e.type == KvEvent::Type::kStored ? v1::KvEvent::TYPE_STORED
                                                     : v1::KvEvent::TYPE_EVICTED);
    event->mutable_key()->set_hi(e.key.hi);
    event->mutable_key()->set_lo(e.key.lo);
    event->set_tier(static_cast<v1::KvEvent::Tier>(e.tier));
  }
}

}  // namespace kvserve
