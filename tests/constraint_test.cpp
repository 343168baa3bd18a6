// Constrained decoding (runtime/reply_constraint.h): the JSON-object grammar against nlohmann's
// parser on valid texts and their one-byte mutations, and whole replies drawn from random logits
// (a "model" that writes anything) under tool_choice named / required and response_format, in
// both chat dialects: the reply must always parse into what the rule asks for.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "runtime/reply_constraint.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace wren {
namespace {

bool grammar_accepts(const std::string& s) {
  JsonPrefix j;
  return j.push(s) && j.complete();
}

bool parser_accepts(const std::string& s) {
  if (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) return false;
  try {
    return nlohmann::json::parse(s).is_object();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

TEST(JsonGrammar, AgreesWithTheParserOnValidTextsAndMutations) {
  const std::vector<std::string> valid = {
      "{}", "{\"a\":1}", " {\"a\" : 0 }", "{\"a\": [1, -2.5e+3, 0.0, 1E9, true, false, null, \"x\\u00e9\\n\\\"\"], \"b\": {\"c\": {}}}",
      "{\"k\":[[],[{}],\"\"],\"z\":-0}", "{\"caf\xc3\xa9\": \"\xe2\x82\xac\"}"};
  for (const std::string& v : valid) EXPECT_TRUE(grammar_accepts(v)) << v;
  const std::vector<std::string> invalid = {"[1]", "{\"a\" 1}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":tru}", "{\"a\":\"\x01\"}",
                                            "{\"a\":1}}", "{\"a\":.5}", "{\"a\":1.}", "{'a':1}", "{\"a\":1} ", "1", "\"s\""};
  for (const std::string& v : invalid) EXPECT_FALSE(grammar_accepts(v)) << v;
  // One-byte mutations of the valid texts: the grammar and the parser agree on every one.
  const std::string alphabet = "{}[]:,\"\\ 0123456789.-+eEtrufalsn\x01u";
  std::mt19937 rng(7);
  int agreed = 0, accepted = 0;
  for (const std::string& v : valid)
    for (size_t i = 0; i <= v.size(); ++i)
      for (char c : alphabet)
        for (int op = 0; op < 3; ++op) {
          std::string m = v;
          if (op == 0 && i < m.size()) m[i] = c;
          else if (op == 1) m.insert(m.begin() + i, c);
          else if (op == 2 && i < m.size()) m.erase(i, 1);
          const bool g = grammar_accepts(m), p = parser_accepts(m);
          EXPECT_EQ(g, p) << "text: " << m;
          agreed += g == p;
          accepted += g;
        }
  EXPECT_GT(accepted, 100);  // the mutations include valid texts too
  (void)agreed;
  // A refused byte leaves the state as it was.
  JsonPrefix j;
  ASSERT_TRUE(j.push(std::string("{\"a\":")));
  EXPECT_FALSE(j.push((unsigned char)'}'));
  EXPECT_TRUE(j.push(std::string("7}")));
  EXPECT_TRUE(j.complete());
}

/// Draws a whole reply under `rule` from seeded random logits (biased towards a few ids, so
/// replies end), feeding the ids to a parser as the server does. Returns the ids.
std::vector<int> draw(const ChatFormat& fmt, const ReplyRule& rule, bool thinking, uint64_t seed, int max_tokens,
                      const std::vector<int>& bias = {}) {
  const int V = fmt.tokenizer().vocab_size();
  ReplyConstraint c(fmt, rule, thinking, {});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int> out;
  Sampler s(SamplerOptions{1.f, 1.f, 0, seed});
  for (int n = 0; n < max_tokens && !c.done(); ++n) {
    for (float& l : logits) l = nd(rng);
    for (int b : bias) logits[size_t(b)] += 4.f;
    c.mask(logits.data(), V);
    const int id = s.sample(logits.data(), V);
    EXPECT_TRUE(std::isfinite(logits[size_t(id)])) << "drew a masked id";
    c.accept(id);
    out.push_back(id);
  }
  EXPECT_TRUE(c.done()) << "the plan did not finish in " << max_tokens << " tokens";
  return out;
}

std::vector<int> closers(const Tokenizer& tok) {  // ids whose bytes close JSON values: replies end
  std::vector<int> b;
  for (int id = 0; id < tok.n_ranks(); ++id) {
    const std::string_view t = tok.token_bytes(id);
    if (t == "}" || t == "]" || t == "\"" || t == "\"}" || t == "1" || t == "," || t == "\":") b.push_back(id);
  }
  return b;
}

TEST(ReplyConstraint, RandomLogitsGiveTheNamedCallInBothDialects) {
  const Tokenizer k3 = Tokenizer::load(test::golden_dir());
  const Tokenizer k2 = test::k2_tokenizer();
  for (const Tokenizer* tok : {&k3, &k2}) {
    const ChatFormat fmt(*tok);
    for (bool named : {true, false}) {
      ReplyRule rule;
      rule.kind = ReplyRule::Kind::ToolCall;
      rule.tools = named ? std::vector<std::string>{"get_weather"} : std::vector<std::string>{"get", "get_time", "now"};
      for (bool thinking : {false, true}) {
        for (uint64_t seed = 1; seed <= 3; ++seed) {
          SCOPED_TRACE(std::string(fmt.dialect() == ChatDialect::K2 ? "K2" : "XTML") + (named ? " named" : " required") +
                       (thinking ? " thinking" : "") + " seed " + std::to_string(seed));
          if (fmt.dialect() == ChatDialect::Xtml) {
            // K3's arguments are typed blocks (not constrained): the random model never closes
            // the call, so only the forced opening is checked; the closing is checked below.
            const int V = tok->vocab_size();
            ReplyConstraint c(fmt, rule, thinking, {});
            ReplyParser p(fmt, thinking);
            std::mt19937_64 rng(seed);
            std::normal_distribution<float> nd(0.f, 1.f);
            std::vector<float> l(static_cast<size_t>(V));
            for (int n = 0; n < 300 && !c.done(); ++n) {
              for (float& x : l) x = nd(rng);
              if (thinking && n == 20) l[size_t(fmt.close_id())] = 100.f;  // the model ends its thinking
              c.mask(l.data(), V);
              const int id = argmax(l.data(), V);
              c.accept(id);
              p.push(id);
              if (id == fmt.end_of_msg()) {
                EXPECT_TRUE(c.done()) << "the message ends only as the last step of the plan";
              }
            }
            ASSERT_EQ(p.calls().size(), 1u);
            EXPECT_NE(std::find(rule.tools.begin(), rule.tools.end(), p.calls()[0].name), rule.tools.end())
                << p.calls()[0].name;
            continue;
          }
          const std::vector<int> ids = draw(fmt, rule, thinking, seed, 3000, closers(*tok));
          ReplyParser p(fmt, thinking);
          for (int id : ids) p.push(id);
          EXPECT_TRUE(p.done());
          ASSERT_EQ(p.calls().size(), 1u);
          EXPECT_TRUE(p.calls()[0].json_ok()) << p.calls()[0].arguments;
          EXPECT_EQ(rule.check(p.calls(), ""), "");
          EXPECT_EQ(p.calls()[0].id, "functions." + p.calls()[0].name + ":0");
        }
      }
    }
  }
}

TEST(ReplyConstraint, XtmlCallIsClosedAndBadTypedArgumentsAreReported) {
  const Tokenizer tok = Tokenizer::load(test::golden_dir());
  const ChatFormat fmt(tok);
  ReplyRule rule;
  rule.kind = ReplyRule::Kind::ToolCall;
  rule.tools = {"f"};
  ReplyConstraint c(fmt, rule, false, {});
  ReplyParser p(fmt, false);
  // The model "wants" an argument block whose number is not JSON, then to close the call; then
  // it wants to keep talking: the constraint closes tools and the message instead.
  std::vector<int> script;
  auto seg = [&](const std::string& s) {
    for (int id : tok.encode_ordinary(s)) script.push_back(id);
  };
  script.push_back(fmt.open_id());
  seg("argument key=\"n\" type=\"number\"");
  script.push_back(fmt.sep_id());
  seg("twelve");
  script.push_back(fmt.close_id());
  seg("argument");
  script.push_back(fmt.sep_id());
  script.push_back(fmt.close_id());
  seg("call");
  script.push_back(fmt.sep_id());
  const int V = tok.vocab_size();
  std::vector<float> l;
  size_t k = 0;
  int steps = 0;
  std::vector<int> ids;
  for (; !c.done() && steps < 200; ++steps) {
    l.assign(size_t(V), 0.f);
    const int more = tok.encode_ordinary("more")[0];  // before the call is open, and after the script
    const int want = !p.calls().empty() && k < script.size() ? script[k] : more;
    l[size_t(want)] = 1.f;
    c.mask(l.data(), V);
    const int id = argmax(l.data(), V);
    if (id == want && want != more) ++k;
    c.accept(id);
    p.push(id);
    ids.push_back(id);
  }
  ASSERT_TRUE(c.done());
  EXPECT_EQ(k, script.size()) << "the whole script got through once the call was open";
  EXPECT_TRUE(p.done()) << "the constraint ends the message";
  ASSERT_EQ(p.calls().size(), 1u);
  EXPECT_EQ(p.calls()[0].name, "f");
  EXPECT_TRUE(p.calls()[0].complete);
  EXPECT_FALSE(p.calls()[0].json_ok()) << p.calls()[0].arguments;
  EXPECT_NE(rule.check(p.calls(), "").find("not a JSON object"), std::string::npos) << rule.check(p.calls(), "");
}

TEST(ReplyConstraint, RandomLogitsGiveAJsonObjectReply) {
  const Tokenizer k3 = Tokenizer::load(test::golden_dir());
  const Tokenizer k2 = test::k2_tokenizer();
  for (const Tokenizer* tok : {&k3, &k2}) {
    const ChatFormat fmt(*tok);
    ReplyRule rule;
    rule.kind = ReplyRule::Kind::JsonObject;
    for (bool thinking : {false, true}) {
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        SCOPED_TRACE(std::string(fmt.dialect() == ChatDialect::K2 ? "K2" : "XTML") + (thinking ? " thinking" : "") +
                     " seed " + std::to_string(seed));
        std::vector<int> bias = closers(*tok);
        if (thinking && fmt.dialect() == ChatDialect::Xtml) bias.push_back(fmt.close_id());
        const std::vector<int> ids = draw(fmt, rule, thinking, seed, 3000, bias);
        ReplyParser p(fmt, thinking);
        std::string content;
        for (int id : ids)
          if (p.push(id) == ReplyParser::Channel::Response) content += tok->token_bytes(id);
        EXPECT_TRUE(p.done());
        EXPECT_EQ(rule.check({}, content), "") << content;
        EXPECT_TRUE(nlohmann::json::parse(content).is_object());
      }
    }
  }
  ReplyRule schema;
  schema.kind = ReplyRule::Kind::JsonObject;
  schema.required = {"city"};
  EXPECT_EQ(schema.check({}, "{\"city\": 1}"), "");
  EXPECT_NE(schema.check({}, "{\"town\": 1}").find("'city'"), std::string::npos);
  EXPECT_NE(schema.check({}, "[1]").find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace wren
