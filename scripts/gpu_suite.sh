#!/usr/bin/env bash
# The GPU test suite, on the GPU machine in one call, from .gpucarry/ (scripts/make_gpucarry.sh):
# the CUDA kernel tests, the model tests (the GPU backends against the Hugging Face references),
# the engine, experts and CLI tests, and `moetier logits` on each fixture, GPU against CPU.
# summary.txt and logs.tar.gz (every log) land in $OUT: a device call brings back 8 files at most.
# Exit status: the number of failed test executables.
#   scripts/gpu_suite.sh             # tests
#   SYNTH=1 scripts/gpu_suite.sh     # then the synthetic Qwen3-30B-A3B-shaped 8-layer model (bf16
#                                    # and q4_0 banks) and `moetier bench` on it with the gpu,
#                                    # offload (smallest expert cache) and cpu backends;
#                                    # with LLAMA=1 also llama-bench -ngl 99 (and -ncmoe 8,
#                                    # offload's peer) on the same weights, from llama-bin.tar.xz
#                                    # when carried, else built here from source (minutes)
#   PPL=1 (with LLAMA=1) measures perplexity over README.md and docs/*.md on the same weights:
#   `moetier perplexity` (gpu) against llama-perplexity -ngl 99, --ctx / -c 512, PPL_CHUNKS
#   windows (8);
#   TESTS=0 skips the tests; DTYPES="q4_0" limits the synthetic dtypes; BACKENDS="gpu offload"
#   limits the backends benched (gpu: also without CUDA graphs, and at 4 and 16 sequences;
#   BACKENDS=none: none; also offload-decode: offload's decode at 1,
#   4 and 16 sequences, and hybrid: the same, with half the banks pinned, and --profile, both
#   after llama.cpp's build as they use the CPU); CROSS=1 adds offload prefill at 32-256
#   tokens (CROSS_SIZES="512 1024": those) streamed and not (the crossover); LOAD=1 times a load with every bank pinned against a raw read
#   (LOAD_STREAMS="4x8,16x8": first the banks alone read so, THREADSxCHUNK_MIB, by bench/engine/load_bench)
#   (LOAD_ROUNDS times, under each of LOAD_ENVS, its log lines stamped);
#   PROFILE="bf16 q4_0" times every kernel of a gpu decode run per dtype, without PDL
#   (bench/gpu/kernel_profile.cpp; the top rows in the summary, then each kernel's share of the
#   wall time; PROFILE_PDL=1 keeps PDL on, PROFILE_N=1 one sequence only, PROFILE_ATTN=0 skips the attention-splits rerun);
#   NCU="q4_0" reads hardware counters of a decode step's kernels with Nsight Compute
#   (NCU_KERNELS: a regex of kernel names, NCU_SKIP / NCU_COUNT: launches of them);
#   PROFILE_PREFILL="q4_0" the
#   same for a 512-token prefill; EXPERT_TIMING=1 runs the expert kernels' timing test (ms by
#   path and tokens: the prefill crossover) and bf16c's expansion's; BACKENDS=gpu1: gpu's first row alone;
#   BACKENDS=gpu-gemv: decode at 1 and 4 sequences with the tiled expert kernels alone
#   (MOETIER_CUDA_GEMV_ASSIGN=0) and with the one-warp-a-row ones up to 4 tokens (32); BACKENDS=gpu-sampled: gpu decode greedy and sampled (the GPU's top-k candidates; top-p alone and temperature alone drawn on the GPU, and on the host), 1 and 16 sequences;
#   RECALL=1 measures the prefetch predictor's recall on the synthetic bf16 model
#   (bench/engine/prefetch_recall); STAGING=1 runs bench/gpu/staging_bench; DRAWS=1 bench/gpu/draw_bench
#   (device time of the top-k and of the device draw, at DRAW_SLICES slices a row) and the draw's
#   Nsight Compute rows (DRAW_NCU_KERNELS: a regex of kernel names, DRAW_NCU_COUNT launches);
#   BOUNDARY=1 runs bench/gpu/boundary_bench (a dependency between phases as a kernel boundary
#   in a graph, with and without PDL, and as a grid barrier in a persistent kernel; BOUNDARY_ARGS);
#   BACKENDS=staged:
#   prefill of 4,096 tokens with every expert locked (--moe-backend cpu) on the CPU executor,
#   staged to the GPU, and as measured (bf16 with --weight-packing none: bf16c is CPU-only);
#   BACKENDS=hybrid-ab: hybrid decode with and without recorded graph segments at a fixed split;
#   BACKENDS=hybrid-evict: the expert cache's eviction rules (MOETIER_CACHE_LRU) side by side;
#   BACKENDS=halfpin: hybrid with half the banks pinned, recorded and profiled, and cpu profiled;
#   BACKENDS=hybrid16: hybrid at 16 sequences twice and at 4 (the smallest cache);
#   BACKENDS=cpu-batched: the CPU alone (--no-gpu) at 4 and 16 sequences (CPU_PAR), with AMX
#   batches on and off, and with the carried base build (make_gpucarry.sh's BASE_BIN) when there
#   (CPU_VARIANTS="new noamx base" picks), with LLAMA=1 beside llama-batched-bench on the CPU;
#   LLAMA_GPU=0 skips llama-bench's everything-on-the-GPU run;
#   KERNELS=1: kernel_bench on the Xeon first, this build's and the base build's, interleaved;
#   BACKENDS=offload-packed: offload with pinned banks as stored and as bf16c (MOETIER_PACK_PINNED),
#   prefill 4096 and decode at 1 and 16 sequences, interleaved ROUNDS times;
#   BACKENDS=hybrid-threads: hybrid at 1, 16 and 4 sequences under the CPU-thread variants
#   HYBRID_VARIANTS (the mode's comment says which), interleaved;
#   BACKENDS=gpu-ab: all-VRAM decode with PDL, the weight prefetch and the fused launches on and
#   off, and attention splits of 16 and 32 positions (MOETIER_CUDA_ATTN_CHUNK), twice (GPU_AB
#   picks the variants);
#   BACKENDS=gpu-env: one sequence's all-VRAM decode under each of GPU_ENVS (default the norm
#   fusion on and off: MOETIER_CUDA_NORM_FUSE; "base" the carried base build), ROUNDS (2) rounds
#   interleaved, after llama.cpp's build;
#   KVTIER=1 times a 4,000-token prefix's second request after a filler evicted it from VRAM,
#   with and without the host KV tier (bench/engine/prefix_ttft.sh), gpu and hybrid
#   (KVTIER_DTYPES: which dtypes, default DTYPES);
#   LLAMA_P4096=0 skips llama.cpp's 4096-token prefill runs; LLAMA_BATCHED_ROUNDS=N runs
#   llama-batched-bench N times (its figures move between runs); LLAMA_NCMOE=0 its -ncmoe llama-bench runs (LLAMA_BATCHED_ROUNDS=0: llama-batched-bench's); DEADLINE=S (default 540) skips what would start after S seconds.
set -u
cd "$(dirname "$0")/.."
START=$SECONDS
DEADLINE=${DEADLINE:-540}
C=$PWD/.gpucarry
OUT=${OUT:-/tmp/gpu-suite}
W=/tmp/gpu-work
LOGS=$W/logs
mkdir -p "$OUT" "$LOGS"
S=$OUT/summary.txt
: > "$S"
say() { echo "[$((SECONDS - START)) s] $*" >> "$S"; }
time_left() { echo $((DEADLINE - (SECONDS - START))); }
# Runs "$@" under a timeout of at most what is left before the deadline; skips it when too little is.
run_timed() {
  local want=$1; shift
  local left; left=$(time_left)
  if [ "$left" -lt 20 ]; then say "skipped (deadline): $*"; return 124; fi
  [ "$want" -gt "$left" ] && want=$left
  timeout "$want" "$@"
}
pack_logs() { tar -C "$LOGS" -czf "$OUT/logs.tar.gz" . 2>/dev/null; }
trap pack_logs EXIT
B=$W/bin
mkdir -p "$B" && xz -dc "$C/bin.tar.xz" | tar -C "$B" -xf -
export LD_LIBRARY_PATH=$B/libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The tests find their fixtures where this repository was built (/work/main); point that here.
if [ ! -e /work/main/tests/fixtures ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
export MOETIER_CLI=$B/moetier
# Hybrid runs keep their measured split here (the tests' and then the benchmarks').
export MOETIER_CACHE_DIR=$W/cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$S" 2>&1
FAILED=0
# Another build's moetier and kernel_bench for A/B runs (make_gpucarry.sh's BASE_BIN), if carried.
[ -f "$C/base.tar.xz" ] && xz -dc "$C/base.tar.xz" | tar -C "$W" -xf -
# The CPU matmul kernels, this build's and the carried base build's, interleaved twice, before
# anything else takes the cores: weight GB/s by format, level and tokens (KB_ARGS: the flags).
if [ "${KERNELS:-0}" = 1 ]; then
  KB_ARGS=${KB_ARGS:---threads 16 --isa amx,avx512vnni --formats bf16,bf16c,q8_0 --prefill 2,4,8,16 --prefill-experts 128 --gib 1 --reps 3}
  for round in 1 2; do
    for v in new base; do
      kb=$B/kernel_bench; [ "$v" = base ] && kb=$W/base/kernel_bench
      [ -x "$kb" ] || continue
      # shellcheck disable=SC2086  # KB_ARGS is a list of flags
      run_timed 150 "$kb" $KB_ARGS > "$LOGS/kb-$v-$round.json" 2> "$LOGS/kb-$v-$round.log"
      say "kernel_bench $v, round $round: exit $?"
      python3 - "$LOGS/kb-$v-$round.json" "$v" >> "$S" 2>&1 <<'PY'
import json, sys
d, v = json.load(open(sys.argv[1])), sys.argv[2]
print(v, "read GB/s:", " ".join(f"{r['format']}/{r['threads']}:{r['gbs']:.0f}" for r in d["read_bandwidth"]))
print(v, "decode GB/s:", " ".join(f"{r['format']}/{r['isa']}:{r['gbs']:.0f}" for r in d["decode"]))
print(v, "batches GB/s:", " ".join(f"{r['format']}/{r['isa']}/{r['tokens']}:{r['weight_gbs']:.0f}"
                                   for r in d["prefill"]))
PY
    done
  done
fi
if [ "${SYNTH:-0}" = 1 ] && [ "${LLAMA:-0}" = 1 ]; then
  if [ -f "$C/llama-bin.tar.xz" ]; then
    xz -dc "$C/llama-bin.tar.xz" | tar -C "$W" -xf -
    LB=$W/llama
  else
    # llama.cpp for CUDA builds meanwhile (minutes, at the lowest priority); only what the
    # benchmarks run.
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      "$C/llama-src.tar.xz" "$W/llama-src"
    (cd "$W/llama-src" && cmake -S . -B b -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
       > "$LOGS/llama-cmake.log" 2>&1 &&
     nice -n 19 cmake --build b -j"$(nproc)" --target llama-bench llama-batched-bench llama-quantize \
       ${PPL:+llama-perplexity} \
       > "$LOGS/llama-build.log" 2>&1) &
    LLAMA_PID=$!
    LB=$W/llama-src/b/bin
  fi
fi
GPU_TESTS=${GPU_TESTS:-cuda_attention_tests cuda_dense_tests cuda_expert_ffn_tests
  cuda_staging_ring_tests model_tests engine_tests experts_tests backend_tests
  decode_alloc_tests cli_tests}
[ "${TESTS:-1}" = 1 ] && for name in $GPU_TESTS; do
  t=$B/tests/$name
  [ -x "$t" ] || continue
  run_timed 240 "$t" --gtest_brief=1 > "$LOGS/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
  say "$name: exit $rc, $(grep -c '^\[  FAILED  \]' "$LOGS/$name.log") failed lines, \
$(grep -c 'SKIPPED' "$LOGS/$name.log") skipped"
  grep -E '^\[  FAILED  \]' "$LOGS/$name.log" | head -20 >> "$S"
  [ $rc -ne 0 ] && tail -5 "$LOGS/$name.log" >> "$S"
done
# The expert kernels' checks again with every decode step on the one-warp-a-row kernels (steps of
# more than 32 active experts among them), as ctest's cuda_expert_ffn_tests.all_gemv runs them.
if [ "${TESTS:-1}" = 1 ] && [[ " $(echo $GPU_TESTS) " = *" cuda_expert_ffn_tests "* ]]; then
  MOETIER_CUDA_GEMV_ASSIGN=4096 run_timed 240 "$B/tests/cuda_expert_ffn_tests" --gtest_brief=1 \
    --gtest_filter='DtypesAndPaths/ExpertFfnTest.*_Decode' > "$LOGS/cuda_expert_ffn_tests-all-gemv.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
  say "cuda_expert_ffn_tests, every decode step on the GEMV kernels: exit $rc"
  grep -E '^\[  FAILED  \]' "$LOGS/cuda_expert_ffn_tests-all-gemv.log" | head -20 >> "$S"
fi
# The expert kernels' timing by path and tokens (the prefill crossover), when asked.
if [ "${EXPERT_TIMING:-0}" = 1 ]; then
  # The decode rows with the tiled kernels alone (MOETIER_CUDA_GEMV_ASSIGN=0), and with the
  # one-warp-a-row kernels up to 16 tokens (128 assignments), beside the default.
  for gemv in default 0 128; do
    [ "$gemv" = default ] && unset MOETIER_CUDA_GEMV_ASSIGN || export MOETIER_CUDA_GEMV_ASSIGN=$gemv
    run_timed 120 "$B/tests/cuda_expert_ffn_tests" --gtest_also_run_disabled_tests \
      --gtest_filter='ExpertFfnBench.*' > "$LOGS/expert-timing-$gemv.log" 2>&1
    say "expert timing (MOETIER_CUDA_GEMV_ASSIGN $gemv): exit $?"
    if [ "$gemv" = default ]; then grep '^experts' "$LOGS/expert-timing-$gemv.log" >> "$S"
    else grep '^experts.*decode' "$LOGS/expert-timing-$gemv.log" >> "$S"; fi
  done
  unset MOETIER_CUDA_GEMV_ASSIGN
  run_timed 60 "$B/tests/cuda_dense_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='Bf16cExpandBench.*' > "$LOGS/expand-timing.log" 2>&1
  grep '^expand' "$LOGS/expand-timing.log" >> "$S"
fi
# The device draw's time beside the top-k's, and where its time goes (Nsight Compute), when asked.
if [ "${DRAWS:-0}" = 1 ]; then
  run_timed 120 "$B/draw_bench" --slices "${DRAW_SLICES:-0,32,64,128,256}" > "$LOGS/draws.json" \
    2> "$LOGS/draws.log"
  say "draw_bench: exit $?: $(cat "$LOGS/draws.json")"
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
  if [ -n "$NCU_BIN" ]; then
    run_timed 120 "$NCU_BIN" --kernel-name "regex:${DRAW_NCU_KERNELS:-Draw}" \
      --launch-count "${DRAW_NCU_COUNT:-40}" --section SpeedOfLight \
      --section WarpStateStats --section Occupancy "$B/draw_bench" --rows 1,16 --sigma 0.5 \
      --reps 1 > "$LOGS/draws-ncu.log" 2>&1
    say "draw ncu: exit $?"
    grep -E "(Draw|TopK)[A-Za-z]*Kernel|Duration|Achieved Occ|Active Threads|Issued Instruction" \
      "$LOGS/draws-ncu.log" | head -160 >> "$S"
  fi
fi
# What a dependency between decode phases costs: kernel boundaries against grid barriers.
if [ "${BOUNDARY:-0}" = 1 ]; then
  # shellcheck disable=SC2086  # BOUNDARY_ARGS is a list of flags
  run_timed 120 "$B/boundary_bench" ${BOUNDARY_ARGS:-} > "$LOGS/boundary.json" 2> "$LOGS/boundary.log"
  say "boundary_bench: exit $?: $(cat "$LOGS/boundary.json") $(head -3 "$LOGS/boundary.log")"
fi
# Logits of five tokens under each placement, against the CPU engine's.
logits() {  # model-dir out-name moetier-args...
  local m=$1 name=$2; shift 2
  run_timed 60 "$B/moetier" logits --model "$m" --tokens 3,17,42,7,99 --out "$W/$name.bin" "$@" \
    >> "$LOGS/logits.log" 2>&1 || say "logits $name: exit $?"
}
[ "${TESTS:-1}" = 1 ] && for m in qwen3_moe mixtral; do
  M=tests/fixtures/hf/$m
  logits "$M" "$m-cpu" --moe-backend cpu --no-gpu
  logits "$M" "$m-cpu_gpu_dense" --moe-backend cpu
  logits "$M" "$m-gpu" --moe-backend gpu --report "$LOGS/$m-gpu-report.json"
  logits "$M" "$m-offload" --moe-backend offload --moe-cpu-layers 1 \
    --report "$LOGS/$m-offload-report.json"
  for be in gpu offload cpu_gpu_dense; do
    python3 - "$W/$m-cpu.bin" "$W/$m-$be.bin" "$m $be" >> "$S" 2>&1 <<'PY'
import os, struct, sys
if not (os.path.exists(sys.argv[1]) and os.path.exists(sys.argv[2])):
    print(sys.argv[3], "logits: missing output"); sys.exit(0)
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
  say "synthetic model"
  G=$W/llama-src
  [ -d "$G/gguf-py" ] || python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
    "$C/llama-src.tar.xz" "$G"
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
    "$C/template-meta.gguf.xz" "$W/template.gguf"
  GGUF_PY=$G/gguf-py python3 "$C/synth_model.py" "$W/template.gguf" "$W/q3moe-8L" --layers 8 \
    --hf-dir "$W/q3moe-8L-hf" --tokenizer-dir tests/fixtures/hf/realvocab/qwen3_moe_tiny \
    > "$LOGS/synth.log" 2>&1
  DTYPES=${DTYPES:-bf16 q4_0}
  for dt in $DTYPES; do
    extra=(); [ "$dt" != bf16 ] && extra=(--dtype "$dt" --dense-dtype "$dt")
    run_timed 240 "$B/moetier" convert -m "$W/q3moe-8L-hf" -o "$W/bank-$dt" --overwrite "${extra[@]}" \
      >> "$LOGS/synth.log" 2>&1 || say "convert $dt: exit $?"
  done
  say "converted"
  # One `moetier bench --json` on bank $2 under the name $1 (the rest: its flags).
  bench() {  # BENCH_BIN: another moetier binary (the carried base build's)
    local name=$1 dt=$2; shift 2
    run_timed 150 "${BENCH_BIN:-$B/moetier}" bench --model "$W/bank-$dt" --json "$@" \
      > "$LOGS/bench-$dt-$name.json" 2> "$LOGS/bench-$dt-$name.log"
    say "bench $dt $name: exit $?: $(python3 scripts/bench_line.py "$LOGS/bench-$dt-$name.json" 2>&1)"
  }
  # Expert cache sizes, GB: the minimum (one layer's 128 experts: 1.21 GB bf16, 0.34 GB q4_0, an
  # eighth of all experts), a quarter, half and all of the 8 layers' experts.
  declare -A CACHE_MIN=([bf16]=1.22 [q4_0]=0.35) CACHE_25=([bf16]=2.43 [q4_0]=0.69)
  declare -A CACHE_50=([bf16]=4.85 [q4_0]=1.37) CACHE_100=([bf16]=9.70 [q4_0]=2.74)
  OFFLOAD=(--moe-backend offload --moe-cpu-layers 0 --moe-collect-stats)
  for dt in $DTYPES; do
    for be in ${BACKENDS:-gpu offload cpu cpu-only}; do
      case $be in
        gpu)  # everything in VRAM: decode, and prefill of 512 tokens; decode steps launched
              # one kernel at a time (no CUDA graphs); without programmatic dependent launch;
              # with the fused launches; 4 and 16 sequences
          bench gpu "$dt" --moe-backend gpu --prompt-tokens 512 --gen-tokens 128
          MOETIER_CUDA_GRAPHS=0 bench gpu-eager "$dt" --moe-backend gpu --prompt-tokens 512 \
            --gen-tokens 128
          MOETIER_CUDA_PDL=0 bench gpu-nopdl "$dt" --moe-backend gpu --prompt-tokens 512 \
            --gen-tokens 128
          MOETIER_CUDA_FUSE=1 bench gpu-fuse "$dt" --moe-backend gpu --prompt-tokens 512 \
            --gen-tokens 128
          for n in 4 16; do
            bench "gpu-par$n" "$dt" --moe-backend gpu --parallel "$n" --prompt-tokens 128 \
              --gen-tokens 32
          done ;;
        gpu1)  # the first row of gpu alone: prefill of 512 tokens, then decode
          bench gpu "$dt" --moe-backend gpu --prompt-tokens 512 --gen-tokens 128 ;;
        gpu-gemv)  # decode with the tiled expert kernels alone against the default, 1 and 4
          for n in 1 4; do
            MOETIER_CUDA_GEMV_ASSIGN=0 bench "gpu-tiled-par$n" "$dt" --moe-backend gpu \
              --parallel $n --prompt-tokens 512 --gen-tokens 128
            MOETIER_CUDA_GEMV_ASSIGN=32 bench "gpu-gemv-par$n" "$dt" --moe-backend gpu \
              --parallel $n --prompt-tokens 512 --gen-tokens 128
          done ;;
        gpu-sampled)  # what a sampled draw costs, against greedy, at 1 and 16 sequences:
                      # Qwen3's sampling defaults (top-k 20, top-p 0.95, temperature 0.6: the
                      # GPU hands back top-k candidates), top-p alone and temperature alone (the
                      # OpenAI API's default), each drawn on the GPU (MOETIER_DEVICE_DRAWS=1,
                      # the default) and with the rows copied and drawn on the host (=0)
          SAMPLED=(--temperature 0.6 --top-k 20 --top-p 0.95)
          TOP_P=(--temperature 0.6 --top-p 0.95)
          TEMP=(--temperature 1.0)
          ONE=(--moe-backend gpu --prompt-tokens 512 --gen-tokens 128)
          SIXTEEN=(--moe-backend gpu --parallel 16 --prompt-tokens 128 --gen-tokens 32)
          bench gpu-greedy "$dt" "${ONE[@]}"
          bench gpu-qwen3-sampling "$dt" "${ONE[@]}" "${SAMPLED[@]}"
          MOETIER_DEVICE_DRAWS=1 bench device-top-p "$dt" "${ONE[@]}" "${TOP_P[@]}"
          MOETIER_DEVICE_DRAWS=1 bench device-temperature "$dt" "${ONE[@]}" "${TEMP[@]}"
          bench gpu-par16-greedy "$dt" "${SIXTEEN[@]}"
          bench gpu-par16-qwen3-sampling "$dt" "${SIXTEEN[@]}" "${SAMPLED[@]}"
          MOETIER_DEVICE_DRAWS=1 bench device-par16-top-p "$dt" "${SIXTEEN[@]}" "${TOP_P[@]}"
          MOETIER_DEVICE_DRAWS=1 bench device-par16-temperature "$dt" "${SIXTEEN[@]}" \
            "${TEMP[@]}"
          MOETIER_DEVICE_DRAWS=0 bench rows-top-p "$dt" "${ONE[@]}" "${TOP_P[@]}"
          MOETIER_DEVICE_DRAWS=0 bench rows-temperature "$dt" "${ONE[@]}" "${TEMP[@]}"
          MOETIER_DEVICE_DRAWS=0 bench rows-par16-top-p "$dt" "${SIXTEEN[@]}" "${TOP_P[@]}"
          MOETIER_DEVICE_DRAWS=0 bench rows-par16-temperature "$dt" "${SIXTEEN[@]}" "${TEMP[@]}"
          if [ -x "$W/base/moetier" ]; then  # the carried base build's device draws, beside
            BENCH_BIN=$W/base/moetier bench base-device-top-p "$dt" "${ONE[@]}" "${TOP_P[@]}"
            BENCH_BIN=$W/base/moetier bench base-device-par16-top-p "$dt" "${SIXTEEN[@]}" \
              "${TOP_P[@]}"
            MOETIER_DEVICE_DRAWS=1 bench device-top-p-again "$dt" "${ONE[@]}" "${TOP_P[@]}"
            BENCH_BIN=$W/base/moetier bench base-device-temperature "$dt" "${ONE[@]}" "${TEMP[@]}"
            BENCH_BIN=$W/base/moetier bench base-qwen3-sampling "$dt" "${ONE[@]}" "${SAMPLED[@]}"
            bench gpu-qwen3-sampling-again "$dt" "${ONE[@]}" "${SAMPLED[@]}"
          fi ;;
        gpu-ab)  # one sequence's decode with PDL, the weight prefetch and the fused launches on
                 # and off, and attention splits of 16 and 32 positions (GPU_AB: which, as
                 # "pdl prefetch chunk fuse" quadruples separated by commas); two rounds
                 # interleaved: what each is worth, and the spread between rounds
          IFS=, read -r -a VARIANTS <<< "${GPU_AB:-1 1 64 0,1 0 64 0,0 1 64 0,0 0 64 0,1 1 16 0,1 1 32 0}"
          for round in 1 2; do
            for ab in "${VARIANTS[@]}"; do
              read -r pdl pf chunk fuse <<< "$ab"
              MOETIER_CUDA_PDL=$pdl MOETIER_CUDA_PREFETCH=$pf MOETIER_CUDA_ATTN_CHUNK=$chunk \
                MOETIER_CUDA_FUSE=$fuse bench "ab-pdl$pdl-pf$pf-c$chunk-fuse$fuse-$round" "$dt" \
                --moe-backend gpu --prompt-tokens 512 --gen-tokens 256
            done
          done ;;
        offload)  # every expert pinned, the cache at its minimum: prefill 4096, decode, 16 sequences
          bench offload-p4096 "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_MIN[$dt]}" \
            --prompt-tokens 4096 --max-batch-tokens 4096 --gen-tokens 16 --repeats 2
          bench offload-min "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_MIN[$dt]}" \
            --prompt-tokens 32 --gen-tokens 64
          bench offload-25 "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_25[$dt]}" --prompt-tokens 32 --gen-tokens 64
          bench offload-50 "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_50[$dt]}" --prompt-tokens 32 --gen-tokens 64
          bench offload-100 "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_100[$dt]}" --prompt-tokens 32 --gen-tokens 64
          bench offload-par16 "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_MIN[$dt]}" \
            --parallel 16 --prompt-tokens 128 --gen-tokens 32 ;;
        cpu | cpu-only | cpu-batched | offload-decode | offload-packed | hybrid | hybrid-ab | hybrid-evict | hybrid-threads | hybrid16 | halfpin | staged) ;;  # after llama.cpp's build
      esac
    done
  done
  # Where a decode step's device time goes, by kernel; without programmatic dependent launch, as
  # under it a kernel's time includes waiting for the one before it.
  for dt in ${PROFILE:-}; do
    # One sequence as the decode rows bench it (512-token prompt), then 16 (32-token prompts).
    for n in ${PROFILE_N:-1 16}; do
      MOETIER_CUDA_PDL=${PROFILE_PDL:-0} CUDA_INJECTION64_PATH=$B/libs/libmoetier_kernel_profile.so \
        MOETIER_KPROF_OUT=$LOGS/kprof-$dt-$n.txt MOETIER_KPROF_TOP=80 bench "kprof-$n" "$dt" \
        --moe-backend gpu --parallel "$n" --prompt-tokens $((n == 1 ? 512 : 32)) --gen-tokens 256
      head -$((n == 1 ? 45 : 25)) "$LOGS/kprof-$dt-$n.txt" >> "$S"
      grep -A 40 "^wall time" "$LOGS/kprof-$dt-$n.txt" >> "$S"
    done
    [ "${PROFILE_ATTN:-1}" = 1 ] || continue
    # The attention kernels again with splits of 16 positions (MOETIER_CUDA_ATTN_CHUNK).
    MOETIER_CUDA_PDL=0 MOETIER_CUDA_ATTN_CHUNK=16 \
      CUDA_INJECTION64_PATH=$B/libs/libmoetier_kernel_profile.so \
      MOETIER_KPROF_OUT=$LOGS/kprof-$dt-1-c16.txt MOETIER_KPROF_TOP=80 bench "kprof-1-c16" "$dt" \
      --moe-backend gpu --prompt-tokens 512 --gen-tokens 256
    { echo "attention with 16-position splits:"; grep "attention::" "$LOGS/kprof-$dt-1-c16.txt"; } >> "$S"
  done
  # Hardware counters of one decode step's kernels (Nsight Compute, at the card's own clocks):
  # time, DRAM and L2 read rates, achieved occupancy, registers and the main stall reasons.
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
  for dt in ${NCU:-}; do
    [ -n "$NCU_BIN" ] || { say "ncu: not found"; break; }
    run_timed 240 "$NCU_BIN" --clock-control none --csv --page raw \
      --kernel-name "regex:${NCU_KERNELS:-Gemv|DecodeKernel|RmsNorm|WarpRoute|DecodeCombine|Prologue|QuantizeRows|QuantizeActivations}" \
      --launch-skip "${NCU_SKIP:-3000}" --launch-count "${NCU_COUNT:-40}" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum.per_second,lts__t_bytes.sum.per_second,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__grid_size,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active \
      "$B/moetier" bench --model "$W/bank-$dt" --moe-backend gpu --prompt-tokens 512 \
      --gen-tokens 48 > "$LOGS/ncu-$dt.csv" 2> "$LOGS/ncu-$dt.log"
    say "ncu $dt: exit $?"
    python3 - "$LOGS/ncu-$dt.csv" >> "$S" << 'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit()
head, data = rows[0], rows[2:]
want = ["Kernel Name", "launch__grid_size", "gpu__time_duration.sum", "dram__bytes_read.sum.per_second",
        "lts__t_bytes.sum.per_second", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "launch__registers_per_thread", "launch__occupancy_limit_registers",
        "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio",
        "smsp__average_warp_latency_issue_stalled_barrier.ratio",
        "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio"]
idx = [head.index(w) if w in head else -1 for w in want]
print("ncu: kernel | grid | ns | DRAM read/s | L2/s | occupancy % | regs | reg-limit blocks | issue % | long-sb | barrier | lg-throttle")
for r in data:
    vals = [r[i] if i >= 0 else "?" for i in idx]
    vals[0] = vals[0][:60]
    print(" | ".join(vals))
PY
  done
  for dt in ${PROFILE_PREFILL:-}; do  # the same for a 512-token prefill (then one token)
    MOETIER_CUDA_PDL=0 CUDA_INJECTION64_PATH=$B/libs/libmoetier_kernel_profile.so \
      MOETIER_KPROF_OUT=$LOGS/kprof-prefill-$dt.txt MOETIER_KPROF_TOP=40 bench "kprof-prefill" "$dt" \
      --moe-backend gpu --prompt-tokens 512 --gen-tokens 1
    { echo "prefill 512 kernels ($dt):"; head -30 "$LOGS/kprof-prefill-$dt.txt"; } >> "$S"
  done
  if [ "${LOAD:-0}" = 1 ]; then  # load with every bank pinned, against reading the files raw,
    # LOAD_ROUNDS times, under each of LOAD_ENVS (VAR=value words, comma-separated; "-": none;
    # "base": the carried base build); each stderr line of a load stamped with its second since
    # the start. First, with LOAD_STREAMS (THREADSxCHUNK_MIB,...), the banks alone read as the
    # load reads them under each, beside `cat`'s way (bench/engine/load_bench --streams).
    for dt in ${LOAD_STREAMS:+$DTYPES}; do
      run_timed 200 "$B/load_bench" --model "$W/bank-$dt" --streams "$LOAD_STREAMS" \
        --repeats "${LOAD_ROUNDS:-2}" > "$LOGS/streams-$dt.json" 2> "$LOGS/streams-$dt.log"
      say "load_bench streams $dt: exit $?: $(cat "$LOGS/streams-$dt.json")"
    done
    IFS=, read -r -a LENVS <<< "${LOAD_ENVS:--}"
    for round in $(seq "${LOAD_ROUNDS:-2}"); do
      for dt in $DTYPES; do
        sync; echo 3 > /proc/sys/vm/drop_caches
        t0=$EPOCHREALTIME; cat "$W/bank-$dt"/* > /dev/null; t1=$EPOCHREALTIME
        say "load $dt round $round: $(du -sb "$W/bank-$dt" | cut -f1) bytes; raw read \
$(python3 -c "print(f'{$t1 - $t0:.3f}')") s"
        for e in "${LENVS[@]}"; do
          [ "$e" = - ] && e=
          [ "$(time_left)" -lt 30 ] && { say "skipped (deadline): load $dt $e"; continue; }
          name=$(echo "${e:-default}" | tr -c 'A-Za-z0-9=\n' _)
          bin=$B/moetier verbose=(-v)  # debug lines: when each bank was in
          if [ "$e" = base ]; then  # (which has no -v)
            [ -x "$W/base/moetier" ] || continue
            bin=$W/base/moetier e= verbose=()
          fi
          sync; echo 3 > /proc/sys/vm/drop_caches
          t2=$EPOCHREALTIME
          # shellcheck disable=SC2086  # $e: VAR=value words
          { env $e timeout 120 "$bin" logits --model "$W/bank-$dt" --tokens 1 "${verbose[@]}" \
              --out "$W/load.bin" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_MIN[$dt]}" 2>&1; } |
            while IFS= read -r line; do echo "$EPOCHREALTIME $line"; done |
            awk -v t="$t2" '{ $1 = sprintf("%.3f", $1 - t); print }' > "$LOGS/load-$dt-$name-$round.log"
          t3=$EPOCHREALTIME
          say "load $dt round $round $name: pinned load (logits of one token, the \
process) $(python3 -c "print(f'{$t3 - $t2:.3f}')") s"
          grep -E "^[0-9.]+ (load:|wrote|debug: bank 7 read)" "$LOGS/load-$dt-$name-$round.log" >> "$S"
        done
      done
    done
  fi
  if [ "${RECALL:-0}" = 1 ]; then  # next-layer expert prediction, on the CPU
    run_timed 200 "$B/prefetch_recall" --model "$W/bank-bf16" --prompt-tokens 128 --gen-tokens 32 \
      --weight-packing none > "$LOGS/recall.json" 2> "$LOGS/recall.log"
    say "prefetch recall: exit $?"; tail -25 "$LOGS/recall.log" >> "$S"
  fi
  if [ "${STAGING:-0}" = 1 ]; then
    run_timed 120 "$B/staging_bench" > "$LOGS/staging.json" 2> "$LOGS/staging.log"
    say "staging_bench: exit $?: $(cat "$LOGS/staging.json")"
  fi
  if [ "${KVTIER:-0}" = 1 ]; then  # TTFT of an evicted prefix: from the host tier, or recomputed
    for dt in ${KVTIER_DTYPES:-$DTYPES}; do
      for be in gpu hybrid; do
        flags=(--moe-backend "$be" --ctx-size 4608)
        [ "$be" = hybrid ] && flags+=(--moe-cpu-layers 0 --moe-cache-gb "${CACHE_MIN[$dt]}")
        for gb in 0 2; do
          run_timed 150 bash bench/engine/prefix_ttft.sh --moetier "$B/moetier" \
            --model "$W/bank-$dt" --prefix 4000 --filler 4200 -- "${flags[@]}" --kv-host-gb "$gb" \
            > "$LOGS/ttft-$dt-$be-$gb.json" 2> "$LOGS/ttft-$dt-$be-$gb.log"
          say "ttft $dt $be --kv-host-gb $gb: exit $?: $(tail -1 "$LOGS/ttft-$dt-$be-$gb.json")"
        done
      done
    done
  fi
  if [ "${CROSS:-0}" = 1 ]; then  # the prefill crossover: prompts streamed whole or through the cache
    for dt in $DTYPES; do
      sizes="32 64 128 256"; [ "$dt" = bf16 ] && sizes="32 128"
      for p in ${CROSS_SIZES:-$sizes}; do
        for mode in stream cache; do
          n=1; [ $mode = cache ] && n=1099511627776
          MOETIER_STREAM_MIN_TOKENS=$n bench "cross-$p-$mode" "$dt" "${OFFLOAD[@]}" \
            --moe-cache-gb "${CACHE_MIN[$dt]}" --prompt-tokens "$p" --max-batch-tokens "$p" \
            --gen-tokens 2 --repeats 3
        done
      done
    done
  fi
  if [ "${LLAMA:-0}" = 1 ]; then
    [ -n "${LLAMA_PID:-}" ] && wait "$LLAMA_PID"
    say "llama.cpp ready"
    export LD_LIBRARY_PATH=$LB:$LD_LIBRARY_PATH
    [[ " $DTYPES " = *" q4_0 "* ]] && run_timed 120 "$LB/llama-quantize" --pure "$W/q3moe-8L.gguf" \
      "$W/q3moe-8L-q4_0.gguf" Q4_0 > "$LOGS/quantize.log" 2>&1
    lb() { run_timed 120 "$LB/llama-bench" -m "$W/$g.gguf" -ngl 99 -r 3 -o md "$@" >> "$LOGS/llama-bench.md" 2>&1; }
    for dt in $DTYPES; do
      g=q3moe-8L; [ "$dt" = q4_0 ] && g=q3moe-8L-q4_0
      [ "${LLAMA_GPU:-1}" = 1 ] && lb -p 512 -n 128      # everything on the GPU
      if [ "${LLAMA_NCMOE:-1}" = 1 ]; then
        lb -ncmoe 8 -mmp 1 -p 0 -n 128                     # experts on the CPU, mmap'd
        lb -ncmoe 8 -mmp 0 -p 0 -n 128                     # ... in a pinned buffer
      fi
      if [ "${LLAMA_NCMOE:-1}" = 1 ] && [ "${LLAMA_P4096:-1}" = 1 ]; then
        lb -ncmoe 8 -mmp 0 -p 4096 -n 0                    # prefill 4096, default batches
        lb -ncmoe 8 -mmp 0 -p 4096 -n 0 -ub 2048 -b 4096   # ... its best batches
      fi
      for round in $(seq "${LLAMA_BATCHED_ROUNDS:-1}"); do
        run_timed 120 "$LB/llama-batched-bench" -m "$W/$g.gguf" -ngl 99 -ncmoe 8 --no-mmap -c 8192 \
          -npp 128 -ntg 32 -npl 4,16 --output-format jsonl >> "$LOGS/llama-batched-$dt.jsonl" 2>&1
      done
      grep '"pp"' "$LOGS/llama-batched-$dt.jsonl" 2>/dev/null | sed "s/^/llama-batched-bench $dt: /" >> "$S"
      if [[ " ${BACKENDS:-} " = *" cpu-batched "* ]]; then  # its peer: the CPU alone, GPU hidden
        CUDA_VISIBLE_DEVICES= run_timed 150 "$LB/llama-batched-bench" -m "$W/$g.gguf" -ngl 0 \
          -t "$(nproc)" -c 16384 -npp 128 -ntg 32 -npl "$(echo ${CPU_PAR:-4 16} | tr ' ' ,)" \
          --output-format jsonl >> "$LOGS/llama-batched-cpu-$dt.jsonl" 2>&1
        grep '"pp"' "$LOGS/llama-batched-cpu-$dt.jsonl" 2>/dev/null |
          sed "s/^/llama-batched-bench CPU $dt: /" >> "$S"
      fi
    done
    grep '|' "$LOGS/llama-bench.md" >> "$S"
    if [ "${PPL:-0}" = 1 ]; then  # perplexity over the same text and weights, both engines
      cat README.md docs/*.md > "$W/ppl.txt"
      for dt in $DTYPES; do
        g=q3moe-8L; [ "$dt" = q4_0 ] && g=q3moe-8L-q4_0
        run_timed 200 "$B/moetier" perplexity --model "$W/bank-$dt" --moe-backend gpu \
          --file "$W/ppl.txt" --ctx 512 --chunks "${PPL_CHUNKS:-8}" --json \
          > "$LOGS/ppl-$dt.json" 2> "$LOGS/ppl-$dt.log"
        say "moetier perplexity $dt: exit $?: $(cat "$LOGS/ppl-$dt.json")"
        run_timed 200 "$LB/llama-perplexity" -m "$W/$g.gguf" -f "$W/ppl.txt" -c 512 \
          --chunks "${PPL_CHUNKS:-8}" -ngl 99 > "$LOGS/llama-ppl-$dt.log" 2>&1
        say "llama-perplexity $dt: exit $?: $(grep -E 'Final estimate|tokenizes|add_bos|chunks' \
"$LOGS/llama-ppl-$dt.log" | tr '\n' ' ')"
      done
    fi
  fi
  for dt in $DTYPES; do  # the CPU executor: after the build, which would take its cores
    for be in ${BACKENDS:-gpu offload cpu cpu-only}; do
      case $be in
        cpu)  # dense and KV on the GPU, every expert on the CPU executor
          bench cpu "$dt" --moe-backend cpu --prompt-tokens 128 --gen-tokens 64 ;;
        cpu-only)
          bench cpu-only "$dt" --moe-backend cpu --no-gpu --prompt-tokens 128 --gen-tokens 32 ;;
        gpu-env)  # one sequence's all-VRAM decode under each of GPU_ENVS (comma-separated sets
                  # of VAR=value, or "base": the carried base build), ROUNDS rounds interleaved,
                  # after llama.cpp's build (a quiet host)
          # (GPU_ENV_ARGS: the bench's flags instead, sets separated by ";", each run in turn,
          # e.g. "--prompt-tokens 512 --gen-tokens 256;--parallel 16 --prompt-tokens 128")
          IFS=, read -r -a ENVS <<< "${GPU_ENVS:-MOETIER_CUDA_NORM_FUSE=1,MOETIER_CUDA_NORM_FUSE=0}"
          IFS=';' read -r -a ARG_SETS <<< "${GPU_ENV_ARGS:---prompt-tokens 512 --gen-tokens 256}"
          for round in $(seq "${ROUNDS:-2}"); do
            for a in "${!ARG_SETS[@]}"; do
              read -r -a ENV_ARGS <<< "${ARG_SETS[$a]}"
              for e in "${ENVS[@]}"; do
                if [ "$e" = base ]; then  # the carried base build (make_gpucarry.sh BASE_BIN)
                  [ -x "$W/base/moetier" ] && BENCH_BIN=$W/base/moetier bench \
                    "env-base-args$a-$round" "$dt" --moe-backend gpu "${ENV_ARGS[@]}"
                  continue
                fi
                # shellcheck disable=SC2086  # $e: VAR=value words
                (export $e; bench "env-${e// /_}-args$a-$round" "$dt" --moe-backend gpu \
                  "${ENV_ARGS[@]}")
              done
            done
          done ;;
        cpu-batched)  # the CPU alone at CPU_PAR sequences (4 and 16): this build, the same with
                      # AMX batches off (MOETIER_AMX_MIN_TOKENS past any batch), the carried base
          # (CPU_VARIANTS: which of "new noamx base")
          CPU_ARGS=(--moe-backend cpu --no-gpu --prompt-tokens 128 --gen-tokens 32 --repeats 2)
          for n in ${CPU_PAR:-4 16}; do
            for v in ${CPU_VARIANTS:-new noamx base}; do
              case $v in
                new) bench "cpu-par$n" "$dt" "${CPU_ARGS[@]}" --parallel "$n" ;;
                noamx) MOETIER_AMX_MIN_TOKENS=1000000 bench "cpu-noamx-par$n" "$dt" \
                  "${CPU_ARGS[@]}" --parallel "$n" ;;
                base) [ -x "$W/base/moetier" ] && BENCH_BIN=$W/base/moetier \
                  bench "cpu-base-par$n" "$dt" "${CPU_ARGS[@]}" --parallel "$n" ;;
              esac
            done
          done ;;
        offload-decode)  # every expert pinned, the smallest cache: 1, 4 and 16 sequences
          bench offload-min "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_MIN[$dt]}" \
            --prompt-tokens 32 --gen-tokens 64
          for n in 4 16; do
            bench "offload-par$n" "$dt" "${OFFLOAD[@]}" --moe-cache-gb "${CACHE_MIN[$dt]}" \
              --parallel "$n" --prompt-tokens 128 --gen-tokens 32
          done ;;
        offload-packed)  # pinned banks as stored and held as bf16c (MOETIER_PACK_PINNED=1: copied
                         # packed, expanded in VRAM), interleaved, ROUNDS times: prefill 4096
                         # (streamed banks), decode at 1 and 16 sequences, the smallest cache
          for round in $(seq "${ROUNDS:-1}"); do
            for pk in 0 1; do
              MOETIER_PACK_PINNED=$pk bench "offload-pack$pk-p4096-r$round" "$dt" "${OFFLOAD[@]}" \
                --moe-cache-gb "${CACHE_MIN[$dt]}" --prompt-tokens 4096 --max-batch-tokens 4096 \
                --gen-tokens 16
              MOETIER_PACK_PINNED=$pk bench "offload-pack$pk-min-r$round" "$dt" "${OFFLOAD[@]}" \
                --moe-cache-gb "${CACHE_MIN[$dt]}" --prompt-tokens 32 --gen-tokens 64
              MOETIER_PACK_PINNED=$pk bench "offload-pack$pk-par16-r$round" "$dt" "${OFFLOAD[@]}" \
                --moe-cache-gb "${CACHE_MIN[$dt]}" --parallel 16 --prompt-tokens 128 --gen-tokens 32
            done
          done ;;
        hybrid)  # the same with the misses split (decode steps recorded as graph segments; then
                 # launched call by call, and timed by --profile); then half the banks pinned
          HYBRID=(--moe-backend hybrid --moe-collect-stats --moe-cache-gb "${CACHE_MIN[$dt]}")
          bench hybrid-min "$dt" "${HYBRID[@]}" --moe-cpu-layers 0 --prompt-tokens 32 \
            --gen-tokens 64
          grep -h "hybrid:" "$LOGS/bench-$dt-hybrid-min.log" >> "$S"  # where the split started
          MOETIER_CUDA_GRAPHS=0 bench hybrid-min-eager "$dt" "${HYBRID[@]}" --moe-cpu-layers 0 \
            --prompt-tokens 32 --gen-tokens 64
          bench hybrid-min-profile "$dt" "${HYBRID[@]}" --moe-cpu-layers 0 --prompt-tokens 32 \
            --gen-tokens 64 --profile
          for n in 4 16; do
            bench "hybrid-par$n" "$dt" "${HYBRID[@]}" --moe-cpu-layers 0 --parallel "$n" \
              --prompt-tokens 128 --gen-tokens 32
          done
          bench hybrid-halfpin "$dt" "${HYBRID[@]}" --pin-budget-gb "${CACHE_50[$dt]}" \
            --prompt-tokens 32 --gen-tokens 64
          grep -h "hybrid:" "$LOGS/bench-$dt-hybrid-halfpin.log" >> "$S" ;;
        staged)  # prefill of 4,096 tokens with every expert locked: CPU executor, staged, measured
          pack=(); [ "$dt" = bf16 ] && pack=(--weight-packing none)
          STAGED_RUN=(--moe-backend cpu "${pack[@]}" --moe-collect-stats --prompt-tokens 4096
            --max-batch-tokens 4096 --gen-tokens 4 --repeats 3)
          MOETIER_STAGE_LOCKED=0 bench staged-cpu "$dt" "${STAGED_RUN[@]}"
          MOETIER_STAGE_LOCKED=1 bench staged-ring "$dt" "${STAGED_RUN[@]}"
          bench staged-auto "$dt" "${STAGED_RUN[@]}" ;;
        hybrid-threads)  # how the CPU executor's threads share the cores with the host thread
                         # that drives the GPU: hybrid decode at 1, 16 and 4 sequences (HYBRID_N)
                         # under each of HYBRID_VARIANTS, interleaved, ROUNDS times. A variant
                         # joins parts with '+': base (the defaults), tN (--threads N), spinN
                         # (MOETIER_SPIN_US=N), fixP (MOETIER_FETCH_PERCENT=P), async (the CPU's
                         # share on a worker thread), profile (--profile), topp (sampled with
                         # top-p alone: drawn on the GPU),
                         # nocopy (--weight-packing none: no bf16c CPU copies of pinned layers),
                         # packed (MOETIER_PACK_PINNED=1: pinned banks held as bf16c, copied
                         # packed and expanded in VRAM; the CPU's share reads them, no copies),
                         # NAME=VALUE (that environment variable); each variant keeps its own
                         # measured split
          HYBRID=(--moe-backend hybrid --moe-collect-stats --moe-cache-gb "${CACHE_MIN[$dt]}"
            --moe-cpu-layers 0)
          for n in ${HYBRID_N:-1 16 4}; do
            p=128; [ "$n" = 1 ] && p=32
            for round in $(seq "${ROUNDS:-1}"); do
              for v in ${HYBRID_VARIANTS:-base t15}; do
                (
                  args=()
                  export MOETIER_CACHE_DIR=$W/cache-$v  # each variant learns its own split
                  for part in ${v//+/ }; do
                    case $part in
                      topp) args+=(--temperature 0.6 --top-p 0.95) ;;  # drawn on the GPU
                      t*) args+=(--threads "${part#t}") ;;
                      spin*) export MOETIER_SPIN_US=${part#spin} ;;
                      fix*) export MOETIER_FETCH_PERCENT=${part#fix} ;;
                      async) export MOETIER_CPU_SHARE_ASYNC=1 ;;
                      profile) args+=(--profile) ;;
                      nocopy) args+=(--weight-packing none) ;;  # the CPU's share reads the pinned bf16
                      packed) export MOETIER_PACK_PINNED=1 ;;
                      stored) export MOETIER_PACK_PINNED=0 ;;  # pinned bf16 banks as stored, with CPU copies
                      *=*) export "${part?}" ;;
                    esac
                  done
                  bench "hybrid-par$n-$v-r$round" "$dt" "${HYBRID[@]}" "${args[@]}" \
                    --parallel "$n" --prompt-tokens "$p" --gen-tokens $((n == 1 ? 64 : 32))
                  grep -h "split starts" "$LOGS/bench-$dt-hybrid-par$n-$v-r$round.log" >> "$S"
                )
              done
            done
          done ;;
        hybrid16)  # every expert pinned, the smallest cache: hybrid decode at 16 sequences
                   # twice (calls differ: the host's memory bandwidth), then at 4
          HYBRID=(--moe-backend hybrid --moe-collect-stats --moe-cache-gb "${CACHE_MIN[$dt]}"
            --moe-cpu-layers 0)
          for n in 16 16 4; do
            bench "hybrid-par$n" "$dt" "${HYBRID[@]}" --parallel "$n" --prompt-tokens 128 \
              --gen-tokens 32
          done ;;
        halfpin)  # half the banks pinned (the plan locks the rest): hybrid decode recorded, then
                  # with --profile; every expert locked (cpu) beside it
          HYBRID=(--moe-backend hybrid --moe-collect-stats --moe-cache-gb "${CACHE_MIN[$dt]}")
          bench hybrid-halfpin "$dt" "${HYBRID[@]}" --pin-budget-gb "${CACHE_50[$dt]}" \
            --prompt-tokens 32 --gen-tokens 64
          bench hybrid-halfpin-profile "$dt" "${HYBRID[@]}" --pin-budget-gb "${CACHE_50[$dt]}" \
            --prompt-tokens 32 --gen-tokens 64 --profile
          bench cpu "$dt" --moe-backend cpu --prompt-tokens 32 --gen-tokens 64 --profile ;;
        hybrid-evict)  # the expert cache's eviction, layer order (default) against least
                       # recently used, alternating: hybrid at 16, 4 and 1 sequences, offload
                       # at 16; then hybrid at 16 with --profile
          HYBRID=(--moe-backend hybrid --moe-collect-stats --moe-cache-gb "${CACHE_MIN[$dt]}"
            --moe-cpu-layers 0)
          for n in 16 4 1; do
            p=128; [ "$n" = 1 ] && p=32
            for lru in 0 1; do
              MOETIER_CACHE_LRU=$lru bench "hybrid-par$n-lru$lru" "$dt" "${HYBRID[@]}" \
                --parallel "$n" --prompt-tokens "$p" --gen-tokens $((n == 1 ? 64 : 32))
            done
          done
          for lru in 0 1; do
            MOETIER_CACHE_LRU=$lru bench "offload-par16-lru$lru" "$dt" "${OFFLOAD[@]}" \
              --moe-cache-gb "${CACHE_MIN[$dt]}" --parallel 16 --prompt-tokens 128 --gen-tokens 32
          done
          bench hybrid-par16-profile "$dt" "${HYBRID[@]}" --parallel 16 --prompt-tokens 128 \
            --gen-tokens 32 --profile
          tr -d '\n ' < "$MOETIER_CACHE_DIR/hybrid-split.json" | head -c 600 >> "$S"; echo >> "$S" ;;
        hybrid-ab)  # recorded segments against launches at the same fixed split, 1 and 16
                    # sequences; then the measured split again, and the rates it keeps
          HYBRID=(--moe-backend hybrid --moe-collect-stats --moe-cache-gb "${CACHE_MIN[$dt]}"
            --moe-cpu-layers 0)
          pct=40; [ "$dt" = q4_0 ] && pct=70
          for g in 1 0; do
            MOETIER_FETCH_PERCENT=$pct MOETIER_CUDA_GRAPHS=$g bench "hybrid-q$pct-graphs$g" "$dt" \
              "${HYBRID[@]}" --prompt-tokens 32 --gen-tokens 64
            MOETIER_FETCH_PERCENT=35 MOETIER_CUDA_GRAPHS=$g bench "hybrid-par16-q35-graphs$g" \
              "$dt" "${HYBRID[@]}" --parallel 16 --prompt-tokens 128 --gen-tokens 32
          done
          for g in 1 0 1; do
            MOETIER_CUDA_GRAPHS=$g bench "hybrid-graphs$g" "$dt" "${HYBRID[@]}" --prompt-tokens 32 \
              --gen-tokens 64
            tr -d '\n ' < "$MOETIER_CACHE_DIR/hybrid-split.json" | head -c 600 >> "$S"; echo >> "$S"
          done ;;
      esac
    done
  done
fi
say "failed test executables: $FAILED"
cat "$S"
exit "$FAILED"
