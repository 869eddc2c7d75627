#include "experts/memory_limits.h"

#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace moetier {

namespace {

// The value of `key` (e.g. "MemTotal:") in a /proc file of "Key:   123 kB" lines, in bytes.
std::optional<uint64_t> ReadKbField(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream ss(line.substr(key.size()));
    uint64_t kb = 0;
    if (ss >> kb) return kb * 1024;
  }
  return std::nullopt;
}

bool DetectWsl() {
  if (std::getenv("WSL_DISTRO_NAME") != nullptr || std::getenv("WSL_INTEROP") != nullptr)
    return true;
  std::ifstream in("/proc/sys/kernel/osrelease");
  std::string release;
  std::getline(in, release);
  for (auto& c : release) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return release.find("microsoft") != std::string::npos || release.find("wsl") != std::string::npos;
}

bool HasCapIpcLock() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
    constexpr int kCapIpcLock = 14;  // linux/capability.h
    return (caps >> kCapIpcLock) & 1u;
  }
  return false;
}

}  // namespace

HostMemoryInfo ReadHostMemoryInfo() {
  HostMemoryInfo info;
  info.total_bytes = ReadKbField("/proc/meminfo", "MemTotal:").value_or(0);
  info.available_bytes = ReadKbField("/proc/meminfo", "MemAvailable:").value_or(info.total_bytes);
  info.is_wsl = DetectWsl();
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    info.memlock_limit_bytes = static_cast<uint64_t>(rl.rlim_cur);
  info.has_cap_ipc_lock = HasCapIpcLock();
  return info;
}

uint64_t ReadVmLckBytes() {
  return ReadKbField("/proc/self/status", "VmLck:").value_or(0);
}

uint64_t ReadPeakRssBytes() {
  return ReadKbField("/proc/self/status", "VmHWM:").value_or(0);
}

}  // namespace moetier
