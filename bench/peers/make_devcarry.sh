#!/usr/bin/env bash
# Fills .devcarry/ (ignored by git: add "/.devcarry/" to .git/info/exclude) with what
# bench/peers/device_run.sh needs on the GPU machine, which has no package registry: the moetier
# binary built here (Release; its kernels pick the instruction set at run time), the shared
# libraries it needs beyond glibc/libstdc++, llama.cpp's source (from build-llama-cpp.sh's
# checkout, without its build and docs), the synthetic-model writer, and the fixture GGUF's
# metadata without its tensors (the writer reads only the metadata). About 14 MB.
#
#   bench/peers/make_devcarry.sh [BUILD_DIR]   # default: build
# then carry ".devcarry" in the device call.
set -euo pipefail
BUILD=$(realpath -m "${1:-build}")  # relative to where it is called from
LLAMA_SRC=${LLAMA_SRC:-$HOME/.cache/moetier-peers/llama.cpp}
SHARED=${SHARED:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
cd "$(dirname "$0")/../.."  # .devcarry/ goes in the repository root, where device calls start
[ -x "$BUILD/bin/moetier" ] || { echo "make_devcarry.sh: no $BUILD/bin/moetier; build first (README)" >&2; exit 2; }
[ -d "$LLAMA_SRC/gguf-py" ] || { echo "make_devcarry.sh: no llama.cpp source at $LLAMA_SRC; run $SHARED/peers/build-llama-cpp.sh" >&2; exit 2; }
rm -rf .devcarry && mkdir -p .devcarry/libs
cp "$BUILD/bin/moetier" .devcarry/moetier && strip .devcarry/moetier
# Every library ldd resolves outside the C/C++ runtime, which the device image has.
ldd "$BUILD/bin/moetier" | awk '$3 ~ /^\// {print $3}' |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
  while read -r lib; do cp -L "$lib" .devcarry/libs/; done
cp "$SHARED/peers/synth_model.py" .devcarry/
tar -C "$LLAMA_SRC" --exclude=./build-cpu --exclude=./build-cuda --exclude=./.git --exclude=./models \
  --exclude=./docs --exclude=./media -cJf .devcarry/llama-src.tar.xz .
GGUF_PY=$LLAMA_SRC/gguf-py /usr/bin/python3 - "$SHARED/fixtures/gguf/qwen3_moe_tiny-bf16.gguf" \
  .devcarry/template-meta.gguf.xz <<'PY'
import lzma, os, sys, tempfile
sys.path.insert(0, os.environ["GGUF_PY"])
import gguf
src, dst = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(src)
tmp = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False).name
w = gguf.GGUFWriter(tmp, "qwen3moe")
skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}
for k, f in r.fields.items():
    if k in skip:
        continue
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            w.add_array(k, [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data])
        else:
            w.add_array(k, [f.parts[i][0].item() for i in f.data])
    elif t == gguf.GGUFValueType.STRING:
        w.add_string(k, bytes(f.parts[f.data[0]]).decode())
    else:
        w.add_key_value(k, f.parts[f.data[0]][0].item(), t)
w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
open(dst, "wb").write(lzma.compress(open(tmp, "rb").read()))
os.unlink(tmp)
PY
du -sh .devcarry
