// `kvserve plan`: how one GPU's memory splits into weights, activations and KV cache, for each
// pipeline stage of a pp × tp layout.

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/command.h"
#include "nlohmann/json.hpp"
#include "worker/planner/byte_size.h"
#include "worker/planner/capacity_planner.h"
#include "worker/planner/model_spec_loader.h"
#include "worker/planner/pipeline_layout.h"

namespace kvserve::cli {
namespace {

struct PlanCommandOptions {
  std::string model;
  std::string gpu_memory = "80GiB";
  double gpu_memory_utilization = 0.9;
  int tp = 1;
  int pp = 1;
  std::string pp_layers;
  std::string weight_dtype;
  std::string kv_cache_dtype = "bf16";
  std::string activation_dtype = "bf16";
  int max_model_len = 0;
  int block_size = 16;
  int shared_prefix_len = 0;
  int max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
  bool json = false;
};

// A stage's KV figures for one dtype (sequence counts are the group's).
nlohmann::json StageDTypeJson(const KvDTypePlan& entry) {
  return {{"kv_bytes_per_token", entry.kv_bytes_per_token},
          {"bytes_per_block", entry.bytes_per_block},
          {"num_kv_blocks", entry.num_kv_blocks},
          {"kv_tokens", entry.kv_tokens}};
}

nlohmann::json DTypeJson(const Plan& plan, const KvDTypePlan& entry) {
  nlohmann::json out = StageDTypeJson(entry);
  out["max_concurrent_seqs"] = entry.max_concurrent_seqs;
  out["max_concurrent_seqs_shared_prefix"] = entry.max_concurrent_seqs_shared_prefix;
  if (plan.pp > 1) out["limiting_stage"] = entry.limiting_stage;
  return out;
}

nlohmann::json ActivationsJson(const Plan& plan, const ActivationEstimate& activations) {
  nlohmann::json out = {{"buffer_bytes", activations.buffer_bytes},
                        {"elements_per_token", activations.elements_per_token},
                        {"f32_elements_per_token", activations.f32_elements_per_token},
                        {"logits_bytes", activations.logits_bytes},
                        {"workspace_bytes", activations.workspace_bytes}};
  if (plan.pp > 1) out["pipeline_bytes"] = activations.pipeline_bytes;
  return out;
}

// The pp > 1 fields: the layout and one object per stage.
void AddPipelineJson(const Plan& plan, nlohmann::json& out) {
  nlohmann::json layers = nlohmann::json::array();
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& stage = plan.stages[s];
    layers.push_back(stage.layers.count);
    nlohmann::json by_dtype = nlohmann::json::object();
    for (const KvDTypePlan& entry : stage.by_kv_dtype) {
      by_dtype[std::string(KvCacheDTypeName(entry.dtype))] = StageDTypeJson(entry);
    }
    nlohmann::json item = {{"stage", s},
                           {"first_layer", stage.layers.first},
                           {"num_layers", stage.layers.count},
                           {"weight_bytes", stage.weight_bytes},
                           {"activation_bytes", stage.activations.total()},
                           {"activations", ActivationsJson(plan, stage.activations)},
                           {"kv_budget_bytes", stage.kv_budget_bytes},
                           {"by_kv_dtype", by_dtype}};
    item.update(StageDTypeJson(plan.chosen(stage)));
    stages.push_back(std::move(item));
  }
  out["pp"] = plan.pp;
  out["num_gpus"] = plan.pp * plan.tp;
  out["layers_per_stage"] = std::move(layers);
  out["stages"] = std::move(stages);
}

nlohmann::json PlanJson(const ModelSpec& spec, const PlanOptions& options, const Plan& plan) {
  const KvDTypePlan& chosen = plan.chosen();
  nlohmann::json by_dtype = nlohmann::json::object();
  for (const KvDTypePlan& entry : plan.by_kv_dtype) {
    by_dtype[std::string(KvCacheDTypeName(entry.dtype))] = DTypeJson(plan, entry);
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
                        {"activation_dtype", options.activation_bytes == 4 ? "f32" : "bf16"},
                        {"activations", ActivationsJson(plan, plan.activations)},
                        {"kv_budget_bytes", plan.kv_budget_bytes},
                        {"kv_cache_dtype", std::string(KvCacheDTypeName(plan.kv_dtype))},
                        {"kv_heads_per_gpu", plan.kv_heads_per_gpu},
                        {"kv_heads_replicated", plan.kv_heads_replicated},
                        {"max_model_len", plan.max_model_len},
                        {"block_size", plan.block_size},
                        {"shared_prefix_len", plan.shared_prefix_len},
                        {"by_kv_dtype", by_dtype}};
  out.update(DTypeJson(plan, chosen));
  // pp 1 keeps the output it always had.
  if (plan.pp > 1) AddPipelineJson(plan, out);
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

// "0-30 (31)": a stage's decoder layers.
std::string StageLayersText(StageLayers layers) {
  return absl::StrFormat("%d-%d (%d)", layers.first, layers.end() - 1, layers.count);
}

// One row per pipeline stage with its per-GPU figures, the stage that limits the group's KV
// capacity marked.
void PrintStages(const Plan& plan) {
  std::printf("%-6s %-13s %11s %15s %13s %14s %9s %10s\n", "stage", "layers", "weights/GPU",
              "activations/GPU", "KV budget/GPU", "KV bytes/token", "KV blocks", "KV tokens");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& stage = plan.stages[s];
    const KvDTypePlan& kv = plan.chosen(stage);
    const std::string name =
        absl::StrFormat("%d%s", s, static_cast<int>(s) == plan.chosen().limiting_stage ? " *" : "");
    std::printf("%-6s %-13s %11s %15s %13s %14lld %9lld %10lld\n", name.c_str(),
                StageLayersText(stage.layers).c_str(), FormatBytes(stage.weight_bytes).c_str(),
                FormatBytes(stage.activations.total()).c_str(),
                FormatBytes(stage.kv_budget_bytes).c_str(),
                static_cast<long long>(kv.kv_bytes_per_token),
                static_cast<long long>(kv.num_kv_blocks), static_cast<long long>(kv.kv_tokens));
  }
  std::printf(
      "* sets the group's KV capacity (KV figures in %s): every stage caches the same block ids\n"
      "  for its own layers\n\n",
      std::string(KvCacheDTypeName(plan.kv_dtype)).c_str());
}

// The lines above the KV table: the model, the layout and the per-GPU budgets.
void PrintBudgets(const ModelSpec& spec, const PlanOptions& options, const Plan& plan) {
  std::printf("model        %s (%s%s, %.3gB parameters)\n", spec.source.c_str(),
              spec.model_type.c_str(), spec.assumed_llama_like ? ", treated as llama" : "",
              static_cast<double>(plan.num_params) / 1e9);
  const std::string kv_heads =
      absl::StrFormat("KV heads per GPU: %d%s", plan.kv_heads_per_gpu,
                      spec.IsMla() ? ", MLA latent on every rank"
                                   : (plan.kv_heads_replicated ? ", replicated" : ""));
  if (plan.pp > 1) {
    std::vector<StageLayers> layers;
    for (const StagePlan& stage : plan.stages) layers.push_back(stage.layers);
    std::printf("layout       pp %d x tp %d = %d GPUs, layers %s (%s)\n", plan.pp, plan.tp,
                plan.pp * plan.tp, DescribeStageLayers(layers).c_str(), kv_heads.c_str());
  } else {
    std::printf("tp           %d (%s)\n", plan.tp, kv_heads.c_str());
  }
  std::printf("GPU memory   %s x %g = %s usable\n", FormatBytes(options.gpu_memory_bytes).c_str(),
              options.gpu_memory_utilization, FormatBytes(plan.usable_bytes).c_str());
  const std::string weight_origin =
      plan.weight_bytes_exact
          ? "measured from the tensors"
          : absl::StrFormat("%s x parameters",
                            std::string(WeightDTypeName(options.weight_dtype.value_or(
                                spec.checkpoint_dtype.value_or(WeightDType::kBF16)))));
  if (plan.pp > 1) {
    std::printf("weights      per stage below (%s)\n", weight_origin.c_str());
    std::printf(
        "activations  per stage below: %s buffers for %d tokens, workspace %s; logits %s on\n",
        options.activation_bytes == 4 ? "f32" : "bf16", options.max_num_batched_tokens,
        FormatBytes(options.workspace_bytes).c_str(),
        FormatBytes(plan.stages.back().activations.logits_bytes).c_str());
    std::printf("             the last stage, hidden-state send/recv buffers %s on the others\n\n",
                FormatBytes(plan.stages.front().activations.pipeline_bytes).c_str());
    PrintStages(plan);
    return;
  }
  std::printf("weights      %s per GPU (%s)\n", FormatBytes(plan.weight_bytes).c_str(),
              weight_origin.c_str());
  std::printf("activations  %s (%s buffers %s for %d tokens, logits %s, workspace %s)\n",
              FormatBytes(plan.activations.total()).c_str(),
              options.activation_bytes == 4 ? "f32" : "bf16",
              FormatBytes(plan.activations.buffer_bytes).c_str(), options.max_num_batched_tokens,
              FormatBytes(plan.activations.logits_bytes).c_str(),
              FormatBytes(plan.activations.workspace_bytes).c_str());
  std::printf("KV budget    %s per GPU\n\n", FormatBytes(plan.kv_budget_bytes).c_str());
}

void PrintTable(const ModelSpec& spec, const PlanOptions& options, const Plan& plan) {
  PrintBudgets(spec, options, plan);
  if (plan.pp > 1) std::printf("the group (pp %d x tp %d)\n", plan.pp, plan.tp);

  std::printf("%-34s", "KV cache dtype (* = chosen)");
  for (const KvDTypePlan& entry : plan.by_kv_dtype) {
    const std::string name = absl::StrFormat("%s%s", std::string(KvCacheDTypeName(entry.dtype)),
                                             entry.dtype == plan.kv_dtype ? "*" : "");
    std::printf(" %14s", name.c_str());
  }
  std::printf("\n");
  const bool pipeline = plan.pp > 1;
  PrintRow(plan, pipeline ? "KV bytes per token (per GPU, max)" : "KV bytes per token (per GPU)",
           [](const KvDTypePlan& e) { return e.kv_bytes_per_token; });
  PrintRow(plan, absl::StrFormat("bytes per block (%d tokens)", plan.block_size),
           [](const KvDTypePlan& e) { return e.bytes_per_block; });
  PrintRow(plan, pipeline ? "KV blocks (fewest of the stages)" : "KV blocks",
           [](const KvDTypePlan& e) { return e.num_kv_blocks; });
  if (pipeline) {
    PrintRow(plan, "  set by stage", [](const KvDTypePlan& e) { return e.limiting_stage; });
  }
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
  options.pp = args.pp;
  absl::StatusOr<std::vector<int>> pp_layers = ParseStageLayerCounts(args.pp_layers);
  if (!pp_layers.ok()) return ReportError("plan", pp_layers.status());
  options.pp_layers = *std::move(pp_layers);
  if (!args.weight_dtype.empty()) {
    absl::StatusOr<WeightDType> dtype = ParseWeightDType(args.weight_dtype);
    if (!dtype.ok()) return ReportError("plan", dtype.status());
    options.weight_dtype = *dtype;
  }
  absl::StatusOr<KvCacheDType> kv_dtype = ParseKvCacheDType(args.kv_cache_dtype);
  if (!kv_dtype.ok()) return ReportError("plan", kv_dtype.status());
  options.kv_dtype = *kv_dtype;
  if (args.activation_dtype == "bf16" || args.activation_dtype == "f32") {
    options.activation_bytes = args.activation_dtype == "f32" ? 4 : 2;
  } else {
    return ReportError(
        "plan", absl::InvalidArgumentError(absl::StrCat(
                    "--activation-dtype must be bf16 or f32 (got '", args.activation_dtype, "')")));
  }
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
                         "concurrent sequences) for every KV cache dtype, per pipeline stage.");
  sub->add_option("--model", opts->model,
                  "Model directory (config.json + safetensors), a config.json, or a GGUF file")
      ->required();
  sub->add_option("--gpu-memory", opts->gpu_memory,
                  "Memory of one GPU: bytes or with a unit (80GiB, 141GB)")
      ->capture_default_str();
  sub->add_option("--gpu-memory-utilization", opts->gpu_memory_utilization,
                  "Fraction of the GPU memory the server may use")
      ->capture_default_str();
  sub->add_option("--tp", opts->tp, "Tensor-parallel degree (GPUs per pipeline stage)")
      ->capture_default_str();
  sub->add_option("--pp", opts->pp,
                  "Pipeline-parallel degree: stages, each holding a slice of the layers on its "
                  "own --tp GPUs")
      ->capture_default_str();
  sub->add_option("--pp-layers", opts->pp_layers,
                  "Layers per stage, e.g. 31,30 (default: as even as possible, earlier stages "
                  "taking the extra ones)");
  sub->add_option("--weight-dtype", opts->weight_dtype,
                  "Assume weights stored as f32, f16, bf16, int8, fp8 or int4 (default: measure "
                  "the tensors, else the config's dtype)");
  sub->add_option("--kv-cache-dtype", opts->kv_cache_dtype, "f32, f16, bf16, int8 or fp8")
      ->capture_default_str();
  sub->add_option("--activation-dtype", opts->activation_dtype,
                  "Activations between ops: bf16 (the CUDA backend's default) or f32 "
                  "(KVSERVE_CUDA_F32_ACTIVATIONS=1); the residual stream and logits are f32 "
                  "either way")
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
