#!/usr/bin/env python3
"""One line from a `moetier bench --json` file: the figures gpu_suite.sh's summary keeps."""
import json
import sys

try:
    j = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no JSON ({e})")
    sys.exit(0)
keys = ["backend", "dtype", "held_dtype", "cpu_copy_bytes", "prompt_tokens", "parallel",
        "prefill_tokens_per_s", "decode_tokens_per_s", "decode_gb_per_s", "cache_hit_rate", "h2d_gb_per_s",
        "q_star", "fetched_experts_per_token", "cpu_experts_per_token", "graph_replayed_steps", "peak_rss_bytes"]
out = [f"{k}={j[k]:.4g}" if isinstance(j.get(k), float) else f"{k}={j.get(k)}"
       for k in keys if k in j]
phases = j.get("decode_phase_ms_per_token")
if phases:
    out.append("decode ms/token: " + ", ".join(f"{k} {v:.3g}" for k, v in phases.items()))
print(" ".join(out))
