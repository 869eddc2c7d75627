// The progress observer: what the server's /health reports while a model loads.
#include "core/progress.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace moetier {
namespace {

TEST(ProgressObserver, SeesEveryUpdateUntilRemoved) {
  std::vector<std::pair<std::string, double>> seen;
  SetProgressObserver([&](const std::string& label, double f) { seen.emplace_back(label, f); });
  {
    Progress p("loading", 200);
    p.Update(50);
    p.Update(200);
  }
  Progress empty("nothing", 0);  // no total: no fraction to tell
  empty.Update(0);
  SetProgressObserver(nullptr);
  Progress later("later", 10);
  later.Update(5);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, "loading");
  EXPECT_DOUBLE_EQ(seen[0].second, 0.25);
  EXPECT_DOUBLE_EQ(seen[1].second, 1.0);
}

}  // namespace
}  // namespace moetier
