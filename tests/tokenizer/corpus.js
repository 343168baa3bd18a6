// Deterministic tokenizer test corpus: varied strings (as UTF-8 Buffers, some deliberately
// ill-formed) covering every branch of the Kimi pre-tokenizer and the upstream long-input cuts.
"use strict";

/// mulberry32: a small seeded PRNG, so the corpus is the same on every machine.
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  const pick = (arr) => arr[Math.floor(next() * arr.length)];
  return { next, int, pick, chance: (p) => next() < p };
}

const cp = (c) => String.fromCodePoint(c);
const range = (lo, hi) => [lo, hi];

// Code point pools: [lo, hi] ranges, all assigned since Unicode 13 or earlier (stable categories).
const POOLS = {
  latinLower: [range(0x61, 0x7a)],
  latinUpper: [range(0x41, 0x5a)],
  latin1: [range(0xc0, 0xd6), range(0xd8, 0xf6), range(0xf8, 0xff), range(0x100, 0x17f)],
  titlecase: [[0x1c5, 0x1c5], [0x1c8, 0x1c8], [0x1cb, 0x1cb], [0x1f2, 0x1f2], range(0x1f88, 0x1f8f)],
  modifier: [range(0x2b0, 0x2c1), range(0x2c6, 0x2d1), [0x2ec, 0x2ec], [0x3005, 0x3005], [0x30fc, 0x30fc], [0xff70, 0xff70]],
  greek: [range(0x391, 0x3a9), range(0x3b1, 0x3c9)],
  cyrillic: [range(0x410, 0x44f)],
  armenian: [range(0x531, 0x556), range(0x561, 0x586)],
  hebrew: [range(0x5d0, 0x5ea), range(0x5b0, 0x5bc)],
  arabic: [range(0x627, 0x64a), range(0x64b, 0x652), range(0x660, 0x669)],
  devanagari: [range(0x905, 0x939), range(0x93e, 0x94d), range(0x966, 0x96f)],
  thai: [range(0xe01, 0xe2e), [0xe31, 0xe31], range(0xe34, 0xe3a), range(0xe50, 0xe59)],
  georgian: [range(0x10d0, 0x10fa)],
  hangul: [range(0xac00, 0xd7a3)],
  jamo: [range(0x1100, 0x1112), range(0x1161, 0x1175)],
  hiragana: [range(0x3041, 0x3096)],
  katakana: [range(0x30a1, 0x30fa)],
  halfKana: [range(0xff66, 0xff9d)],
  han: [range(0x4e00, 0x9fa5)],
  hanRare: [range(0x3400, 0x4dbf), range(0x20000, 0x2a6df), range(0xf900, 0xfa6d), [0x3006, 0x3007], range(0x3021, 0x3029), range(0x2f00, 0x2fd5)],
  cjkPunct: [range(0x3001, 0x3003), range(0x3008, 0x3011), range(0xff01, 0xff0f), range(0xff1a, 0xff20)],
  fullwidth: [range(0xff10, 0xff19), range(0xff21, 0xff3a), range(0xff41, 0xff5a)],
  combining: [range(0x300, 0x36f), range(0x1ab0, 0x1abe), range(0x20d0, 0x20f0), range(0xfe20, 0xfe2f)],
  emoji: [range(0x1f600, 0x1f64f), range(0x1f300, 0x1f5ff), range(0x1f680, 0x1f6c5), range(0x1f90c, 0x1f9ff), range(0x2600, 0x26ff), range(0x2700, 0x27bf)],
  math: [range(0x2200, 0x22ff), range(0x2100, 0x214f), range(0x1d400, 0x1d454), range(0x1d7ce, 0x1d7ff)],
  numbers: [range(0x30, 0x39), [0xb2, 0xb3], [0xb9, 0xb9], range(0xbc, 0xbe), range(0x2160, 0x2188), range(0x2460, 0x249b), range(0x2070, 0x2079), range(0x1040, 0x1049)],
  punct: [range(0x21, 0x2f), range(0x3a, 0x40), range(0x5b, 0x60), range(0x7b, 0x7e), range(0xa1, 0xbf), range(0x2010, 0x2027), range(0x2030, 0x205e)],
  spaces: [range(0x9, 0xd), [0x20, 0x20], [0x85, 0x85], [0xa0, 0xa0], [0x1680, 0x1680], range(0x2000, 0x200a), [0x2028, 0x2029], [0x202f, 0x202f], [0x205f, 0x205f], [0x3000, 0x3000]],
  format: [range(0x200b, 0x200f), [0xfeff, 0xfeff], [0x180e, 0x180e], [0x2060, 0x2060], range(0x1c, 0x1f), [0xad, 0xad]],
  controls: [range(0x0, 0x8), range(0xe, 0x1b), [0x7f, 0x7f], range(0x80, 0x84), range(0x86, 0x9f)],
  private: [range(0xe000, 0xe0ff), range(0xf0000, 0xf00ff)],
  nonchar: [[0xfffe, 0xffff], range(0xfdd0, 0xfdef), [0x10fffe, 0x10ffff], [0xfffd, 0xfffd]],
};

const WORDS = ("the of and to in is that for it as was with be by on not he I this are or his from at which " +
  "but have an they you were her she there would their we him been has when who will more no if out so said " +
  "what up its about into than them can only other new some could time these two may then do first any my now " +
  "such like our over man me even most made after also did many before must through back years where much your " +
  "way well down should because each just those people Mr how too little state good very make world still own " +
  "see men work long get here between both life being under never day same another know while last might us " +
  "great old year off come since against go came right used take three tokenizer merge rank encoding Paris " +
  "France capital Wren Kimi internationalization HTTPServer XMLHttpRequest iPhone McDonald O'Brien naïve café " +
  "résumé coöperate façade Zürich Ångström São Paulo straße ÉCOLE").split(" ");
const CONTRACTIONS = ["s", "t", "re", "ve", "m", "ll", "d"];
const SPECIALS = ["[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "[start_header_id]",
  "[end_header_id]", "[EOT]", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
  "<|reserved_token_8|>", "<|reserved_token_10|>", "<osagent_mode>", "[UNK]", "[PAD]"];
const NEAR_SPECIALS = ["<|open", "open|>", "<|OPEN|>", "[BOS", "BOS]", "<||>", "<|reserved_token_9999|>", "< |sep| >", "[[BOS]]", "<|<|open|>|>"];
const ZWJ_EMOJI = ["👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "👁️‍🗨️", "🧑🏿‍🤝‍🧑🏻", "❤️‍🔥", "🐻‍❄️", "👨‍❤️‍💋‍👨", "🤷🏾‍♀️",
  "1️⃣", "#️⃣", "🇯🇵", "🇺🇸🇬🇧", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "✋🏻", "☺️", "©️", "🫶🏼"];

function fromPool(r, name) {
  const rs = POOLS[name];
  const [lo, hi] = r.pick(rs);
  return cp(r.int(lo, hi));
}
function run(r, name, lo, hi) {
  let s = "";
  for (let n = r.int(lo, hi); n > 0; n--) s += fromPool(r, name);
  return s;
}
function word(r) {
  const w = r.pick(WORDS);
  const k = r.next();
  return k < 0.1 ? w.toUpperCase() : k < 0.25 ? w[0].toUpperCase() + w.slice(1) : w;
}
function randCase(r, s) {
  return [...s].map((c) => (r.chance(0.5) ? c.toUpperCase() : c)).join("");
}

// ---- generators: each returns a string ----

function prose(r) {
  let s = "";
  for (let sentences = r.int(1, 4); sentences > 0; sentences--) {
    let sent = [];
    for (let n = r.int(3, 18); n > 0; n--) {
      let w = word(r);
      if (r.chance(0.08)) w += r.pick([",", ";", ":", " —", "…"]);
      if (r.chance(0.05)) w = r.pick(['"', "(", "'", "“", "‘"]) + w + r.pick(['"', ")", "'", "”", "’"]);
      if (r.chance(0.05)) w = String(r.int(0, 100000));
      sent.push(w);
    }
    s += sent.join(" ") + r.pick([".", "!", "?", "...", ".\n", ".\n\n", "?!"]) + (r.chance(0.7) ? " " : "");
  }
  return s;
}

const CODE_SNIPPETS = [
  (id, n) => `int ${id}(const std::vector<int>& v) {\n  int s = 0;\n  for (int x : v) s += x * ${n};\n  return s;\n}\n`,
  (id, n) => `def ${id}(xs):\n    """Sum ${n} things."""\n    return sum(x ** 2 for x in xs if x != ${n})\n`,
  (id, n) => `const ${id} = async (url) => { const r = await fetch(\`\${url}/api/v${n}\`); return r.ok ? r.json() : null; };`,
  (id, n) => `{"${id}": [${n}, ${n + 1}.5, -${n}e-3, true, null], "nested": {"k": "v\\n\\t\\"q\\""}}`,
  (id, n) => `<div class="${id}" data-n="${n}"><a href="https://example.com/${id}?q=${n}&x=1#top">link</a></div>`,
  (id, n) => `#include <stdio.h>\n#define ${id.toUpperCase()} ${n}\nint main(void){printf("%d\\n",${id.toUpperCase()});return 0;}`,
  (id, n) => `SELECT ${id}, COUNT(*) FROM t_${id} WHERE id >= ${n} GROUP BY ${id} ORDER BY 2 DESC;`,
  (id, n) => `fn ${id}<'a>(x: &'a str) -> Option<&'a str> { x.get(..${n}) } // it's 'static? don't`,
  (id, n) => `    if (${id} !== undefined && ${id}.length > ${n}) {\r\n        return ${id}.map((x) => x >>> 1);\r\n    }\r\n`,
  (id, n) => `$ ls -la /usr/local/${id} | grep -E '^d.*[0-9]{${n % 9 + 1}}' && echo "ok" >> /tmp/${id}.log`,
  (id, n) => `\t\t${id}:\n\t\t\t- name: "${id}-${n}"\n\t\t\t  value: 0x${n.toString(16).toUpperCase()}\n`,
  (id, n) => `/* ${id} */ a->b::c<d>(e) ?: f ?? g; x+=${n}; y<<=2; z = a||b&&!c; /^[a-z]+\\d*$/i.test(s)`,
];

function code(r) {
  const id = r.pick(["foo", "barBaz", "my_var", "HTTPClient", "parseJSON", "x1", "__init__", "getUserID", "snake_case_name"]);
  let s = r.pick(CODE_SNIPPETS)(id, r.int(0, 99999));
  if (r.chance(0.3)) s = s.replace(/\n/g, "\r\n");
  if (r.chance(0.2)) s = s.replace(/    /g, "\t");
  return s;
}

function chinese(r) {
  let s = "";
  for (let n = r.int(1, 6); n > 0; n--) {
    s += run(r, "han", 1, 12);
    if (r.chance(0.2)) s += run(r, "hanRare", 1, 3);
    if (r.chance(0.2)) s += r.pick([" ", "", "2024年", "GPT-4", "AI", " iPhone ", "3.14", "ＡＢＣ"]);
    s += r.pick(["，", "。", "！", "？", "、", "：", "；", "「", "」", "（", "）", "", "", "\n", ". ", ","]);
  }
  return s;
}

function japanese(r) {
  let s = "";
  for (let n = r.int(2, 8); n > 0; n--) {
    const k = r.next();
    if (k < 0.35) s += run(r, "hiragana", 1, 6);
    else if (k < 0.6) s += run(r, "katakana", 1, 6) + (r.chance(0.3) ? "ー" : "");
    else if (k < 0.85) s += run(r, "han", 1, 3) + (r.chance(0.15) ? "々" : "");
    else if (k < 0.92) s += run(r, "halfKana", 1, 4);
    else s += run(r, "fullwidth", 1, 4);
    if (r.chance(0.3)) s += r.pick(["、", "。", "「", "」", "・", "〜", "！", " ", "　"]);
  }
  return s;
}

function korean(r) {
  const words = [];
  for (let n = r.int(1, 10); n > 0; n--) {
    let w = r.chance(0.1) ? run(r, "jamo", 1, 3) : run(r, "hangul", 1, 5);
    if (r.chance(0.15)) w += r.pick([".", ",", "?", "!", "~", "...", "ㅋㅋ"]);
    words.push(w);
  }
  return words.join(r.chance(0.8) ? " " : "");
}

function mixed(r) {
  const names = ["latinLower", "latinUpper", "latin1", "titlecase", "modifier", "greek", "cyrillic", "armenian", "hebrew",
    "arabic", "devanagari", "thai", "georgian", "hangul", "hiragana", "katakana", "han", "fullwidth", "numbers", "math"];
  let s = "";
  for (let n = r.int(2, 10); n > 0; n--) {
    s += run(r, r.pick(names), 1, 8);
    if (r.chance(0.5)) s += r.pick([" ", "", "-", "_", "'", "’", ", ", "\n", "/", "."]);
  }
  return s;
}

function emoji(r) {
  let s = "";
  for (let n = r.int(1, 8); n > 0; n--) {
    const k = r.next();
    if (k < 0.35) s += r.pick(ZWJ_EMOJI);
    else if (k < 0.6) s += fromPool(r, "emoji") + (r.chance(0.3) ? cp(r.int(0x1f3fb, 0x1f3ff)) : "") + (r.chance(0.2) ? "\ufe0f" : "");
    else if (k < 0.8) s += word(r);
    else s += r.pick([" ", "  ", "\n", "!", "😂😂😂", "\u200d", "\ufe0f", "\u20e3", "a\u200db"]);
    if (r.chance(0.5)) s += " ";
  }
  return s;
}

function combining(r) {
  let s = "";
  for (let n = r.int(1, 8); n > 0; n--) {
    const base = r.pick(["latinLower", "latinUpper", "greek", "cyrillic", "han", "numbers", "punct", "spaces", "hangul", "emoji"]);
    s += r.chance(0.1) ? "" : fromPool(r, base);
    s += run(r, "combining", 1, r.chance(0.1) ? 12 : 3);
    if (r.chance(0.4)) s += r.pick([" ", "", word(r), "'s", "'LL"]);
  }
  return r.chance(0.1) ? s.normalize(r.pick(["NFC", "NFD", "NFKC", "NFKD"])) : s;
}

function digits(r) {
  const parts = [];
  for (let n = r.int(1, 5); n > 0; n--) {
    const k = r.next();
    let d = "";
    const len = r.chance(0.2) ? r.int(20, 300) : r.int(1, 12);
    for (let i = 0; i < len; i++) d += String(r.int(0, 9));
    if (k < 0.4) parts.push(d);
    else if (k < 0.5) parts.push(Number(d.slice(0, 15)).toLocaleString("en-US"));
    else if (k < 0.6) parts.push("-" + d.slice(0, 8) + "." + d.slice(8, 14));
    else if (k < 0.7) parts.push(r.pick(["abc", "x", "Ab", "v", "ID"]) + d.slice(0, 7) + r.pick(["th", "nd", "", "px", "ND", "k"]));
    else if (k < 0.85) parts.push(run(r, "numbers", 1, 10));
    else parts.push([...d.slice(0, 10)].map((c) => cp(r.pick([0x660, 0x966, 0xff10, 0x1d7ce, 0xe50]) + Number(c))).join(""));
  }
  return parts.join(r.pick([" ", "", ", ", "\n", "+", "x", ":"]));
}

function whitespace(r) {
  let s = "";
  for (let n = r.int(1, 8); n > 0; n--) {
    const k = r.next();
    if (k < 0.3) s += word(r);
    else if (k < 0.45) s += " ".repeat(r.int(1, r.chance(0.2) ? 400 : 8));
    else if (k < 0.55) s += r.pick(["\r\n", "\n", "\r", "\r\n\r\n", "\n\n\n", "\r\r\n", "\n\r"]);
    else if (k < 0.65) s += "\t".repeat(r.int(1, 6));
    else if (k < 0.8) s += run(r, "spaces", 1, 6);
    else if (k < 0.9) s += r.pick(["  \n", " \r\n  ", "\t\n\t", " . ", "  !", "\n  x", " \u00a0 ", "\u3000\u3000"]);
    else s += run(r, "format", 1, 3);
  }
  return s;
}

function contractions(r) {
  const parts = [];
  for (let n = r.int(1, 6); n > 0; n--) {
    const c = randCase(r, r.pick(CONTRACTIONS));
    const k = r.next();
    const apos = r.chance(0.85) ? "'" : r.pick(["’", "`", "''"]);
    if (k < 0.45) parts.push(word(r) + apos + c);
    else if (k < 0.55) parts.push(word(r).toUpperCase() + apos + c.toUpperCase());
    else if (k < 0.62) parts.push(word(r) + "'ſ");
    else if (k < 0.7) parts.push(apos + c);
    else if (k < 0.78) parts.push(r.pick(["3", "))", " ", "你好", "ÉTÉ", "ǅ"]) + apos + c);
    else if (k < 0.86) parts.push(word(r) + apos + c + apos + randCase(r, r.pick(CONTRACTIONS)));
    else parts.push(r.pick(["don't", "DON'T", "I'M", "WE'RE", "y'all'd've", "O'Reilly's", "rock'n'roll", "'tis", "ma'am", "'S'S'S", "he'LL", "She'Re", "it'sa", "we'ved"]));
  }
  return parts.join(r.pick([" ", "", ", ", "\n"]));
}

function specials(r) {
  let s = "";
  for (let n = r.int(1, 6); n > 0; n--) {
    const k = r.next();
    if (k < 0.45) s += r.pick(SPECIALS);
    else if (k < 0.6) s += r.pick(NEAR_SPECIALS);
    else if (k < 0.85) s += word(r);
    else s += run(r, r.pick(["han", "emoji", "spaces", "punct"]), 1, 3);
    if (r.chance(0.5)) s += r.pick([" ", "", "\n", "  "]);
  }
  return s;
}

function soup(r) {
  const names = Object.keys(POOLS);
  let s = "";
  for (let n = r.int(1, 60); n > 0; n--) s += fromPool(r, r.pick(names));
  return s;
}

/// Ill-formed UTF-8: valid text with bad bytes, truncated sequences, overlongs, surrogates.
function badBytes(r) {
  const chunks = [];
  for (let n = r.int(1, 6); n > 0; n--) {
    const k = r.next();
    if (k < 0.35) chunks.push(Buffer.from(r.chance(0.5) ? word(r) + " " : soup(r), "utf8"));
    else if (k < 0.5) chunks.push(Buffer.from([r.int(0x80, 0xff)]));
    else if (k < 0.65) chunks.push(Buffer.from(r.pick(["é", "中", "😀", "ő"]), "utf8").subarray(0, 1 + r.int(0, 1)));
    else if (k < 0.8) chunks.push(Buffer.from(r.pick([[0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf],
      [0xf4, 0x90, 0x80, 0x80], [0xf0, 0x80, 0x80, 0x80], [0xf5, 0x80], [0xff, 0xfe], [0xf8, 0x88, 0x80, 0x80, 0x80]])));
    else chunks.push(Buffer.from(Array.from({ length: r.int(1, 12) }, () => r.int(0, 255))));
  }
  return Buffer.concat(chunks);
}

/// Texts longer than the upstream cut limits (25,000-code-point runs, 400,000-code-point slices).
function longTexts(r) {
  const words = [];
  for (let len = 0; len < 410000;) {
    words.push(r.chance(0.02) ? run(r, "han", 1, 4) : word(r));
    len += words[words.length - 1].length + 1;
  }
  let letters = "";
  for (let i = 0; i < 3000; i++) letters += fromPool(r, "latinLower");
  let digitsRun = "";
  for (let i = 0; i < 5000; i++) digitsRun += String(r.int(0, 9));
  // Runs over 25,000 code points are built from short regex pieces (tiktoken's merge loop is
  // quadratic in the piece length); a few single long pieces stay moderate in size.
  return [
    "a.".repeat(12600), "1234567890".repeat(2550), "\u001f".repeat(25003) + " z", " \u001f".repeat(12600),
    "x " + "\u001c ".repeat(13000) + "y", "<|open|>".repeat(4000), "a.".repeat(12500), "a.".repeat(12500) + "b",
    words.join(" "), letters, digitsRun, "a".repeat(2000), " ".repeat(3000) + "x", "\n".repeat(2000),
    "中".repeat(1000), "😀".repeat(800), "x" + "\r\n".repeat(1500) + "y",
  ];
}

function edgeCases() {
  const out = ["", " ", "  ", "\n", "\r\n", "\r", "\t", "a", "A", "'", "'s", "'S", "0", "中", "😀", "\u0301", "\u0301a",
    "a\u0301", "ǅ", "ǅa", "Aǅ", "ʰ", "ʰA", "々", "〇", "ー", "ſ", "'ſ", "K", "Å", "\ufeff", "\ufefftext", "\u0085", "a\u0085b",
    "\u00a0", "a\u00a0b", "\u2028", "\u180e", "a\u180eb", "\u200b", "ﬁ", "Ⅻ", "½", "²", "١٢٣", "𝐀𝐁𝐂", "𝟎𝟏", "\u0000",
    "\u0000a\u0000", "\u007f", "Hello world", "你好世界", "The capital of France is", "it's 2026.\n\n",
    "  hello", "hello  ", "a  b", "a \n b", " \n ", "!!!\n\n\n", " !\r\n", "\r\n\r\n", "   \t\n\t  x"];
  for (let c = 0; c < 128; c++) out.push(String.fromCharCode(c), "a" + String.fromCharCode(c) + "b", " " + String.fromCharCode(c) + "\n");
  return out;
}

/// The whole corpus: an array of Buffers (UTF-8 bytes; a few deliberately ill-formed).
function makeCorpus(seed = 20260509) {
  const r = rng(seed);
  const gens = [[prose, 260], [code, 160], [chinese, 200], [japanese, 160], [korean, 120], [mixed, 220], [emoji, 160],
    [combining, 160], [digits, 160], [whitespace, 200], [contractions, 220], [specials, 160], [soup, 260]];
  const texts = edgeCases();
  for (const [gen, count] of gens) for (let i = 0; i < count; i++) texts.push(gen(r));
  const out = texts.map((t) => Buffer.from(t, "utf8"));
  for (let i = 0; i < 150; i++) out.push(badBytes(r));
  for (const t of longTexts(r)) out.push(Buffer.from(t, "utf8"));
  return out;
}

module.exports = { makeCorpus };
