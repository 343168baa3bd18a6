#!/usr/bin/env bash
# Stages what the GPU machine needs into DEST (a git-ignored folder of the checkout that `run` sends,
# e.g. /work/main/.dev-train, passed as carry): k3_tiny.py and the tokenized corpus (about 16 MB).
# Builds the corpus first when it is missing (needs the Debian packages of scripts/train/README.md).
# Usage: scripts/train/stage_device.sh DEST
# Then on the device, from the repository root:
#   cd .dev-train && bash train_on_device.sh "$OUT"      (about 7 minutes; 5 files come back)
set -euo pipefail
dest="$1"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
corpus="$root/build/train-corpus"
if [ ! -s "$corpus/train.u16" ]; then
  python3 "$here/make_corpus.py" "$corpus"
  node "$here/tokenize.js" "$corpus" "$root/data/default-vocab.tiktoken"
fi
rm -rf "$dest"
mkdir -p "$dest/scripts/train" "$dest/corpus"
cp "$here/k3_tiny.py" "$dest/scripts/train/"
cp "$corpus/train.u16" "$corpus/prompts.json" "$corpus/heldout-text.u16" "$dest/corpus/"
cat > "$dest/train_on_device.sh" <<'EOS'
#!/usr/bin/env bash
# Trains, exports and checks wren-tiny; leaves in OUT: the shards (each < 15 MB), rest.tgz
# (config.json, model.safetensors.index.json, train_log.json, reference/) and log.txt.
set -eo pipefail
out="$1"
mkdir -p "$out/m"
PYTHONUNBUFFERED=1 python3 scripts/train/k3_tiny.py train corpus/train.u16 "$out/m" --seconds "${SECONDS_BUDGET:-420}" \
  --batch 256 --seq 128 --prompts corpus/prompts.json --heldout corpus/heldout-text.u16 2>&1 | tee "$out/log.txt"
cd "$out/m"
tar czf ../rest.tgz ./*.json reference
mv model-*.safetensors ..
cd .. && rm -rf m
EOS
du -sh "$dest"
