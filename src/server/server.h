// `wren serve`'s HTTP front: the OpenAI routes on cpp-httplib, feeding the generation queue.
#pragma once
#include <httplib.h>

#include <atomic>
#include <string>

#include "runtime/engine.h"
#include "server/gen_queue.h"
#include "server/metrics.h"

namespace wren::server {

/// Where and how to serve.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  ///< 0 = any free port
  std::string model_id;             ///< the id clients name in `model`
  int ctx = 4096;                   ///< context capacity of each sequence (prompt + max_tokens)
  int default_max_tokens = 256;     ///< when a request gives no max_tokens (capped by the context)
  int max_queue = 64;               ///< requests waiting beyond the running one
  size_t max_body = 1 << 20;        ///< request body limit in bytes (413 above)
  /// Test only (hidden `--replay-ids FILE`): request k generates replay[k % n] instead of running
  /// the model, through the real reply parser and streaming path (GenQueue::set_replay).
  std::vector<std::vector<int>> replay;
  /// Non-empty: every route but /health needs `Authorization: Bearer <api_key>` (401 otherwise;
  /// compared in constant time).
  std::string api_key;
  bool log_requests = true;  ///< one line per request on stderr
  size_t prefix_cache = 0;   ///< --prefix-cache: host bytes of state snapshots (0 = off; runtime/prefix_cache.h)
  int prefix_interval = 256; ///< snapshot every this many prompt tokens
  int max_seqs = 1;          ///< --max-seqs: sequences decoded together (runtime/scheduler.h)
  /// --max-batch-tokens: rows per step, decodes + prefill chunks (0 = no budget; else >= max_seqs)
  int max_batch_tokens = 0;
};

/// `a == b` in time that depends only on a's length (the secret is b).
bool constant_time_equal(const std::string& a, const std::string& b);

/// The OpenAI-compatible server around one Engine.
class Server {
 public:
  Server(Engine& engine, ServerOptions o);
  /// Binds the listening socket; returns the port (the chosen one when port is 0). Throws wren::Error.
  int bind();
  /// Serves until stop() (blocks).
  void listen();
  /// Stops listening; listen() returns. Safe from another thread.
  /// Stops promptly: new requests get 503, waiting ones an error, running generations end at their
  /// next token (their clients get what was generated); then the listener closes. Any thread.
  void stop();

 private:
  void routes();
  void health(httplib::Response& res);
  bool authorized(const httplib::Request& req) const;
  void log_request(const httplib::Request& req, const httplib::Response& res);
  void models(httplib::Response& res);
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  std::vector<int> prompt_ids(const GenRequest& g) const;
  int max_tokens_for(const GenRequest& g, int prompt_len) const;

  Engine& engine_;
  ServerOptions o_;
  Metrics metrics_;
  PrefixCache cache_;
  GenQueue queue_;
  httplib::Server http_;
  std::atomic<long long> next_id_{1};
  long long started_;
};

}  // namespace wren::server
