// A stream that waits for the host: a one-thread kernel polls a flag in mapped pinned memory
// (HostFlag) until the host has published a value, so work queued after it on the stream runs
// once the host's side is done — without a host callback or a synchronization per wait, and
// with the host free to queue more work meanwhile. A watchdog ends the wait after a timeout
// and records it, so a host side that never answers becomes an error, not a hang.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace moetier::cuda {

class HostFlag {
 public:
  // Mapped pinned memory for the flag and the watchdog's record; fails (naming what) when the
  // device cannot map host memory.
  static Expected<HostFlag> Create();
  HostFlag() = default;
  ~HostFlag();
  HostFlag(HostFlag&& o) noexcept;
  HostFlag& operator=(HostFlag&& o) noexcept;
  HostFlag(const HostFlag&) = delete;
  HostFlag& operator=(const HostFlag&) = delete;

  // The next value to wait for (each wait takes a new one).
  uint32_t Next() { return ++issued_; }
  // Queues on `stream` a wait until the flag reaches `value` (wrap-around safe), for at most
  // timeout_ms; a timed-out wait records itself (TimedOut) and lets the stream go on.
  void QueueWait(uint32_t value, uint32_t timeout_ms, cudaStream_t stream) const;
  // The host's side: publishes `value` (release: every write before it is visible to the
  // device, and to copies queued after the wait, once the wait returns).
  void Publish(uint32_t value) const;
  // Whether a wait timed out since the last Clear (read after the stream synchronized).
  bool TimedOut() const;
  void Clear() const;

 private:
  uint32_t* host_ = nullptr;  // [0]: the flag (host writes), [1]: timed out (device writes)
  uint32_t* device_ = nullptr;
  uint32_t issued_ = 0;
};

}  // namespace moetier::cuda
