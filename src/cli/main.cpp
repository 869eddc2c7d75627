// moetier: serve Mixture-of-Experts models whose experts do not fit in GPU memory.
#include <cstdio>
#include <vector>

#include "cli/commands.h"

namespace moetier::cli {
int ReportError(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}
}  // namespace moetier::cli

int main(int argc, char** argv) {
  using namespace moetier::cli;
  CLI::App app{
      "moetier: runs Mixture-of-Experts language models whose experts do not fit in GPU memory.\n"
      "Run `moetier <command> --help` for the options of each command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moetier 0.1.0");

  std::vector<Command> commands = {
      AddRunCommand(app),      AddGenerateCommand(app), AddLogitsCommand(app),
      AddConvertCommand(app),  AddPlanCommand(app),     AddBenchCommand(app),
      AddTokenizeCommand(app), AddTemplateCommand(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return ReportError("no command given; run `moetier --help`");
}
