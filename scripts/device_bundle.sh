#!/usr/bin/env bash
# Packs a CUDA build for the GPU machine, whose image lacks the Debian libraries Wren links:
#   scripts/device_bundle.sh BUILD_DIR DEST
# DEST (a git-ignored folder of the checkout that travels, e.g. .dev-final) receives the stripped
# binaries (wren, wren_tests, share/ without its models/; packed into payload.tar.gz), the shared libraries they need that the
# device image lacks, and env.sh, keeping BUILD_DIR's path relative to the checkout. On the device:
# `cd DEST && source env.sh && ./BUILD_DIR/wren_tests ...`.
# The checkout travels too, so DEST carries no second copy of tests/data or models/ (the 64 MiB
# limit): env.sh links DEST/tests/data and DEST/BUILD_DIR/share/wren/models to the checkout's, puts
# lib/ on LD_LIBRARY_PATH and links the source path compiled into the tests (WREN_SOURCE_DIR) to
# DEST, so tests find tests/data there.
set -euo pipefail
build="$1"; dest="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$build" && pwd)"
case "$build" in "$root"/*) rel="${build#"$root"/}" ;; *) echo "BUILD_DIR must be inside $root" >&2; exit 2 ;; esac
rm -rf "$dest"; mkdir -p "$dest/lib" "$dest/$rel" "$dest/tests"
for b in wren wren_tests; do
  if [ -x "$build/$b" ]; then strip -o "$dest/$rel/$b" "$build/$b"; fi
done
if [ -d "$build/share" ]; then
  mkdir -p "$dest/$rel/share/wren"
  find "$build/share/wren" -mindepth 1 -maxdepth 1 ! -name models -exec cp -r {} "$dest/$rel/share/wren/" \;
fi
ldd "$build/wren_tests" "$build/wren" 2>/dev/null | awk '/=>/ {print $3}' | sort -u |
  grep -E 'httplib|pcre2|libssl|libcrypto|brotli|libz\.|libedit|libbsd|libmd|libtinfo|liburing|libgtest' |
  while read -r so; do cp -L "$so" "$dest/lib/"; done
# Packed (binaries compress ~3x): what travels is the checkout plus this folder, 64 MiB in all.
(cd "$dest" && tar czf payload.tar.gz lib "${rel%%/*}" && rm -rf lib "${rel%%/*}" tests)
cat > "$dest/env.sh" <<ENV
# Sourced on the device from $(basename "$dest"): unpacks, libraries and the compiled-in source path.
[ -d lib ] || tar xzf payload.tar.gz
mkdir -p tests
export LD_LIBRARY_PATH="\$PWD/lib:\${LD_LIBRARY_PATH:-}"
ln -sfn "\$PWD/../tests/data" tests/data
[ -d ../models ] && ln -sfn "\$PWD/../models" "$rel/share/wren/models"
# The compiled-in source path: absent there -> a link to DEST; the checkout itself (built in the
# checkout the device receives) -> a link to DEST's build folder inside it.
if [ -e "$root" ]; then [ -e "$root/$rel" ] || ln -s "\$PWD/$rel" "$root/$rel"; else mkdir -p "$(dirname "$root")" && ln -s "\$PWD" "$root"; fi
ENV
du -sh "$dest"
