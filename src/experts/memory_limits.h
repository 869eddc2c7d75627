// What the host lets this process page-lock: RAM, RLIMIT_MEMLOCK, CAP_IPC_LOCK, WSL. Read from
// /proc and getrlimit; no side effects.
#pragma once

#include <cstdint>
#include <optional>

namespace moetier {

struct HostMemoryInfo {
  uint64_t total_bytes = 0;      // MemTotal
  uint64_t available_bytes = 0;  // MemAvailable
  bool is_wsl = false;           // Windows Subsystem for Linux caps pinned memory far lower
  // RLIMIT_MEMLOCK soft limit; nullopt when unlimited.
  std::optional<uint64_t> memlock_limit_bytes;
  bool has_cap_ipc_lock = false;  // may lock past RLIMIT_MEMLOCK (root usually has it)

  bool may_lock_without_limit() const { return !memlock_limit_bytes || has_cap_ipc_lock; }
};

HostMemoryInfo ReadHostMemoryInfo();

// VmLck of /proc/self/status in bytes: what the kernel counts as mlock'ed by this process.
uint64_t ReadVmLckBytes();

// VmHWM: the most resident memory this process has held so far.
uint64_t ReadPeakRssBytes();

}  // namespace moetier
