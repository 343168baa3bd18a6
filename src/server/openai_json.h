// The OpenAI wire format for `wren serve`: request bodies parsed and validated into GenRequest,
// responses, stream chunks and error objects built as JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/chat_format.h"
#include "runtime/sampler.h"

namespace wren::server {

/// A request the server refuses: HTTP status plus the OpenAI error fields.
class RequestError : public Error {
 public:
  RequestError(int status, const std::string& msg, const std::string& param = "", const std::string& code = "")
      : Error(msg), status(status), param(param), code(code) {}
  int status;
  std::string param, code;
};

/// One validated generation request (chat or raw completion).
struct GenRequest {
  bool chat = false;
  std::vector<ChatMessage> messages;  ///< chat
  std::string prompt;                 ///< raw completion
  bool thinking = true;               ///< chat: `thinking` or `chat_template_kwargs.thinking`
  bool stream = false, include_usage = false;
  int max_tokens = -1;                ///< -1: not given (the server default applies)
  SamplerOptions sampling;
  bool seeded = false;                ///< `seed` was given
  std::vector<std::string> stop;      ///< stop strings (not included in the output)
};

/// Parses a POST /v1/chat/completions body. `model_id` is the one served model. Throws RequestError.
GenRequest parse_chat_request(const std::string& body, const std::string& model_id);
/// Parses a POST /v1/completions body. Throws RequestError.
GenRequest parse_completion_request(const std::string& body, const std::string& model_id);

/// What a finished generation produced.
struct GenResult {
  std::string content, reasoning;
  int prompt_tokens = 0, completion_tokens = 0;
  std::string finish_reason = "length";  ///< "stop" or "length"
};

/// `{"error": {"message", "type", "param", "code"}}`; empty param/code become null.
nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code);
/// `{"prompt_tokens", "completion_tokens", "total_tokens"}`.
nlohmann::json usage_json(const GenResult& r);

/// Identity of one response: id ("chatcmpl-..."/"cmpl-..."), creation time, model id.
struct ResponseMeta {
  std::string id, model;
  long long created = 0;
};

/// The non-streaming chat.completion object.
nlohmann::json chat_response(const ResponseMeta& m, const GenResult& r);
/// A chat.completion.chunk with `delta` and finish_reason (empty = null).
nlohmann::json chat_chunk(const ResponseMeta& m, const nlohmann::json& delta, const std::string& finish_reason);
/// The non-streaming text_completion object.
nlohmann::json completion_response(const ResponseMeta& m, const GenResult& r);
/// A streamed text_completion with `text` and finish_reason (empty = null).
nlohmann::json completion_chunk(const ResponseMeta& m, const std::string& text, const std::string& finish_reason);
/// The final usage-only chunk (`stream_options.include_usage`): empty choices plus usage.
nlohmann::json usage_chunk(const ResponseMeta& m, bool chat, const GenResult& r);

/// JSON text safe to send even when a string holds invalid UTF-8 (replaced by U+FFFD).
std::string dump(const nlohmann::json& j);

}  // namespace wren::server
