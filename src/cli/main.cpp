// moetier: serve Mixture-of-Experts models whose experts do not fit in GPU memory.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/log.h"
#include "core/tuning.h"
#include "kernels/cpu/cpu_isa.h"

namespace moetier::cli {

int ReportError(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

namespace {

// Exit status of a command line that cannot be parsed (as for most Unix tools); 1 for every
// other error.
constexpr int kUsageExitCode = 2;

// Every MOETIER_* variable, checked before any work: a malformed value is an error, an unknown
// name a warning (a misspelt knob would otherwise be ignored without a word).
Status CheckEnvironmentVariables() {
  MT_ASSIGN_OR_RETURN(std::vector<std::string> warnings, CheckEnvironment());
  for (const auto& w : warnings) LogWarn(w);
  return kernels::CheckCpuIsaEnvironment();
}

// What moetier says on stderr beside errors (which it always says), by --log-level, -q or -v.
struct Verbosity {
  std::string level = "info";
  bool quiet = false;
  bool verbose = false;

  LogLevel Chosen() const {
    if (quiet) return LogLevel::kWarn;
    if (verbose) return LogLevel::kDebug;
    if (level == "quiet") return LogLevel::kQuiet;
    if (level == "warn") return LogLevel::kWarn;
    if (level == "debug") return LogLevel::kDebug;
    return LogLevel::kInfo;
  }
};

// The options every command takes, before or after its name (`moetier -q run ...` or
// `moetier run -q ...`).
void AddVerbosityOptions(CLI::App& app, Verbosity& v) {
  CLI::Option* level =
      app.add_option("--log-level", v.level,
                     "what moetier says on stderr besides errors: quiet (nothing more), warn "
                     "(warnings), info (also what the load placed where and how fast it went) or "
                     "debug (also each bank's read and packing time)")
          ->check(CLI::IsMember({"quiet", "warn", "info", "debug"}));
  CLI::Option* q =
      app.add_flag("-q,--quiet", v.quiet, "warnings and errors only (--log-level warn)");
  CLI::Option* d = app.add_flag("-v,--verbose", v.verbose, "--log-level debug");
  q->excludes(d)->excludes(level);
  d->excludes(level);
}

// Each command's --help names the options it shares with every other.
constexpr const char* kSharedOptionsFooter =
    "Every command also takes --log-level quiet|warn|info|debug, -q/--quiet and -v/--verbose: "
    "what it says on stderr besides errors (`moetier --help`).";

int Main(int argc, char** argv) {
  CLI::App app{
      "moetier: runs Mixture-of-Experts language models whose experts do not fit in GPU memory.\n"
      "Run `moetier <command> --help` for the options of each command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moetier 0.1.0");
  app.failure_message(FormatParseError);
  ShowDefaultsInHelp(app);
  Verbosity verbosity;
  AddVerbosityOptions(app, verbosity);
  app.fallthrough();  // the commands' unknown options are tried here: -q after the command's name

  std::vector<Command> commands = {
      AddRunCommand(app),      AddGenerateCommand(app),   AddLogitsCommand(app),
      AddConvertCommand(app),  AddPlanCommand(app),       AddBenchCommand(app),
      AddTokenizeCommand(app), AddTemplateCommand(app),   AddBatchCommand(app),
      AddServeCommand(app),    AddPerplexityCommand(app),
  };
  std::vector<std::string> names;
  for (const auto& c : commands) {
    names.push_back(c.app->get_name());
    c.app->footer(kSharedOptionsFooter);
  }
  if (argc < 2) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    return ReportError("no command given; the commands are " + list +
                       "; `moetier --help` explains them");
  }
  if (const std::string e = UnknownCommandError(argv[1], names); !e.empty()) return ReportError(e);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end here too (exit 0); a command line that cannot be parsed exits
    // with the usage status, whatever CLI11's own code for the kind of mistake.
    const int code = app.exit(e);
    return code == 0 ? 0 : kUsageExitCode;
  }
  SetLogLevel(verbosity.Chosen());
  if (Status s = CheckEnvironmentVariables(); !s.ok()) return ReportError(s.message());
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return ReportError("no command given; run `moetier --help`");
}

}  // namespace
}  // namespace moetier::cli

// Errors are Status values; an exception reaching here is a defect, but it still ends in one
// line on stderr and a non-zero exit, never an abort.
int main(int argc, char** argv) {
  using moetier::cli::ReportError;
  try {
    return moetier::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    return ReportError("out of memory; use a smaller --ctx-size or a smaller model");
  } catch (const std::filesystem::filesystem_error& e) {
    return ReportError(e.what());
  } catch (const std::exception& e) {
    return ReportError(std::string("internal error: ") + e.what() +
                       " (please report it with the command line)");
  }
}
