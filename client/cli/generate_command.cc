// `kvserve generate`: run a model on one or more prompts on this machine through the engine
// (continuous batching over the paged KV pool) and stream the text.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/engine_flags.h"
#include "client/sdk/client.h"
#include "common/auth/tls_credentials.h"
#include "nlohmann/json.hpp"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"

namespace kvserve::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string endpoint;
  std::vector<std::string> prompts;
  std::string prompts_file;
  int32_t n = 1;
  std::string cache_salt;
  EngineOptions engine;
  int32_t max_tokens = 256;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = -1;
  bool no_special = false;
  bool json = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string api_key;
  // Constrained decoding: at most one of these (text, or @PATH to read it from a file).
  std::string json_schema;
  bool json_object = false;
  std::string regex;
  std::string grammar;
};

// "@PATH" reads the file; anything else is the value itself.
absl::StatusOr<std::string> TextOrFile(const std::string& value, const char* flag) {
  if (value.empty() || value[0] != '@') return value;
  std::ifstream in(value.substr(1), std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot open ", value.substr(1)));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The constraint flags as a spec (kind kNone when none is given).
absl::StatusOr<constraint::ConstraintSpec> ConstraintFlags(const GenerateOptions& o) {
  using Kind = constraint::ConstraintSpec::Kind;
  const int given = !o.json_schema.empty() + o.json_object + !o.regex.empty() + !o.grammar.empty();
  if (given > 1) {
    return absl::InvalidArgumentError(
        "--json-schema, --json-object, --regex and --grammar: give at most one");
  }
  constraint::ConstraintSpec spec;
  if (o.json_object) spec.kind = Kind::kJsonObject;
  const std::pair<const std::string*, std::pair<Kind, const char*>> texts[] = {
      {&o.json_schema, {Kind::kJsonSchema, "--json-schema"}},
      {&o.regex, {Kind::kRegex, "--regex"}},
      {&o.grammar, {Kind::kGrammar, "--grammar"}}};
  for (const auto& [value, kind_flag] : texts) {
    if (value->empty()) continue;
    absl::StatusOr<std::string> text = TextOrFile(*value, kind_flag.second);
    if (!text.ok()) return text.status();
    spec = {kind_flag.first, *std::move(text)};
  }
  return spec;
}

SamplingParams ToSamplingParams(const GenerateOptions& o) {
  SamplingParams p;
  p.max_tokens = o.max_tokens;
  p.temperature = o.temperature;
  p.top_p = o.top_p;
  p.top_k = o.top_k;
  p.min_p = o.min_p;
  p.repetition_penalty = o.repetition_penalty;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.seed = o.seed;
  p.stop = o.stop;
  p.stop_token_ids = o.stop_token_ids;
  p.ignore_eos = o.ignore_eos;
  p.logprobs = o.logprobs;
  return p;
}

nlohmann::json LogprobsJson(const std::vector<TokenId>& ids, const std::vector<SampleResult>& lp) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < lp.size() && i < ids.size(); ++i) {
    nlohmann::json top = nlohmann::json::array();
    for (const TokenLogprob& t : lp[i].top_logprobs) {
      top.push_back({{"token_id", t.id}, {"logprob", t.logprob}});
    }
    out.push_back({{"token_id", ids[i]},
                   {"logprob", lp[i].logprob.value_or(0.0f)},
                   {"top_logprobs", std::move(top)}});
  }
  return out;
}

// One sample's output, gathered from the stream.
struct SampleOutput {
  std::vector<TokenId> token_ids;
  std::string text;
  std::vector<SampleResult> logprobs;
  RequestOutput final_output;
};

nlohmann::json SampleJson(const std::vector<TokenId>& prompt_ids, const SampleOutput& s) {
  const RequestOutput& f = s.final_output;
  nlohmann::json j = {{"prompt_token_ids", prompt_ids},
                      {"token_ids", s.token_ids},
                      {"text", s.text},
                      {"finish_reason", std::string(FinishReasonName(f.finish_reason))},
                      {"usage",
                       {{"prompt_tokens", f.usage.prompt_tokens},
                        {"completion_tokens", f.usage.completion_tokens},
                        {"cached_prompt_tokens", f.usage.cached_prompt_tokens},
                        {"peak_kv_blocks", f.usage.peak_kv_blocks}}}};
  if (!f.stop_string.empty()) j["stop_reason"] = f.stop_string;
  if (!s.logprobs.empty()) j["logprobs"] = LogprobsJson(s.token_ids, s.logprobs);
  return j;
}

nlohmann::json PoolJson(const EngineStats& st) {
  return {{"pool",
           {{"total_blocks", st.total_blocks},
            {"used_blocks", st.used_blocks},
            {"cached_free_blocks", st.cached_free_blocks},
            {"free_blocks", st.free_blocks},
            {"prefix_query_tokens", st.prefix_query_tokens},
            {"prefix_hit_tokens", st.prefix_hit_tokens},
            {"preemptions", st.num_preemptions},
            {"engine_steps", st.num_steps}}}};
}

void PrintJson(const nlohmann::json& j) {
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::printf("%s\n", line.c_str());
}

absl::Status ReadPromptsFile(const std::string& path, std::vector<std::string>& prompts) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(path + ": cannot open prompts file");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) prompts.push_back(line);
  }
  return absl::OkStatus();
}

// --endpoint: the same request sent to a router or worker over gRPC with the SDK. The server
// owns the engine, so the engine flags do not apply and no pool statistics are printed.
absl::Status WithEndpoint(const std::string& endpoint, const absl::Status& s) {
  return absl::Status(s.code(), endpoint + ": " + std::string(s.message()));
}

absl::StatusOr<GenerateParams> ToRemoteParams(const GenerateOptions& o) {
  if (o.max_tokens < 0) return absl::InvalidArgumentError("--max-tokens: must be >= 0");
  if (o.top_k < 0) return absl::InvalidArgumentError("--top-k: must be >= 0");
  if (o.n < 1) return absl::InvalidArgumentError("--n: must be >= 1");
  GenerateParams p;
  p.model = o.model;
  p.max_tokens = static_cast<uint32_t>(o.max_tokens);
  p.sampling.temperature = o.temperature;
  p.sampling.top_p = o.top_p;
  p.sampling.top_k = static_cast<uint32_t>(o.top_k);
  p.sampling.min_p = o.min_p;
  p.sampling.repetition_penalty = o.repetition_penalty;
  p.sampling.presence_penalty = o.presence_penalty;
  p.sampling.frequency_penalty = o.frequency_penalty;
  p.sampling.seed = o.seed;
  p.stop = o.stop;
  p.stop_token_ids = o.stop_token_ids;
  p.ignore_eos = o.ignore_eos;
  p.n = static_cast<uint32_t>(o.n);
  if (o.logprobs >= 0) p.logprobs = static_cast<uint32_t>(o.logprobs);
  p.cache_salt = o.cache_salt;
  p.add_special_tokens = !o.no_special;
  absl::StatusOr<constraint::ConstraintSpec> spec = ConstraintFlags(o);
  if (!spec.ok()) return spec.status();
  using Kind = constraint::ConstraintSpec::Kind;
  switch (spec->kind) {
    case Kind::kJsonSchema:
      p.constraint = {OutputConstraint::Kind::kJsonSchema, spec->text};
      break;
    case Kind::kJsonObject:
      p.constraint = {OutputConstraint::Kind::kJsonObject, ""};
      break;
    case Kind::kRegex:
      p.constraint = {OutputConstraint::Kind::kRegex, spec->text};
      break;
    case Kind::kGrammar:
      p.constraint = {OutputConstraint::Kind::kGrammar, spec->text};
      break;
    case Kind::kToolCalls:  // no flag makes one: tool calls come from the chat endpoint
    case Kind::kNone:
      break;
  }
  return p;
}

// The same JSON object as SampleJson, from a remote sample.
nlohmann::json RemoteSampleJson(const std::vector<TokenId>& prompt_ids, const CompletionSample& s) {
  nlohmann::json j = {{"prompt_token_ids", prompt_ids},
                      {"token_ids", s.token_ids},
                      {"text", s.text},
                      {"finish_reason", std::string(CompletionFinishReasonName(s.finish_reason))},
                      {"usage",
                       {{"prompt_tokens", s.usage.prompt_tokens},
                        {"completion_tokens", s.usage.completion_tokens},
                        {"cached_prompt_tokens", s.usage.cached_prompt_tokens},
                        {"peak_kv_blocks", s.usage.peak_kv_blocks}}}};
  if (!s.stop_reason.empty()) j["stop_reason"] = s.stop_reason;
  if (!s.logprobs.empty()) {
    nlohmann::json lps = nlohmann::json::array();
    for (const CompletionLogprobs& lp : s.logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const CompletionTokenLogprob& t : lp.top) {
        top.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}});
      }
      lps.push_back(
          {{"token_id", lp.token_id}, {"logprob", lp.logprob}, {"top_logprobs", std::move(top)}});
    }
    j["logprobs"] = std::move(lps);
  }
  return j;
}

// One prompt's remote result: its token ids (JSON mode only) and the gathered completion.
struct RemoteResult {
  std::vector<TokenId> prompt_ids;
  absl::StatusOr<Completion> completion;
};

// In JSON mode the prompt is tokenized by the endpoint first, so that prompt_token_ids can be
// printed and exactly those ids are generated from.
RemoteResult GenerateOneRemote(Client& client, GenerateParams params, const std::string& prompt,
                               bool json) {
  RemoteResult r;
  if (json) {
    absl::StatusOr<std::vector<TokenId>> ids = client.Tokenize(
        {.model = params.model, .text = prompt, .add_special_tokens = params.add_special_tokens});
    if (!ids.ok()) {
      r.completion = ids.status();
      return r;
    }
    r.prompt_ids = std::move(*ids);
    params.prompt_token_ids = r.prompt_ids;
  } else {
    params.prompt = prompt;
  }
  r.completion = client.GenerateSync(params);
  return r;
}

// TLS files and the API key (flag, else $KVSERVE_API_KEY) for the endpoint.
absl::StatusOr<ClientOptions> ToClientOptions(const GenerateOptions& o) {
  ClientOptions options;
  const bool tls = !o.tls_ca.empty() || !o.tls_cert.empty() || !o.tls_key.empty();
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert/--tls-key: give both or neither");
  }
  options.use_tls = tls;
  if (!o.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = auth::ReadPemFile(o.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.tls_root_certs = *std::move(ca);
  }
  if (!o.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = auth::ReadPemFile(o.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = auth::ReadPemFile(o.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    options.tls_client_cert = *std::move(cert);
    options.tls_client_key = *std::move(key);
  }
  options.tls_server_name = o.tls_server_name;
  options.api_key = o.api_key;
  if (options.api_key.empty()) {
    if (const char* env = std::getenv("KVSERVE_API_KEY")) options.api_key = env;
  }
  return options;
}

int RunRemoteGenerate(const GenerateOptions& opts) {
  absl::StatusOr<GenerateParams> params = ToRemoteParams(opts);
  if (!params.ok()) return ReportError("generate", params.status());
  absl::StatusOr<ClientOptions> client_options = ToClientOptions(opts);
  if (!client_options.ok()) return ReportError("generate", client_options.status());
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(opts.endpoint, *std::move(client_options));
  if (!client.ok()) return ReportError("generate", WithEndpoint(opts.endpoint, client.status()));
  if (!opts.json && opts.prompts.size() == 1 && opts.n == 1) {
    // Stream the text as it arrives.
    GenerateParams p = *params;
    p.prompt = opts.prompts[0];
    absl::Status s = (*client)->Generate(p, [](const GenerateChunk& chunk) {
      std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    if (!s.ok()) return ReportError("generate", WithEndpoint(opts.endpoint, s));
    return 0;
  }
  // Several prompts run concurrently (a few calls at a time) and print in order.
  constexpr size_t kMaxConcurrentCalls = 8;
  std::vector<RemoteResult> results(opts.prompts.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min(kMaxConcurrentCalls, opts.prompts.size()); ++t) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < opts.prompts.size(); i = next++) {
        results[i] = GenerateOneRemote(**client, *params, opts.prompts[i], opts.json);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].completion.ok()) {
      return ReportError("generate", WithEndpoint(opts.endpoint, results[i].completion.status()));
    }
    for (const CompletionSample& s : results[i].completion->samples) {
      if (opts.json) {
        PrintJson(RemoteSampleJson(results[i].prompt_ids, s));
      } else {
        std::printf("%s%s\n", opts.prompts[i].c_str(), s.text.c_str());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

int RunGenerate(GenerateOptions opts) {
  if (!opts.prompts_file.empty()) {
    if (absl::Status s = ReadPromptsFile(opts.prompts_file, opts.prompts); !s.ok()) {
      return ReportError("generate", s);
    }
  }
  if (opts.prompts.empty()) {
    return ReportError("generate", absl::InvalidArgumentError("no prompt: use --prompt or --prompts-file"));
  }
  if (!opts.endpoint.empty()) return RunRemoteGenerate(opts);
  if (opts.model.empty()) {
    return ReportError("generate",
                       absl::InvalidArgumentError("--model is required without --endpoint"));
  }
  absl::StatusOr<constraint::ConstraintSpec> constraint_spec = ConstraintFlags(opts);
  if (!constraint_spec.ok()) return ReportError("generate", constraint_spec.status());
  absl::StatusOr<LoadedModel> model = LoadModel(opts.model);
  if (!model.ok()) return ReportError("generate", model.status());
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&*model, opts.engine);
  if (!engine.ok()) return ReportError("generate", engine.status());

  // Submit everything first so the prompts run concurrently, then read the streams in order.
  std::vector<std::vector<TokenId>> prompt_ids;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < opts.prompts.size(); ++i) {
    absl::StatusOr<std::vector<TokenId>> ids =
        model->tokenizer->Encode(opts.prompts[i], {.add_special_tokens = !opts.no_special});
    if (!ids.ok()) return ReportError("generate", ids.status());
    EngineRequest request;
    request.request_id = std::to_string(i);
    request.prompt_ids = *ids;
    request.params = ToSamplingParams(opts);
    request.n = opts.n;
    request.cache_salt = opts.cache_salt;
    request.constraint = *constraint_spec;
    absl::StatusOr<std::shared_ptr<RequestStream>> stream = (*engine)->Submit(std::move(request));
    if (!stream.ok()) return ReportError("generate", stream.status());
    prompt_ids.push_back(std::move(*ids));
    streams.push_back(std::move(*stream));
  }
  // Plain output streams the first prompt's text as it is generated, and prints the others
  // (and further samples) whole, one after another, as they finish.
  const bool stream_text = !opts.json && opts.prompts.size() == 1 && opts.n == 1;
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<SampleOutput> samples(opts.n);
    RequestOutput msg;
    while (streams[i]->Next(&msg)) {
      SampleOutput& s = samples[msg.sample_index];
      s.token_ids.insert(s.token_ids.end(), msg.token_ids.begin(), msg.token_ids.end());
      s.logprobs.insert(s.logprobs.end(), msg.logprobs.begin(), msg.logprobs.end());
      s.text += msg.text;
      if (stream_text && !msg.text.empty()) {
        std::fwrite(msg.text.data(), 1, msg.text.size(), stdout);
        std::fflush(stdout);
      }
      if (msg.finished) {
        if (!msg.status.ok()) return ReportError("generate", msg.status);
        s.final_output = std::move(msg);
      }
    }
    for (const SampleOutput& s : samples) {
      if (opts.json) {
        PrintJson(SampleJson(prompt_ids[i], s));
      } else if (stream_text) {
        std::printf("\n");
      } else {
        std::printf("%s%s\n", opts.prompts[i].c_str(), s.text.c_str());
      }
    }
    std::fflush(stdout);
  }
  if (opts.json && (opts.prompts.size() > 1 || opts.n > 1)) PrintJson(PoolJson((*engine)->stats()));
  return 0;
}

}  // namespace

Command AddGenerateCommand(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand(
      "generate",
      "Generate text from prompts with a local model (or on a router/worker with --endpoint), "
      "streaming it to stdout.");
  sub->add_option("--model", o->model,
                  "GGUF file or Hugging Face model directory; with --endpoint, a served model's "
                  "name (default: the endpoint's only model)");
  sub->add_option("--endpoint", o->endpoint,
                  "HOST:PORT of a kvserve router or worker: generate there over gRPC instead of "
                  "loading the model here (the engine flags then do not apply)");
  sub->add_option("--prompt", o->prompts, "Prompt text; repeat for several prompts");
  sub->add_option("--max-tokens", o->max_tokens, "Most tokens to generate per prompt")
      ->capture_default_str();
  sub->add_option("--temperature", o->temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str();
  sub->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  sub->add_option("--top-k", o->top_k, "Keep the k most likely tokens; 0 disables")
      ->capture_default_str();
  sub->add_option("--min-p", o->min_p, "Drop tokens below min_p x the top probability")
      ->capture_default_str();
  sub->add_option("--repetition-penalty", o->repetition_penalty,
                  "Penalty (> 0) on tokens seen in prompt or output; 1 disables")
      ->capture_default_str();
  sub->add_option("--presence-penalty", o->presence_penalty,
                  "Subtracted once per generated token id, in [-2, 2]")
      ->capture_default_str();
  sub->add_option("--frequency-penalty", o->frequency_penalty,
                  "Subtracted per occurrence in the output, in [-2, 2]")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Random seed for reproducible sampling");
  sub->add_option("--stop", o->stop, "Stop string; repeat for several");
  sub->add_option("--stop-token-id", o->stop_token_ids, "Extra stop token id; repeatable");
  sub->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past the model's EOS");
  sub->add_option("--logprobs", o->logprobs,
                  "Report each token's log-probability and the N most likely alternatives "
                  "(JSON output)");
  sub->add_flag("--no-special", o->no_special, "Do not add BOS/special tokens to the prompt");
  sub->add_flag("--json", o->json,
                "Print one JSON object per prompt and sample: prompt_token_ids, token_ids, "
                "text, finish_reason, usage; with several, then one with the pool statistics");
  sub->add_option("--json-schema", o->json_schema,
                  "Constrain the output to JSON valid against this schema (JSON text, or @FILE)");
  sub->add_flag("--json-object", o->json_object, "Constrain the output to a JSON object");
  sub->add_option("--regex", o->regex,
                  "Constrain the output to match this regular expression (or @FILE)");
  sub->add_option("--grammar", o->grammar,
                  "Constrain the output to this GBNF grammar, rooted at 'root' (or @FILE)");
  sub->add_option("--prompts-file", o->prompts_file, "File with one prompt per line");
  sub->add_option("-n,--n", o->n, "Samples per prompt (they share the prompt's KV blocks)")
      ->capture_default_str();
  sub->add_option("--cache-salt", o->cache_salt,
                  "Prefix-cache namespace: only requests with the same salt share blocks");
  sub->add_option("--tls-ca", o->tls_ca,
                  "With --endpoint: PEM CA that signed the endpoint's certificate (enables TLS)");
  sub->add_option("--tls-cert", o->tls_cert,
                  "With --endpoint: PEM client certificate, for endpoints requiring one");
  sub->add_option("--tls-key", o->tls_key, "With --endpoint: PEM private key of --tls-cert");
  sub->add_option("--tls-server-name", o->tls_server_name,
                  "With --endpoint: name to check the endpoint's certificate against");
  sub->add_option("--api-key", o->api_key,
                  "With --endpoint: API key sent as 'authorization: Bearer <key>' (default: "
                  "$KVSERVE_API_KEY)");
  AddEngineFlags(sub, &o->engine);
  return {sub, [o] { return RunGenerate(*o); }};
}

}  // namespace kvserve::cli
