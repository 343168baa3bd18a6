// Tokenizer oracle for Wren's tests: the real tiktoken core (npm `tiktoken`, Rust compiled to
// WASM) with the Kimi pre-tokenizer pattern, as in shared/tools/tiktoken_oracle.js.
//   node oracle.js corpus OUT.json                   write the test corpus: a JSON list of base64 texts
//   node oracle.js o200k TOKENIZER_CONFIG OUT_DIR    write all o200k_base ranks as OUT_DIR/tiktoken.model and
//                                                    TOKENIZER_CONFIG's specials renumbered after them
//   node oracle.js sweep FIRST LAST STRIDE OUT_DIR
//        code-point class sweep: for every STRIDE-th scalar value c in [FIRST, LAST] (hex), short probes
//        ("中c中", "ac", "cAa", ...) whose pre-tokenizer pieces depend on c's classes; OUT_DIR gets a
//        segmentation-revealing vocabulary (all 256 bytes + every substring of every probe, so each piece is
//        one id), a tokenizer_config.json, probes.json (base64) and ids.json (tiktoken encode_ordinary)
//   node oracle.js bench-corpus SRC_ROOT MB OUT_DIR
//        write the throughput corpora of `wren bench tokenizer`, about MB megabytes each:
//        english.txt (SRC_ROOT's README.md and docs/*.md), code.txt (SRC_ROOT/src C++ and CUDA sources),
//        mixed.txt (the well-formed test-corpus strings: every script, emoji, digits, whitespace runs)
//   node oracle.js bench MODEL_DIR REPS FILE...
//        encode_ordinary throughput: per FILE one JSON line {file, bytes, ids, hash, best_s, best_cpu_s}
//        (best of REPS runs after one warm-up, wall clock and process CPU time; hash = FNV-1a over
//        the ids as wren computes it)
//   node oracle.js encode MODEL_DIR CORPUS.json OUT.json
//        encode every corpus text; OUT = {"ordinary": [...], "kimi": [...], "special": [...]}, one id list
//        per text: ordinary = encode_ordinary of the whole text; kimi = upstream tokenization_kimi.py
//        cuts (400,000-code-point slices, runs over 25,000 split) then encode_ordinary per cut;
//        special = the same cuts, encode with all special tokens allowed.
// Texts are UTF-8 bytes; ill-formed ones are decoded with U+FFFD replacement (WHATWG), BOM kept.
"use strict";
const fs = require("fs");
const path = require("path");

function requireTiktoken() {
  try {
    return require("tiktoken/lite");
  } catch (e) {
    console.error("oracle.js: cannot load the npm package 'tiktoken' (" + e.message.split("\n")[0] +
      "); install it with: npm ci --prefix " + __dirname + "  (scripts/setup.sh does this)");
    process.exit(3);
  }
}

const { KIMI_PAT } = require("./kimi_pattern");

// Python's str.isspace() (general category Zs, or bidi class WS, B, S), checked against CPython.
const PY_SPACE = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]$/u;

/// tokenization_kimi.py's cuts, re-implemented here from its description (code points, not UTF-16).
function upstreamCuts(text) {
  const cps = Array.from(text);
  const out = [];
  for (let i = 0; i < cps.length; i += 400000) {
    const s = cps.slice(i, i + 400000);
    let start = 0, len = 0, isSpace = PY_SPACE.test(s[0]);
    for (let j = 0; j < s.length; j++) {
      const now = PY_SPACE.test(s[j]);
      if (now !== isSpace) { len = 1; isSpace = now; continue; }
      if (++len > 25000) { out.push(s.slice(start, j).join("")); start = j; len = 1; }
    }
    out.push(s.slice(start).join(""));
  }
  return out;
}

function loadModel(dir) {
  const { Tiktoken } = requireTiktoken();
  const lines = fs.readFileSync(path.join(dir, "tiktoken.model"), "utf8").trim().split("\n").map((l) => l.split(" "));
  // lite Tiktoken takes ranks as "! OFFSET tok tok ..." lines (consecutive ranks from OFFSET); one
  // line per rank is accepted too but is much slower to parse
  const inOrder = lines.every(([, r], i) => Number(r) === i);
  const ranks = inOrder ? "! 0 " + lines.map(([b]) => b).join(" ") : lines.map(([b, r]) => "! " + r + " " + b).join("\n");
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const specials = {};
  for (const [id, v] of Object.entries(cfg.added_tokens_decoder)) specials[v.content] = Number(id);
  return new Tiktoken(ranks, specials, KIMI_PAT);
}

function cmdCorpus(out) {
  const { makeCorpus } = require("./corpus.js");
  fs.writeFileSync(out, JSON.stringify(makeCorpus().map((b) => b.toString("base64"))));
}

function cmdO200k(configPath, outDir) {
  const { Tiktoken } = requireTiktoken();
  const o = require("tiktoken/encoders/o200k_base.json");
  const enc = new Tiktoken(o.bpe_ranks, o.special_tokens, o.pat_str);
  const n = o.bpe_ranks.split(" ").length - 2;  // compact form: "! 0 tok tok ..."
  const lines = [];
  for (let r = 0; r < n; r++) lines.push(Buffer.from(enc.decode_single_token_bytes(r)).toString("base64") + " " + r);
  enc.free();
  fs.mkdirSync(outDir, { recursive: true });
  fs.writeFileSync(path.join(outDir, "tiktoken.model"), lines.join("\n") + "\n");
  const cfg = JSON.parse(fs.readFileSync(configPath, "utf8"));
  const ids = Object.keys(cfg.added_tokens_decoder).map(Number);
  const first = Math.min(...ids), renumbered = {};
  for (const [id, v] of Object.entries(cfg.added_tokens_decoder)) renumbered[String(Number(id) - first + n)] = v;
  cfg.added_tokens_decoder = renumbered;
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(cfg, null, 1));
}

function cmdEncode(modelDir, corpusPath, out) {
  const enc = loadModel(modelDir);
  const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  const texts = JSON.parse(fs.readFileSync(corpusPath, "utf8")).map((b) => decoder.decode(Buffer.from(b, "base64")));
  const result = { ordinary: [], kimi: [], special: [] };
  for (const t of texts) {
    const cuts = upstreamCuts(t);
    const kimi = cuts.flatMap((c) => Array.from(enc.encode_ordinary(c)));
    result.kimi.push(kimi);
    result.ordinary.push(cuts.length === 1 ? kimi : Array.from(enc.encode_ordinary(t)));
    result.special.push(cuts.flatMap((c) => Array.from(enc.encode(c, "all"))));
  }
  enc.free();
  fs.writeFileSync(out, JSON.stringify(result));
}

const PROBES = [(c) => "中" + c + "中", (c) => "a" + c, (c) => c + "Aa", (c) => "1" + c, (c) => "!" + c,
  (c) => "a'" + c, (c) => " " + c, (c) => c + "\n"];

function cmdSweep(firstHex, lastHex, strideStr, outDir) {
  const first = parseInt(firstHex, 16), last = parseInt(lastHex, 16), stride = Number(strideStr);
  const probes = [];
  for (let c = first; c <= last; c += stride) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    for (const p of PROBES) probes.push(p(String.fromCodePoint(c)));
  }
  const tokens = new Map();
  for (let b = 0; b < 256; b++) tokens.set(Buffer.from([b]).toString("latin1"), b);
  for (const p of probes) {
    const cps = Array.from(p);
    for (let i = 0; i < cps.length; i++)
      for (let j = i + 1; j <= cps.length; j++) {
        const key = Buffer.from(cps.slice(i, j).join(""), "utf8").toString("latin1");
        if (!tokens.has(key)) tokens.set(key, tokens.size);
      }
  }
  fs.mkdirSync(outDir, { recursive: true });
  const lines = [];
  for (const [k, r] of tokens) lines.push(Buffer.from(k, "latin1").toString("base64") + " " + r);
  fs.writeFileSync(path.join(outDir, "tiktoken.model"), lines.join("\n") + "\n");
  const cfg = { added_tokens_decoder: { [String(tokens.size)]: { content: "<|sweep|>", special: true } } };
  fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(cfg));
  fs.writeFileSync(path.join(outDir, "probes.json"), JSON.stringify(probes.map((p) => Buffer.from(p, "utf8").toString("base64"))));
  const enc = loadModel(outDir);
  fs.writeFileSync(path.join(outDir, "ids.json"), JSON.stringify(probes.map((p) => Array.from(enc.encode_ordinary(p)))));
  enc.free();
}

/// Documents repeated in order until about `mb` megabytes (whole documents, so no text is cut).
function cycleTo(docs, mb) {
  const want = Math.max(1, Math.round(mb * 1e6)), parts = [];
  let n = 0;
  if (docs.length === 0) throw new Error("no documents to build a corpus from");
  for (let i = 0; n < want; i = (i + 1) % docs.length) {
    parts.push(docs[i]);
    n += docs[i].length;
  }
  return Buffer.concat(parts);
}

function listFiles(dir, exts) {
  const out = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...listFiles(p, exts));
    else if (exts.some((x) => e.name.endsWith(x))) out.push(p);
  }
  return out;
}

function cmdBenchCorpus(srcRoot, mbStr, outDir) {
  const mb = Number(mbStr);
  const read = (p) => fs.readFileSync(p);
  const english = [path.join(srcRoot, "README.md"), ...listFiles(path.join(srcRoot, "docs"), [".md"])].map(read);
  const code = listFiles(path.join(srcRoot, "src"), [".h", ".cpp", ".cu", ".cuh"]).map(read);
  // Well-formed strings only, none long enough for upstream's 25,000-character cuts (wren's encode
  // applies them, encode_ordinary does not), each followed by a newline.
  const { makeCorpus } = require("./corpus.js");
  const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  const wellFormed = (b) => { try { decoder.decode(b); return true; } catch (e) { return false; } };
  const mixed = makeCorpus().filter((b) => b.length < 20000 && wellFormed(b)).map((b) => Buffer.concat([b, Buffer.from("\n")]));
  fs.mkdirSync(outDir, { recursive: true });
  for (const [name, docs] of [["english", english], ["code", code], ["mixed", mixed]])
    fs.writeFileSync(path.join(outDir, name + ".txt"), cycleTo(docs, mb));
}

/// FNV-1a over 32-bit ids (bench/wren agree on it to show both produced the same ids).
function fnv(ids) {
  let h = 0x811c9dc5;
  for (const id of ids) h = Math.imul((h ^ id) >>> 0, 16777619) >>> 0;
  return h >>> 0;
}

function cmdBench(modelDir, repsStr, files) {
  const enc = loadModel(modelDir);
  const reps = Math.max(1, Number(repsStr));
  for (const file of files) {
    const text = fs.readFileSync(file, "utf8");
    const bytes = Buffer.byteLength(text, "utf8");
    let ids = enc.encode_ordinary(text), best = Infinity, bestCpu = Infinity;  // warm-up (and the ids to check)
    for (let r = 0; r < reps; r++) {
      const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
      ids = enc.encode_ordinary(text);
      const c = process.cpuUsage(c0);
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
      bestCpu = Math.min(bestCpu, (c.user + c.system) / 1e6);
    }
    console.log(JSON.stringify({ file, bytes, ids: ids.length, hash: fnv(ids), best_s: best, best_cpu_s: bestCpu }));
  }
  enc.free();
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === "corpus" && args.length === 1) cmdCorpus(args[0]);
else if (cmd === "o200k" && args.length === 2) cmdO200k(args[0], args[1]);
else if (cmd === "sweep" && args.length === 4) cmdSweep(...args);
else if (cmd === "encode" && args.length === 3) cmdEncode(args[0], args[1], args[2]);
else if (cmd === "bench-corpus" && args.length === 3) cmdBenchCorpus(...args);
else if (cmd === "bench" && args.length >= 3) cmdBench(args[0], args[1], args.slice(2));
else {
  console.error("usage: node oracle.js corpus OUT | o200k TOKENIZER_CONFIG OUT_DIR | encode MODEL_DIR CORPUS OUT |\n" +
    "       sweep FIRST_HEX LAST_HEX STRIDE OUT_DIR | bench-corpus SRC_ROOT MB OUT_DIR | bench MODEL_DIR REPS FILE...");
  process.exit(2);
}
