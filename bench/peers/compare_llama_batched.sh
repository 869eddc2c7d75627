#!/usr/bin/env bash
# Many sequences at once: moetier bench --parallel N against llama.cpp's llama-batched-bench, on
# the same weights, threads and machine, in one run. Each of N sequences gets its own prompt of
# PROMPT_TOKENS tokens, then the N decode GEN_TOKENS tokens together (one token each a step, at
# positions PROMPT_TOKENS+1.. as in compare_llama.sh); the figure is the aggregate decode tokens/s
# over all N (llama-batched-bench's S_TG, `speed_tg`). Writes each tool's output and a summary
# (summary.md; summary.jsonl: one line per N with both aggregates and their ratio) to OUT.
#
#   bench/peers/compare_llama_batched.sh --moetier build/bin/moetier --llama-bin DIR \
#       --gguf MODEL.gguf --model CONVERTED_DIR --out DIR [--threads N] [--parallel 4,16,64] \
#       [--prompt-tokens 128] [--gen-tokens 32] [--repeats 3] [--label NAME]
#
# MODEL.gguf and CONVERTED_DIR hold the same weights: compare_llama.sh's WORK/q3moe-8L.gguf with
# WORK/bank-bf16, or WORK/q3moe-8L-q4_0.gguf with WORK/bank-q4_0 (made there, or with
# PREPARE_ONLY=1 compare_llama.sh). llama-batched-bench runs REPEATS times (all N in one process,
# its context sized for the largest N), moetier once per N with --repeats REPEATS; medians.
# MOETIER_BENCH_ARGS adds flags to moetier bench. LLAMA_ONLY=1 runs llama.cpp's half alone.
set -euo pipefail

ME=compare_llama_batched.sh
MOETIER='' LLAMA_BIN='' GGUF='' MODEL='' OUT='' LABEL=''
THREADS=$(nproc) PARALLEL=4,16,64 PP=128 TG=32 REPEATS=3
die() { echo "$ME: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --moetier|--llama-bin|--gguf|--model|--out|--threads|--parallel|--prompt-tokens|--gen-tokens|--repeats|--label)
      [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;;&
    --moetier) MOETIER=$2; shift 2 ;;
    --llama-bin) LLAMA_BIN=$2; shift 2 ;;
    --gguf) GGUF=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    --prompt-tokens) PP=$2; shift 2 ;;
    --gen-tokens) TG=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
LLAMA_ONLY=${LLAMA_ONLY:-0}
REQUIRED="LLAMA_BIN GGUF OUT"
[ "$LLAMA_ONLY" = 1 ] || REQUIRED="MOETIER $REQUIRED MODEL"
flag_of() {  # the option that sets a variable
  case $1 in LLAMA_BIN) echo --llama-bin ;; PP) echo --prompt-tokens ;; TG) echo --gen-tokens ;;
    *) echo "--${1,,}" ;; esac
}
for v in $REQUIRED; do
  [ -n "${!v}" ] || die "$(flag_of "$v") is required (see --help)"
done
for v in THREADS PP TG REPEATS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$(flag_of "$v") must be a whole number >= 1, got '${!v}'"
done
[[ $PARALLEL =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  die "--parallel takes sequence counts separated by commas (e.g. 4,16,64), got '$PARALLEL'"
BB=$LLAMA_BIN/llama-batched-bench
[ -x "$BB" ] || die "no $BB; build it with shared/peers/build-llama-cpp.sh (or point --llama-bin at its bin folder)"
[ -f "$GGUF" ] || die "--gguf $GGUF: no such file"
if [ "$LLAMA_ONLY" != 1 ]; then
  [ -x "$MOETIER" ] || die "--moetier $MOETIER: not an executable"
  [ -f "$MODEL/moetier-index.json" ] || die "--model $MODEL: not a converted model (no moetier-index.json; make it with moetier convert)"
fi
LABEL=${LABEL:-$(basename "$GGUF" .gguf)}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" >&2; }

# llama-batched-bench skips, without a word, every N whose N * (PP + TG) tokens do not fit its
# context, and splits the context evenly between max(N) sequences: size it for the largest N
# (llama.cpp then pads each sequence's share to a multiple of 256 tokens).
MAX_N=$(tr , '\n' <<< "$PARALLEL" | sort -n | tail -1)
CTX=$(( MAX_N * (PP + TG) ))
# Captured first: grep -q in a pipe can end it early, and pipefail would read SIGPIPE as "absent".
BB_HELP=$("$BB" --help 2>&1 || true)
grep -q -- '--output-format' <<< "$BB_HELP" ||
  die "$BB has no --output-format (jsonl); build a newer llama.cpp with shared/peers/build-llama-cpp.sh"

: > "$OUT/llama-batched.jsonl"
for r in $(seq "$REPEATS"); do
  log "llama-batched-bench $LABEL, run $r of $REPEATS (-npl $PARALLEL, -c $CTX)"
  # The JSON lines go to stdout, the loading log to stderr.
  if ! "$BB" -m "$GGUF" -c "$CTX" -npp "$PP" -ntg "$TG" -npl "$PARALLEL" -t "$THREADS" \
      --output-format jsonl > "$OUT/llama-batched-run$r.out" 2> "$OUT/llama-batched-run$r.log"; then
    tail -5 "$OUT/llama-batched-run$r.log" >&2
    die "llama-batched-bench failed on $GGUF (log: $OUT/llama-batched-run$r.log)"
  fi
  grep '^{' "$OUT/llama-batched-run$r.out" | sed "s/^{/{\"run\": $r, /" >> "$OUT/llama-batched.jsonl" || true
done

MOETIER_STATUS=ok
if [ "$LLAMA_ONLY" = 1 ]; then
  MOETIER_STATUS="not run (LLAMA_ONLY=1)"
else
  MT_HELP=$("$MOETIER" bench --help 2>&1 || true)
  if ! grep -q -- '--parallel' <<< "$MT_HELP"; then
    MOETIER_STATUS="not run: this moetier has no 'bench --parallel' (many sequences; not implemented in $MOETIER yet)"
  else
    for n in ${PARALLEL//,/ }; do
      log "moetier bench $LABEL --parallel $n"
      # shellcheck disable=SC2086
      if ! "$MOETIER" bench --model "$MODEL" --parallel "$n" --prompt-tokens "$PP" --gen-tokens "$TG" \
          --threads "$THREADS" --repeats "$REPEATS" ${MOETIER_BENCH_ARGS:-} --json \
          > "$OUT/moetier-p$n.json" 2> "$OUT/moetier-p$n.log"; then
        tail -5 "$OUT/moetier-p$n.log" >&2
        MOETIER_STATUS="failed at --parallel $n (log: $OUT/moetier-p$n.log)"
        rm -f "$OUT/moetier-p$n.json"
        break
      fi
    done
  fi
fi

SUMMARY_RC=0
python3 - "$OUT" "$PARALLEL" "$LABEL" "$THREADS" "$PP" "$TG" "$REPEATS" "$MOETIER_STATUS" <<'PY' || SUMMARY_RC=$?
import json, os, statistics, sys
out, parallel, label, threads, pp, tg, repeats, status = sys.argv[1:]
counts = [int(n) for n in parallel.split(",")]
pp, tg, threads = int(pp), int(tg), int(threads)
llama = {}
for line in open(os.path.join(out, "llama-batched.jsonl")):
    r = json.loads(line)
    if r["pp"] == pp and r["tg"] == tg:
        llama.setdefault(r["pl"], []).append(r)
rows, lines, problems = [], [], []
for n in counts:
    s = dict(label=label, parallel=n, threads=threads, prompt_tokens=pp, gen_tokens=tg)
    runs = llama.get(n, [])
    if runs:
        s["llama_runs"] = len(runs)
        s["llama_decode_tokens_per_s"] = statistics.median(r["speed_tg"] for r in runs)
        s["llama_decode_tokens_per_s_per_sequence"] = s["llama_decode_tokens_per_s"] / n
        s["llama_prefill_tokens_per_s"] = statistics.median(r["speed_pp"] for r in runs)
    else:
        problems.append(f"llama-batched-bench reported nothing for {n} sequences")
    path = os.path.join(out, f"moetier-p{n}.json")
    if os.path.exists(path):
        m = json.load(open(path))
        if m.get("parallel") != n:
            problems.append(f"{path}: 'parallel' is {m.get('parallel')!r}, expected {n}")
        else:
            s["moetier_decode_tokens_per_s"] = m["decode_tokens_per_s"]
            s["moetier_decode_tokens_per_s_per_sequence"] = m.get("decode_tokens_per_s_per_sequence")
            for k in ("prefill_tokens_per_s", "dtype", "held_dtype", "cpu_isa",
                      "read_bandwidth_gb_per_s"):
                if k in m:
                    s["moetier_" + k] = m[k]
    if "moetier_decode_tokens_per_s" in s and "llama_decode_tokens_per_s" in s:
        s["decode_ratio"] = s["moetier_decode_tokens_per_s"] / s["llama_decode_tokens_per_s"]
    s["moetier_status"] = status
    lines.append(json.dumps(s))
    f = lambda k, fmt="{:.1f}": fmt.format(s[k]) if s.get(k) is not None else "—"
    rows.append(f"| {label} | {n} | {f('moetier_decode_tokens_per_s')} | "
                f"{f('moetier_decode_tokens_per_s_per_sequence', '{:.2f}')} | {f('llama_decode_tokens_per_s')} | "
                f"{f('llama_decode_tokens_per_s_per_sequence', '{:.2f}')} | {f('decode_ratio', '{:.2f}×')} | "
                f"{f('moetier_prefill_tokens_per_s')} | {f('llama_prefill_tokens_per_s')} |")
head = ("| model | sequences | moetier decode tok/s (all sequences) | per sequence | "
        "llama.cpp decode tok/s (all sequences) | per sequence | ratio | moetier prefill tok/s | "
        "llama.cpp prefill tok/s |\n|---|---|---|---|---|---|---|---|---|")
text = head + "\n" + "\n".join(rows) + "\n"
open(os.path.join(out, "summary.jsonl"), "w").write("\n".join(lines) + "\n")
open(os.path.join(out, "summary.md"), "w").write(text)
print("\n".join(lines))
print()
print(text)
for p in problems:
    print(f"compare_llama_batched.sh: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY

if [ "$MOETIER_STATUS" != ok ]; then
  echo "$ME: moetier $MOETIER_STATUS; llama.cpp's half is in $OUT/summary.md" >&2
  [ "$LLAMA_ONLY" = 1 ] || exit 3
fi
exit "$SUMMARY_RC"
