#ifndef KVSERVE_CLIENT_CLI_ENGINE_FLAGS_H_
#define KVSERVE_CLIENT_CLI_ENGINE_FLAGS_H_

#include "CLI/CLI.hpp"
#include "worker/engine/engine.h"

namespace kvserve::cli {

/// Registers the engine's sizing and batching flags on a subcommand, bound to `options` (which
/// must outlive parsing): --block-size --num-kv-blocks --kv-cache-memory
/// --gpu-memory-utilization --kv-cache-dtype --max-num-seqs --max-num-batched-tokens
/// --no-prefix-caching --no-chunked-prefill --threads --max-n.
/// Defaults are those of EngineOptions.
void AddEngineFlags(CLI::App* app, EngineOptions* options);

}  // namespace kvserve::cli

#endif  // KVSERVE_CLIENT_CLI_ENGINE_FLAGS_H_
