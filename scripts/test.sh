#!/usr/bin/env bash
# The full test job: setup, then build and run the suite twice (plain RelWithDebInfo, then with
# AddressSanitizer + UndefinedBehaviorSanitizer), with warnings as errors (-DWREN_WERROR=ON: development
# and CI only; a user's plain build never fails on a new warning). The sanitizer build leaves the CUDA backend out
# (-DWREN_CUDA=OFF): ASan does not cover device code, and CI has no GPU to run it on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Line tables only (-g1) in this build: backtraces keep file:line, and the suite compiles ~25% faster
# than with full debug info (CI runs on 2 cores; a user's own build keeps RelWithDebInfo's -g).
bash scripts/build.sh build -DWREN_WERROR=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG -Xcompiler=-g1"
ctest --test-dir build --output-on-failure -j"$(nproc)"
bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DWREN_SANITIZE=ON -DWREN_CUDA=OFF -DWREN_WERROR=ON
# Under the sanitizers, the tests that measure quality, time or the source layout rather than
# exercise memory (perplexity and quantization quality, the exhaustive tokenizer sweeps against the
# oracle, a TTFT ratio, the include-layout scan) are left to the plain run above: ~2 min of the
# sanitizer run's test time on CI's 2 cores, no code path of their own.
asan_skip='^(QuantQuality\.|Perplexity\.HeldOut|BenchQuality\.|TokenizerSweep\.|TokenizerOracle\.Full|PrefixCacheTest\.Ttft|Layout\.)'
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E "$asan_skip"
# The libFuzzer targets (clang, ASan + UBSan): saved regressions replayed, then 10 s per parser
# from the seed corpus (tests/fuzz/); longer runs: scripts/fuzz.sh 60 (docs/reliability.md).
bash scripts/fuzz.sh 10
