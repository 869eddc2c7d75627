#!/usr/bin/env bash
# Installs every Debian package the build and the test suite need, and the npm clients the server's
# tests drive. Idempotent: runs `apt-get update` only when something is missing, installs nothing
# that is already there, and runs `npm ci` only when tests/server/node_modules is missing or older
# than its lock file.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev clang-format
  nlohmann-json3-dev libcli11-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libutf8proc-dev
  libcpp-httplib-dev
  python3
  python3-numpy  # bench/peers/compare_llama.sh's synthetic model writer
  chromium  # headless, for the residency page's test (tests/server/residency_page.test.mjs)
)
# Node runs the server's client tests (the real `openai` and `@anthropic-ai/sdk` packages); a node
# installed otherwise (nvm, NodeSource) is used as it is.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present" >&2
fi

# The npm clients of tests/server, exactly as its package-lock.json pins them.
SERVER_TESTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/server"
if [ ! -f "$SERVER_TESTS/node_modules/.package-lock.json" ] ||
   [ "$SERVER_TESTS/package-lock.json" -nt "$SERVER_TESTS/node_modules/.package-lock.json" ]; then
  echo "setup: npm ci in tests/server" >&2
  (cd "$SERVER_TESTS" && npm ci --no-audit --no-fund) ||
    echo "setup: npm ci failed in tests/server (offline?); the npm client tests will be skipped" >&2
else
  echo "setup: tests/server/node_modules up to date" >&2
fi
