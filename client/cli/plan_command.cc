// `kvserve plan`: how one GPU's memory splits into weights, activations and KV cache.

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "client/cli/command.h"
#include "nlohmann/json.hpp"
#include "worker/planner/byte_size.h"
#include "worker/planner/capacity_planner.h"
#include "worker/planner/model_spec_loader.h"

namespace kvserve::cli {
namespace {

struct PlanCommandOptions {
  std::string model;
  std::string gpu_memory = "80GiB";
  double gpu_memory_utilization = 0.9;
  int tp = 1;
  std::string weight_dtype;
  std::string kv_cache_dtype = "bf16";
  int max_model_len = 0;
  int block_size = 16;
  int shared_prefix_len = 0;
  int max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
  bool json = false;
};

nlohmann::json DTypeJson(const KvDTypePlan& entry) {
  return {{"kv_bytes_per_token", entry.kv_bytes_per_token},
          {"bytes_per_block", entry.bytes_per_block},
          {"num_kv_blocks", entry.num_kv_blocks},
          {"kv_tokens", entry.kv_tokens},
          {"max_concurrent_seqs", entry.max_concurrent_seqs},
          {"max_concurrent_seqs_shared_prefix", entry.max_concurrent_seqs_shared_prefix}};
}

nlohmann::json PlanJson(const ModelSpec& spec, const PlanOptions& options, const Plan& plan) {
  const KvDTypePlan& chosen = plan.chosen();
  nlohmann::json by_dtype = nlohmann::json::object();
  for (const KvDTypePlan& entry : plan.by_kv_dtype) {
    by_dtype[std::string(KvCacheDTypeName(entry.dtype))] = DTypeJson(entry);
  }
  nlohmann::json out = {{"model", spec.source},
                        {"model_type", spec.model_type},
                        {"num_params", plan.num_params},
                        {"tp", plan.tp},
                        {"gpu_memory_bytes", options.gpu_memory_bytes},
                        {"gpu_memory_utilization", options.gpu_memory_utilization},
                        {"usable_bytes", plan.usable_bytes},
                        {"weight_bytes", plan.weight_bytes},
                        {"weight_bytes_exact", plan.weight_bytes_exact},
                        {"activation_bytes", plan.activations.total()},
                        {"activations",
                         {{"buffer_bytes", plan.activations.buffer_bytes},
                          {"logits_bytes", plan.activations.logits_bytes},
                          {"workspace_bytes", plan.activations.workspace_bytes}}},
                        {"kv_budget_bytes", plan.kv_budget_bytes},
                        {"kv_cache_dtype", std::string(KvCacheDTypeName(plan.kv_dtype))},
                        {"kv_heads_per_gpu", plan.kv_heads_per_gpu},
                        {"kv_heads_replicated", plan.kv_heads_replicated},
                        {"max_model_len", plan.max_model_len},
                        {"block_size", plan.block_size},
                        {"shared_prefix_len", plan.shared_prefix_len},
                        {"by_kv_dtype", by_dtype}};
  out.update(DTypeJson(chosen));
  return out;
}

// One table row: a label and one number per KV dtype.
template <typename Field>
void PrintRow(const Plan& plan, const std::string& label, Field field) {
  std::printf("%-34s", label.c_str());
  for (const KvDTypePlan& entry : plan.by_kv_dtype) {
    std::printf(" %14lld", static_cast<long long>(field(entry)));
  }
  std::printf("\n");
}

void PrintTable(const ModelSpec& spec, const PlanOptions& options, const Plan& plan) {
  std::printf("model        %s (%s%s, %.3gB parameters)\n", spec.source.c_str(),
              spec.model_type.c_str(), spec.assumed_llama_like ? ", treated as llama" : "",
              static_cast<double>(plan.num_params) / 1e9);
  std::printf("tp           %d (KV heads per GPU: %d%s)\n", plan.tp, plan.kv_heads_per_gpu,
              spec.IsMla() ? ", MLA latent on every rank"
                           : (plan.kv_heads_replicated ? ", replicated" : ""));
  std::printf("GPU memory   %s x %g = %s usable\n", FormatBytes(options.gpu_memory_bytes).c_str(),
              options.gpu_memory_utilization, FormatBytes(plan.usable_bytes).c_str());
  const std::string weight_origin =
      plan.weight_bytes_exact
          ? "measured from the tensors"
          : absl::StrFormat("%s x parameters",
                            std::string(WeightDTypeName(options.weight_dtype.value_or(
                                spec.checkpoint_dtype.value_or(WeightDType::kBF16)))));
  std::printf("weights      %s per GPU (%s)\n", FormatBytes(plan.weight_bytes).c_str(),
              weight_origin.c_str());
  std::printf("activations  %s (buffers %s for %d tokens, logits %s, workspace %s)\n",
              FormatBytes(plan.activations.total()).c_str(),
              FormatBytes(plan.activations.buffer_bytes).c_str(), options.max_num_batched_tokens,
              FormatBytes(plan.activations.logits_bytes).c_str(),
              FormatBytes(plan.activations.workspace_bytes).c_str());
  std::printf("KV budget    %s per GPU\n\n", FormatBytes(plan.kv_budget_bytes).c_str());

  std::printf("%-34s", "KV cache dtype (* = chosen)");
  for (const KvDTypePlan& entry : plan.by_kv_dtype) {
    const std::string name = absl::StrFormat("%s%s", std::string(KvCacheDTypeName(entry.dtype)),
                                             entry.dtype == plan.kv_dtype ? "*" : "");
    std::printf(" %14s", name.c_str());
  }
  std::printf("\n");
  PrintRow(plan, "KV bytes per token (per GPU)",
           [](const KvDTypePlan& e) { return e.kv_bytes_per_token; });
  PrintRow(plan, absl::StrFormat("bytes per block (%d tokens)", plan.block_size),
           [](const KvDTypePlan& e) { return e.bytes_per_block; });
  PrintRow(plan, "KV blocks", [](const KvDTypePlan& e) { return e.num_kv_blocks; });
  PrintRow(plan, "KV tokens", [](const KvDTypePlan& e) { return e.kv_tokens; });
  PrintRow(plan, absl::StrFormat("sequences of %d tokens", plan.max_model_len),
           [](const KvDTypePlan& e) { return e.max_concurrent_seqs; });
  PrintRow(plan, absl::StrFormat("  with a %d-token shared prefix", plan.shared_prefix_len),
           [](const KvDTypePlan& e) { return e.max_concurrent_seqs_shared_prefix; });
  if (spec.sliding_window > 0) {
    std::printf(
        "\nnote: the model uses a %d-token sliding window; these figures assume full "
        "attention (conservative)\n",
        spec.sliding_window);
  }
  if (plan.chosen().max_concurrent_seqs == 0) {
    std::printf("\nwarning: not even one %d-token sequence fits the KV cache in %s\n",
                plan.max_model_len, std::string(KvCacheDTypeName(plan.kv_dtype)).c_str());
  }
}

int RunPlan(const PlanCommandOptions& args) {
  PlanOptions options;
  absl::StatusOr<int64_t> memory = ParseByteSize(args.gpu_memory);
  if (!memory.ok()) return ReportError("plan", memory.status());
  options.gpu_memory_bytes = *memory;
  options.gpu_memory_utilization = args.gpu_memory_utilization;
  options.tp = args.tp;
  if (!args.weight_dtype.empty()) {
    absl::StatusOr<WeightDType> dtype = ParseWeightDType(args.weight_dtype);
    if (!dtype.ok()) return ReportError("plan", dtype.status());
    options.weight_dtype = *dtype;
  }
  absl::StatusOr<KvCacheDType> kv_dtype = ParseKvCacheDType(args.kv_cache_dtype);
  if (!kv_dtype.ok()) return ReportError("plan", kv_dtype.status());
  options.kv_dtype = *kv_dtype;
  options.max_model_len = args.max_model_len;
  options.block_size = args.block_size;
  options.shared_prefix_len = args.shared_prefix_len;
  options.max_num_batched_tokens = args.max_num_batched_tokens;
  options.max_num_seqs = args.max_num_seqs;

  absl::StatusOr<ModelSpec> spec = LoadModelSpec(args.model);
  if (!spec.ok()) return ReportError("plan", spec.status());
  absl::StatusOr<Plan> plan = PlanCapacity(*spec, options);
  if (!plan.ok()) return ReportError("plan", plan.status());
  if (args.json) {
    std::printf("%s\n", PlanJson(*spec, options, *plan).dump().c_str());
  } else {
    PrintTable(*spec, options, *plan);
  }
  return 0;
}

}  // namespace

Command AddPlanCommand(CLI::App& app) {
  auto opts = std::make_shared<PlanCommandOptions>();
  CLI::App* sub =
      app.add_subcommand("plan",
                         "Plan GPU memory: weights, activations and the KV cache (blocks, tokens, "
                         "concurrent sequences) for every KV cache dtype.");
  sub->add_option("--model", opts->model,
                  "Model directory (config.json + safetensors), a config.json, or a GGUF file")
      ->required();
  sub->add_option("--gpu-memory", opts->gpu_memory,
                  "Memory of one GPU: bytes or with a unit (80GiB, 141GB)")
      ->capture_default_str();
  sub->add_option("--gpu-memory-utilization", opts->gpu_memory_utilization,
                  "Fraction of the GPU memory the server may use")
      ->capture_default_str();
  sub->add_option("--tp", opts->tp, "Tensor-parallel degree")->capture_default_str();
  sub->add_option("--weight-dtype", opts->weight_dtype,
                  "Assume weights stored as f32, f16, bf16, int8, fp8 or int4 (default: measure "
                  "the tensors, else the config's dtype)");
  sub->add_option("--kv-cache-dtype", opts->kv_cache_dtype, "f32, f16, bf16, int8 or fp8")
      ->capture_default_str();
  sub->add_option("--max-model-len", opts->max_model_len,
                  "Sequence length for the concurrency figures (default: the model's maximum)");
  sub->add_option("--block-size", opts->block_size, "Tokens per KV block")->capture_default_str();
  sub->add_option("--shared-prefix-len", opts->shared_prefix_len,
                  "Tokens of prefix every sequence shares (held once in the cache)")
      ->capture_default_str();
  sub->add_option("--max-num-batched-tokens", opts->max_num_batched_tokens,
                  "Token budget of one engine step (sizes the activations)")
      ->capture_default_str();
  sub->add_option("--max-num-seqs", opts->max_num_seqs,
                  "Sequences per step (sizes the logits buffer)")
      ->capture_default_str();
  sub->add_flag("--json", opts->json, "Print one JSON object instead of a table");
  return {sub, [opts] { return RunPlan(*opts); }};
}

}  // namespace kvserve::cli
