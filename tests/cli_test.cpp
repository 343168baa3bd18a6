// The `wren` executable end to end: run (ids, --json, every validation hook), inspect and synth.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/hash.h"
#include "model/load.h"
#include "test_util.h"

namespace wren {
namespace {

const std::string kPrompt0 = "4096,976,2328,2258,328,2312,766,382";

std::string model_arg() { return "--model " + test::golden_dir(); }

TEST(Cli, RunJsonPrintsGoldenGreedyContinuation) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 8 --json", &out)) << out;
  EXPECT_NE(out.find("{\"output_ids\":[2012,1133,1466,4188,4038,3107,1460,537],\"prompt_ids\":[" + kPrompt0 + "]"),
            std::string::npos) << out;
}

// `run --json` prints stats.logits_fnv1a64: FNV-1a 64 over the logits rows the tokens were sampled
// from. With -n 1 that is the prompt's last row, which --logits also writes; equal runs print equal
// hashes, another weight format another hash.
TEST(Cli, JsonLogitsHashCoversTheSampledRows) {
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);  // published FNV-1a 64 test vectors
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  EXPECT_EQ(hex64(0xaf63dc4c8601ec8cull), "af63dc4c8601ec8c");
  auto hash_of = [](const std::string& out) {
    const std::string key = "\"logits_fnv1a64\":\"";
    const size_t at = out.find(key);
    return at == std::string::npos ? std::string("missing") : out.substr(at + key.size(), 16);
  };
  const std::string dir = test::temp_dir("cli-hash");
  std::string one, a, b, q;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 1 --json --logits " + dir + "/l.f32", &one)) << one;
  const auto logits = test::read_all_f32(dir + "/l.f32");
  const size_t V = logits.size() / 8;  // 8 prompt tokens
  ASSERT_GT(V, 0u);
  EXPECT_EQ(hash_of(one), hex64(fnv1a64(logits.data() + 7 * V, V * sizeof(float)))) << one;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 4 --json", &a)) << a;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 4 --json --threads 1", &b)) << b;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 4 --json --quant q8", &q)) << q;
  EXPECT_EQ(hash_of(a), hash_of(b)) << "the thread count changes no bit";
  EXPECT_NE(hash_of(a), hash_of(one));
  EXPECT_NE(hash_of(a), hash_of(q)) << "q8 weights change the logits";
  std::filesystem::remove_all(dir);
}

TEST(Cli, TraceAndLogitsHooksWriteGoldenShapedFiles) {
  const std::string dir = test::temp_dir("cli");
  std::string out;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 1 --trace " + dir +
                                  "/t.f32 --logits " + dir + "/l.f32",
                              &out)) << out;
  const auto trace = test::read_all_f32(dir + "/t.f32");
  const auto logits = test::read_all_f32(dir + "/l.f32");
  const auto gtrace = test::read_all_f32(test::golden_dir() + "/golden/prompt0.trace.f32");
  const auto glogits = test::read_all_f32(test::golden_dir() + "/golden/prompt0.logits.f32");
  ASSERT_EQ(trace.size(), gtrace.size());
  ASSERT_EQ(logits.size(), glogits.size());
  EXPECT_LT(test::rel_l2(logits.data(), glogits.data(), logits.size()), 1e-4);
  std::filesystem::remove_all(dir);
}

TEST(Cli, LayersDumpAndX0HooksAgreeWithEachOther) {
  const std::string dir = test::temp_dir("cli");
  std::string out;
  // --layers 3: trace has 3 rows per token; the dump's `hidden` equals the trace row.
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 1 --layers 3 --trace " + dir +
                                  "/t.f32 --dump-layer 2 --dump-token 5 --dump-dir " + dir + "/dump",
                              &out)) << out;
  const auto trace = test::read_all_f32(dir + "/t.f32");
  ASSERT_EQ(trace.size(), 8u * 3 * 128);
  for (const char* n : {"nrm_attn", "att", "nrm_mlp", "mlp"})
    EXPECT_EQ(test::read_all_f32(dir + "/dump/" + n + ".f32").size(), 128u) << n;
  const auto hidden = test::read_all_f32(dir + "/dump/hidden.f32");
  ASSERT_EQ(hidden.size(), 128u);
  EXPECT_EQ(0, std::memcmp(hidden.data(), trace.data() + (5 * 3 + 2) * 128, 128 * 4));
  // --x0 with rows equal to... the trace of layer 0 is not an embedding, so inject P-after-layer-0
  // rows and check the run is deterministic and differs from the plain run.
  std::ofstream(dir + "/x0.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(trace.data()), 8 * 128 * 4);
  std::string a, b;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 4 --json --x0 " + dir + "/x0.f32", &a)) << a;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 4 --json --x0 " + dir + "/x0.f32", &b)) << b;
  auto json_line = [](const std::string& s) {  // the ids, without the timing statistics
    const size_t b = s.find("{\"output_ids\""), e = s.find(",\"stats\"");
    return s.substr(b, e - b);
  };
  EXPECT_EQ(json_line(a), json_line(b));
  std::string bad;
  EXPECT_NE(0, test::run_wren("run " + model_arg() + " --ids 4096,976 --x0 " + dir + "/x0.f32", &bad));
  EXPECT_NE(bad.find("expected 1024 for --x0"), std::string::npos) << bad;
  std::filesystem::remove_all(dir);
}

TEST(CliValidate, CpuAgainstItselfPasses) {
  std::string out;
  // The reference kernels against themselves: every layer exact.
  ASSERT_EQ(0, test::run_wren("validate " + model_arg() + " --backend cpu --isa scalar --threads 1 --greedy 4", &out)) << out;
  EXPECT_NE(out.find("PASS: 2 prompt(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("| 3 | MLA + MoE | 0.000e+00 | 0.000e+00"), std::string::npos) << out;
  // The SIMD kernels: float-order differences far inside the tolerance.
  ASSERT_EQ(0, test::run_wren("validate " + model_arg() + " --backend cpu --greedy 4", &out)) << out;
  EXPECT_NE(out.find("PASS: 2 prompt(s)"), std::string::npos) << out;
}

TEST(CliValidate, Int4WeightsFailTheExactTolerance) {
  std::string out;
  EXPECT_EQ(1, test::run_wren("validate " + model_arg() + " --backend cpu --quant q4 --greedy 0 --json", &out)) << out;
  EXPECT_NE(out.find("\"pass\": false"), std::string::npos) << out;
  EXPECT_NE(out.find("the candidate failed on at least one prompt"), std::string::npos) << out;
}

// A golden.json with no cases, or an id that is not a token, is an error naming the file and case.
TEST(CliValidate, BadGoldenCasesAreClearErrors) {
  const std::string dir = test::temp_dir("validate");
  for (const auto& f : std::filesystem::directory_iterator(test::golden_dir()))
    if (f.path().filename() != "golden") std::filesystem::create_symlink(f.path(), dir + "/" + f.path().filename().string());
  std::filesystem::create_directories(dir + "/golden");
  std::string out;
  std::ofstream(dir + "/golden/golden.json") << R"({"cases": []})";
  EXPECT_EQ(1, test::run_wren("validate --model " + dir + " --backend cpu", &out)) << out;
  EXPECT_NE(out.find("must be a non-empty list"), std::string::npos) << out;
  std::ofstream(dir + "/golden/golden.json") << R"({"cases": [{"name": "p", "ids": [4096, 4294967296]}]})";
  EXPECT_EQ(1, test::run_wren("validate --model " + dir + " --backend cpu", &out)) << out;
  EXPECT_NE(out.find("case p: id 4294967296 is not a token id in [0, 4352)"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

TEST(CliBench, TokenizerMatchesTiktokenIdsOnTheSameCorpus) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("bench tokenizer " + model_arg() + " --mb 0.05 --reps 1", &out)) << out;
  for (const char* corpus : {"| english", "| code", "| mixed"}) EXPECT_NE(out.find(corpus), std::string::npos) << out;
  EXPECT_EQ(out.find("| NO"), std::string::npos) << out;
  EXPECT_NE(out.find("tiktoken MB/s"), std::string::npos) << out;
  const std::string dir = test::temp_dir("tokbench");
  std::ofstream(dir + "/empty.txt").flush();
  EXPECT_EQ(1, test::run_wren("bench tokenizer " + model_arg() + " --corpus " + dir + "/empty.txt", &out)) << out;
  EXPECT_NE(out.find("is empty"), std::string::npos) << out;
  EXPECT_EQ(1, test::run_wren("bench tokenizer " + model_arg() + " --corpus " + dir, &out)) << out;
  EXPECT_NE(out.find("is not a readable regular file"), std::string::npos) << out;
  EXPECT_NE(0, test::run_wren("bench tokenizer " + model_arg() + " --mb nan", &out)) << out;
  std::filesystem::remove_all(dir);
}

TEST(Cli, InspectPrintsArchitecture) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("inspect " + model_arg(), &out)) << out;
  for (const char* s : {"layers: 10 (7 KDA, 3 gated MLA)", "3:MLA+MoE", "0:KDA+dense*", "16 routed experts",
                        "6.53 KB each", "BF16", "U8"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
}

TEST(Cli, SynthWritesALoadableCheckpoint) {
  const std::string dir = test::temp_dir("synth");
  std::ofstream(dir + "/c.json") << test::golden_config().dump();
  std::string out;
  ASSERT_EQ(0, test::run_wren("synth --config " + dir + "/c.json --out " + dir + "/m --seed 3 --shard-mb 0.5", &out)) << out;
  ASSERT_EQ(0, test::run_wren("run --model " + dir + "/m --ids 5,6,7 -n 3 --json", &out)) << out;
  EXPECT_NE(out.find("\"output_ids\""), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

TEST(Cli, VersionTokensDetokenizeAndInspectSaysAllExpertsFit) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("--version", &out)) << out;
  EXPECT_EQ(out.rfind("wren 0.1.0", 0), 0u) << out;
  ASSERT_EQ(0, test::run_wren("tokenize " + model_arg() + " 'Hello, world'", &out)) << out;
  const std::string ids = out.substr(0, out.find('\n'));
  ASSERT_EQ(0, test::run_wren("tokenize --tokens " + model_arg() + " 'Hello, world'", &out)) << out;
  std::istringstream lines(out);
  std::string line, joined, from_tokens;
  while (std::getline(lines, line)) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << out;
    from_tokens += (from_tokens.empty() ? "" : " ") + line.substr(0, tab);
    ASSERT_EQ(line[tab + 1], '"');
    joined += nlohmann::json::parse(line.substr(tab + 1)).get<std::string>();
  }
  EXPECT_EQ(from_tokens, ids);
  EXPECT_EQ(joined, "Hello, world");
  ASSERT_EQ(0, test::run_wren("detokenize " + model_arg() + " " + ids, &out)) << out;
  EXPECT_EQ(out, "Hello, world\n");
  std::string comma = ids;
  for (char& c : comma) c = c == ' ' ? ',' : c;
  const std::string dir = test::temp_dir("detok");
  std::ofstream(dir + "/ids.json") << "[" << comma << "]\n";
  ASSERT_EQ(0, test::run_wren("detokenize " + model_arg() + " - < " + dir + "/ids.json", &out)) << out;
  std::filesystem::remove_all(dir);
  EXPECT_EQ(out, "Hello, world\n");
  EXPECT_NE(0, test::run_wren("detokenize " + model_arg() + " 12 x", &out));
  EXPECT_NE(out.find("'x' is not a token id"), std::string::npos) << out;
  ASSERT_EQ(0, test::run_wren("inspect " + model_arg() + " --expert-cache 1G", &out)) << out;
  EXPECT_NE(out.find("all 144 experts fit"), std::string::npos) << out;
  ASSERT_EQ(0, test::run_wren("inspect " + model_arg() + " --expert-cache 20K", &out)) << out;
  EXPECT_NE(out.find("of 144 experts; the rest streams"), std::string::npos) << out;
}

// Ctrl-C during `wren run` stops generation after the current token and still prints the
// statistics line (exit 0); a server-less check with the golden model and a long generation.
TEST(Cli, CtrlCDuringRunPrintsTheStatistics) {
  std::string out;
  const std::string dir = test::temp_dir("ctrlc");
  // Interrupt as soon as the model is loaded (the start-up line about the expert cache is on
  // stderr): greedy decoding of this prompt meets EOS after ~1,400 tokens, ~1.5 s on an idle
  // machine, so a fixed sleep raced with the end of the generation.
  const std::string cmd = "bash -c '" + std::string(WREN_BINARY) + " run " + model_arg() +
                          " --ctx 8192 -n 8000 Hello > /dev/null 2> " + dir +
                          "/err & p=$!; for i in $(seq 400); do grep -q \"expert cache\" " + dir +
                          "/err && break; sleep 0.02; done; sleep 0.1; kill -INT $p; wait $p; echo rc=$?'";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_TRUE(p);
  char buf[256];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  std::ifstream f(dir + "/err");
  const std::string err((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(out.find("rc=0"), std::string::npos) << out << err;
  EXPECT_NE(err.find("stopped by Ctrl-C"), std::string::npos) << err;
  EXPECT_NE(err.find("prompt tokens"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

// Every --help shows option defaults (`TYPE=DEFAULT`) and no CLI11 `{false}` after negated flags;
// the test-only serve flag stays hidden.
TEST(Cli, HelpShowsDefaultsWithoutBraces) {
  for (const char* sub : {"run", "chat", "serve", "inspect", "tokenize", "detokenize", "validate", "synth"}) {
    std::string out;
    ASSERT_EQ(0, test::run_wren(std::string(sub) + " --help", &out)) << out;
    EXPECT_EQ(out.find("{false}"), std::string::npos) << sub << "\n" << out;
    EXPECT_EQ(out.find("{true}"), std::string::npos) << sub << "\n" << out;
  }
  std::string out;
  ASSERT_EQ(0, test::run_wren("run --help", &out)) << out;
  EXPECT_NE(out.find("=256"), std::string::npos) << out;      // -n
  EXPECT_NE(out.find("=4096"), std::string::npos) << out;     // --ctx
  EXPECT_NE(out.find("--no-think"), std::string::npos) << out;
  EXPECT_NE(out.find("=every core"), std::string::npos) << out;  // --threads (was =0)
  ASSERT_EQ(0, test::run_wren("serve --help", &out)) << out;
  EXPECT_NE(out.find("=8000"), std::string::npos) << out;
  EXPECT_EQ(out.find("replay"), std::string::npos) << out;
  // No shown default breaks its own flag's check (was --max-seqs INT:POSITIVE=0, NONNEGATIVE=-1).
  EXPECT_EQ(out.find("POSITIVE=0"), std::string::npos) << out;
  EXPECT_EQ(out.find("NONNEGATIVE=-1"), std::string::npos) << out;
  EXPECT_NE(out.find("--max-seqs INT:POSITIVE=16"), std::string::npos) << out;
}

// The CUDA options are typed flags, checked in every build (with or without the CUDA backend).
TEST(Cli, CudaOptionsAreCheckedFlags) {
  std::string out;
  EXPECT_NE(0, test::run_wren("run " + model_arg() + " --ids 4096 -n 1 --cuda-kda fast", &out));
  EXPECT_NE(out.find("--cuda-kda: 'fast' is not a KDA path (expected recurrent or chunked)"), std::string::npos) << out;
  EXPECT_NE(0, test::run_wren("run " + model_arg() + " --ids 4096 -n 1 --cuda-kda-chunk 48", &out));
  EXPECT_NE(out.find("--cuda-kda-chunk"), std::string::npos) << out;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids 4096 -n 1 --backend cpu --cuda-kda chunked", &out)) << out;
  EXPECT_NE(out.find("wren: cpu "), std::string::npos) << out;
  EXPECT_EQ(out.find("wren: cuda precision"), std::string::npos) << "the CUDA line only when CUDA runs:\n" << out;
}

TEST(Cli, BadArgumentsExitNonZero) {
  std::string out;
  EXPECT_NE(0, test::run_wren("run " + model_arg() + " --ids 4096,abc", &out));
  EXPECT_NE(out.find("'abc' is not an integer"), std::string::npos) << out;
  EXPECT_NE(0, test::run_wren("run " + model_arg() + " --ids 4096,99999", &out));
  EXPECT_NE(out.find("outside the vocabulary"), std::string::npos) << out;
  EXPECT_NE(0, test::run_wren("run --model /nonexistent --ids 1", &out));
  EXPECT_NE(out.find("/nonexistent/config.json"), std::string::npos) << out;
  // Command-line usage errors (CLI11's parse errors): one `wren: error:` line and exit 2, like a Unix tool.
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --top-k -5 --ids 1", &out)) << out;
  EXPECT_NE(out.find("wren: error: --top-k"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("run --no-such-flag", &out)) << out;
  EXPECT_NE(out.find("wren: error:"), std::string::npos) << out;
  EXPECT_EQ(0, test::run_wren("run --help", &out)) << out;
  // Values only Wren can check (sizes, presets) are usage errors too: exit 2, naming the flag.
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --expert-cache abc", &out)) << out;
  EXPECT_NE(out.find("wren: error: --expert-cache: 'abc' is not a size"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --quant q3", &out)) << out;
  EXPECT_NE(out.find("wren: error: --quant: 'q3' is not a preset"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --pipeline 0", &out)) << out;
  EXPECT_NE(out.find("wren: error: --pipeline '0'"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --pipeline 1+x", &out)) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --backend cpu --gpus 0", &out)) << out;
  EXPECT_NE(out.find("--gpus: the pipeline ranks need the CUDA backend"), std::string::npos) << out;
  // Closed sets checked by the parser and budgets checked before the load: exit 2 as well.
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --mx-act int4", &out)) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --isa sse2", &out)) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --direct maybe", &out)) << out;
  EXPECT_NE(out.find("wren: error: --direct"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --expert-cache 0", &out)) << out;
  EXPECT_NE(out.find("wren: error: --expert-cache 0 is below one expert"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("run " + model_arg() + " --ids 1 --pipeline 2 --trace " + test::temp_dir("trace-pipe") + "/t.f32", &out)) << out;
  EXPECT_NE(out.find("--trace and --dump-layer need a single stage"), std::string::npos) << out;
  // A budget the server refuses is refused before the model loads, also by bench serve (was: terminate).
  EXPECT_EQ(2, test::run_wren("bench serve " + model_arg() + " --requests 1 --max-tokens 1 --max-batch-tokens 1", &out)) << out;
  EXPECT_NE(out.find("wren: error: --max-batch-tokens 1 is below --max-seqs 16"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("bench serve " + model_arg() + " --clients 0", &out)) << out;
  EXPECT_EQ(2, test::run_wren("bench prefill " + model_arg() + " --prompts 8,0", &out)) << out;
  EXPECT_NE(out.find("wren: error: --prompts: '0' is not a prompt length in 1..4194304"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("bench batch " + model_arg() + " --batches 2,x", &out)) << out;
  EXPECT_EQ(2, test::run_wren("bench batch " + model_arg() + " --expert-forms m0,x3", &out)) << out;
  EXPECT_NE(out.find("--expert-forms: 'x3' is not mN"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("bench batch " + model_arg() + " --expert-forms g2", &out)) << out;
  EXPECT_NE(out.find("or g0 / g1"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("bench stream --dir " + test::temp_dir("bench-stream-budgets") + " --moe-layers 1 --experts 16 --runs 1 --budgets abc", &out)) << out;
  EXPECT_NE(out.find("--budgets: 'abc' is not a fraction"), std::string::npos) << out;
  EXPECT_EQ(2, test::run_wren("bench stream --dir " + test::temp_dir("bench-stream-budgets") + " --moe-layers 1 --experts 16 --runs 1 --budgets 0.1,-0.5", &out)) << out;
  EXPECT_EQ(1, test::run_wren("perplexity " + model_arg() + " " + test::temp_dir("ppl-dir"), &out)) << out;
  EXPECT_NE(out.find("is a folder (expected a UTF-8 text file)"), std::string::npos) << out;
  // bench stream writes its checkpoint only into a folder it owns: a model folder is refused untouched.
  const std::string dir = test::temp_dir("bench-stream-dir");
  std::ofstream(dir + "/config.json") << "{}";
  EXPECT_NE(0, test::run_wren("bench stream --dir " + dir + " --moe-layers 1 --experts 16 --runs 1", &out)) << out;
  EXPECT_NE(out.find("holds other files"), std::string::npos) << out;
  std::ifstream f(dir + "/config.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "{}");
}

}  // namespace
}  // namespace wren

namespace wren {
namespace {

// `bench experts --runs N` repeats each measurement N times (cold each time) and reports min and
// median, the store / sequential ratio per run; the decode rows too.
TEST(Cli, BenchExpertsReportsMinAndMedianOfSeveralRuns) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("bench experts " + model_arg() + " -n 2 --runs 3", &out)) << out;
  EXPECT_NE(out.find("min / median of 3 runs"), std::string::npos) << out;
  const std::string key = "ratio store / sequential (per run): min ";
  const size_t at = out.find(key);
  ASSERT_NE(at, std::string::npos) << out;
  double lo = 0, med = 0;
  ASSERT_EQ(2, std::sscanf(out.c_str() + at + key.size(), "%lfx, median %lfx (3 runs", &lo, &med)) << out;
  EXPECT_GT(lo, 0) << out;
  EXPECT_LE(lo, med) << out;
  EXPECT_NE(out.find("| decode tok/s min | decode tok/s median |"), std::string::npos) << out;
  // Three decode rows (10%, 50%, 100%), each with min <= median.
  int rows = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| 10% (", 0) != 0 && line.rfind("| 50% (", 0) != 0 && line.rfind("| 100% (", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream cs(line);
    for (std::string cell; std::getline(cs, cell, '|');) cells.push_back(cell);
    ASSERT_GE(cells.size(), 9u) << line;
    EXPECT_LE(std::stod(cells[7]), std::stod(cells[8])) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 3) << out;
  EXPECT_EQ(2, test::run_wren("bench experts " + model_arg() + " --runs 0", &out)) << out;
}

TEST(LoadProgress, CallbackCountsEveryDenseByteOnce) {
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  const auto m = load_model(test::golden_dir(), {}, LoadOptions{nullptr, [&](uint64_t done, uint64_t total) { calls.push_back({done, total}); }});
  ASSERT_FALSE(calls.empty());
  uint64_t prev = 0;
  for (const auto& [done, total] : calls) {
    EXPECT_EQ(total, calls.front().second);
    EXPECT_GT(done, prev);  // every call reports progress
    prev = done;
  }
  EXPECT_EQ(calls.back().first, calls.back().second);
  // The total is the dense tensors' stored bytes: the embedding alone is V x D elements of 2 or 4 bytes.
  EXPECT_GE(calls.back().second, uint64_t(m->config.vocab) * m->config.hidden * 2);
}

TEST(LoadProgress, LineOnlyOnATerminalAndNotWithQuiet) {
  std::string out;
  ASSERT_EQ(0, test::run_wren("run " + model_arg() + " --ids " + kPrompt0 + " -n 1", &out)) << out;
  EXPECT_EQ(out.find("loading weights"), std::string::npos) << "stderr is a pipe here: no progress line\n" << out;
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "no `script` to give wren a terminal";
  const std::string wren = WREN_BINARY;
  for (bool quiet : {false, true}) {
    const std::string cmd = "script -qec '" + wren + " run " + model_arg() + " --ids " + kPrompt0 + " -n 1" +
                            (quiet ? " --quiet" : "") + "' /dev/null 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string tty;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) tty.append(buf, n);
    ASSERT_EQ(0, pclose(p)) << tty;
    if (quiet) EXPECT_EQ(tty.find("loading weights"), std::string::npos) << tty;
    else EXPECT_NE(tty.find("wren: loading weights 100% ("), std::string::npos) << tty;
  }
}

}  // namespace
}  // namespace wren
