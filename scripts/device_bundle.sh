#!/usr/bin/env bash
# Packs a CUDA build for the GPU machine, whose image lacks the Debian libraries Wren links:
#   scripts/device_bundle.sh [--prev WREN_BINARY] BUILD_DIR DEST [PLANTED_NAME...]
# DEST (an untracked folder of the checkout that travels, e.g. .dev-final) receives the stripped
# binaries (wren, wren_tests, share/ without its models/; packed into payload.tar.xz), the shared libraries they need that the
# device image lacks, and env.sh, keeping BUILD_DIR's path relative to the checkout. On the device:
# `cd DEST && source env.sh && ./BUILD_DIR/wren_tests ...`.
# Each PLANTED_NAME (a test binary BUILD_DIR/NAME from scripts/cuda_planted.sh) travels as a zstd
# patch against the stripped wren_tests (~0.1 MB instead of ~3 MB xz: the working tree that travels
# is limited to 64 MiB) and env.sh rebuilds it as DEST/planted/NAME with the zstd binary it carries.
# The checkout travels too, so DEST carries no second copy of tests/data or models/ (the 64 MiB
# limit): env.sh links DEST/tests/data and DEST/BUILD_DIR/share/wren/models to the checkout's, puts
# lib/ on LD_LIBRARY_PATH and links the source path compiled into the tests (WREN_SOURCE_DIR) to
# DEST, so tests find tests/data there.
# --prev: an earlier build's wren (e.g. made with `git checkout COMMIT -- src && ninja -C build wren`)
# for side-by-side timing in one call; it travels as a zstd patch against the stripped wren and
# env.sh rebuilds it as DEST/wren_prev.
set -euo pipefail
prev=""
if [ "${1:-}" = "--prev" ]; then prev="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2; fi
build="$1"; dest="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$build" && pwd)"
case "$build" in "$root"/*) rel="${build#"$root"/}" ;; *) echo "BUILD_DIR must be inside $root" >&2; exit 2 ;; esac
rm -rf "$dest"; mkdir -p "$dest/lib" "$dest/$rel" "$dest/tests"
for b in wren wren_tests; do
  if [ -x "$build/$b" ]; then strip -o "$dest/$rel/$b" "$build/$b"; fi
done
shift 2
# A zstd patch of binary $1 (stripped) against $2, written to $3.
zpatch() {
  strip -o "$3.bin" "$1"
  # zstd prints its parser notes on stderr even with -q: shown only when it fails.
  zstd -q -19 --long=27 --patch-from="$2" "$3.bin" -o "$3" 2>"$3.log" || { cat "$3.log" >&2; exit 1; }
  rm "$3.bin" "$3.log"
}
if [ -n "$prev" ]; then zpatch "$prev" "$dest/$rel/wren" "$dest/wren_prev.zpatch"; fi
if [ $# -gt 0 ]; then
  mkdir -p "$dest/planted"
  for name in "$@"; do zpatch "$build/$name" "$dest/$rel/wren_tests" "$dest/planted/$name.zpatch"; done
fi
if [ $# -gt 0 ] || [ -n "$prev" ]; then
  cp -L "$(command -v zstd)" "$dest/lib/zstd"
  ldd "$(command -v zstd)" | awk '/=>/ {print $3}' | { grep -E 'liblz4|libzstd|liblzma|libz\.' || true; } |
    while read -r so; do cp -L "$so" "$dest/lib/"; done
fi
if [ -d "$build/share" ]; then
  mkdir -p "$dest/$rel/share/wren"
  find "$build/share/wren" -mindepth 1 -maxdepth 1 ! -name models -exec cp -r {} "$dest/$rel/share/wren/" \;
fi
ldd "$build/wren_tests" "$build/wren" 2>/dev/null | awk '/=>/ {print $3}' | sort -u |
  grep -E 'httplib|pcre2|libssl|libcrypto|brotli|libz\.|libedit|libbsd|libmd|libtinfo|liburing|libgtest' |
  while read -r so; do cp -L "$so" "$dest/lib/"; done
# Packed with xz (binaries compress ~5x; unpacked on the device by Python's lzma, as its image may
# lack xz): what travels is the checkout plus this folder, 64 MiB in all.
(cd "$dest" && tar cf - lib "${rel%%/*}" | xz -9e -T2 > payload.tar.xz && rm -rf lib "${rel%%/*}" tests)
cat > "$dest/env.sh" <<ENV
# Sourced on the device from $(basename "$dest"): unpacks, libraries and the compiled-in source path.
[ -d lib ] || python3 -c "import lzma,sys,tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall()" payload.tar.xz
mkdir -p tests
export LD_LIBRARY_PATH="\$PWD/lib:\${LD_LIBRARY_PATH:-}"
for p in planted/*.zpatch; do
  # Always rebuilt (a file left by an earlier call or a failed run would be stale).
  [ -e "\$p" ] && rm -f "\${p%.zpatch}" && lib/zstd -q -d --long=27 --patch-from="$rel/wren_tests" "\$p" -o "\${p%.zpatch}" && chmod +x "\${p%.zpatch}"
done
if [ -e wren_prev.zpatch ]; then rm -f wren_prev && lib/zstd -q -d --long=27 --patch-from="$rel/wren" wren_prev.zpatch -o wren_prev && chmod +x wren_prev; fi
ln -sfn "\$PWD/../tests/data" tests/data
[ -d ../models ] && ln -sfn "\$PWD/../models" "$rel/share/wren/models"
# The compiled-in source path: absent there -> a link to DEST; the checkout itself (built in the
# checkout the device receives) -> a link to DEST's build folder inside it.
if [ -e "$root" ]; then [ -e "$root/$rel" ] || ln -s "\$PWD/$rel" "$root/$rel"; else mkdir -p "$(dirname "$root")" && ln -s "\$PWD" "$root"; fi
ENV
du -sh "$dest"
