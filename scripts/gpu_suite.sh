#!/usr/bin/env bash
# The GPU test suite, on the GPU machine in one call, from .gpucarry/ (scripts/make_gpucarry.sh):
# every CUDA kernel test, the model tests (the GPU backend against the Hugging Face references),
# the engine tests, pinned banks read through device pointers, and `moetier logits` on each
# fixture, GPU against CPU. Logs under $OUT (summary.txt first); exit status: failures.
#   scripts/gpu_suite.sh             # tests
#   SYNTH=1 scripts/gpu_suite.sh     # then the synthetic Qwen3-30B-A3B-shaped 8-layer model (bf16
#                                    # and q4_0 banks) and `moetier bench` on it with the gpu,
#                                    # offload (smallest expert cache) and cpu backends;
#                                    # with LLAMA=1 also llama.cpp built for CUDA and llama-bench
#                                    # -ngl 99 (and -ncmoe 8, offload's peer) on the same weights
#   TESTS=0 skips the tests.
set -u
cd "$(dirname "$0")/.."
C=$PWD/.gpucarry
OUT=${OUT:-/tmp/gpu-suite}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$C/libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The tests find their fixtures where this repository was built (/work/main); point that here.
if [ ! -e /work/main/tests/fixtures ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
export MOETIER_CLI=$C/moetier
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$S" 2>&1
FAILED=0
W=/tmp/gpu-work
mkdir -p "$W"
if [ "${SYNTH:-0}" = 1 ] && [ "${LLAMA:-0}" = 1 ]; then
  # llama.cpp for CUDA builds meanwhile (minutes); only llama-bench and llama-quantize.
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$C/llama-src.tar.xz" "$W/llama"
  (cd "$W/llama" && cmake -S . -B b -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
     > "$OUT/llama-cmake.log" 2>&1 &&
   cmake --build b -j"$(nproc)" --target llama-bench llama-quantize > "$OUT/llama-build.log" 2>&1) &
  LLAMA_PID=$!
fi
[ "${TESTS:-1}" = 1 ] && for t in "$C"/tests/*_tests; do
  name=$(basename "$t")
  "$t" --gtest_brief=1 > "$OUT/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
  echo "$name: exit $rc, $(grep -c '^\[  PASSED\|OK \]' "$OUT/$name.log") ok, \
$(grep -c '^\[  FAILED  \]' "$OUT/$name.log") failed lines, \
$(grep -c 'SKIPPED' "$OUT/$name.log") skipped" >> "$S"
  grep -E '^\[  FAILED  \]' "$OUT/$name.log" | head -20 >> "$S"
done
[ "${TESTS:-1}" = 1 ] && for m in qwen3_moe mixtral; do
  M=tests/fixtures/hf/$m
  "$C/moetier" logits --model "$M" --tokens 3,17,42,7,99 --out "$OUT/$m-cpu.bin" --moe-backend cpu \
    --no-gpu 2>> "$OUT/logits.log"
  "$C/moetier" logits --model "$M" --tokens 3,17,42,7,99 --out "$OUT/$m-cpu_gpu_dense.bin" \
    --moe-backend cpu 2>> "$OUT/logits.log"
  "$C/moetier" logits --model "$M" --tokens 3,17,42,7,99 --out "$OUT/$m-gpu.bin" --moe-backend gpu \
    --report "$OUT/$m-gpu-report.json" 2>> "$OUT/logits.log"
  "$C/moetier" logits --model "$M" --tokens 3,17,42,7,99 --out "$OUT/$m-offload.bin" \
    --moe-backend offload --moe-cpu-layers 1 --report "$OUT/$m-offload-report.json" 2>> "$OUT/logits.log"
  for be in gpu offload cpu_gpu_dense; do
  python3 - "$OUT/$m-cpu.bin" "$OUT/$m-$be.bin" "$m $be" >> "$S" 2>&1 <<'PY'
import struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
x = struct.unpack(f"{len(a)//4}f", a); y = struct.unpack(f"{len(b)//4}f", b)
if len(x) != len(y) or not x:
    print(sys.argv[3], "logits: sizes differ", len(x), len(y)); sys.exit(0)
m = max(abs(v) for v in x); d = max(abs(p - q) for p, q in zip(x, y))
print(f"{sys.argv[3]} logits vs cpu: max |diff| {d:.3g}, max |cpu| {m:.3g}, ratio {d / m:.2e}")
PY
  done
done
if [ "${SYNTH:-0}" = 1 ]; then
  [ -d "$W/llama/gguf-py" ] || python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$C/llama-src.tar.xz" "$W/llama"
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
    "$C/template-meta.gguf.xz" "$W/template.gguf"
  GGUF_PY=$W/llama/gguf-py python3 "$C/synth_model.py" "$W/template.gguf" "$W/q3moe-8L" --layers 8 \
    --hf-dir "$W/q3moe-8L-hf" --tokenizer-dir tests/fixtures/hf/realvocab/qwen3_moe_tiny \
    > "$OUT/synth.log" 2>&1
  "$C/moetier" convert -m "$W/q3moe-8L-hf" -o "$W/bank-bf16" --overwrite 2>> "$OUT/synth.log"
  "$C/moetier" convert -m "$W/bank-bf16" -o "$W/bank-q4_0" --dtype q4_0 --dense-dtype q4_0 \
    --overwrite 2>> "$OUT/synth.log"
  # offload: every expert pinned in host memory, the cache at its minimum (one layer's 128
  # experts: 1.21 GB bf16, 0.34 GB q4_0), so nearly every active expert is copied each step.
  declare -A MIN_CACHE=([bf16]=1.22 [q4_0]=0.35)
  for dt in bf16 q4_0; do
    # cpu: dense on the GPU, every expert on the CPU executor; cpu-only: --no-gpu.
    for be in gpu offload cpu cpu-only; do
      extra=()
      [ $be = offload ] && extra=(--moe-cpu-layers 0 --moe-cache-gb "${MIN_CACHE[$dt]}" --moe-collect-stats)
      [ $be = cpu-only ] && extra=(--no-gpu)
      "$C/moetier" bench --model "$W/bank-$dt" --moe-backend "${be%-only}" --json --repeats 3 "${extra[@]}" \
        > "$OUT/bench-$dt-$be.json" 2> "$OUT/bench-$dt-$be.log"
      echo "bench $dt $be: exit $?: $(tr -d '\n' < "$OUT/bench-$dt-$be.json" | head -c 900)" >> "$S"
    done
  done
  if [ -n "${LLAMA_PID:-}" ]; then
    wait "$LLAMA_PID"
    LB=$W/llama/b/bin
    "$LB/llama-quantize" --pure "$W/q3moe-8L.gguf" "$W/q3moe-8L-q4_0.gguf" Q4_0 > "$OUT/quantize.log" 2>&1
    for g in q3moe-8L q3moe-8L-q4_0; do
      "$LB/llama-bench" -m "$W/$g.gguf" -ngl 99 -p 512 -n 128 -r 3 -o md >> "$OUT/llama-bench.md" 2>&1
      # The peer of offload: every expert on the CPU (-ncmoe 8), mmap'd and not.
      for mmp in 1 0; do
        "$LB/llama-bench" -m "$W/$g.gguf" -ngl 99 -ncmoe 8 -mmp $mmp -p 512 -n 128 -r 3 -o md \
          >> "$OUT/llama-bench.md" 2>&1
      done
    done
    cat "$OUT/llama-bench.md" >> "$S"
  fi
fi
echo "failed test executables: $FAILED" >> "$S"
cat "$S"
exit "$FAILED"
