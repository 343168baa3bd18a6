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
  bool thinking = true;               ///< chat: `thinking` or `chat_template_kwargs.thinking`; off with reasoning_effort "none"
  std::string effort = "max";         ///< chat: reasoning_effort / thinking_effort: low, high or max
  nlohmann::json tools;               ///< chat: the `tools` list as given (null = none)
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;       ///< the function named by a tool_choice object
  bool logprobs = false;              ///< chat `logprobs: true`; completions `logprobs: N` (N >= 0)
  int top_logprobs = 0;               ///< alternatives per token (chat `top_logprobs`, completions `logprobs`)
  bool stream = false, include_usage = false;
  int max_tokens = -1;                ///< -1: not given (the server default applies)
  SamplerOptions sampling;
  bool seeded = false;                ///< `seed` was given
  std::vector<std::string> stop;      ///< stop strings (not included in the output)
  /// chat `response_format.type`: "text", "json_object" or "json_schema" (decoding constrained
  /// to a JSON object; the schema's top-level `required` keys are checked after generation).
  std::string response_format = "text";
  nlohmann::json json_schema;         ///< json_schema: `response_format.json_schema.schema`
};

/// Parses a POST /v1/chat/completions body. `model_id` is the one served model. Throws RequestError.
GenRequest parse_chat_request(const std::string& body, const std::string& model_id);
/// Parses a POST /v1/completions body. Throws RequestError.
GenRequest parse_completion_request(const std::string& body, const std::string& model_id);

/// One generated token's logprobs as the API reports them (see TokenLogprobs for the distribution).
struct LogprobEntry {
  std::string token;  ///< the token's bytes (may be part of a UTF-8 character)
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;  ///< most likely first
};

/// A tool call of the reply, as returned in `message.tool_calls`.
struct ResultToolCall {
  std::string id, name, arguments;
};

/// What a finished generation produced.
struct GenResult {
  std::string content, reasoning;
  std::vector<ResultToolCall> tool_calls;  ///< complete calls parsed from the tools channel
  /// Non-empty when the reply breaks the request's tool_choice (required / named) or
  /// response_format: why (the server answers with an `invalid_model_output` error).
  std::string invalid;
  std::vector<LogprobEntry> logprobs;      ///< the content tokens' logprobs (when asked)
  int prompt_tokens = 0, completion_tokens = 0;
  int cached_tokens = 0;                 ///< prompt tokens resumed from the prefix cache
  std::string finish_reason = "length";  ///< "stop", "length" or "tool_calls"
  double ttft_s = 0;                     ///< arrival to first generated token (seconds; 0 if none)
  std::vector<double> gaps_s;            ///< seconds between consecutive generated tokens
};

/// The `logprobs` object of a chat choice: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
nlohmann::json chat_logprobs_json(const std::vector<LogprobEntry>& e);
/// The `logprobs` object of a completions choice: tokens, token_logprobs, top_logprobs, text_offset
/// (byte offsets of each token's own bytes from `offset0`; the text may differ where a token ends
/// inside a UTF-8 character and the decoder repaired it).
nlohmann::json completion_logprobs_json(const std::vector<LogprobEntry>& e, size_t offset0 = 0);

/// `{"error": {"message", "type", "param", "code"}}`; empty param/code become null.
nlohmann::json error_json(const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code);
/// `{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}`.
nlohmann::json usage_json(const GenResult& r);

/// Identity of one response: id ("chatcmpl-..."/"cmpl-..."), creation time, model id.
struct ResponseMeta {
  std::string id, model;
  long long created = 0;
};

/// The non-streaming chat.completion object (`logprobs` filled when `with_logprobs`).
nlohmann::json chat_response(const ResponseMeta& m, const GenResult& r, bool with_logprobs = false);
/// A chat.completion.chunk with `delta` and finish_reason (empty = null); `logprobs` may be null.
nlohmann::json chat_chunk(const ResponseMeta& m, const nlohmann::json& delta, const std::string& finish_reason,
                          const nlohmann::json& logprobs = nullptr);
/// The non-streaming text_completion object.
nlohmann::json completion_response(const ResponseMeta& m, const GenResult& r, bool with_logprobs = false);
/// A streamed text_completion with `text` and finish_reason (empty = null).
nlohmann::json completion_chunk(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                                const nlohmann::json& logprobs = nullptr);
/// The final usage-only chunk (`stream_options.include_usage`): empty choices plus usage.
nlohmann::json usage_chunk(const ResponseMeta& m, bool chat, const GenResult& r);

/// JSON text safe to send even when a string holds invalid UTF-8 (replaced by U+FFFD).
std::string dump(const nlohmann::json& j);

}  // namespace wren::server
