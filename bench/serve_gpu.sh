#!/usr/bin/env bash
# The GPU part of issue 15 in one device call (docs/serve.md, docs/gpu-results.md "Run 22-serve"):
# the CUDA batched tests, then `wren bench serve` at 1, 4 and 16 concurrent clients on the
# Kimi-Linear-48B-size checkpoint (built on the device by bench/gpu_vs_fla.py, given a stand-in
# tokenizer by bench/synth_tokenizer.py). Run from a bundle folder inside the checkout
# (scripts/device_bundle.sh BUILD DEST, with this script and synth_tokenizer.py copied into DEST):
#   cd DEST && source env.sh && bash serve_gpu.sh BUILD OUTDIR
set -uo pipefail
b="${1:-build}"; out="${2:-/tmp}"
timeout 120 "./$b/wren_tests" --gtest_filter='CudaBatched.*' 2>&1 | tee "$out/tests.log"
(cd .. && timeout 120 python3 -c "import sys; sys.path.insert(0,'bench'); import gpu_vs_fla as g; g.build_checkpoint('/tmp/kl48', 0)") 2>&1 | tail -3 | tee "$out/ckpt.log"
python3 synth_tokenizer.py /tmp/kl48 163840 | tee -a "$out/ckpt.log"
cat /tmp/kl48/*.safetensors > /dev/null
timeout 200 "./$b/wren" bench serve --model /tmp/kl48 --backend cuda --quant bf16 --clients 1,4,16 --requests 3 \
  --max-tokens 128 --ctx 1024 --json 2>&1 | tee "$out/bench.log"
