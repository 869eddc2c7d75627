#include "core/log.h"

#include <atomic>

namespace moetier {

namespace {
std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LogLevel::kInfo)};
  return level;
}
void Emit(LogLevel at, const char* prefix, const std::string& line) {
  if (Level().load(std::memory_order_relaxed) < static_cast<int>(at)) return;
  std::fprintf(stderr, "%s%s\n", prefix, line.c_str());
}
}  // namespace

void SetLogLevel(LogLevel level) {
  Level().store(static_cast<int>(level));
}
LogLevel GetLogLevel() {
  return static_cast<LogLevel>(Level().load());
}
void LogInfo(const std::string& line) {
  Emit(LogLevel::kInfo, "", line);
}
void LogWarn(const std::string& line) {
  Emit(LogLevel::kWarn, "warning: ", line);
}
void LogDebug(const std::string& line) {
  Emit(LogLevel::kDebug, "debug: ", line);
}

}  // namespace moetier
