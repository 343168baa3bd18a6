#!/usr/bin/env bash
# Configures and builds Wren: scripts/build.sh [DIR] [CMAKE_ARGS...] [--target NAME]...
# DIR defaults to build/; without --target every target is built (wren and wren_tests).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake_args=()
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) targets+=(--target "$2"); shift 2 ;;
    *) cmake_args+=("$1"); shift ;;
  esac
done
cmake -S . -B "$dir" -G Ninja "${launcher[@]}" "${cmake_args[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)" "${targets[@]}"
