#!/usr/bin/env bash
# `cmake --install` smoke test: installs the build into a temporary prefix and runs the installed
# binary from a folder outside the source and build trees; it finds its data through
# <prefix>/share/wren alone (the source path is compiled in only for `wren bench tokenizer`). Usage: install_smoke.sh BUILD_DIR
set -euo pipefail
build="$1"
tmp="$(mktemp -d /tmp/wren-install.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -x "$tmp/prefix/bin/wren" || { echo "FAIL: no $tmp/prefix/bin/wren"; exit 1; }
if [ ! -s "$tmp/prefix/share/wren/default-vocab.tiktoken" ]; then
  echo "FAIL: the default vocabulary was not installed into share/wren"; exit 1
fi
cd "$tmp"
out="$(XDG_CACHE_HOME="$tmp/cache" ./prefix/bin/wren run "Hello" -n 4 --temperature 0 --json 2>"$tmp/err")" || {
  echo "FAIL: the installed wren failed:"; cat "$tmp/err"; exit 1; }
case "$out" in *output_ids*) echo "PASS: installed binary ran from $tmp/prefix" ;;
  *) echo "FAIL: unexpected output: $out"; exit 1 ;; esac
