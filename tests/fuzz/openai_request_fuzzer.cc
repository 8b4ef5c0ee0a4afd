// The HTTP front's request parser (OpenAI JSON -> kvserve.v1.GenerateRequest) over arbitrary
// bytes, for both endpoints: it must answer OK or INVALID_ARGUMENT and never throw (nlohmann
// throws on type mismatches) or crash.

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
  }
  return 0;
}
