#include "engine/stop_strings.h"

#include <algorithm>

namespace moetier {

std::string StopStringFilter::Push(std::string_view piece) {
  if (stopped_) return "";
  pending_.append(piece);
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::Flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  return out;
}

}  // namespace moetier
