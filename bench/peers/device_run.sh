#!/usr/bin/env bash
# On the GPU machine (no package registry): builds llama.cpp from a carried source tarball,
# writes the synthetic model, converts and quantizes it, then runs bench/peers/compare_llama.sh.
# Expects in .devcarry/ (bench/peers/make_devcarry.sh fills it): moetier (built here, Release),
# libs/ (its shared libraries), llama-src.tar.xz, template-meta.gguf.xz (the fixture GGUF's
# metadata, no tensors), synth_model.py.
#   bench/peers/device_run.sh prep    # build + models (call 1)
#   bench/peers/device_run.sh bench   # measurements (call 2, same machine)
#   bench/peers/device_run.sh rounds  # prep, then rounds until BUDGET_S (default 420) seconds
#                                     # after the start; each round's summary is appended to
#                                     # $OUT/summaries.md, everything else to $OUT/rounds.tgz
#                                     # (a call brings back few files)
# DTYPES="q4_0" (default "bf16 q8_0 q4_0") limits every phase to those dtypes.
set -euo pipefail
PHASE=${1:-all}
START=$(date +%s)
REPO=$PWD
W=${DEVICE_WORK:-/tmp/moetier-peers}
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=$REPO/.devcarry/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MT=$REPO/.devcarry/moetier
T=${THREADS:-$(nproc)}
DTYPES=${DTYPES:-bf16 q8_0 q4_0}
mkdir -p "$W" "$OUT"
LB=$W/llama/b/bin
# Where prep's logs go: $OUT, except in the rounds phase, which keeps them with the rounds (in
# rounds.tgz) so that the few files a call brings back are its summaries.
PREP_LOGS=$OUT
[ "$PHASE" = rounds ] && PREP_LOGS=$W/rounds/prep && mkdir -p "$PREP_LOGS"
if [ "$PHASE" != bench ]; then
  { nproc; lscpu || cat /proc/cpuinfo | head -30; free -g; df -h "$W"; } > "$PREP_LOGS/machine.txt" 2>&1 || true
  "$MT" --help > /dev/null
  if [ ! -x "$LB/llama-bench" ]; then
    # Python's tarfile/lzma, in case the image has no xz.
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      .devcarry/llama-src.tar.xz "$W/llama"
    (cd "$W/llama" && cmake -S . -B b -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON > "$PREP_LOGS/llama-cmake.log" 2>&1 &&
     cmake --build b -j"$(nproc)" --target llama-bench llama-quantize > "$PREP_LOGS/llama-build.log" 2>&1) &
    BUILD_PID=$!
  fi
  if [ ! -f "$W/q3moe-8L-hf/model.safetensors.done" ]; then
    python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
      .devcarry/template-meta.gguf.xz "$W/template.gguf"
    GGUF_PY=$W/llama/gguf-py python3 .devcarry/synth_model.py "$W/template.gguf" "$W/q3moe-8L" --layers 8 \
      --hf-dir "$W/q3moe-8L-hf" --tokenizer-dir tests/fixtures/hf/realvocab/qwen3_moe_tiny
    touch "$W/q3moe-8L-hf/model.safetensors.done"
  fi
  [ -n "${BUILD_PID:-}" ] && wait "$BUILD_PID"
  PREPARE_ONLY=1 bench/peers/compare_llama.sh --moetier "$MT" --llama-bin "$LB" --work "$W" --out "$PREP_LOGS" --threads "$T" \
    --dtypes "$DTYPES"
  df -h "$W" >> "$PREP_LOGS/machine.txt"
  [ "$PREP_LOGS" = "$OUT" ] || cp "$PREP_LOGS/machine.txt" "$OUT/"
fi
# The models just written (tens of GB) are still being written back to disk for a while; rounds
# measured meanwhile ran moetier at 33-37 % of the read bandwidth on a fresh VM (docs/
# benchmarks.md, rounds 51-52). Wait for the writeback before measuring (NO_SYNC=1 skips it, to
# study that state).
[ "${NO_SYNC:-0}" = 1 ] || sync
if [ "$PHASE" = rounds ]; then
  # Rounds of ~35 s each on the 16-core Xeon; the call must end inside the device's 600 s.
  BUDGET_S=${BUDGET_S:-420}
  n=0
  while [ $(( $(date +%s) - START )) -lt "$BUDGET_S" ]; do
    n=$((n + 1))
    R=$W/rounds/r$n
    mkdir -p "$R"
    bench/peers/compare_llama.sh --moetier "$MT" --llama-bin "$LB" --work "$W" --out "$R" --threads "$T" \
      --dtypes "$DTYPES" > "$R/compare.log" 2>&1 || tail -20 "$R/compare.log" >&2
    { echo "round $n ($(( $(date +%s) - START )) s after the start)"; cat "$R/summary.md" 2>/dev/null; echo; } |
      tee -a "$OUT/summaries.md"
  done
  tar -C "$W" -czf "$OUT/rounds.tgz" rounds
elif [ "$PHASE" != prep ]; then
  bench/peers/compare_llama.sh --moetier "$MT" --llama-bin "$LB" --work "$W" --out "$OUT" --threads "$T" \
    --dtypes "$DTYPES"
fi
