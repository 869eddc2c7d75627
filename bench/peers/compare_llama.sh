#!/usr/bin/env bash
# moetier bench against llama-bench in one run: the same synthetic weights (Qwen3-30B-A3B shapes,
# ../shared/peers/synth_model.py), the same threads, the same machine, one dtype after the other.
# Writes each tool's JSON and a summary table (summary.md, summary.json) to OUT.
#
#   bench/peers/compare_llama.sh --moetier build/bin/moetier --llama-bin DIR --work DIR --out DIR \
#       [--threads N] [--dtypes "bf16 q8_0 q4_0"] [--prompt-tokens 128] [--gen-tokens 32] [--repeats 3] \
#       [--hf DIR | --synth TEMPLATE.gguf --tokenizer-dir DIR [--synth-script PATH]]
#
# WORK holds the models: q3moe-8L.gguf (bf16) and q3moe-8L-hf/ (made with --synth when missing),
# q3moe-8L-<dtype>.gguf (llama-quantize --pure: every matrix in that dtype, as moetier converts
# with --dtype D --dense-dtype D, so both engines read the same bytes) and bank-<dtype>/ (the
# others converted from bank-bf16/ when it exists, else from the checkpoint). bf16c (moetier's
# lossless packing of bf16, the same values) is compared with llama.cpp on the bf16 GGUF. By
# default moetier also holds bank-bf16's weights as bf16c (--weight-packing auto: the row says
# "bf16 (held as bf16c)"); MOETIER_BENCH_ARGS="--weight-packing none" runs them as stored.
# llama.cpp's GB/s: moetier's weights per token times the GGUF's bytes per weight.
# Decode is compared at the same context positions: moetier decodes after the prompt, and
# llama-bench's tg test is run at depth PROMPT_TOKENS too (-d); the empty-context figure is
# reported beside it.
# PREPARE_ONLY=1 stops once the models exist (to split the work over two calls).
set -euo pipefail

MOETIER= LLAMA_BIN= WORK= OUT= HF= SYNTH= TOKDIR= SYNTH_SCRIPT=
THREADS=$(nproc) DTYPES="bf16 q8_0 q4_0" PP=128 TG=32 REPEATS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --moetier) MOETIER=$2; shift 2 ;;
    --llama-bin) LLAMA_BIN=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --dtypes) DTYPES=$2; shift 2 ;;
    --prompt-tokens) PP=$2; shift 2 ;;
    --gen-tokens) TG=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --hf) HF=$2; shift 2 ;;
    --synth) SYNTH=$2; shift 2 ;;
    --tokenizer-dir) TOKDIR=$2; shift 2 ;;
    --synth-script) SYNTH_SCRIPT=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "compare_llama.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in MOETIER LLAMA_BIN WORK OUT; do
  if [ -z "${!v}" ]; then echo "compare_llama.sh: --$(echo $v | tr A-Z a-z | tr _ -) is required" >&2; exit 2; fi
done
mkdir -p "$WORK" "$OUT"
HF=${HF:-$WORK/q3moe-8L-hf}
GGUF=$WORK/q3moe-8L.gguf
log() { echo "[$(date +%T)] $*" >&2; }
# llama.cpp's model for a moetier dtype: bf16c is bf16's values packed losslessly, so llama.cpp
# reads the bf16 GGUF for it.
gguf_for() { case $1 in bf16|bf16c) echo "$GGUF" ;; *) echo "$WORK/q3moe-8L-$1.gguf" ;; esac; }

NEED_HF=0  # the checkpoint is only read to convert banks that are not there yet
BF16_BANK=$WORK/bank-bf16  # quantized banks are converted from it when it exists (same result)
for dt in $DTYPES; do
  [ -f "$WORK/bank-$dt/moetier-index.json" ] && continue
  [ "$dt" != bf16 ] && [ -f "$BF16_BANK/moetier-index.json" ] && continue
  NEED_HF=1
done
if [ ! -f "$GGUF" ] || { [ "$NEED_HF" = 1 ] && [ ! -f "$HF/config.json" ]; }; then
  [ -n "$SYNTH" ] || { echo "compare_llama.sh: $GGUF or $HF missing; pass --synth TEMPLATE.gguf" >&2; exit 2; }
  SYNTH_SCRIPT=${SYNTH_SCRIPT:-$(dirname "$0")/../../../shared/peers/synth_model.py}
  # The writer needs numpy; a python3 earlier on PATH (pyenv, a venv) may lack it where the
  # system's has it (apt-get install python3-numpy).
  PY=python3
  if ! "$PY" -c 'import numpy' 2>/dev/null; then
    if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then PY=/usr/bin/python3; else
      echo "compare_llama.sh: the synthetic model writer needs numpy: apt-get install -y python3-numpy" >&2; exit 2
    fi
  fi
  log "writing the synthetic model (gguf + hf) to $WORK"
  "$PY" "$SYNTH_SCRIPT" "$SYNTH" "$WORK/q3moe-8L" --layers 8 --hf-dir "$HF" ${TOKDIR:+--tokenizer-dir "$TOKDIR"} >&2
fi

for dt in $DTYPES; do
  G=$(gguf_for "$dt")
  if [ ! -f "$G" ]; then
    log "llama-quantize --pure $dt"
    # Written under another name first: an interrupted run must not leave a half file behind.
    "$LLAMA_BIN/llama-quantize" --pure "$GGUF" "$G.part" "$(echo $dt | tr a-z A-Z)" "$THREADS" > "$OUT/quantize-$dt.log" 2>&1
    mv "$G.part" "$G"
  fi
  B=$WORK/bank-$dt
  if [ ! -f "$B/moetier-index.json" ]; then
    log "moetier convert --dtype $dt"
    if [ "$dt" = bf16 ]; then
      "$MOETIER" convert -m "$HF" -o "$B" --overwrite >&2
    else
      SRC=$HF
      [ -f "$BF16_BANK/moetier-index.json" ] && SRC=$BF16_BANK
      "$MOETIER" convert -m "$SRC" -o "$B" --dtype "$dt" --dense-dtype "$dt" --overwrite >&2
    fi
  fi
done

[ "${PREPARE_ONLY:-0}" = 1 ] && { log "models ready (PREPARE_ONLY=1)"; exit 0; }

for dt in $DTYPES; do
  G=$(gguf_for "$dt")
  log "llama-bench $dt"
  # moetier's decode runs after the prompt (positions PP+1..PP+TG); llama-bench's tg test runs
  # from an empty context unless given a depth, so it is also run at depth PP (-d 0,PP) and the
  # decode ratio compares the same positions. Builds without -d only have the empty-context one.
  # (The help text is captured first: `grep -q` in a pipe can end it early, and under pipefail
  # llama-bench's SIGPIPE would then read as "no -d".)
  DEPTH=()
  LLAMA_HELP=$("$LLAMA_BIN/llama-bench" --help 2>&1 || true)
  if grep -q -- '--n-depth' <<< "$LLAMA_HELP"; then DEPTH=(-d "0,$PP"); fi
  "$LLAMA_BIN/llama-bench" -m "$G" -p "$PP" -n "$TG" "${DEPTH[@]}" -t "$THREADS" -r "$REPEATS" -o json > "$OUT/llama-$dt.json" 2> "$OUT/llama-$dt.log"
  log "moetier bench $dt"
  # MOETIER_BENCH_ARGS adds flags, e.g. "--weight-packing none" to run bf16 as stored.
  # shellcheck disable=SC2086
  "$MOETIER" bench --model "$WORK/bank-$dt" --prompt-tokens "$PP" --gen-tokens "$TG" \
    --threads "$THREADS" --repeats "$REPEATS" ${MOETIER_BENCH_ARGS:-} --json > "$OUT/moetier-$dt.json" 2> "$OUT/moetier-$dt.log"
done

python3 - "$OUT" "$DTYPES" <<'PY'
import json, os, sys
out, dtypes = sys.argv[1], sys.argv[2].split()
rows, summary = [], {}
for dt in dtypes:
    m = json.load(open(os.path.join(out, f"moetier-{dt}.json")))
    ll = json.load(open(os.path.join(out, f"llama-{dt}.json")))
    depth = lambda r: r.get("n_depth", 0)
    pp = next(r["avg_ts"] for r in ll if r["n_prompt"] > 0 and depth(r) == 0)
    tg0 = next(r["avg_ts"] for r in ll if r["n_gen"] > 0 and depth(r) == 0)
    # Decode at the positions moetier decodes at (after the prompt) when llama-bench has -d.
    at_depth = next((r for r in ll if r["n_gen"] > 0 and depth(r) == m["prompt_tokens"]), None)
    tg = at_depth["avg_ts"] if at_depth else tg0
    s = dict(llama_prefill=pp, llama_decode=tg, llama_decode_empty_context=tg0,
             llama_decode_depth=m["prompt_tokens"] if at_depth else 0,
             moetier_prefill=m["prefill_tokens_per_s"],
             moetier_decode=m["decode_tokens_per_s"], decode_ratio=m["decode_tokens_per_s"] / tg,
             decode_ratio_vs_empty_context=m["decode_tokens_per_s"] / tg0,
             prefill_ratio=m["prefill_tokens_per_s"] / pp, decode_gb_per_s=m["decode_gb_per_s"],
             read_bandwidth_gb_per_s=m["read_bandwidth_gb_per_s"],
             decode_bytes_per_token=m["decode_bytes_per_token"], threads=m["threads"])
    # llama.cpp's bytes per token: the same weights in its GGUF's format (bf16 for bf16 and
    # bf16c; moetier may hold bf16 packed as bf16c, --weight-packing).
    per_weight = {"bf16": 2.0, "bf16c": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}[dt]
    llama_bytes = m.get("decode_weights_per_token", 0) * per_weight
    s["llama_decode_gb_per_s"] = tg * llama_bytes / 1e9 if llama_bytes else float("nan")
    s["held_dtype"] = m.get("held_dtype", m["dtype"]).lower()
    label = dt if s["held_dtype"] == dt else f"{dt} (held as {s['held_dtype']})"
    summary[dt] = s
    rows.append(f"| {label} | {s['moetier_decode']:.1f} | {tg:.1f} (d{s['llama_decode_depth']}) | {s['decode_ratio']:.2f}x | "
                f"{tg0:.1f} | {s['decode_ratio_vs_empty_context']:.2f}x | "
                f"{s['decode_gb_per_s']:.1f} ({100*s['decode_gb_per_s']/s['read_bandwidth_gb_per_s']:.0f}%) | "
                f"{s['llama_decode_gb_per_s']:.1f} ({100*s['llama_decode_gb_per_s']/s['read_bandwidth_gb_per_s']:.0f}%) | "
                f"{s['moetier_prefill']:.1f} | {pp:.1f} | {s['prefill_ratio']:.2f}x | {s['read_bandwidth_gb_per_s']:.1f} |")
head = ("| dtype | moetier decode tok/s | llama.cpp decode tok/s (context depth) | ratio | "
        "llama.cpp decode from empty context | ratio | moetier GB/s (% of read BW) | "
        "llama.cpp GB/s (%) | moetier prefill tok/s | llama.cpp prefill tok/s | ratio | read BW GB/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|")
text = head + "\n" + "\n".join(rows) + "\n"
open(os.path.join(out, "summary.md"), "w").write(text)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(text)
PY
