#include "client/cli/engine_flags.h"

#include <optional>
#include <string>

#include "kernels/backend.h"
#include "kernels/kv_dtype.h"
#include "worker/planner/byte_size.h"

namespace kvserve::cli {

void AddEngineFlags(CLI::App* app, EngineOptions* options) {
  EngineOptions& e = *options;
  app->add_option("--block-size", e.block_size, "Tokens per KV block")->capture_default_str();
  app->add_option("--num-kv-blocks", e.num_kv_blocks,
                  "KV pool size in blocks; 0 sizes it from --kv-cache-memory")
      ->capture_default_str();
  // A size flag taking bytes or units; `field` gets the bytes.
  auto size_flag = [app](const std::string& name, int64_t* field, const std::string& help) {
    app->add_option_function<std::string>(
           name,
           [name, field](const std::string& text) {
             absl::StatusOr<int64_t> bytes = ParseByteSize(text);
             if (!bytes.ok())
               throw CLI::ValidationError(name, std::string(bytes.status().message()));
             *field = *bytes;
           },
           help)
        ->default_str(std::to_string(*field));
  };
  size_flag("--kv-cache-memory", &e.kv_cache_memory,
            "KV pool size: bytes or with a unit (2GiB, 512MB); 0: room for --max-num-seqs "
            "full-length sequences, at most 4 GiB");
  size_flag("--kv-offload-memory", &e.kv_offload.host_bytes,
            "Host-memory tier of the prefix cache (bytes or 8GiB, 512MB): full KV blocks are "
            "copied there as they are computed and restored on a prefix hit after the device "
            "pool has dropped them; 0: off");
  app->add_option("--kv-disk-dir", e.kv_offload.disk_dir,
                  "Disk tier of the prefix cache: block files under this directory survive a "
                  "restart (needs --kv-disk-bytes); empty: off");
  size_flag("--kv-disk-bytes", &e.kv_offload.disk_bytes,
            "Size of the disk tier (bytes or with a unit); least recently used files go first");
  app->add_option("--gpu-memory-utilization", e.gpu_memory_utilization,
                  "With --num-kv-blocks and --kv-cache-memory 0: give the KV pool this fraction "
                  "of the device's memory minus weights and activations (0 disables)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app->add_option_function<std::string>(
         "--kv-cache-dtype",
         [options](const std::string& name) {
           std::optional<KvCacheDType> dtype = KvCacheDTypeFromName(name);
           // CLI11 reports this as a usage error naming the flag.
           if (!dtype)
             throw CLI::ValidationError("--kv-cache-dtype", "unknown dtype '" + name + "'");
           options->kv_cache_dtype = *dtype;
         },
         "Element type of the KV cache: f32, f16, bf16, int8 or fp8")
      ->default_str(std::string(KvCacheDTypeName(e.kv_cache_dtype)));
  app->add_option("--max-num-seqs", e.scheduler.max_num_seqs, "Most sequences running at once")
      ->capture_default_str();
  app->add_option("--max-num-batched-tokens", e.scheduler.max_num_batched_tokens,
                  "Token budget of one engine step (prefill chunks + decodes)")
      ->capture_default_str();
  app->add_flag("!--no-prefix-caching", e.scheduler.enable_prefix_caching,
                "Do not reuse KV blocks of identical prefixes");
  app->add_flag("!--no-chunked-prefill", e.scheduler.enable_chunked_prefill,
                "Only admit a prompt when all of it fits in one step");
  app->add_option("--threads", e.num_threads, "Compute threads; 0 uses every core")
      ->capture_default_str();
  app->add_option("--max-n", e.max_n, "Most samples (n) one request may ask for")
      ->capture_default_str();
  app->add_option_function<std::string>(
         "--device",
         [options](const std::string& name) {
           std::optional<DeviceChoice> device = DeviceChoiceFromName(name);
           if (!device) {
             throw CLI::ValidationError("--device", "unknown device '" + name +
                                                        "' (expected cpu, cuda, auto or cuda-sim)");
           }
           options->device = *device;
         },
         "Where the model runs: cpu, cuda (fails without a usable GPU) or auto (CUDA when a "
         "usable GPU is present, else the CPU, saying why once on stderr); cuda-sim is a test "
         "device: the CUDA backend run on the CPU by the CUDA simulator (slow, checked)")
      ->default_str(std::string(DeviceChoiceName(e.device)));
  app->add_flag("--keep-f32-weights", e.keep_f32_weights,
                "CUDA: keep f32 weights in f32 (fp32 GEMMs) instead of converting them to bf16 at "
                "load; twice the memory, arithmetic next to the CPU's (for checking a GPU)");
  app->add_option_function<std::string>(
         "--quantization,-q",
         [options](const std::string& method) {
           if (method == "fp8") {
             options->fp8_weights = true;
           } else if (method == "none") {
             options->fp8_weights = false;
           } else {
             throw CLI::ValidationError("--quantization",
                                        "unknown method '" + method + "' (expected fp8 or none)");
           }
         },
         "CUDA (sm_89+): fp8 quantizes the f32 / f16 / bf16 Linear weights to FP8 E4M3 with one "
         "scale per output row at load (half the memory and decode traffic of bf16) and runs "
         "them on FP8 tensor cores, each activation row quantized with a scale of its own; the "
         "vocabulary projection, routers and GGUF-quantized tensors stay as stored")
      ->default_str("none");
  app->add_flag("!--enforce-eager", e.cuda_graphs,
                "CUDA: launch every op of every decode step instead of replaying CUDA graphs");
  app->add_flag("!--host-sampling", e.device_sampling,
                "CUDA: copy every step's logits to the host and sample there, instead of sampling "
                "on the device the steps whose requests its kernel serves exactly (greedy or "
                "top-k <= 64, no logprobs, penalties, min-p or constraints; the same tokens "
                "either way)");
  app->add_option("--tp", e.tensor_parallel_size,
                  "Tensor-parallel ranks: CPU threads, or with --device cuda one GPU each (NCCL)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
}

}  // namespace kvserve::cli
