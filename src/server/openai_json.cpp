// OpenAI request validation and response building for `wren serve`.
#include "server/openai_json.h"

#include <cmath>
#include <limits>

#include "loader/json_brief.h"  // bounded: dump() of a value nested 200k deep overflows the stack

namespace wren::server {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw RequestError(400, msg, param, "invalid_value");
}

/// The body as a JSON object, or 400.
json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    throw RequestError(400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw RequestError(400, "the request body must be a JSON object", "", "invalid_json");
  return j;
}

/// A number field in [lo, hi], or `def` when absent or null.
double number(const json& j, const char* key, double def, double lo, double hi) {
  if (!j.contains(key) || j[key].is_null()) return def;
  const json& v = j[key];
  if (!v.is_number()) bad(key, std::string("'") + key + "' must be a number, got " + json_brief(v));
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi))
    bad(key, std::string("'") + key + "' must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + json_brief(v));
  return d;
}

/// An integer field in [lo, hi], or `def` when absent or null.
long long integer(const json& j, const char* key, long long def, long long lo, long long hi) {
  if (!j.contains(key) || j[key].is_null()) return def;
  const json& v = j[key];
  if (!v.is_number_integer())
    bad(key, std::string("'") + key + "' must be an integer, got " + json_brief(v));
  const long long i = v.is_number_unsigned() && v.get<unsigned long long>() > (unsigned long long)hi ? hi + 1 : v.get<long long>();
  if (i < lo || i > hi)
    bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + json_brief(v));
  return i;
}

bool boolean(const json& j, const char* key, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) bad(key, std::string("'") + key + "' must be true or false, got " + json_brief(j[key]));
  return j[key].get<bool>();
}

void check_model(const json& j, const std::string& model_id) {
  if (!j.contains("model") || j["model"].is_null()) return;
  if (!j["model"].is_string()) bad("model", "'model' must be a string");
  const std::string m = j["model"].get<std::string>();
  if (m != model_id)
    throw RequestError(404, "The model '" + m + "' does not exist; this server serves '" + model_id + "'", "model",
                       "model_not_found");
}

std::vector<std::string> stop_list(const json& j) {
  if (!j.contains("stop") || j["stop"].is_null()) return {};
  const json& v = j["stop"];
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& s : v) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or a list of strings, got " + json_brief(v));
  }
  if (out.size() > 4) bad("stop", "'stop' takes at most 4 strings");
  for (const std::string& s : out)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
  return out;
}

/// Fields common to both endpoints: sampling, limits, streaming, stop, model.
void common_fields(const json& j, const std::string& model_id, GenRequest& r) {
  check_model(j, model_id);
  r.stream = boolean(j, "stream", false);
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(j["stream_options"], "include_usage", false);
  }
  const long long kMax = std::numeric_limits<int>::max();
  r.max_tokens = int(integer(j, "max_tokens", -1, 1, kMax));
  r.max_tokens = int(integer(j, "max_completion_tokens", r.max_tokens, 1, kMax));
  r.sampling.temperature = float(number(j, "temperature", 1.0, 0.0, 2.0));
  r.sampling.top_p = float(number(j, "top_p", 1.0, 0.0, 1.0));
  if (r.sampling.top_p <= 0.f) bad("top_p", "'top_p' must be in (0, 1]");
  r.sampling.top_k = int(integer(j, "top_k", 0, 0, kMax));
  r.seeded = j.contains("seed") && !j["seed"].is_null();
  r.sampling.seed = uint64_t(integer(j, "seed", 0, std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max()));
  if (integer(j, "n", 1, 1, kMax) != 1) bad("n", "only n = 1 is supported");
  r.stop = stop_list(j);
}

/// A message's content: a string, null, or a list of {"type": "text", "text": ...} parts.
std::string content_text(const json& m, size_t i) {
  const std::string p = "messages[" + std::to_string(i) + "].content";
  if (!m.contains("content") || m["content"].is_null()) return "";
  const json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(p, "'" + p + "' must be a string or a list of text parts");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(p, "'" + p + "': only {\"type\": \"text\", \"text\": ...} parts are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

std::vector<ChatMessage> messages(const json& j) {
  if (!j.contains("messages")) bad("messages", "'messages' is required");
  const json& ms = j["messages"];
  if (!ms.is_array()) bad("messages", "'messages' must be a list of message objects, got " + json_brief(ms));
  if (ms.empty()) bad("messages", "'messages' must not be empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    const json& m = ms[i];
    if (!m.is_object()) bad(p, "'" + p + "' must be an object");
    if (!m.contains("role") || !m["role"].is_string()) bad(p + ".role", "'" + p + ".role' must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant")
      bad(p + ".role", "'" + p + ".role' must be system, developer, user or assistant, got '" + role + "'");
    ChatMessage cm{role, content_text(m, i), ""};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      cm.reasoning = m["reasoning_content"].get<std::string>();
    out.push_back(std::move(cm));
  }
  return out;
}

}  // namespace

GenRequest parse_chat_request(const std::string& body, const std::string& model_id) {
  const json j = parse_body(body);
  GenRequest r;
  r.chat = true;
  r.messages = messages(j);
  common_fields(j, model_id, r);
  r.thinking = boolean(j, "thinking", true);
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
    if (!j["chat_template_kwargs"].is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r.thinking = boolean(j["chat_template_kwargs"], "thinking", r.thinking);
  }
  return r;
}

GenRequest parse_completion_request(const std::string& body, const std::string& model_id) {
  const json j = parse_body(body);
  GenRequest r;
  if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
  if (!j["prompt"].is_string()) bad("prompt", "'prompt' must be a string (token lists and batches are not supported)");
  r.prompt = j["prompt"].get<std::string>();
  common_fields(j, model_id, r);
  return r;
}

json error_json(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json usage_json(const GenResult& r) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens}};
}

static json reason_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json chat_response(const ResponseMeta& m, const GenResult& r) {
  json msg = {{"role", "assistant"}, {"content", r.content}};
  if (!r.reasoning.empty()) msg["reasoning_content"] = r.reasoning;
  return {{"id", m.id}, {"object", "chat.completion"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"message", msg}, {"logprobs", nullptr},
                                    {"finish_reason", r.finish_reason}}})},
          {"usage", usage_json(r)}};
}

json chat_chunk(const ResponseMeta& m, const json& delta, const std::string& finish_reason) {
  return {{"id", m.id}, {"object", "chat.completion.chunk"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr},
                                    {"finish_reason", reason_or_null(finish_reason)}}})}};
}

json completion_response(const ResponseMeta& m, const GenResult& r) {
  return {{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"text", r.content}, {"logprobs", nullptr},
                                    {"finish_reason", r.finish_reason}}})},
          {"usage", usage_json(r)}};
}

json completion_chunk(const ResponseMeta& m, const std::string& text, const std::string& finish_reason) {
  return {{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr},
                                    {"finish_reason", reason_or_null(finish_reason)}}})}};
}

json usage_chunk(const ResponseMeta& m, bool chat, const GenResult& r) {
  return {{"id", m.id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", m.created},
          {"model", m.model}, {"choices", json::array()}, {"usage", usage_json(r)}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace wren::server
