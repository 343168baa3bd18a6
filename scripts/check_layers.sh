#!/usr/bin/env bash
# Checks that no #include in src/ runs back up a floor (docs/architecture.md, "Floors"):
#   0 core  ->  1 loader, tokenizer  ->  2 io  ->  3 ops  ->  4 model, backends/cpu, backends/cuda
#   ->  5 synth  ->  6 runtime  ->  7 server, bench  ->  8 cli
# A file in folder A may include its own folder and any folder on a lower floor; folders on the
# same floor are peers and never include each other (model and the backends meet only in ops/).
# Usage: scripts/check_layers.sh [--graph]   (--graph also prints the folder import graph)
# Exit 0 when every include holds, 1 with one line per offending include otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

floor_of() {
  case "$1" in
    core) echo 0 ;;
    loader | tokenizer) echo 1 ;;
    io) echo 2 ;;
    ops) echo 3 ;;
    model | backends/cpu | backends/cuda) echo 4 ;;
    synth) echo 5 ;;
    runtime) echo 6 ;;
    server | bench) echo 7 ;;
    cli) echo 8 ;;
    *) echo -1 ;;
  esac
}

# The unit a path belongs to: its top folder under src/, or backends/<name>.
unit_of() {
  local p=$1
  case "$p" in
    backends/*/*) p=${p#backends/}; echo "backends/${p%%/*}" ;;
    */*) echo "${p%%/*}" ;;
    *) echo "" ;;
  esac
}

bad=0
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
while IFS= read -r file; do
  rel=${file#src/}
  from=$(unit_of "$rel")
  ff=$(floor_of "$from")
  if [ "$ff" -lt 0 ]; then
    echo "check_layers: $file: folder '$from' has no floor (add it to scripts/check_layers.sh and docs/architecture.md)"
    bad=1
    continue
  fi
  while IFS=: read -r line inc; do
    target=$(unit_of "$inc")
    [ -z "$target" ] && continue  # "x.h" beside the file
    [ "$target" = "$from" ] && continue
    tf=$(floor_of "$target")
    echo "$from $target" >>"$edges"
    if [ "$tf" -lt 0 ] || [ "$tf" -ge "$ff" ]; then
      echo "check_layers: $file:$line: includes \"$inc\": $from (floor $ff) may not import $target (floor $tf)"
      bad=1
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" | sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/')
done < <(find src -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)

if [ "${1:-}" = "--graph" ]; then
  sort -u "$edges" | awk '{a[$1] = a[$1] (a[$1] ? ", " : "") $2} END {for (k in a) print k " -> " a[k]}' | sort
fi
if [ "$bad" -ne 0 ]; then
  echo "check_layers: FAILED (an include runs back up a floor or across peers)"
  exit 1
fi
echo "check_layers: ok (every include in src/ points down a floor)"
