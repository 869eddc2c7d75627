// How every command reads its flags: numeric validators that say the accepted range in words
// (and refuse NaN and infinities everywhere), output paths checked before any work, and the
// one-line `error: …` form of every parse failure.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moetier::cli {

// A whole number in [min, max], checked on the text as typed ("must be a whole number from 1
// to 16, not '-1'"). `zero_means`, when given, is said in the message: "0 = auto".
CLI::Validator WholeNumber(int64_t min, int64_t max = std::numeric_limits<int64_t>::max(),
                           std::string zero_means = "");

// A finite number in the range written as in mathematics: [min, max] with open ends where
// `min_open` / `max_open`. NaN and infinities are never accepted.
CLI::Validator FiniteNumber(double min, double max = std::numeric_limits<double>::max(),
                            bool min_open = false, bool max_open = false);

// Shows each option's default in --help for the options added to `app` afterwards (and to the
// subcommands created from it).
void ShowDefaultsInHelp(CLI::App& app);

// The one-line form of a CLI11 parse failure: "error: <what> (see `moetier <cmd> --help`)".
std::string FormatParseError(const CLI::App* app, const CLI::Error& e);

// For a first argument that is not a known command: the error naming the commands there are
// (and the nearest, for a typo). Empty when `arg` is a command or an option.
std::string UnknownCommandError(std::string_view arg, const std::vector<std::string>& commands);

// Checks that `path` can be written (--out, --report) before any work starts, without
// clobbering it: a file that exists is opened for appending, one that does not is created and
// removed again. Errors name the flag and the system's reason.
Status CheckWritableFile(const std::string& path, std::string_view flag);

// A file that must be read whole (--prompt-file, --messages, --file): a regular file (not a
// directory or a FIFO), readable. Errors name the flag.
Expected<std::string> ReadInputFile(const std::string& path, std::string_view flag);

}  // namespace moetier::cli
