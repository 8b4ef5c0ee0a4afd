#ifndef KVSERVE_CLIENT_CLI_COMMAND_H_
#define KVSERVE_CLIENT_CLI_COMMAND_H_

#include <functional>
#include <string_view>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace kvserve::cli {

/// A subcommand of the `kvserve` binary: registered on the app before parsing, run after it.
struct Command {
  CLI::App* app = nullptr;
  /// Runs the command once its options are parsed; returns the process exit code.
  std::function<int()> run;
};

/// Prints "kvserve <command>: <message>" to stderr and returns exit code 1.
int ReportError(std::string_view command, const absl::Status& status);

Command AddTokenizeCommand(CLI::App& app);
Command AddChatTemplateCommand(CLI::App& app);
Command AddGenerateCommand(CLI::App& app);
Command AddPlanCommand(CLI::App& app);
Command AddWorkerCommand(CLI::App& app);
Command AddRouterCommand(CLI::App& app);
Command AddUpCommand(CLI::App& app);
Command AddSynthCommand(CLI::App& app);
Command AddBenchCommand(CLI::App& app);

}  // namespace kvserve::cli

#endif  // KVSERVE_CLIENT_CLI_COMMAND_H_
