// The MOETIER_* knobs (core/tuning.h): parsed typed and validated, a bad value an error naming
// the variable, and CheckEnvironment warning of a MOETIER_* name that moetier does not read.
#include "core/tuning.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

namespace moetier {
namespace {

Expected<TuningKnobs> ParseFrom(const std::map<std::string, std::string>& env) {
  return ParseTuningKnobs([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Tuning, UnsetAndEmptyKnobsKeepTheDefault) {
  const Expected<TuningKnobs> k = ParseFrom({{"MOETIER_IO_THREADS", ""}});
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_FALSE(k->io_threads.has_value());
  EXPECT_FALSE(k->device_draws.has_value());
}

TEST(Tuning, AKnobTakesAnIntegerInItsRange) {
  const Expected<TuningKnobs> k =
      ParseFrom({{"MOETIER_IO_THREADS", "16"}, {"MOETIER_DEVICE_DRAWS", "0"}});
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ(k->io_threads, 16);
  EXPECT_EQ(k->device_draws, 0);
}

TEST(Tuning, ABadValueIsAnErrorNamingTheVariableAndRange) {
  for (const std::string bad : {"8x", "abc", " 8", "0", "65"}) {
    const Expected<TuningKnobs> k = ParseFrom({{"MOETIER_IO_THREADS", bad}});
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_NE(k.status().message().find("MOETIER_IO_THREADS"), std::string::npos)
        << k.status().message();
    EXPECT_NE(k.status().message().find("1..64"), std::string::npos) << k.status().message();
  }
}

TEST(Tuning, EveryKnobIsNamedOnceWithARange) {
  std::set<std::string_view> names;
  for (const TuningKnobSpec& s : kTuningKnobSpecs) {
    EXPECT_EQ(s.name.substr(0, 8), "MOETIER_") << s.name;
    EXPECT_LE(s.min, s.max) << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
  }
  for (std::string_view n : kOtherEnvironmentVariables) {
    EXPECT_EQ(n.substr(0, 8), "MOETIER_") << n;
    EXPECT_TRUE(names.insert(n).second) << n;
  }
}

// The process's own environment: a misspelt knob is a warning naming it; the test-only and
// feature variables are known; a malformed knob is an error.
TEST(Tuning, CheckEnvironmentWarnsOfUnknownNamesOnly) {
  ASSERT_EQ(setenv("MOETIER_IO_THREAD", "8", 1), 0);
  ASSERT_EQ(setenv("MOETIER_CLI", "/bin/true", 1), 0);
  Expected<std::vector<std::string>> w = CheckEnvironment();
  ASSERT_TRUE(w.ok()) << w.status().message();
  int misspelt = 0;
  for (const std::string& line : *w) {
    EXPECT_EQ(line.find("MOETIER_CLI"), std::string::npos) << line;
    misspelt += line.find("MOETIER_IO_THREAD ") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(misspelt, 1);
  ASSERT_EQ(setenv("MOETIER_IO_THREADS", "many", 1), 0);
  w = CheckEnvironment();
  EXPECT_FALSE(w.ok());
  if (!w.ok()) {
    EXPECT_NE(w.status().message().find("MOETIER_IO_THREADS"), std::string::npos);
  }
  unsetenv("MOETIER_IO_THREAD");
  unsetenv("MOETIER_IO_THREADS");
  unsetenv("MOETIER_CLI");
}

}  // namespace
}  // namespace moetier
