#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the Release build, the ASan+UBSan build, and a
# short libFuzzer run of every fuzz target. Usage: bash scripts/test.sh
#   MOETIER_SKIP_SANITIZE=1   skip the ASan+UBSan build
#   MOETIER_FUZZ_SECONDS=N    seconds per fuzz target (default 20; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
JOBS=$(nproc)

echo "== Release build and tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
(cd build && ctest -j"$JOBS" --output-on-failure)

if [ "${MOETIER_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== ASan+UBSan build and tests"
  # -O1 (what the sanitizers' authors advise): the ISA kernels' instrumented -O2 builds alone
  # took minutes each. No CUDA: CI has no GPU, and the Release build compiles it.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g -DNDEBUG" \
    -DMOETIER_SANITIZE=ON -DMOETIER_BENCH=OFF -DMOETIER_CUDA=OFF >/dev/null
  cmake --build build-asan -j"$JOBS"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest -j"$JOBS" --output-on-failure)
fi

FUZZ_SECONDS=${MOETIER_FUZZ_SECONDS:-20}
if [ "$FUZZ_SECONDS" != 0 ]; then
  echo "== libFuzzer: ${FUZZ_SECONDS}s per target"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DMOETIER_FUZZ=ON -DMOETIER_TESTS=OFF -DMOETIER_BENCH=OFF \
    -DMOETIER_CUDA=OFF >/dev/null
  targets=$(for f in fuzz/*_fuzz.cpp; do basename "$f" .cpp; done)
  # shellcheck disable=SC2086  # one target per word
  cmake --build build-fuzz -j"$JOBS" --target $targets
  for bin in build-fuzz/fuzz/*_fuzz; do
    name=$(basename "$bin" _fuzz)
    work=$(mktemp -d)
    cp -r "fuzz/corpus/$name/." "$work/" 2>/dev/null || true
    "$bin" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=10 -print_final_stats=0 "$work" \
      2>"$work.log" || { tail -40 "$work.log"; echo "fuzz target $name failed"; exit 1; }
    echo "fuzz $name: no crash in ${FUZZ_SECONDS}s ($(ls "$work" | wc -l) corpus inputs)"
    rm -rf "$work" "$work.log"
  done
fi
echo "== all tests passed"
