// Tokenizes the corpus of make_corpus.py with the default model's tokenizer (the first 16,384 ranks of
// o200k_base + the K3 specials at 16384..16639), using the npm `tiktoken` core with the Kimi pre-tokenizer
// pattern (tests/tokenizer/kimi_pattern.js, shared with tests/tokenizer/oracle.js).
//   node scripts/train/tokenize.js CORPUS_DIR VOCAB_FILE
// Writes CORPUS_DIR/train.u16 (little-endian uint16 ids of all training documents, concatenated),
// CORPUS_DIR/heldout.txt (held-out raw documents, one blank line between), CORPUS_DIR/heldout-text.u16
// (that text's ids, as `wren perplexity` tokenizes it), CORPUS_DIR/heldout.u16 and CORPUS_DIR/prompts.json.
// Raw document: [BOS] text <|end_of_msg|>. Chat document: the K3 chat format exactly as
// src/runtime/chat_format.cpp renders it (each text segment encoded on its own, specials disabled); the
// assistant turn has an empty, closed think pair in half of the samples and none in the other half.
"use strict";
const fs = require("fs");
const path = require("path");
const { Tiktoken } = require(require.resolve("tiktoken/lite", { paths: [path.join(__dirname, "../../tests/tokenizer")] }));

const { KIMI_PAT } = require(path.join(__dirname, "../../tests/tokenizer/kimi_pattern.js"));

const [dir, vocab] = process.argv.slice(2);
const lines = fs.readFileSync(vocab, "utf8").trim().split("\n");
const R = lines.length;  // 16384
const enc = new Tiktoken("! 0 " + lines.map((l) => l.split(" ")[0]).join(" "), {}, KIMI_PAT);
const BOS = R, EOM = R + 2, OPEN = R + 3, CLOSE = R + 4, SEP = R + 5;
const t = (s) => (s ? Array.from(enc.encode_ordinary(s)) : []);
const openTag = (name, role) => [OPEN, ...t(name), ...(role ? [...t(" role"), ...t('="'), ...t(role), ...t('"')] : []), SEP];
const closeTag = (name) => [CLOSE, ...t(name), SEP];
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);

function render(d) {
  if (d.src !== "chat") return [BOS, ...t(d.text), EOM];
  const think = rand() < 0.5 ? [...openTag("think"), ...closeTag("think")] : [];
  return [...openTag("message", "user"), ...t(d.user), ...closeTag("message"), EOM,
          ...openTag("message", "assistant"), ...think, ...openTag("response"), ...t(d.answer),
          ...closeTag("response"), ...closeTag("message"), EOM];
}
function write(file, docs) {
  const ids = [];
  for (const d of docs) for (const x of render(d)) ids.push(x);
  fs.writeFileSync(file, Buffer.from(Uint16Array.from(ids).buffer));
  return ids.length;
}
const read = (f) => fs.readFileSync(path.join(dir, f), "utf8").trim().split("\n").map((l) => JSON.parse(l));
const train = read("docs.jsonl"), held = read("heldout.jsonl");
const n = write(path.join(dir, "train.u16"), train);
const h = write(path.join(dir, "heldout.u16"), held);
const heldText = held.map((d) => d.text).join("\n\n") + "\n";
fs.writeFileSync(path.join(dir, "heldout.txt"), heldText);
fs.writeFileSync(path.join(dir, "heldout-text.u16"), Buffer.from(Uint16Array.from(t(heldText)).buffer));
// Prompts whose teacher-forced logits the export saves as reference data (tests/data/wren-tiny):
// raw text gets [BOS] first; the chat prompt is a user turn plus the generation prompt with thinking on.
const firstWords = (s, n) => s.split(/\s+/).slice(0, n).join(" ");
const byS = (src) => held.find((d) => d.src === src).text;
const prompts = [
  [BOS, ...t("The capital of France is")],
  [BOS, ...t(firstWords(byS("fortunes"), 16))],
  [BOS, ...t(firstWords(byS("kjv"), 16))],
  [...openTag("message", "user"), ...t("Hi"), ...closeTag("message"), EOM, ...openTag("message", "assistant"), ...openTag("think")],
];
fs.writeFileSync(path.join(dir, "prompts.json"), JSON.stringify(prompts));
console.error(`train ${n} ids, heldout ${h} ids`);
