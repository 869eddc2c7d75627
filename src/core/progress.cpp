#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "core/log.h"

namespace moetier {

namespace {

std::mutex observer_mu;
ProgressObserver& Observer() {
  static ProgressObserver observer;
  return observer;
}

void Notify(const std::string& label, double fraction) {
  std::lock_guard<std::mutex> lock(observer_mu);
  if (Observer()) Observer()(label, fraction);
}

}  // namespace

void SetProgressObserver(ProgressObserver observer) {
  std::lock_guard<std::mutex> lock(observer_mu);
  Observer() = std::move(observer);
}

Progress::Progress(std::string label, uint64_t total_bytes)
    : label_(std::move(label)),
      total_(total_bytes),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  Finish();
}

void Progress::Update(uint64_t done, const std::string& detail) {
  done_ = done;
  if (total_ > 0) Notify(label_, static_cast<double>(done) / static_cast<double>(total_));
  if (GetLogLevel() < LogLevel::kInfo || total_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const double gbps = secs > 0 ? static_cast<double>(done) / 1e9 / secs : 0.0;
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total_) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r%s [%s] %3.0f%%  %.2f/%.2f GB  %.2f GB/s %s\x1b[K", label_.c_str(),
                 bar.c_str(), frac * 100, static_cast<double>(done) / 1e9,
                 static_cast<double>(total_) / 1e9, gbps, detail.c_str());
  } else {
    // In a log, progress of a short load is noise; a line every 10% only for big jobs.
    constexpr uint64_t kLogThresholdBytes = 1ull << 30;
    if (total_ < kLogThresholdBytes) return;
    const int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s: %3d%%  %.2f/%.2f GB  %.2f GB/s %s\n", label_.c_str(), decile * 10,
                 static_cast<double>(done) / 1e9, static_cast<double>(total_) / 1e9, gbps,
                 detail.c_str());
  }
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && GetLogLevel() >= LogLevel::kInfo && total_ > 0) std::fprintf(stderr, "\n");
}

}  // namespace moetier
