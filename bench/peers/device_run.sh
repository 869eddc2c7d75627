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
#   bench/peers/device_run.sh batched # prep, then bench/peers/compare_llama_batched.sh per dtype
#                                     # (many sequences: moetier bench --parallel N against
#                                     # llama-batched-bench, N in PARALLEL, default 1,4,16,64,
#                                     # REPEATS runs, default 3); tables appended to
#                                     # $OUT/batched-summary.md and .jsonl, the rest in
#                                     # $OUT/batched.tgz. LLAMA_ONLY=1: llama.cpp's half alone.
# DTYPES="q4_0" (default "bf16 q8_0 q4_0"; "bf16 q4_0" for batched) limits every phase to those
# dtypes.
set -euo pipefail
PHASE=${1:-all}
START=$(date +%s)
REPO=$PWD
W=${DEVICE_WORK:-/tmp/moetier-peers}
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=$REPO/.devcarry/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MT=$REPO/.devcarry/moetier
T=${THREADS:-$(nproc)}
if [ "$PHASE" = batched ]; then DTYPES=${DTYPES:-bf16 q4_0}; else DTYPES=${DTYPES:-bf16 q8_0 q4_0}; fi
mkdir -p "$W" "$OUT"
LB=$W/llama/b/bin
LLAMA_TARGETS=(llama-bench llama-quantize)
[ "$PHASE" = batched ] && LLAMA_TARGETS+=(llama-batched-bench)
# Where prep's logs go: $OUT, except in the rounds and batched phases, which keep them with their
# results (in rounds.tgz, batched.tgz) so that the few files a call brings back are its summaries.
PREP_LOGS=$OUT
case $PHASE in rounds|batched) PREP_LOGS=$W/$PHASE/prep && mkdir -p "$PREP_LOGS" ;; esac
if [ "$PHASE" != bench ]; then
  { nproc; lscpu || cat /proc/cpuinfo | head -30; free -g; df -h "$W"; } > "$PREP_LOGS/machine.txt" 2>&1 || true
  "$MT" --help > /dev/null
  MISSING=0
  for t in "${LLAMA_TARGETS[@]}"; do [ -x "$LB/$t" ] || MISSING=1; done
  if [ "$MISSING" = 1 ]; then
    # Python's tarfile/lzma, in case the image has no xz.
    [ -f "$W/llama/CMakeLists.txt" ] ||
      python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
        .devcarry/llama-src.tar.xz "$W/llama"
    (cd "$W/llama" && cmake -S . -B b -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON > "$PREP_LOGS/llama-cmake.log" 2>&1 &&
     cmake --build b -j"$(nproc)" --target "${LLAMA_TARGETS[@]}" > "$PREP_LOGS/llama-build.log" 2>&1) &
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
# benchmarks.md, "Noise"). Wait for the writeback before measuring (NO_SYNC=1 skips it, to
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
    { echo "round $n ($(( $(date +%s) - START )) s after the start)"; cat "$R/summary.md" 2>/dev/null || true; echo; } |
      tee -a "$OUT/summaries.md"
  done
  tar -C "$W" -czf "$OUT/rounds.tgz" rounds
elif [ "$PHASE" = batched ]; then
  # Many sequences on the CPU (the GPU unused), one dtype after the other, on the models prep made.
  for dt in $DTYPES; do
    # compare_llama.sh's names (bf16c is bf16's values packed: llama.cpp runs the bf16 GGUF)
    case $dt in bf16|bf16c) G=$W/q3moe-8L.gguf ;; *) G=$W/q3moe-8L-$dt.gguf ;; esac
    R=$W/batched/$dt
    rc=0
    bench/peers/compare_llama_batched.sh --moetier "$MT" --llama-bin "$LB" --gguf "$G" --model "$W/bank-$dt" \
      --out "$R" --threads "$T" --parallel "${PARALLEL:-1,4,16,64}" --repeats "${REPEATS:-3}" --label "$dt" \
      > "$W/batched/$dt.log" 2>&1 || rc=$?
    { echo "$dt (exit $rc, $(( $(date +%s) - START )) s after the start)"; cat "$R/summary.md" 2>/dev/null || true;
      grep '^compare_llama_batched.sh:' "$W/batched/$dt.log" || true; echo; } | tee -a "$OUT/batched-summary.md"
    cat "$R/summary.jsonl" >> "$OUT/batched-summary.jsonl" 2>/dev/null || true
  done
  tar -C "$W" -czf "$OUT/batched.tgz" batched
elif [ "$PHASE" != prep ]; then
  bench/peers/compare_llama.sh --moetier "$MT" --llama-bin "$LB" --work "$W" --out "$OUT" --threads "$T" \
    --dtypes "$DTYPES"
fi
