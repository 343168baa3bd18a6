#!/usr/bin/env bash
# Negative control for the CUDA tests (gpu-backend.md §3.7): builds BUILD/wren_tests_planted, the
# test binary with the bugs of tests/cuda_planted_bugs.patch planted in the CUDA kernels (one per
# op: wrong nibble order, KV row written at position 0, decay skipped, ...). Every CudaOps test and
# every CUDA model test must FAIL with it. Only the patched .cu files are recompiled (with the
# build's own nvcc command lines) and the test binary relinked; BUILD must be a CUDA build.
# Usage: scripts/cuda_planted.sh [BUILD [PATCH [NAME [TARGET]]]]   (defaults: build,
# tests/cuda_planted_bugs.patch, wren_tests_planted, wren_tests). TARGET wren links the CLI instead
# (a variant binary for side-by-side timing, e.g. a patch that restores an old default). A PATCH that touches no .cuh header only
# recompiles the .cu files it patches (single-bug patches: tests/cuda_planted_{routed,graph,tier}.patch).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${1:-build}
patch_file=${2:-tests/cuda_planted_bugs.patch}
out_name=${3:-wren_tests_planted}
target=${4:-wren_tests}
case "$target" in wren|wren_tests) ;; *) echo "TARGET must be wren or wren_tests" >&2; exit 2 ;; esac
case "$patch_file" in /*) ;; *) patch_file="$root/$patch_file" ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r src "$tmp/src"
(cd "$tmp" && patch -s -p1 < "$patch_file")
if grep -q '^+++ .*\.cuh' "$patch_file"; then
  sources=(src/backends/cuda/*.cu)
else
  mapfile -t sources < <(grep '^+++ ' "$patch_file" | sed -E 's#^\+\+\+ [^/]+/([^[:space:]]+).*#\1#')
fi
mkdir -p "$tmp/obj"
cp "$build/libwren_lib.a" "$tmp/libwren_lib.a"
for cu in "${sources[@]}"; do
  name=$(basename "$cu")
  cmd=$(python3 -c 'import json,sys; [print(e["command"]) for e in json.load(open(sys.argv[1])) if e["file"].endswith(sys.argv[2])]' \
        "$build/compile_commands.json" "/$cu")
  [ -n "$cmd" ] || { echo "no compile command for $cu in $build" >&2; exit 1; }
  cmd=${cmd//-I$root\/src/-I$tmp\/src}
  cmd=${cmd//$root\/$cu/$tmp\/$cu}
  cmd=$(sed -E "s# -o [^ ]+# -o $tmp/obj/$name.o#" <<<"$cmd")
  (cd "$build" && eval "$cmd")
done
(cd "$tmp/obj" && ar r "$tmp/libwren_lib.a" ./*.o)  # x.cu.o, or x.cpp.o for a patched .cpp
link=$(cd "$build" && ninja -t commands "$target" | tail -1)
link=${link#: && }
link=${link%% && :*}
link=${link// libwren_lib.a / $tmp\/libwren_lib.a }
link=${link//-o $target /-o $out_name }
(cd "$build" && eval "$link")
echo "built $build/$out_name"
