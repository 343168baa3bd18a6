#!/usr/bin/env bash
# Installs the Debian packages Wren's build and tests need (idempotent; run as root or with sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS=(build-essential cmake ninja-build pkg-config ccache
      nlohmann-json3-dev libcli11-dev libpcre2-dev libcpp-httplib-dev
      libgtest-dev libgmock-dev libbenchmark-dev nodejs npm)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The openai npm client that tests/serve_test.cpp and the load test drive `wren serve` with (from
# its lock file; nothing is fetched at test time).
npm ci --prefix tests/serve --no-audit --no-fund >/dev/null
