#!/usr/bin/env bash
# Fills .gpucarry/ (ignored by git: "/.gpucarry/" in .git/info/exclude) with what
# scripts/gpu_suite.sh runs on the GPU machine, which has no package registry: bin.tar.xz holds the
# moetier binary, the test executables, bench/engine/prefetch_recall and load_bench, bench/gpu/staging_bench, draw_bench
# and boundary_bench
# of a CUDA build (configure
# it with -DMOETIER_CUDA=ON and, to build fast, -DCMAKE_CUDA_ARCHITECTURES=90 for the H200),
# stripped, and the shared libraries they need beyond the C/C++ runtime (xz: a device call carries
# at most 64 MiB with the working tree); from .devcarry/ (bench/peers/make_devcarry.sh), the
# synthetic model's writer and llama.cpp's source; and, when LLAMA_BUILD names a CUDA build of
# llama.cpp made here, its programs and libraries (llama-bin.tar.xz, ~41 MB), so the GPU machine
# need not build it; when BASE_BIN names a folder holding another build's moetier and
# kernel_bench (an earlier commit's, built here), those as base.tar.xz, for A/B runs (KERNELS=1,
# BACKENDS=cpu-batched); it warns when the whole no longer fits one device call.
# Carry ".gpucarry" in the device call.
#   scripts/make_gpucarry.sh [BUILD_DIR]   # default: build
set -euo pipefail
BUILD=$(realpath -m "${1:-build}")
cd "$(dirname "$0")/.."
[ -x "$BUILD/bin/moetier" ] || { echo "make_gpucarry.sh: no $BUILD/bin/moetier; build first" >&2; exit 2; }
grep -q MOETIER_WITH_CUDA "$BUILD/CMakeCache.txt" 2>/dev/null ||
  grep -q "MOETIER_CUDA:BOOL=ON" "$BUILD/CMakeCache.txt" ||
  { echo "make_gpucarry.sh: $BUILD is not a CUDA build (-DMOETIER_CUDA=ON)" >&2; exit 2; }
grep -qx "/.gpucarry/" .git/info/exclude || echo "/.gpucarry/" >> .git/info/exclude
rm -rf .gpucarry && mkdir -p .gpucarry
B=$(mktemp -d) && trap 'rm -rf "$B"' EXIT
mkdir -p "$B/libs" "$B/tests"
cp "$BUILD/bin/moetier" "$B/" && strip "$B/moetier"
# The device-time profiler (bench/gpu/kernel_profile.cpp), when built.
P=$BUILD/bench/gpu/libmoetier_kernel_profile.so
[ -f "$P" ] && cp "$P" "$B/libs/"
for t in "$BUILD"/tests/*/*_tests "$BUILD"/tests/kernels/cuda/*_tests; do
  [ -x "$t" ] && cp "$t" "$B/tests/" && strip "$B/tests/$(basename "$t")"
done
# Benchmark executables run there beside the CLI, when built.
BENCHES=()
for b in bench/engine/prefetch_recall bench/engine/load_bench bench/gpu/staging_bench bench/gpu/draw_bench \
  bench/gpu/boundary_bench bench/kernels/kernel_bench; do
  [ -x "$BUILD/$b" ] || continue
  cp "$BUILD/$b" "$B/" && strip "$B/$(basename "$b")" && BENCHES+=("$(basename "$b")")
done
for f in "$B/moetier" "$B"/tests/* "${BENCHES[@]/#/$B/}"; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}' |
    grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
    grep -v '/usr/local/cuda' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$B/libs/"; done
echo "make_gpucarry.sh: compressing (about a minute)" >&2
tar -C "$B" -cf - moetier tests libs "${BENCHES[@]}" | xz -9 -T2 > .gpucarry/bin.tar.xz
if [ -n "${BASE_BIN:-}" ]; then
  mkdir -p "$B/base" && cp "$BASE_BIN/moetier" "$BASE_BIN/kernel_bench" "$B/base/" && strip "$B"/base/*
  tar -C "$B" -cf - base | xz -9 -T2 > .gpucarry/base.tar.xz
fi
if [ -n "${LLAMA_BUILD:-}" ]; then
  L=$(realpath "$LLAMA_BUILD")/bin
  [ -x "$L/llama-bench" ] || { echo "make_gpucarry.sh: no $L/llama-bench (LLAMA_BUILD)" >&2; exit 2; }
  mkdir -p "$B/llama" && cp "$L"/llama-bench "$L"/llama-batched-bench "$L"/llama-quantize "$B/llama/"
  # Each library once, under the name the programs load (plain .so files and the .so.N links).
  find "$(dirname "$L")" \( \( -name '*.so' -type f \) -o -name '*.so.[0-9]' \) \
    -exec cp -L {} "$B/llama/" \;
  strip "$B"/llama/* 2>/dev/null || true
  tar -C "$B" -cf - llama | xz -9 -T2 > .gpucarry/llama-bin.tar.xz
fi
# For SYNTH=1 (the synthetic model and llama.cpp on the GPU machine): what make_devcarry.sh keeps;
# with llama.cpp's programs carried, of its source only gguf-py (the synthetic model's writer).
for f in synth_model.py template-meta.gguf.xz llama-src.tar.xz; do
  [ -f ".devcarry/$f" ] && cp ".devcarry/$f" .gpucarry/
done
if [ -n "${LLAMA_BUILD:-}" ] && [ -f .devcarry/llama-src.tar.xz ]; then
  mkdir -p "$B/src" && xz -dc .devcarry/llama-src.tar.xz | tar -C "$B/src" -xf - ./gguf-py
  tar -C "$B/src" -cf - . | xz -9 -T2 > .gpucarry/llama-src.tar.xz
fi
du -sh .gpucarry
# A device call carries at most 64 MiB: the working tree (tracked and untracked files git does
# not ignore) and .gpucarry together.
TREE=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
CARRY=$(du -sb .gpucarry | cut -f1)
if [ $((TREE + CARRY)) -gt $((64 * 1024 * 1024)) ]; then
  echo "make_gpucarry.sh: the working tree ($((TREE >> 20)) MiB) and .gpucarry ($((CARRY >> 20)) MiB)" \
    "exceed a device call's 64 MiB; without LLAMA_BUILD, gpu_suite.sh builds llama.cpp there" >&2
fi
