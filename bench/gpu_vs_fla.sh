#!/usr/bin/env bash
# Side-by-side prefill and decode on the GPU machine, one run: a random Kimi-Linear-48B-A3B-size
# checkpoint (6 layers, BF16, ~20 GB) built and saved by transformers, then transformers (+ fla) and
# Wren on it at 512, 4096 and 16384 prompt tokens, and the ratios; then one sequence's decode after
# 64 tokens, each engine's ms/token against the floor (`wren bench batch --batches 1`: the token's
# bytes at the copy bandwidth measured in that run) (bench/gpu_vs_fla.py; docs/gpu-results.md).
#   bench/gpu_vs_fla.sh [WREN_BINARY] [FLA_SOURCE_DIR] [OUT_DIR]
# FLA_SOURCE_DIR: a folder holding fla/ (flash-linear-attention at a pinned commit, brought as
# source: `git archive <commit> fla | tar -x -C DIR`); nothing is installed from the network.
# Give DIR a flash_linear_attention-VERSION.dist-info (METADATA, top_level.txt) so that
# importlib.metadata finds the version transformers checks. Pinned here: fla-org/flash-linear-attention
# bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (fla 0.5.2). WREN_EXTRA: more flags for the Wren run (e.g.
# --profile: a per-launch device-time table per length); DECODE_QUANT (default stored: the
# checkpoint's BF16) and DECODE_EXTRA (e.g. --profile) for the decode run.
set -euo pipefail
cd "$(dirname "$0")/.."
wren=${1:-./build/wren}
fla=${2:-}
out=${3:-/tmp}
ckpt=${CKPT:-/tmp/kimi-linear-48b-6l}
lengths=${LENGTHS:-512,4096,16384}
[ -n "$fla" ] && export PYTHONPATH="$fla${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
common="$wren bench prefill --model $ckpt --backend cuda --quant bf16 --json"
python3 bench/gpu_vs_fla.py --out "$ckpt" --lengths "$lengths" --repeat 3 --json "$out/gpu_vs_fla.json" \
  --wren "$common --gpu-precision fast --prompts $lengths --repeat 3 --also-exact 512 ${WREN_EXTRA:-}" \
  "$wren bench batch --model $ckpt --backend cuda --quant ${DECODE_QUANT:-stored} --gpu-precision fast --batches 1 --prompt 64 --steps 64 ${DECODE_EXTRA:-} --json"
