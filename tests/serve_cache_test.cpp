// `wren serve` with the prefix cache and batched decode (--max-seqs 8), in process on the golden
// model: answers resumed from cached prefixes, decoded in batches, equal those of a server without
// either (greedy), usage reports
// prompt_tokens_details.cached_tokens, /health and /metrics count hits; A->B->A, a conversation
// edited at turn 2, concurrent clients sharing a prefix while one of them hangs up mid-stream.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/chat_format.h"
#include "server/server.h"
#include "test_util.h"

namespace wren {
namespace {

using nlohmann::json;

/// A Server on a free loopback port, listening on its own thread.
struct Running {
  server::Server s;
  int port;
  std::thread th;
  Running(Engine& e, server::ServerOptions o) : s(e, std::move(o)), port(s.bind()), th([this] { s.listen(); }) {}
  ~Running() {
    s.stop();
    th.join();
  }
  json post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const auto r = c.Post(path, body.dump(), "application/json");
    if (!r) return json{{"error", httplib::to_string(r.error())}};
    if (r->status != 200) return json{{"error", r->body}};
    return json::parse(r->body);
  }
  json get(const std::string& path) {
    httplib::Client c("127.0.0.1", port);
    const auto r = c.Get(path);
    return r && path == "/health" ? json::parse(r->body) : r ? json(r->body) : json();
  }
  /// Waits until no generation runs (a hung-up one stops at its next token).
  void idle() {
    for (int i = 0; i < 200 && get("/health")["busy"].get<bool>(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
};

class ServePrefixCache : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.model_dir = test::golden_dir();
    o.ctx = 512;
    o.backend = "cpu";
    o.announce = false;
    engine_ = new Engine(o);
  }
  static void TearDownTestSuite() { delete engine_; }
  /// With the cache on, 8 sequences decode together (batched steps); the reference server has
  /// neither (one request at a time, fresh prefill).
  static server::ServerOptions opts(size_t cache) {
    server::ServerOptions o;
    o.max_seqs = cache ? 8 : 1;
    o.port = 0;
    o.model_id = "k3-tiny-a";
    o.ctx = 512;
    o.log_requests = false;
    o.prefix_cache = cache;
    o.prefix_interval = 32;
    return o;
  }
  static Engine* engine_;
};
Engine* ServePrefixCache::engine_ = nullptr;

json chat(const json& messages, int max_tokens = 8, bool stream = false) {
  json j = {{"model", "k3-tiny-a"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) j["stream"] = true, j["stream_options"] = {{"include_usage", true}};
  return j;
}
json user(const std::string& s) { return {{"role", "user"}, {"content", s}}; }
int cached(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); }
std::string answer(const json& r) {
  const json& c = r["choices"][0];
  return c.contains("message") ? c["message"]["content"].get<std::string>() + "|" + c["message"].value("reasoning_content", "")
                               : c["text"].get<std::string>();
}

const std::string kLong =
    "The history of the printing press begins in the fifteenth century, when movable metal type, oil-based ink "
    "and a wooden screw press were brought together in one workshop. Within fifty years presses ran in more "
    "than two hundred cities, and the price of a book fell to a fraction of a hand-copied manuscript.";

TEST_F(ServePrefixCache, SamePromptAgainAndItsExtensionEqualAFreshServer) {
  json fresh_a, fresh_b;
  const json a = {{"model", "k3-tiny-a"}, {"prompt", kLong}, {"max_tokens", 8}, {"temperature", 0}};
  json b = a;
  b["prompt"] = kLong + " Then came the newspapers, which";
  {
    Running plain(*engine_, opts(0));
    fresh_a = plain.post("/v1/completions", a);
    fresh_b = plain.post("/v1/completions", b);
  }
  Running srv(*engine_, opts(64 << 20));
  const json r1 = srv.post("/v1/completions", a);
  ASSERT_FALSE(r1.contains("error")) << r1.dump();
  EXPECT_EQ(cached(r1), 0);
  const json r2 = srv.post("/v1/completions", a);
  EXPECT_EQ(cached(r2), r2["usage"]["prompt_tokens"].get<int>()) << "the whole prompt, logits included";
  const json r3 = srv.post("/v1/completions", b);
  EXPECT_GE(cached(r3), 32) << r3.dump();
  EXPECT_LT(cached(r3), r3["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(answer(r1), answer(fresh_a));
  EXPECT_EQ(answer(r2), answer(fresh_a));
  EXPECT_EQ(answer(r3), answer(fresh_b));
  const json h = srv.get("/health");
  EXPECT_EQ(h["prefix_cache"]["lookups"], 3);
  EXPECT_EQ(h["prefix_cache"]["hits"], 2);
  EXPECT_EQ(h["prefix_cache"]["cached_tokens"], cached(r2) + cached(r3));
  EXPECT_GT(h["prefix_cache"]["bytes"].get<long long>(), 0);
  const std::string m = srv.get("/metrics");
  EXPECT_NE(m.find("wren_prefix_cache_hits_total 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("wren_prefix_cache_cached_tokens_total " + std::to_string(cached(r2) + cached(r3)) + "\n"),
            std::string::npos) << m;
}

TEST_F(ServePrefixCache, ChatABAAndAConversationEditedAtTurnTwo) {
  const json A = json::array({user("Tell me about printing presses, please.")});
  const json B = json::array({user("What is the capital of France?")});
  std::vector<json> convs = {A, B, A};
  std::vector<json> fresh;
  {
    Running plain(*engine_, opts(0));
    for (const json& c : convs) fresh.push_back(plain.post("/v1/chat/completions", chat(c)));
    const std::string a1 = fresh[0]["choices"][0]["message"]["content"];
    for (const char* turn2 : {"And who built the first one?", "And who sold the first one?"}) {
      json conv = A;
      conv.push_back({{"role", "assistant"}, {"content", a1}});
      conv.push_back(user(turn2));
      convs.push_back(conv);
      fresh.push_back(plain.post("/v1/chat/completions", chat(conv)));
    }
  }
  Running srv(*engine_, opts(64 << 20));
  std::vector<json> got;
  for (const json& c : convs) got.push_back(srv.post("/v1/chat/completions", chat(c)));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(got[i].contains("error")) << got[i].dump();
    EXPECT_EQ(answer(got[i]), answer(fresh[i])) << "request " << i;
  }
  EXPECT_EQ(cached(got[0]), 0);
  EXPECT_EQ(cached(got[2]), got[2]["usage"]["prompt_tokens"].get<int>()) << "A again after B";
  EXPECT_GT(cached(got[3]), 0) << "turn 2 resumes inside turn 1";
  EXPECT_GT(cached(got[4]), 0) << "the edited turn 2 too";
  EXPECT_LT(cached(got[4]), got[4]["usage"]["prompt_tokens"].get<int>());
  // The streamed usage chunk reports it as well.
  httplib::Client c("127.0.0.1", srv.port);
  c.set_read_timeout(120, 0);
  const auto r = c.Post("/v1/chat/completions", chat(convs[3], 8, true).dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_NE(r->body.find("\"prompt_tokens_details\":{\"cached_tokens\":" +
                         std::to_string(got[3]["usage"]["prompt_tokens"].get<int>()) + "}"),
            std::string::npos) << r->body;
}

/// Sends a streaming chat request on a raw socket, reads until the first delta, then hangs up.
bool hang_up_after_first_delta(int port, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return close(fd), false;
  const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != ssize_t(req.size())) return close(fd), false;
  std::string got;
  bool seen = false;
  for (int i = 0; i < 300 && !seen; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
    seen = got.find("content\":\"") != std::string::npos;
  }
  close(fd);
  return seen;
}

TEST_F(ServePrefixCache, ConcurrentClientsShareAPrefixWhileOneHangsUp) {
  const json sys = {{"role", "system"}, {"content", kLong}};
  const std::vector<std::string> qs = {"Who?", "When was it?", "Where did it start?", "Why did it matter?",
                                       "How fast did it spread?", "What came next?", "Was it costly?",
                                       "Name one printer."};  // 8 + the hang-up: more than --max-seqs
  std::vector<json> fresh;
  {
    Running plain(*engine_, opts(0));
    for (const std::string& q : qs) fresh.push_back(plain.post("/v1/chat/completions", chat({sys, user(q)})));
  }
  Running srv(*engine_, opts(64 << 20));
  for (int round = 0; round < 2; ++round) {  // cold (concurrent prefills of one prefix), then warm
    std::vector<json> got(qs.size());
    std::vector<std::thread> th;
    bool hung_up = false;
    th.emplace_back([&] {
      hung_up = hang_up_after_first_delta(srv.port, chat({sys, user("Tell me a long story.")}, 200, true).dump());
    });
    for (size_t i = 0; i < qs.size(); ++i)
      th.emplace_back([&, i] { got[i] = srv.post("/v1/chat/completions", chat({sys, user(qs[i])})); });
    for (auto& t : th) t.join();
    EXPECT_TRUE(hung_up);
    for (size_t i = 0; i < qs.size(); ++i) {
      ASSERT_FALSE(got[i].contains("error")) << got[i].dump();
      EXPECT_EQ(answer(got[i]), answer(fresh[i])) << "round " << round << " client " << i;
      if (round == 1) {
        EXPECT_EQ(cached(got[i]), got[i]["usage"]["prompt_tokens"].get<int>()) << "warm: the whole prompt";
      }
    }
  }
  srv.idle();
  const json h = srv.get("/health");
  EXPECT_GE(h["prefix_cache"]["hits"].get<int>(), int(qs.size())) << h.dump();
  EXPECT_GE(h["cancelled"].get<int>(), 1) << h.dump();
}

/// The answer lines of a `wren chat` transcript: stdout lines that are neither stats nor notes.
std::vector<std::string> chat_lines(const std::string& out) {
  std::vector<std::string> r;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind("wren", 0) != 0 && !l.empty()) r.push_back(l);
  return r;
}

// `wren chat`'s /retry: greedy, the retried answer equals the first one and its whole prompt comes
// from the prefix cache (nothing prefilled); with the cache off it is prefilled again, same answer.
TEST(ChatCliRetry, RetryResumesFromTheCacheAndGreedyGivesTheSameAnswer) {
  const std::string dir = test::temp_dir("chat-retry");
  std::ofstream(dir + "/in.txt") << "/retry\nHello\n/retry\nAnd again\n/retry\n/exit\n";
  const Tokenizer tok = Tokenizer::load(test::golden_dir());
  const ChatFormat fmt(tok);
  const size_t first = fmt.render({{"user", "Hello", ""}}, false).size() + fmt.generation_prompt(false).size();
  for (const char* cache : {"64M", "0"}) {
    SCOPED_TRACE(std::string("--prefix-cache ") + cache);
    // stdout (the answers) and stderr (the stats) apart: they interleave mid-line otherwise.
    ASSERT_EQ(0, std::system((std::string(WREN_BINARY) + " chat --model " + test::golden_dir() +
                              " -n 5 --no-think --temperature 0 --prefix-cache " + cache + " < " + dir + "/in.txt > " +
                              dir + "/out.txt 2> " + dir + "/err.txt").c_str()));
    std::ifstream fo(dir + "/out.txt"), fe(dir + "/err.txt");
    const std::string answers((std::istreambuf_iterator<char>(fo)), {}), err((std::istreambuf_iterator<char>(fe)), {});
    const std::string out = answers + err;
    EXPECT_NE(out.find("[nothing to retry yet]"), std::string::npos) << out;
    const std::vector<std::string> lines = chat_lines(answers);
    ASSERT_EQ(lines.size(), 5u) << out;  // the note, then two answers each followed by its retry
    EXPECT_EQ(lines[1], lines[2]) << out;
    EXPECT_EQ(lines[3], lines[4]) << out;
    const std::string retried = std::to_string(first) + " prompt tokens (" + std::to_string(first) + " from the prefix cache)";
    if (std::string(cache) == "0") {
      EXPECT_EQ(out.find("from the prefix cache"), std::string::npos) << out;
    } else {
      EXPECT_NE(out.find(retried), std::string::npos) << out;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wren
