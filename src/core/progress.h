// A progress line on stderr for long loads and conversions: redrawn in place on a terminal,
// a line every 10% otherwise (logs stay short). Silent at LogLevel::kQuiet.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace moetier {

// Told every Progress's label and fraction done (0 to 1) on each Update, whatever the log level,
// on the updating thread: how a front end reports a load elsewhere (the server's /health).
// One per process; an empty function removes it.
using ProgressObserver = std::function<void(const std::string& label, double fraction)>;
void SetProgressObserver(ProgressObserver observer);

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes);
  ~Progress();  // finishes the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Update(uint64_t done_bytes, const std::string& detail = "");
  void Finish();

 private:
  std::string label_;
  uint64_t total_;
  bool tty_;
  bool finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
  uint64_t done_ = 0;
};

}  // namespace moetier
