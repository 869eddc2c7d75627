// Seeds for randomized tests: fresh each run (fresh inputs find more), printed so that a failure
// replays. MOETIER_TEST_SEED=N fixes the seed of every test in the run.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace moetier::testing {

inline uint32_t TestSeed() {
  const char* fixed = std::getenv("MOETIER_TEST_SEED");
  const uint32_t seed = fixed != nullptr && *fixed != '\0'
                            ? static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10))
                            : std::random_device{}();
  std::fprintf(stderr, "[seed] %u (MOETIER_TEST_SEED=%u replays it)\n", seed, seed);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

}  // namespace moetier::testing
