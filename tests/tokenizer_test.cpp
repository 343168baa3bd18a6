// Tokenizer tests: exact agreement with the real tiktoken core (npm `tiktoken`, run through
// tests/tokenizer/oracle.js) on a ~3,000-string corpus with two vocabularies, the golden prompt
// ids, and unit tests of the pieces (UTF-8 repair, streaming decode, long-input cuts, specials,
// rank-BPE, tiktoken.model validation, `wren tokenize`).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sys/wait.h>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/base64.h"
#include "tokenizer/bpe.h"
#include "tokenizer/long_input.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tiktoken_model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace wren {
namespace {

using nlohmann::json;
using Ids = std::vector<int>;

// ---------------------------------------------------------------- helpers

const std::string kOracleDir = std::string(WREN_SOURCE_DIR) + "/tests/tokenizer";

using test::run_cmd;

/// Single-quotes a path for the shell (test paths contain no quotes).
std::string shq(const std::string& s) { return "'" + s + "'"; }

/// A printable, truncated rendering of arbitrary bytes for failure messages.
std::string show(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < 240; ++i) {
    const uint8_t c = uint8_t(s[i]);
    char hex[8];
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) std::snprintf(hex, sizeof hex, "\\x%02X", c), out += hex;
    else out += char(c);
  }
  if (out.size() >= 240) out += "... (" + std::to_string(s.size()) + " bytes)";
  return "\"" + out + "\"";
}

std::string show(const Ids& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  if (ids.size() > 40) s += ",... (" + std::to_string(ids.size()) + " ids)";
  return s + "]";
}

const Tokenizer& golden_tokenizer() {
  static const Tokenizer tok = Tokenizer::load(test::golden_dir());
  return tok;
}

const RankTable& golden_ranks() {
  static const RankTable ranks = load_tiktoken_model(test::golden_dir() + "/tiktoken.model");
  return ranks;
}

// ---------------------------------------------------------------- the oracle

/// Corpus texts and tiktoken's ids for them, for one vocabulary.
struct OracleRun {
  std::vector<std::string> texts;
  std::vector<Ids> ordinary, kimi, special;
  std::string error;  // non-empty when the oracle could not run
};

/// Fails with a clear message unless node and the npm tiktoken package are installed.
std::string oracle_prerequisites() {
  std::string out;
  if (run_cmd("node --version", &out) != 0)
    return "node is not installed (needed for the tiktoken oracle; scripts/setup.sh installs nodejs)";
  if (!std::filesystem::exists(kOracleDir + "/node_modules/tiktoken/package.json"))
    return "the npm package 'tiktoken' is missing from tests/tokenizer/node_modules; run "
           "`npm ci --prefix tests/tokenizer` (scripts/setup.sh does this)";
  return "";
}

std::string node(const std::string& args) {
  std::string out;
  const int rc = run_cmd("node " + shq(kOracleDir + "/oracle.js") + " " + args, &out);
  return rc == 0 ? "" : "node oracle.js " + args + " failed (exit " + std::to_string(rc) + "):\n" + out;
}

std::vector<Ids> parse_id_lists(const json& j) {
  std::vector<Ids> out;
  for (const auto& l : j) out.push_back(l.get<Ids>());
  return out;
}

/// Shared corpus (written once per process).
const std::string& corpus_file(std::string* error) {
  static std::string path, err;
  if (path.empty() && err.empty()) {
    err = oracle_prerequisites();
    if (err.empty()) {
      path = test::temp_dir("tok-corpus") + "/corpus.json";
      err = node("corpus " + shq(path));
    }
  }
  *error = err;
  return path;
}

OracleRun run_oracle(const std::string& model_dir) {
  OracleRun r;
  const std::string& corpus = corpus_file(&r.error);
  if (!r.error.empty()) return r;
  const std::string out = test::temp_dir("tok-oracle") + "/ids.json";
  r.error = node("encode " + shq(model_dir) + " " + shq(corpus) + " " + shq(out));
  if (!r.error.empty()) return r;
  for (const auto& b64 : json::parse(std::ifstream(corpus)))
    r.texts.push_back(base64_decode(b64.get<std::string>()).value_or(""));
  const json ids = json::parse(std::ifstream(out));
  r.ordinary = parse_id_lists(ids["ordinary"]);
  r.kimi = parse_id_lists(ids["kimi"]);
  r.special = parse_id_lists(ids["special"]);
  return r;
}

/// Writes the full o200k_base vocabulary (+ the golden specials renumbered) once per process.
std::string o200k_dir(std::string* error) {
  static std::string dir, err;
  if (dir.empty() && err.empty()) {
    err = oracle_prerequisites();
    if (err.empty()) {
      dir = test::temp_dir("tok-o200k");
      err = node("o200k " + shq(test::golden_dir() + "/tokenizer_config.json") + " " + shq(dir));
    }
  }
  *error = err;
  return dir;
}

/// Compares Wren with the oracle on every corpus text, in all three modes, plus round trips.
void expect_matches_oracle(const Tokenizer& tok, const OracleRun& r) {
  ASSERT_GE(r.texts.size(), 2000u);
  ASSERT_EQ(r.texts.size(), r.kimi.size());
  int failures = 0;
  auto report = [&](size_t i, const char* what, const Ids& want, const Ids& got) {
    if (want == got) return;
    if (++failures <= 8)
      ADD_FAILURE() << what << " differs for corpus text " << i << " " << show(r.texts[i])
                    << "\n  tiktoken: " << show(want) << "\n  wren:     " << show(got);
  };
  size_t valid = 0;
  for (size_t i = 0; i < r.texts.size(); ++i) {
    const std::string& text = r.texts[i];
    const Ids ids = tok.encode(text);
    report(i, "encode (specials disabled)", r.kimi[i], ids);
    report(i, "encode (specials allowed)", r.special[i], tok.encode(text, SpecialMode::Allowed));
    const std::string repaired = utf8::repair(text);
    report(i, "encode_ordinary (no cuts)", r.ordinary[i], tok.encode_ordinary(repaired));
    if (tok.decode(ids) != repaired && ++failures <= 8)
      ADD_FAILURE() << "decode(encode(x)) != x for corpus text " << i << " " << show(text);
    valid += repaired == text;
  }
  EXPECT_EQ(failures, 0) << failures << " mismatches";
  EXPECT_GE(valid, 2000u);  // most texts are well-formed; ~150 are deliberately not
}

TEST(TokenizerOracle, TinyGoldenVocabularyMatchesTiktoken) {
  const OracleRun r = run_oracle(test::golden_dir());
  ASSERT_TRUE(r.error.empty()) << r.error;
  expect_matches_oracle(golden_tokenizer(), r);
}

TEST(TokenizerOracle, FullO200kVocabularyMatchesTiktoken) {
  std::string err;
  const std::string dir = o200k_dir(&err);
  ASSERT_TRUE(err.empty()) << err;
  const Tokenizer tok = Tokenizer::load(dir);
  EXPECT_EQ(tok.n_ranks(), 199998);
  const OracleRun r = run_oracle(dir);
  ASSERT_TRUE(r.error.empty()) << r.error;
  expect_matches_oracle(tok, r);
}

// ---------------------------------------------------------------- code-point class sweep

/// Pieces of `ids` under `tok`, for failure messages.
std::string show_pieces(const Tokenizer& tok, const Ids& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : " | ") + show(tok.token_bytes(id));
  return s;
}

constexpr size_t kProbesPerCodePoint = 8;  // oracle.js PROBES

/// Compares pre-tokenizer pieces with tiktoken for every `stride`-th code point of [first, last]:
/// oracle.js builds short probes per code point and a vocabulary holding every substring of every
/// probe, so each piece is exactly one id and equal ids mean equal segmentation. Returns the
/// code points whose probes differ (reporting the first few probes).
std::vector<char32_t> sweep(char32_t first, char32_t last, char32_t stride) {
  std::vector<char32_t> bad;
  for (char32_t lo = first; lo <= last; lo += 8192 * stride) {
    const char32_t hi = std::min<char32_t>(last, lo + 8192 * stride - 1);
    std::vector<char32_t> cps;
    for (char32_t c = lo; c <= hi; c += stride)
      if (c < 0xD800 || c > 0xDFFF) cps.push_back(c);
    char args[96];
    std::snprintf(args, sizeof args, "sweep %X %X %u ", unsigned(lo), unsigned(hi), unsigned(stride));
    const std::string dir = test::temp_dir("tok-sweep");
    const std::string err = node(args + shq(dir));
    if (!err.empty()) {
      ADD_FAILURE() << err;
      return {0xFFFFFFFF};
    }
    const Tokenizer tok = Tokenizer::load(dir);
    const std::vector<Ids> want = parse_id_lists(json::parse(std::ifstream(dir + "/ids.json")));
    const json probes = json::parse(std::ifstream(dir + "/probes.json"));
    EXPECT_EQ(probes.size(), cps.size() * kProbesPerCodePoint);
    for (size_t i = 0; i < probes.size(); ++i) {
      const std::string probe = base64_decode(probes[i].get<std::string>()).value_or("");
      const Ids got = tok.encode_ordinary(probe);
      if (got == want[i]) continue;
      const char32_t c = cps[i / kProbesPerCodePoint];
      if (bad.empty() || bad.back() != c) bad.push_back(c);
      if (bad.size() <= 12)
        ADD_FAILURE() << "probe " << show(probe) << " (U+" << std::hex << uint32_t(c) << std::dec
                      << "): tiktoken pieces " << show_pieces(tok, want[i]) << "\n  wren pieces "
                      << show_pieces(tok, got);
    }
    std::filesystem::remove_all(dir);
  }
  return bad;
}

/// "U+0041-U+005A U+00B5 ..." for a sorted list of code points.
std::string show_ranges(const std::vector<char32_t>& cps) {
  std::string s;
  char buf[40];
  for (size_t i = 0; i < cps.size();) {
    size_t j = i;
    while (j + 1 < cps.size() && cps[j + 1] == cps[j] + 1) ++j;
    std::snprintf(buf, sizeof buf, j > i ? " U+%04X-U+%04X" : " U+%04X", unsigned(cps[i]), unsigned(cps[j]));
    s += buf;
    i = j + 1;
  }
  return s;
}

/// Default: every code point below U+3400 (where scripts change most), every 7th up to U+FFFF and
/// every 37th above (about 40,000 code points, ~30 s). WREN_TOKENIZER_SWEEP_FULL=1: all 1,112,064
/// scalar values (~8 min).
TEST(TokenizerSweep, CodePointClassesMatchTiktoken) {
  ASSERT_TRUE(oracle_prerequisites().empty()) << oracle_prerequisites();
  const char* full = std::getenv("WREN_TOKENIZER_SWEEP_FULL");
  std::vector<char32_t> bad;
  auto add = [&](std::vector<char32_t> b) { bad.insert(bad.end(), b.begin(), b.end()); };
  if (full && std::string(full) == "1") {
    add(sweep(0, 0x10FFFF, 1));
  } else {
    add(sweep(0, 0x33FF, 1));
    add(sweep(0x3400, 0xFFFF, 7));
    add(sweep(0x10000, 0x10FFFF, 37));
  }
  EXPECT_TRUE(bad.empty()) << bad.size() << " code points segment differently:" << show_ranges(bad);
}

TEST(TokenizerSweep, Pcre2UnicodeTablesAreWithinThePatchedRange) {
  // unicode_patch.h tops Unicode 14.0 tables up to 16.0 (tiktoken's); see pretokenizer.h.
  const std::string v = Pretokenizer::pcre2_unicode_version();
  EXPECT_TRUE(v == "14.0.0" || v.rfind("15.", 0) == 0 || v == "16.0.0") << "PCRE2 Unicode " << v;
}

// ---------------------------------------------------------------- golden prompts

Ids golden_ids_without_bos(const std::string& name) {
  const json j = json::parse(std::ifstream(test::golden_dir() + "/golden/" + name + ".ids.json"));
  Ids ids = j.get<Ids>();
  EXPECT_EQ(ids.at(0), 4096);  // [BOS]
  return Ids(ids.begin() + 1, ids.end());
}

TEST(TokenizerGolden, PromptTextsGiveGoldenIds) {
  for (const std::string name : {"prompt0", "prompt1"}) {
    const std::string text = read_file_bytes(test::golden_dir() + "/golden/" + name + ".txt");
    EXPECT_EQ(golden_tokenizer().encode(text), golden_ids_without_bos(name)) << name;
  }
}

TEST(TokenizerGolden, CliTokenizeGivesGoldenIds) {
  for (const std::string name : {"prompt0", "prompt1"}) {
    std::string out;
    const std::string file = test::golden_dir() + "/golden/" + name + ".txt";
    ASSERT_EQ(test::run_wren("tokenize --model " + shq(test::golden_dir()) + " --json - < " + shq(file), &out), 0) << out;
    EXPECT_EQ(json::parse(out).get<Ids>(), golden_ids_without_bos(name)) << name;
  }
}

TEST(TokenizerGolden, SpecialTokensFromTokenizerConfig) {
  const Tokenizer& tok = golden_tokenizer();
  EXPECT_EQ(tok.n_ranks(), 4096);
  EXPECT_EQ(tok.vocab_size(), 4352);
  EXPECT_EQ(tok.specials().size(), 256u);
  EXPECT_EQ(tok.special_id("[BOS]"), 4096);
  EXPECT_EQ(tok.special_id("<|end_of_msg|>"), 4098);
  EXPECT_EQ(tok.special_id("<|open|>"), 4099);
  EXPECT_EQ(tok.special_id("<|close|>"), 4100);
  EXPECT_EQ(tok.special_id("<|sep|>"), 4101);
  EXPECT_FALSE(tok.special_id("<|nope|>").has_value());
  EXPECT_EQ(tok.decode({4099, 976, 4100}), "<|open|>The<|close|>");
}

// ---------------------------------------------------------------- the CLI

TEST(TokenizerCli, PrintsIdsPlainJsonAndWithSpecials) {
  const std::string m = "tokenize --model " + shq(test::golden_dir()) + " ";
  std::string out;
  ASSERT_EQ(test::run_wren(m + shq("Hello <|open|> world"), &out), 0) << out;
  EXPECT_EQ(out, "39 596 78 464 91 3843 91 29 2375\n");
  ASSERT_EQ(test::run_wren(m + "--json " + shq("Hello <|open|> world"), &out), 0) << out;
  EXPECT_EQ(out, "[39,596,78,464,91,3843,91,29,2375]\n");
  ASSERT_EQ(test::run_wren(m + "--allow-special " + shq("Hello <|open|> world"), &out), 0) << out;
  EXPECT_EQ(out, "39 596 78 220 4099 2375\n");
  ASSERT_EQ(test::run_wren(m + "--json ''", &out), 0) << out;
  EXPECT_EQ(out, "[]\n");
}

TEST(TokenizerCli, MissingModelFilesFailWithTheFileName) {
  std::string out;
  EXPECT_NE(test::run_wren("tokenize --model /nonexistent/dir hi", &out), 0);
  EXPECT_NE(out.find("/nonexistent/dir/tiktoken.model: cannot open"), std::string::npos) << out;
}

// ---------------------------------------------------------------- specials

TEST(TokenizerSpecial, DisabledByDefaultAllowedOnRequest) {
  const Tokenizer& tok = golden_tokenizer();
  const std::string text = "a<|open|>b [BOS]<|sep|><|close|>";
  const Ids plain = tok.encode(text);
  for (int id : plain) EXPECT_LT(id, tok.n_ranks()) << "special id in disabled mode";
  EXPECT_EQ(tok.decode(plain), text);
  const Ids allowed = tok.encode(text, SpecialMode::Allowed);
  Ids want = tok.encode("a");
  want.push_back(4099);
  for (int id : tok.encode("b ")) want.push_back(id);
  want.insert(want.end(), {4096, 4101, 4100});
  EXPECT_EQ(allowed, want);
  EXPECT_EQ(tok.decode(allowed), text);
}

TEST(TokenizerSpecial, NearMissesStayPlainText) {
  const Tokenizer& tok = golden_tokenizer();
  for (const std::string s : {"<|open", "<|OPEN|>", "[BOS", "<| open |>", "<|reserved_token_9999|>"})
    EXPECT_EQ(tok.encode(s, SpecialMode::Allowed), tok.encode(s)) << s;
}

TEST(TokenizerSpecial, LongestSpecialWinsAtOnePosition) {
  const Tokenizer tok(golden_ranks(), {{5000, "<|a|>"}, {5001, "<|a|>x"}, {5002, "<|a"}});
  EXPECT_EQ(tok.encode("<|a|>x<|a|>", SpecialMode::Allowed), (Ids{5001, 5000}));
  EXPECT_EQ(tok.vocab_size(), 5003);
  EXPECT_THROW(tok.token_bytes(4500), Error);  // unassigned gap between ranks and specials
}

// ---------------------------------------------------------------- UTF-8 repair and input policy

TEST(TokenizerUtf8, RepairReplacesMaximalSubparts) {
  // The example of Unicode §3.9 (U+FFFD substitution of maximal subparts).
  const std::string bad = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string R(utf8::kReplacement);
  EXPECT_EQ(utf8::repair(bad), "a" + R + R + R + "b" + R + "c" + R + R + "d");
  EXPECT_EQ(utf8::repair("\xED\xA0\x80"), R + R + R);           // surrogate
  EXPECT_EQ(utf8::repair("\xC0\xAF"), R + R);                   // overlong
  EXPECT_EQ(utf8::repair("\xF4\x90\x80\x80"), R + R + R + R);   // above U+10FFFF
  EXPECT_EQ(utf8::repair("\xF0\x9F\x98"), R);                   // truncated at end
  EXPECT_EQ(utf8::repair("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
  EXPECT_TRUE(utf8::is_valid("\xF0\x9F\x98\x80 \xEF\xBB\xBF"));
  EXPECT_FALSE(utf8::is_valid("\xF0\x9F\x98"));
}

TEST(TokenizerUtf8, IllFormedInputIsEncodedAsIfRepaired) {
  const Tokenizer& tok = golden_tokenizer();
  const std::string bad = "caf\xC3 na\xFFve \xE4\xB8 end\xF0\x9F";
  EXPECT_EQ(tok.encode(bad), tok.encode(utf8::repair(bad)));
  EXPECT_EQ(tok.decode(tok.encode(bad)), utf8::repair(bad));
  EXPECT_EQ(tok.encode(bad, SpecialMode::Allowed), tok.encode(utf8::repair(bad)));
}

TEST(TokenizerUtf8, IncompleteTail) {
  EXPECT_EQ(utf8::incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("ab\xE4"), 1u);
  EXPECT_EQ(utf8::incomplete_tail("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8::incomplete_tail("ab\xE4\xB8\xAD"), 0u);
  EXPECT_EQ(utf8::incomplete_tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail("\xE0\x80"), 0u);  // can never complete: not held
  EXPECT_EQ(utf8::incomplete_tail("\x80"), 0u);
}

// ---------------------------------------------------------------- streaming decoder

TEST(TokenizerStream, HoldsBackIncompleteCharacters) {
  const Tokenizer& tok = golden_tokenizer();
  const std::string text = "héllo 😀 中文 ok";
  const Ids ids = tok.encode(text);
  StreamDecoder dec(tok);
  std::string all;
  bool held = false;
  for (int id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(utf8::is_valid(piece)) << show(piece);
    held = held || dec.pending() > 0;
    all += piece;
  }
  all += dec.finish();
  EXPECT_TRUE(held) << "the tiny vocabulary splits 😀 / 中 into byte tokens, so some bytes must be held";
  EXPECT_EQ(all, text);
}

TEST(TokenizerStream, EmojiByteTokensComeOutWhole) {
  const Tokenizer& tok = golden_tokenizer();
  StreamDecoder dec(tok);
  const std::string e = "😀";  // F0 9F 98 80, one byte token each
  std::string out;
  for (size_t i = 0; i < e.size(); ++i) {
    const int id = golden_ranks().find(e.substr(i, 1));
    ASSERT_NE(id, RankTable::kNone);
    out = dec.push(id);
    if (i + 1 < e.size()) {
      EXPECT_EQ(out, "") << "byte " << i;
    }
  }
  EXPECT_EQ(out, e);
  EXPECT_EQ(dec.finish(), "");
}

TEST(TokenizerStream, RandomTokenSequencesEqualRepairedDecode) {
  const Tokenizer& tok = golden_tokenizer();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    Ids ids;
    for (int n = rng() % 12; n >= 0; --n) ids.push_back(int(rng() % 4352));
    StreamDecoder dec(tok);
    std::string all;
    for (int id : ids) {
      const std::string piece = dec.push(id);
      ASSERT_TRUE(utf8::is_valid(piece));
      all += piece;
    }
    const std::string tail = dec.finish();
    EXPECT_TRUE(tail.empty() || tail.find(utf8::kReplacement) == 0);
    all += tail;
    EXPECT_EQ(all, utf8::repair(tok.decode(ids))) << show(ids);
  }
}

TEST(TokenizerStream, FinishFlushesAndUnknownIdsThrow) {
  const Tokenizer& tok = golden_tokenizer();
  const RankTable& ranks = golden_ranks();
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(ranks.find("\xE4")), "");
  EXPECT_EQ(dec.pending(), 1u);
  EXPECT_THROW(dec.push(999999), Error);
  EXPECT_EQ(dec.pending(), 1u);
  EXPECT_EQ(dec.finish(), std::string(utf8::kReplacement));
  EXPECT_EQ(dec.pending(), 0u);
  EXPECT_EQ(dec.push(ranks.find("A")), "A");
}

// ---------------------------------------------------------------- long-input cuts

std::vector<std::string> cuts(std::string_view s, size_t slice, size_t run) {
  std::vector<std::string> out;
  for (auto v : split_long_input(s, slice, run)) out.emplace_back(v);
  return out;
}

TEST(TokenizerLongInput, CutsRunsLongerThanTheLimit) {
  using V = std::vector<std::string>;
  EXPECT_EQ(cuts("aaaaaaa", 100, 3), (V{"aaa", "aaa", "a"}));
  EXPECT_EQ(cuts("aaa", 100, 3), (V{"aaa"}));
  EXPECT_EQ(cuts("aaa    bb", 100, 3), (V{"aaa   ", " bb"}));
  EXPECT_EQ(cuts("ab  cd  ef", 100, 3), (V{"ab  cd  ef"}));
  EXPECT_EQ(cuts("中中中中文", 100, 2), (V{"中中", "中中", "文"}));  // code points, not bytes
  EXPECT_EQ(cuts("\x1f\x1f\x1f\x1fx", 100, 2), (V{"\x1f\x1f", "\x1f\x1fx"}));  // Python: \x1f is space
  EXPECT_EQ(cuts("", 100, 3), (V{""}));
}

TEST(TokenizerLongInput, SlicesRestartRunCounts) {
  using V = std::vector<std::string>;
  EXPECT_EQ(cuts("abcdefgh", 3, 100), (V{"abc", "def", "gh"}));
  EXPECT_EQ(cuts("aaaaaaa", 4, 3), (V{"aaa", "a", "aaa"}));
  EXPECT_EQ(cuts("éééé", 2, 100), (V{"éé", "éé"}));
}

TEST(TokenizerLongInput, PythonIsSpace) {
  for (char32_t c : {0x09, 0x0D, 0x1C, 0x1F, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                     0x202F, 0x205F, 0x3000})
    EXPECT_TRUE(is_python_space(c)) << std::hex << uint32_t(c);
  for (char32_t c : {0x08, 0x0E, 0x21, 0x84, 0x180E, 0x200B, 0xFEFF, 0x2060, 0x61})
    EXPECT_FALSE(is_python_space(c)) << std::hex << uint32_t(c);
}

TEST(TokenizerLongInput, EncodeAppliesUpstreamLimits) {
  const Tokenizer& tok = golden_tokenizer();
  auto concat = [](Ids a, const Ids& b) { a.insert(a.end(), b.begin(), b.end()); return a; };
  std::string letters;  // one 30,000-letter run: cut after 25,000 code points, inside a "the"
  while (letters.size() < 30000) letters += "the";
  EXPECT_EQ(tok.encode(letters), concat(tok.encode(letters.substr(0, 25000)), tok.encode(letters.substr(25000))));
  EXPECT_NE(tok.encode(letters), tok.encode_ordinary(letters));
  std::string words;
  while (words.size() < 450000) words += "tokens ";
  // 400,000 code points: the slice boundary falls inside a word.
  EXPECT_EQ(tok.encode(words), concat(tok.encode(words.substr(0, 400000)), tok.encode(words.substr(400000))));
  EXPECT_EQ(tok.decode(tok.encode(words)), words);
}

TEST(TokenizerLongInput, LongestPiecesFitTheMatcher) {
  // After the cuts a single regex piece can still be 25,000 code points long (up to 100 KB):
  // the matcher's backtracking stack and the heap BPE must cope with every kind of run.
  const Tokenizer& tok = golden_tokenizer();
  for (const std::string c : {"a", "A", "\xF0\x9D\x90\x9A" /* U+1D41A, Ll */, "\xC7\x85" /* Lt */,
                              "\xE4\xB8\xAD" /* Han */, "\xEA\xB0\x80" /* Hangul */, "\xCC\x81" /* Mn */,
                              " ", "\n", "\r\n", "!", "\xF0\x9F\x98\x80" /* emoji */}) {
    std::string s;
    for (int i = 0; i < 25000; ++i) s += c;
    const Ids ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s) << show(c);
  }
}

// ---------------------------------------------------------------- pre-tokenizer and BPE

TEST(TokenizerPretokenizer, SplitsLikeTheKimiPattern) {
  const Pretokenizer p;
  using V = std::vector<std::string_view>;
  EXPECT_EQ(p.pieces("Hello world's 1234567 I'LL"), (V{"Hello", " world's", " ", "123", "456", "7", " I'LL"}));
  EXPECT_EQ(p.pieces("你好。世界abc"), (V{"你好", "。", "世界", "abc"}));  // 。 is Script=Common
  EXPECT_EQ(p.pieces("x  \n\n  y"), (V{"x", "  \n\n", " ", " y"}));
  EXPECT_EQ(p.pieces("!\xC2\x85"), (V{"!", "\xC2\x85"}));  // U+0085 is \s in Rust regex
  EXPECT_EQ(p.pieces("it'ſ"), (V{"it'ſ"}));                  // (?i)'s also matches ſ
  EXPECT_EQ(p.pieces("...\r\n\r\nok"), (V{"...\r\n\r\n", "ok"}));
  EXPECT_EQ(p.pieces("ǅungla DŽ"), (V{"ǅungla", " DŽ"}));
}

TEST(TokenizerBpe, HeapAndScanAgree) {
  const RankTable& ranks = golden_ranks();
  std::mt19937 rng(11);
  const std::string alphabet = "aeinrst \n";
  for (int trial = 0; trial < 200; ++trial) {
    std::string piece;
    for (int n = 1 + rng() % 600; n > 0; --n) piece += alphabet[rng() % alphabet.size()];
    Ids a, b;
    bpe_encode_scan(ranks, piece, a);
    bpe_encode_heap(ranks, piece, b);
    ASSERT_EQ(a, b) << show(piece);
    std::string back;
    for (int id : a) back += ranks.bytes(id);
    ASSERT_EQ(back, piece);
  }
}

TEST(TokenizerBpe, WholePieceInVocabularyIsEmittedDirectly) {
  const RankTable ranks({"a", "b", "c", "abc", "bc"}, "t");
  Ids out;
  bpe_encode(ranks, "abc", out);
  EXPECT_EQ(out, (Ids{3}));
  out.clear();
  bpe_encode(ranks, "abcabc", out);  // b+c (rank 4) first, then a+bc = abc (rank 3), twice
  EXPECT_EQ(out, (Ids{3, 3}));
  out.clear();
  bpe_encode(ranks, "cbc", out);
  EXPECT_EQ(out, (Ids{2, 4}));
}

// ---------------------------------------------------------------- tiktoken.model validation

std::string model_error(const std::string& text) {
  std::string full;
  for (int b = 0; b < 256; ++b) full += base64_encode(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  try {
    parse_tiktoken_model(full + text, "bad.model");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerModelFile, BadFilesGiveClearErrors) {
  EXPECT_EQ(model_error(""), "(no error)");
  EXPECT_EQ(model_error("YWI= 256\n"), "(no error)");
  EXPECT_EQ(model_error("YW*= 256\n"),
            "bad.model line 257: token 'YW*=' is not valid padded base64 of at least one byte");
  EXPECT_EQ(model_error("YWI 256\n"),
            "bad.model line 257: token 'YWI' is not valid padded base64 of at least one byte");
  EXPECT_EQ(model_error("YWI=\n"),
            "bad.model line 257: expected 'BASE64 RANK' (two fields separated by one space), found 'YWI='");
  EXPECT_EQ(model_error("YWI= x1\n"), "bad.model line 257: rank 'x1' is not an integer in [0, 1073741824)");
  EXPECT_EQ(model_error("YWI= 255\n"), "bad.model line 257: duplicate rank 255 (already on line 256)");
  EXPECT_EQ(model_error("YWI= 257\n"),
            "bad.model: rank 256 is missing (ranks must be 0..256 for 257 tokens; line 257 has rank 257)");
  EXPECT_EQ(model_error("YQ== 256\n"), "bad.model: ranks 97 and 256 have the same token bytes");
}

TEST(TokenizerModelFile, MissingSingleByteAndEmptyFile) {
  try {
    parse_tiktoken_model("YQ== 0\n", "m");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "m: the single byte 0x00 has no rank; rank-BPE needs all 256 single bytes in the vocabulary");
  }
  EXPECT_THROW(parse_tiktoken_model("\n\n", "m"), Error);
  EXPECT_THROW(load_tiktoken_model("/nonexistent/tiktoken.model"), Error);
}

TEST(TokenizerModelFile, BadTokenizerConfigGivesClearErrors) {
  auto err = [](const json& j) {
    try {
      parse_special_tokens(j, 4096, "tc.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(err(json::object()), "tc.json: added_tokens_decoder: expected an object {\"ID\": {\"content\": TEXT, ...}, ...}");
  EXPECT_EQ(err({{"added_tokens_decoder", {{"100", {{"content", "x"}}}}}}),
            "tc.json: added_tokens_decoder: id 100 collides with the BPE ranks 0..4095 of tiktoken.model");
  EXPECT_EQ(err({{"added_tokens_decoder", {{"5000x", {{"content", "x"}}}}}}),
            "tc.json: added_tokens_decoder: key '5000x' is not a decimal token id");
  EXPECT_EQ(err({{"added_tokens_decoder", {{"5000", {{"special", true}}}}}}),
            "tc.json: added_tokens_decoder[\"5000\"]: expected an object with a string 'content'");
  EXPECT_EQ(err({{"added_tokens_decoder", {{"5000", {{"content", "x"}}}, {"5001", {{"content", "x"}}}}}}),
            "tc.json: added_tokens_decoder[\"5001\"]: content 'x' is used twice");
}

TEST(TokenizerModelFile, Base64IsStrict) {
  EXPECT_EQ(base64_decode("IQ=="), "!");
  EXPECT_EQ(base64_decode("4pyF"), "\xE2\x9C\x85");
  EXPECT_FALSE(base64_decode("IR==").has_value());  // non-zero padding bits
  EXPECT_FALSE(base64_decode("I===").has_value());
  EXPECT_FALSE(base64_decode("").has_value());
  EXPECT_FALSE(base64_decode("IQ=").has_value());
  for (const std::string s : {"a", "ab", "abc", "\xFF\x00\x10"}) EXPECT_EQ(base64_decode(base64_encode(s)), s);
}

}  // namespace
}  // namespace wren
