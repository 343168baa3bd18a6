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

/// Runs a handler, turning RequestError into its 4xx and any other exception into a 500.
httplib::Server::Handler guarded(std::function<void(const Request&, Response&)> fn) {
  return [fn = std::move(fn)](const Request& req, Response& res) {
    try {
      fn(req, res);
    } catch (const RequestError& e) {
      send_error(res, e.status, e.what(), e.param, e.code);
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what(), "", "internal_error");
    }
  };
}

/// Fills the body of errors httplib produces itself (unknown route 404, body too large 413, ...).
httplib::Server::HandlerResponse default_error(const Request& req, Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  if (res.status == 404)
    send_error(res, 404, "unknown route: " + req.method + " " + req.path, "", "not_found");
  else if (res.status == 413)
    send_error(res, 413, "the request body is too large (see --max-body)", "", "payload_too_large");
  else
    send_error(res, res.status, "the request could not be handled (HTTP " + std::to_string(res.status) + ")", "", "");
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

Server::Server(Engine& engine, ServerOptions o)
    : engine_(engine), o_(std::move(o)), queue_(engine, o_.max_queue), started_(now_s()) {
  const size_t threads = size_t(o_.max_queue) + 8;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_.set_payload_max_length(o_.max_body);
  routes();
}

void Server::routes() {
  http_.Get("/health", guarded([this](const Request&, Response& res) { health(res); }));
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

void Server::health(Response& res) {
  const QueueStats s = queue_.stats();
  res.set_content(dump({{"status", "ok"}, {"model", o_.model_id}, {"queued", s.queued}, {"busy", s.busy},
                        {"completed", s.completed}, {"cancelled", s.cancelled}, {"failed", s.failed}}),
                  "application/json");
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
  std::vector<int> ids = fmt.render(g.messages, g.thinking);
  const std::vector<int> gen = fmt.generation_prompt(g.thinking);
  ids.insert(ids.end(), gen.begin(), gen.end());
  return ids;
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
  auto job = std::make_shared<Job>(std::move(g), std::move(prompt), max_tokens);
  queue_.submit(job);
  const ResponseMeta meta{(chat ? "chatcmpl-" : "cmpl-") + std::to_string(started_) + "-" + std::to_string(next_id_++),
                          o_.model_id, now_s()};
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
  res.set_content(dump(chat ? chat_response(meta, job->result()) : completion_response(meta, job->result())),
                  "application/json");
}

}  // namespace wren::server
