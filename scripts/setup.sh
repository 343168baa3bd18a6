#!/usr/bin/env bash
# Installs the Debian packages Wren's build and tests need (idempotent; run as root or with sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS=(build-essential cmake ninja-build pkg-config ccache
      nlohmann-json3-dev libcli11-dev libpcre2-dev libcpp-httplib-dev
      libgtest-dev libgmock-dev libbenchmark-dev libedit-dev
      clang libclang-rt-14-dev)  # clang + libFuzzer runtime: scripts/fuzz.sh
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node.js and npm: by command, since a Node.js from another source (which bundles npm and
# conflicts with Debian's npm package) serves as well.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Test-only npm packages for the tokenizer oracle (tests/tokenizer: tiktoken and Unicode data,
# pinned by its package-lock.json). Installed here, never at test run time; skipped when present.
tok_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/tokenizer"
if ! npm ls --prefix "$tok_dir" --all >/dev/null 2>&1; then
  npm ci --prefix "$tok_dir" --no-audit --no-fund --prefer-offline >/dev/null
fi

# The built-in default model's vocabulary: the first 16,384 ranks of o200k_base from the npm
# tiktoken package just installed (the model itself, models/wren-tiny, is in the repository; the
# build copies it into build/share/wren, read-only).
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -s "$root/data/default-vocab.tiktoken" ]; then
  node "$root/scripts/make_default_vocab.js" "$root/data/default-vocab.tiktoken" 16384
fi

# The openai npm client that tests/serve_test.cpp and the load test drive `wren serve` with (from
# its lock file; nothing is fetched at test time); skipped when present.
serve_dir="$root/tests/serve"
if ! npm ls --prefix "$serve_dir" --all >/dev/null 2>&1; then
  npm ci --prefix "$serve_dir" --no-audit --no-fund --prefer-offline >/dev/null
fi
