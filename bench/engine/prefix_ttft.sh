#!/usr/bin/env bash
# Time to first token with and without the prefix cache: request A has a PREFIX-token prompt
# (random ids, fixed seed) plus a short tail; request B, arriving after A has finished, shares
# A's prefix with another tail. Prints one JSON line: both TTFTs, B's cached tokens and the ratio
# (the issue's target: B's TTFT at most 10 % of A's).
# With --filler N, a request of N other tokens runs between them: with a KV cache too small for
# both (--ctx-size in FLAGS), it evicts A's blocks, and B's prefix comes back from the host KV
# tier (--kv-host-gb in FLAGS) or is computed again.
#   bench/engine/prefix_ttft.sh --moetier build/bin/moetier --model DIR [--prefix 2000]
#                               [--filler N] [-- FLAGS]
# FLAGS after -- go to `moetier batch` (--threads, --kv-dtype, --ctx-size, --kv-host-gb, ...).
set -euo pipefail
ME=$(basename "$0")
MOETIER="" MODEL="" PREFIX=2000 FILLER=0
while [ $# -gt 0 ]; do
  case $1 in
    --moetier) MOETIER=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    --filler) FILLER=$2; shift 2 ;;
    --help|-h) sed -n '2,12p' "$0"; exit 0 ;;
    --) shift; break ;;
    *) echo "$ME: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$MOETIER" ] || { echo "$ME: --moetier '$MOETIER' is not an executable" >&2; exit 2; }
[ -d "$MODEL" ] || { echo "$ME: --model '$MODEL' is not a directory" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
VOCAB=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$MODEL/config.json")
python3 - "$PREFIX" "$VOCAB" "$FILLER" > "$W/requests.jsonl" <<'PY'
import json, random, sys
prefix, vocab, filler = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1234)
shared = [rng.randrange(vocab) for _ in range(prefix)]
a = shared + [rng.randrange(vocab) for _ in range(10)]
b = shared + [rng.randrange(vocab) for _ in range(10)]
print(json.dumps({"id": "first", "tokens": a, "max_new_tokens": 4, "ignore_eos": True}))
# "after" far past the steps before: each request arrives once the one before has finished
# (the engine skips idle steps).
if filler > 0:
    f = [rng.randrange(vocab) for _ in range(filler)]
    print(json.dumps({"id": "filler", "tokens": f, "max_new_tokens": 4, "ignore_eos": True,
                      "after": 100000}))
print(json.dumps({"id": "second", "tokens": b, "max_new_tokens": 4, "ignore_eos": True,
                  "after": 200000}))
PY
"$MOETIER" batch --model "$MODEL" --requests "$W/requests.jsonl" --parallel 1 \
  --max-batch-tokens 512 "$@" > "$W/out.jsonl"
python3 - "$W/out.jsonl" "$PREFIX" "$FILLER" <<'PY'
import json, sys
rows = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
a, b = rows["first"], rows["second"]
print(json.dumps({"prefix_tokens": int(sys.argv[2]), "filler_tokens": int(sys.argv[3]),
                  "first_ttft_ms": a["ttft_ms"],
                  "second_ttft_ms": b["ttft_ms"], "second_cached_tokens": b["cached_tokens"],
                  "ttft_ratio": b["ttft_ms"] / a["ttft_ms"]}))
PY
