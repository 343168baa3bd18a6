#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a bounded time from its seed
# corpus (tests/fuzz/corpus/<target>/), after replaying every saved regression input
# (tests/fuzz/regressions/<target>/). Exits non-zero on the first crash, leak, timeout or sanitizer
# report; the crashing input is left in the work dir and named in the output.
#   scripts/fuzz.sh [SECONDS_PER_TARGET=30] [TARGET...]      (default: every target)
# Environment: WREN_FUZZ_DIR (build dir, default build-fuzz), WREN_FUZZ_JOBS (build jobs, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
all=(safetensors config index tokenizer_config tiktoken openai_request chat)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi
dir=${WREN_FUZZ_DIR:-build-fuzz}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DWREN_FUZZ=ON -DWREN_TESTS=OFF -DWREN_CUDA=OFF >/dev/null
build=()
for t in "${targets[@]}"; do build+=(--target "fuzz_$t"); done
cmake --build "$dir" -j"${WREN_FUZZ_JOBS:-2}" "${build[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work="$dir/fuzz-work"
for t in "${targets[@]}"; do
  bin="$dir/fuzz_$t"
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  if [ -d "tests/fuzz/regressions/$t" ] && [ -n "$(ls -A "tests/fuzz/regressions/$t")" ]; then
    echo "== fuzz_$t: replaying tests/fuzz/regressions/$t"
    "$bin" -rss_limit_mb=2048 -timeout=10 tests/fuzz/regressions/"$t"/* >"$work/$t/regressions.log" 2>&1 ||
      { tail -40 "$work/$t/regressions.log"; echo "fuzz_$t: a regression input fails again"; exit 1; }
  fi
  echo "== fuzz_$t: ${secs} s from tests/fuzz/corpus/$t"
  # New inputs go to the work corpus; the seed corpus in the repository is only read.
  if ! "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" "tests/fuzz/corpus/$t" >"$work/$t/run.log" 2>&1; then
    tail -60 "$work/$t/run.log"
    echo "fuzz_$t: FAILED; the input is in $work/$t/artifacts/ (add it to tests/fuzz/regressions/$t/ with the fix)"
    exit 1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$t/run.log" | tr '\n' ' ' | sed "s/^/fuzz_$t: /"
  echo
done
echo "fuzz: ${#targets[@]} targets, ${secs} s each, no crashes"
