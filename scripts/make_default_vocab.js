// Writes the vocabulary of Wren's built-in default model: the first N ranks of o200k_base, taken
// from the npm `tiktoken` package (installed by scripts/setup.sh under tests/tokenizer), in
// tiktoken.model format ("base64(token) rank" per line).
//   node scripts/make_default_vocab.js OUT_FILE [N=16384]
"use strict";
const fs = require("fs");
const path = require("path");

const out = process.argv[2];
const n = Number(process.argv[3] || 16384);
if (!out || !(n > 256)) {
  console.error("usage: node scripts/make_default_vocab.js OUT_FILE [N > 256]");
  process.exit(2);
}
let o200k;
try {
  o200k = require(path.join(__dirname, "..", "tests", "tokenizer", "node_modules", "tiktoken", "encoders", "o200k_base.json"));
} catch (e) {
  console.error("make_default_vocab.js: the npm package 'tiktoken' is missing (run scripts/setup.sh)");
  process.exit(3);
}
// The package's compact format: "! R" sets the next rank to R; every other word is base64 bytes.
const lines = [];
let rank = 0;
const words = o200k.bpe_ranks.split(/\s+/);
for (let i = 0; i < words.length && lines.length < n; i++) {
  if (words[i] === "!") { rank = Number(words[++i]); continue; }
  if (words[i] === "") continue;
  lines.push(words[i] + " " + rank++);
}
if (lines.length < n) { console.error("o200k_base has fewer than " + n + " ranks"); process.exit(4); }
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out + ".tmp", lines.join("\n") + "\n");
fs.renameSync(out + ".tmp", out);
