#!/usr/bin/env bash
# Packs a CUDA build for the GPU machine, whose image lacks the Debian libraries Wren links:
#   scripts/device_bundle.sh BUILD_DIR DEST
# DEST (a git-ignored folder of the checkout that travels, e.g. .dev-final) receives the stripped
# binaries (wren, wren_tests, share/), the shared libraries they need that the device image lacks,
# tests/data, and env.sh, keeping BUILD_DIR's path relative to the checkout. On the device:
# `cd DEST && source env.sh && ./BUILD_DIR/wren_tests ...`.
# env.sh puts lib/ on LD_LIBRARY_PATH and links the source path compiled into the tests
# (WREN_SOURCE_DIR) to DEST, so tests find tests/data there.
set -euo pipefail
build="$1"; dest="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$build" && pwd)"
case "$build" in "$root"/*) rel="${build#"$root"/}" ;; *) echo "BUILD_DIR must be inside $root" >&2; exit 2 ;; esac
rm -rf "$dest"; mkdir -p "$dest/lib" "$dest/$rel" "$dest/tests"
for b in wren wren_tests; do
  if [ -x "$build/$b" ]; then strip -o "$dest/$rel/$b" "$build/$b"; fi
done
if [ -d "$build/share" ]; then cp -r "$build/share" "$dest/$rel/"; fi
cp -r "$root/tests/data" "$dest/tests/"
ldd "$build/wren_tests" "$build/wren" 2>/dev/null | awk '/=>/ {print $3}' | sort -u |
  grep -E 'httplib|pcre2|libssl|libcrypto|brotli|libz\.|libedit|libbsd|libmd|libtinfo|liburing|libgtest' |
  while read -r so; do cp -L "$so" "$dest/lib/"; done
cat > "$dest/env.sh" <<ENV
# Sourced on the device from $(basename "$dest"): libraries and the compiled-in source path.
export LD_LIBRARY_PATH="\$PWD/lib:\${LD_LIBRARY_PATH:-}"
mkdir -p "$(dirname "$root")" && { [ -e "$root" ] || ln -s "\$PWD" "$root"; }
ENV
du -sh "$dest"
