// Stop strings in streamed text: text that may be the beginning of a stop string is held back
// until it is known not to be, and the text ends just before the first stop string.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moetier {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns what is now safe to emit. After a stop string, stopped() is true and the
  // returned text ends just before it.
  std::string Push(std::string_view piece);
  std::string Flush();
  bool stopped() const { return stopped_; }
  // The stop string that ended the text (the earliest in it; of two at the same place, the one
  // listed first), empty before.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace moetier
