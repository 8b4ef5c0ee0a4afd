// The `kvserve` binary: one executable, one subcommand per job.

#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"

namespace kvserve::cli {

int ReportError(std::string_view command, const absl::Status& status) {
  std::fprintf(stderr, "kvserve %.*s: %.*s\n", static_cast<int>(command.size()), command.data(),
               static_cast<int>(status.message().size()), status.message().data());
  return 1;
}

}  // namespace kvserve::cli

int main(int argc, char** argv) {
  CLI::App app{"kvserve: a serving cluster for large language models with a paged, prefix-shared "
               "KV cache.",
               "kvserve"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvserve 0.1.0");
  std::vector<kvserve::cli::Command> commands;
  commands.push_back(kvserve::cli::AddGenerateCommand(app));
  commands.push_back(kvserve::cli::AddPlanCommand(app));
  commands.push_back(kvserve::cli::AddTokenizeCommand(app));
  commands.push_back(kvserve::cli::AddChatTemplateCommand(app));
  commands.push_back(kvserve::cli::AddWorkerCommand(app));
  commands.push_back(kvserve::cli::AddRouterCommand(app));
  commands.push_back(kvserve::cli::AddUpCommand(app));
  commands.push_back(kvserve::cli::AddSynthCommand(app));
  commands.push_back(kvserve::cli::AddBenchCommand(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const kvserve::cli::Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return 1;
}
