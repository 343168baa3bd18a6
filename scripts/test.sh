#!/usr/bin/env bash
# The full test job: setup, then build and run the suite twice (plain RelWithDebInfo, then with
# AddressSanitizer + UndefinedBehaviorSanitizer), with warnings as errors (-DWREN_WERROR=ON: development
# and CI only; a user's plain build never fails on a new warning). The sanitizer build leaves the CUDA backend out
# (-DWREN_CUDA=OFF): ASan does not cover device code, and CI has no GPU to run it on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build -DWREN_WERROR=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DWREN_SANITIZE=ON -DWREN_CUDA=OFF -DWREN_WERROR=ON
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)"
