// The CLI's subcommands. Each Add*Command registers its options on `root` and returns the action
// to run when that subcommand was chosen; the action returns the process exit code. Errors are
// printed on one line to stderr by the action itself ("error: ...").
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace moetier::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command AddLogitsCommand(CLI::App& root);
Command AddGenerateCommand(CLI::App& root);
Command AddTokenizeCommand(CLI::App& root);
Command AddConvertCommand(CLI::App& root);
Command AddPlanCommand(CLI::App& root);
Command AddRunCommand(CLI::App& root);
Command AddBenchCommand(CLI::App& root);
Command AddTemplateCommand(CLI::App& root);
Command AddBatchCommand(CLI::App& root);
Command AddServeCommand(CLI::App& root);
Command AddPerplexityCommand(CLI::App& root);

// Prints "error: <message>" on one line of stderr and returns the exit code for failures.
int ReportError(const std::string& message);

}  // namespace moetier::cli
