// GPU tests run only where a CUDA device is present; elsewhere they skip and say so (CI has no
// GPU). Use MT_REQUIRE_GPU() as a test's first statement.
#pragma once

#include <gtest/gtest.h>

#ifdef MOETIER_WITH_CUDA
#include "kernels/cuda/cuda_check.h"
#define MT_REQUIRE_GPU()                                                    \
  do {                                                                      \
    if (!::moetier::cuda::DeviceAvailable())                                \
      GTEST_SKIP() << "skipped: no CUDA device on this machine (GPU test)"; \
  } while (0)
#else
#define MT_REQUIRE_GPU() GTEST_SKIP() << "skipped: built without CUDA (GPU test)"
#endif
