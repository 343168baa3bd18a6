#!/usr/bin/env python3
"""Writes a stand-in tokenizer for a synthetic checkpoint (Python stdlib only), so that `wren serve`
and `wren bench serve` can run a random-weight model whose vocabulary no real tokenizer matches.

  python3 bench/synth_tokenizer.py DIR VOCAB

DIR/tiktoken.model gets VOCAB ranks: the 256 single bytes (rank = byte value), then the lowercase
hex spelling of each rank (b"100", b"101", ...; unique, three bytes or more), so that every id the
model can draw decodes to bytes. DIR/tokenizer_config.json declares no special tokens (an existing
one is kept). A benchmark tool, not a tokenizer for text: prompts encode to the single bytes and
the few hex tokens BPE can reach.
"""
import base64
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: synth_tokenizer.py DIR VOCAB")
    out, vocab = sys.argv[1], int(sys.argv[2])
    if vocab < 256:
        sys.exit("VOCAB must be at least 256")
    if not os.path.isfile(os.path.join(out, "config.json")):
        sys.exit(f"{out}: no config.json (not a checkpoint folder)")
    with open(os.path.join(out, "tiktoken.model"), "w") as f:
        for i in range(vocab):
            tok = bytes([i]) if i < 256 else format(i, "x").encode()
            f.write(base64.b64encode(tok).decode() + " " + str(i) + "\n")
    cfg = os.path.join(out, "tokenizer_config.json")
    if not os.path.exists(cfg):
        with open(cfg, "w") as f:
            json.dump({"added_tokens_decoder": {}}, f)
    print(f"{out}: tiktoken.model with {vocab} ranks")


if __name__ == "__main__":
    main()
