#!/usr/bin/env bash
# Runs on the GPU machine (the workplace's `device` tool), from binaries built on the development
# machine with -DMOETIER_CUDA=ON, copied with the shared libraries they need into an ignored
# folder that the call carries (CARRY, default .devcarry: build-cuda/ and libs/):
# the GPU tests, the residency tests with real pinning, and an offload run whose pin budget is
# below the banks' total. Everything it measures goes under $OUT.
set -u
OUT=${OUT:-/tmp/moetier-device}
mkdir -p "$OUT"
CARRY=${CARRY:-.devcarry}
export LD_LIBRARY_PATH=$PWD/$CARRY/libs:${LD_LIBRARY_PATH:-}
B=$CARRY/build-cuda
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
echo "== experts_tests (GPU pin + device-pointer read must run, not skip)"
$B/tests/experts/experts_tests 2>&1 | tee "$OUT/experts_tests.log" | grep -E "GpuPinned|PASSED|FAILED|SKIPPED" | head
echo "== model_tests with real pinning"
$B/tests/model/model_tests 2>&1 | tee "$OUT/model_tests.log" | grep -E "PASSED|FAILED" | head
M=tests/fixtures/hf/qwen3_moe
T=3,17,42,7,99
echo "== offload, pin budget 0.0004 GB (banks total 0.000655 GB)"
$B/bin/moetier logits --model $M --tokens $T --out "$OUT/offload.bin" --moe-backend offload \
  --pin-budget-gb 0.0004 --report "$OUT/report_offload.json"
$B/bin/moetier logits --model $M --tokens $T --out "$OUT/cpu.bin" --moe-backend cpu \
  --report "$OUT/report_cpu.json"
cmp "$OUT/offload.bin" "$OUT/cpu.bin" && echo "offload logits == cpu logits (bit-identical)"
python3 - "$OUT/report_offload.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("settled:", [(l["layer"], l["tier"]) for l in r["settled"]])
print("pinned bytes", r["bytes"]["pinned"], "<= budget", r["pin_budget_bytes"], ":", r["bytes"]["pinned"] <= r["pin_budget_bytes"])
print("locked bytes", r["bytes"]["locked"], "vmlck", r["vmlck_bytes"])
PY
