// The HTTP front's request parser (OpenAI JSON -> kvserve.v1.GenerateRequest) over arbitrary
// bytes, for both endpoints: it must answer OK or INVALID_ARGUMENT and never throw (nlohmann
// throws on type mismatches) or crash; a parsed chat request's tools then become the tool-call
// constraint without throwing either.

#include <cstdint>
#include <string>

#include "router/http/openai_request.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvserve::http::Endpoint;
  const std::string body(reinterpret_cast<const char*>(data), size);
  const kvserve::http::RequestLimits limits;
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    absl::StatusOr<kvserve::http::OpenAiRequest> parsed =
        kvserve::http::ParseOpenAiRequest(endpoint, body, limits);
    if (!parsed.ok() && parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      kvserve::fuzz::Fail("parse failed with " + parsed.status().ToString());
    }
    if (!parsed.ok()) continue;
    // What the front does next with a chat request's tools: the constraint for every format.
    for (kvserve::ToolCallFormat model : {kvserve::ToolCallFormat::kNone,
                                          kvserve::ToolCallFormat::kHermes,
                                          kvserve::ToolCallFormat::kDeepSeek}) {
      kvserve::http::OpenAiRequest request = *parsed;
      kvserve::http::SetToolCallConstraint(kvserve::http::ToolCallFormatFor(request, model),
                                           &request);
    }
  }
  return 0;
}
