// `wren serve` routes: /v1/chat/completions, /v1/completions, /v1/models, /health, and
// OpenAI-style errors for everything else.
#include "server/server.h"

#include <chrono>
#include <cstdio>

#include "server/sse.h"

namespace wren::server {

namespace {

using httplib::Request;
using httplib::Response;

long long now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(Response& res, int status, const std::string& msg, const std::string& param, const std::string& code) {
  res.status = status;
  const std::string type = status >= 500 ? "server_error" : "invalid_request_error";
  res.set_content(dump(error_json(msg, type, param, code)), "application/json");
}

using SteadyClock = std::chrono::steady_clock;
/// Per request, on the httplib thread that serves it from routing to the logger: its start time
/// and its generation job (for the log line).
thread_local SteadyClock::time_point t_start;
thread_local std::shared_ptr<Job> t_job;

/// Runs a handler, turning RequestError into its 4xx and any other exception into a 500.
httplib::Server::Handler guarded(std::function<void(const Request&, Response&)> fn) {
  return [fn = std::move(fn)](const Request& req, Response& res) {
    try {
      fn(req, res);
    } catch (const RequestError& e) {
      send_error(res, e.status, e.what(), e.param, e.code);
    } catch (const nlohmann::json::exception& e) {  // a request value of an unexpected JSON type
      send_error(res, 400, std::string("the request could not be read: ") + e.what(), "", "invalid_value");
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what(), "", "internal_error");
    }
  };
}

/// The method a known route takes ("GET" or "POST"), or "" for a path the server does not serve.
/// Mirrors the routes Server's constructor registers (httplib has no lookup by path).
std::string route_method(const std::string& path) {
  if (path == "/v1/chat/completions" || path == "/v1/completions") return "POST";
  if (path == "/health" || path == "/metrics" || path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return "GET";
  return "";
}

/// Fills the body of errors httplib produces itself (unknown route 404, a known route asked with
/// the wrong method 405, body too large 413, ...).
httplib::Server::HandlerResponse default_error(const Request& req, Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  const std::string allowed = res.status == 404 ? route_method(req.path) : "";
  if (!allowed.empty() && allowed != req.method) {  // a known route asked with the wrong method
    res.set_header("Allow", allowed);
    send_error(res, 405, req.path + " takes " + allowed + ", not " + req.method, "", "method_not_allowed");
  } else if (res.status == 404)
    send_error(res, 404, "unknown route: " + req.method + " " + req.path, "", "not_found");
  else if (res.status == 413)
    send_error(res, 413, "the request body is too large (see --max-body)", "", "payload_too_large");
  else
    send_error(res, res.status, "the request could not be handled (HTTP " + std::to_string(res.status) + ")", "", "");
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (b.empty()) return a.empty();
  unsigned d = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) d |= unsigned((unsigned char)a[i] ^ (unsigned char)b[i % b.size()]);
  return d == 0;
}

Server::Server(Engine& engine, ServerOptions o)
    : engine_(engine),
      o_(std::move(o)),
      cache_(o_.prefix_cache, o_.prefix_interval),
      queue_(engine, o_.max_queue, &cache_, o_.max_seqs, o_.max_batch_tokens),
      started_(now_s()) {
  if (!o_.replay.empty()) queue_.set_replay(o_.replay);
  queue_.set_metrics(&metrics_);
  const size_t threads = size_t(o_.max_queue) + 8;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_.set_payload_max_length(o_.max_body);
  // httplib's default socket options add SO_REUSEPORT, which lets a second `wren serve` bind the same
  // port and take half the connections: only SO_REUSEADDR here, so the second one fails to bind.
  http_.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
  });
  routes();
}

bool Server::authorized(const Request& req) const {
  if (o_.api_key.empty() || req.path == "/health") return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  const std::string given = h.compare(0, prefix.size(), prefix) == 0 ? h.substr(prefix.size()) : std::string();
  return constant_time_equal(given, o_.api_key);
}

void Server::log_request(const Request& req, const Response& res) {
  static const char* known[] = {"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"};
  std::string route = "other";
  for (const char* k : known)
    if (req.path == k) route = k;
  if (req.path.rfind("/v1/models/", 0) == 0) route = "/v1/models/{id}";
  metrics_.request(route, res.status);
  if (!o_.log_requests) return;
  const double dur = std::chrono::duration<double>(SteadyClock::now() - t_start).count();
  char line[512];
  if (t_job && t_job->done()) {
    const GenResult& r = t_job->result();
    std::snprintf(line, sizeof line, "wren serve: %s %s %d id=%s prompt=%d completion=%d ttft=%.3fs duration=%.3fs finish=%s cached=%d%s\n",
                  req.method.c_str(), req.path.c_str(), res.status, t_job->id.c_str(), r.prompt_tokens,
                  r.completion_tokens, r.ttft_s, dur, r.finish_reason.c_str(), r.cached_tokens,
                  t_job->was_cancelled() ? " cancelled" : !t_job->error().empty() ? " failed" : "");
  } else {
    std::snprintf(line, sizeof line, "wren serve: %s %s %d duration=%.3fs\n", req.method.c_str(),
                  req.path.substr(0, 200).c_str(), res.status, dur);
  }
  std::fputs(line, stderr);
  t_job.reset();
}

void Server::routes() {
  http_.set_pre_routing_handler([this](const Request& req, Response& res) {
    t_start = SteadyClock::now();
    t_job.reset();
    if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, 401, "Incorrect or missing API key: send the header 'Authorization: Bearer KEY' (--api-key)", "",
               "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  http_.set_logger([this](const Request& req, const Response& res) { log_request(req, res); });
  http_.Get("/health", guarded([this](const Request&, Response& res) { health(res); }));
  http_.Get("/metrics", guarded([this](const Request&, Response& res) {
    const QueueStats q = queue_.stats();
    MetricsGauges g;
    g.queued = q.queued;
    g.running = q.running;
    g.expert_visits = q.expert_visits;
    g.expert_bytes = q.expert_bytes;
    g.prefill_rows = q.prefill_rows;
    g.decode_rows = q.decode_rows;
    g.has_store = q.has_store;
    g.expert_hits = q.expert_hits;
    g.expert_misses = q.expert_misses;
    g.expert_bytes_read = q.expert_bytes_read;
    g.has_prefix_cache = q.has_prefix_cache;
    g.prefix_lookups = q.prefix.lookups;
    g.prefix_hits = q.prefix.hits;
    g.prefix_cached_tokens = q.prefix.cached_tokens;
    g.prefix_bytes = q.prefix.bytes;
    g.prefix_entries = q.prefix.entries;
    res.set_content(metrics_.text(g), "text/plain; version=0.0.4");
  }));
  http_.Get("/v1/models", guarded([this](const Request&, Response& res) { models(res); }));
  http_.Get(R"(/v1/models/(.+))", guarded([this](const Request& req, Response& res) {
    if (req.matches[1] != o_.model_id)
      throw RequestError(404, "The model '" + std::string(req.matches[1]) + "' does not exist", "model", "model_not_found");
    res.set_content(dump({{"id", o_.model_id}, {"object", "model"}, {"created", started_}, {"owned_by", "wren"}}),
                    "application/json");
  }));
  http_.Post("/v1/chat/completions", guarded([this](const Request& req, Response& res) { generate(req, res, true); }));
  http_.Post("/v1/completions", guarded([this](const Request& req, Response& res) { generate(req, res, false); }));
  http_.set_error_handler(httplib::Server::HandlerWithResponse(default_error));
  http_.set_exception_handler([](const Request&, Response& res, std::exception_ptr) {
    send_error(res, 500, "internal error", "", "internal_error");
  });
}

int Server::bind() {
  const int port = o_.port == 0 ? http_.bind_to_any_port(o_.host) : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
  check(port > 0, "cannot listen on " + o_.host + ":" + std::to_string(o_.port) + " (address in use or not local?)");
  return port;
}

void Server::listen() { http_.listen_after_bind(); }

void Server::stop() {
  queue_.drain();  // waiting requests get an error now, running ones stop at their next token
  http_.stop();
}

void Server::health(Response& res) {
  const QueueStats s = queue_.stats();
  nlohmann::json h = {{"status", "ok"}, {"model", o_.model_id}, {"queued", s.queued}, {"busy", s.busy},
                      {"running", s.running}, {"completed", s.completed}, {"cancelled", s.cancelled}, {"failed", s.failed}};
  h["prefilling"] = s.prefilling;
  h["max_seqs"] = s.max_seqs;
  h["max_batch_tokens"] = s.max_batch_tokens;
  h["batch"] = {{"steps", s.steps}, {"decode_rows", s.decode_rows}, {"prefill_rows", s.prefill_rows},
                {"last_decode_rows", s.last_decode_rows}, {"last_prefill_rows", s.last_prefill_rows}};
  h["experts"] = {{"visits", s.expert_visits}, {"bytes", s.expert_bytes}, {"generated_tokens", s.generated_tokens},
                  {"bytes_per_generated_token",
                   s.generated_tokens ? double(s.expert_bytes) / double(s.generated_tokens) : 0.0},
                  {"decode_step_bytes", s.decode_step_expert_bytes}, {"decode_step_tokens", s.decode_step_tokens},
                  {"bytes_per_decode_token",
                   s.decode_step_tokens ? double(s.decode_step_expert_bytes) / double(s.decode_step_tokens) : 0.0}};
  if (s.has_prefix_cache)
    h["prefix_cache"] = {{"lookups", s.prefix.lookups}, {"hits", s.prefix.hits},
                         {"cached_tokens", s.prefix.cached_tokens}, {"entries", s.prefix.entries},
                         {"bytes", s.prefix.bytes}, {"budget_bytes", s.prefix.budget},
                         {"evictions", s.prefix.evictions}};
  res.set_content(dump(h), "application/json");
}

void Server::models(Response& res) {
  const nlohmann::json m = {{"id", o_.model_id}, {"object", "model"}, {"created", started_}, {"owned_by", "wren"}};
  res.set_content(dump({{"object", "list"}, {"data", nlohmann::json::array({m})}}), "application/json");
}

std::vector<int> Server::prompt_ids(const GenRequest& g) const {
  const Tokenizer& tok = engine_.tokenizer();
  if (!g.chat) {
    std::vector<int> ids{engine_.config().bos_id};
    const std::vector<int> body = tok.encode(g.prompt);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
  const ChatFormat fmt(tok);
  ChatOptions o;
  o.thinking = g.thinking;
  o.effort = g.effort;
  o.tools = g.tools;
  o.tool_choice = g.tool_choice;
  try {
    return fmt.prompt(g.messages, o);
  } catch (const Error& e) {  // a message the format cannot render (e.g. arguments that are not an object)
    throw RequestError(400, e.what(), "messages", "invalid_value");
  }
}

int Server::max_tokens_for(const GenRequest& g, int prompt_len) const {
  const int room = o_.ctx - prompt_len;
  if (room < 1)
    throw RequestError(400, "the prompt has " + std::to_string(prompt_len) + " tokens; the context limit is " +
                                std::to_string(o_.ctx) + " tokens (prompt + max_tokens)", "messages",
                       "context_length_exceeded");
  if (g.max_tokens < 0) return std::min(o_.default_max_tokens, room);
  if (g.max_tokens > room)
    throw RequestError(400, "max_tokens " + std::to_string(g.max_tokens) + " + " + std::to_string(prompt_len) +
                                " prompt tokens exceed the context limit of " + std::to_string(o_.ctx) + " tokens",
                       "max_tokens", "context_length_exceeded");
  return g.max_tokens;
}

void Server::generate(const Request& req, Response& res, bool chat) {
  GenRequest g;
  try {
    g = chat ? parse_chat_request(req.body, o_.model_id) : parse_completion_request(req.body, o_.model_id);
  } catch (const nlohmann::json::exception& e) {  // anything nlohmann throws on the body is the client's: 400
    throw RequestError(400, std::string("the request body could not be read: ") + e.what(), "", "invalid_request");
  }
  if (!g.seeded) g.sampling.seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  std::vector<int> prompt = prompt_ids(g);
  const int max_tokens = max_tokens_for(g, int(prompt.size()));
  const std::string serial = std::to_string(started_) + "-" + std::to_string(next_id_++);
  const ResponseMeta meta{(chat ? "chatcmpl-" : "cmpl-") + serial, o_.model_id, now_s()};
  auto job = std::make_shared<Job>(std::move(g), std::move(prompt), max_tokens, serial);
  queue_.submit(job);
  t_job = job;
  res.set_header("X-Request-Id", meta.id);
  if (job->req.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [job, meta](size_t, httplib::DataSink& sink) { return write_sse(job, meta, sink); },
        [job](bool ok) {
          if (!ok) job->cancel();
        });
    return;
  }
  job->wait();
  if (!job->error().empty()) throw std::runtime_error("generation failed: " + job->error());
  if (!job->result().invalid.empty()) throw RequestError(500, job->result().invalid, "", "invalid_model_output");
  const bool lp = job->req.logprobs;
  res.set_content(dump(chat ? chat_response(meta, job->result(), lp) : completion_response(meta, job->result(), lp)),
                  "application/json");
}

}  // namespace wren::server
