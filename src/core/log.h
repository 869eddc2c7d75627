// Diagnostics on stderr. stdout belongs to the command's result (ids, text, JSON).
#pragma once

#include <cstdio>
#include <string>

namespace moetier {

enum class LogLevel { kQuiet = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Process-wide verbosity, set once by the CLI before any work starts.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

void LogInfo(const std::string& line);
void LogWarn(const std::string& line);
void LogDebug(const std::string& line);

}  // namespace moetier
