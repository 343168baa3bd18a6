#!/usr/bin/env bash
# Puts the files the GPU run returned (FILES: the shards, rest.tgz) into the repository:
# models/wren-tiny (checkpoint + the default tokenizer files) and tests/data/wren-tiny (reference).
# Usage: scripts/train/install_model.sh FILES_DIR
set -euo pipefail
src="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
m="$root/models/wren-tiny"
rm -rf "$m" && mkdir -p "$m"
cp "$src"/model-*.safetensors "$m/"
tmp="$(mktemp -d)"
tar xzf "$src/rest.tgz" -C "$tmp"
cp "$tmp/config.json" "$tmp/model.safetensors.index.json" "$m/"
cp "$tmp/train_log.json" "$m/" 2>/dev/null || true
cp "$tmp"/reference/* "$root/tests/data/wren-tiny/"
rm -rf "$tmp"
# Tokenizer: the default vocabulary (scripts/setup.sh writes it) and tokenizer_config.json with the
# K3 specials after its 16,384 ranks, as tokenizer_config() in src/runtime/default_model.cpp writes it.
cp "$root/data/default-vocab.tiktoken" "$m/tiktoken.model"
python3 - "$m/tokenizer_config.json" <<'EOP'
import json, sys
R = 16384
named = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
         6: "[start_header_id]", 7: "[end_header_id]", 9: "[EOT]", 18: "<|media_begin|>",
         19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>", 65: "<osagent_mode>",
         254: "[UNK]", 255: "[PAD]"}
dec = {str(R + o): {"content": named.get(o, f"<|reserved_token_{o}|>"), "special": True, "lstrip": False,
                    "rstrip": False, "normalized": False, "single_word": False} for o in range(256)}
cfg = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
       "unk_token": "[UNK]", "additional_special_tokens": ["<|end_of_msg|>"], "added_tokens_decoder": dec}
open(sys.argv[1], "w").write(json.dumps(cfg, indent=1) + "\n")
EOP
du -b "$m"/* | sort -n | tail -5
echo "now: bash scripts/build.sh build --target wren_tests && ./build/wren_tests --gtest_filter='*WrenTiny*:Perplexity.*:DefaultModel.*'"
