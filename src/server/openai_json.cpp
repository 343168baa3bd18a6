// OpenAI request validation and response building for `wren serve`.
#include "server/openai_json.h"

#include <algorithm>
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
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
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

std::string opt_string(const json& m, const char* key, const std::string& p) {
  if (!m.contains(key) || m[key].is_null()) return "";
  if (!m[key].is_string()) bad(p + "." + key, "'" + p + "." + key + "' must be a string");
  return m[key].get<std::string>();
}

/// An assistant message's `tool_calls`: [{id, type: "function", function: {name, arguments}}].
std::vector<ToolCall> tool_calls(const json& m, const std::string& p) {
  std::vector<ToolCall> out;
  if (!m.contains("tool_calls") || m["tool_calls"].is_null()) return out;
  const json& tc = m["tool_calls"];
  if (!tc.is_array()) bad(p + ".tool_calls", "'" + p + ".tool_calls' must be a list");
  for (size_t k = 0; k < tc.size(); ++k) {
    const std::string q = p + ".tool_calls[" + std::to_string(k) + "]";
    const json& c = tc[k];
    if (!c.is_object()) bad(q, "'" + q + "' must be an object");
    const json& fn = c.contains("function") ? c["function"] : c;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      bad(q + ".function.name", "'" + q + ".function.name' must be a string");
    ToolCall call{opt_string(c, "id", q), fn["name"].get<std::string>(), ""};
    if (fn.contains("arguments") && !fn["arguments"].is_null()) {
      if (fn["arguments"].is_string()) call.arguments = fn["arguments"].get<std::string>();
      else if (fn["arguments"].is_object()) call.arguments = fn["arguments"].dump();  // keys come sorted
      else bad(q + ".function.arguments", "'" + q + ".function.arguments' must be a JSON object or its text");
    }
    out.push_back(std::move(call));
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
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(p + ".role", "'" + p + ".role' must be system, developer, user, assistant or tool, got '" + role + "'");
    ChatMessage cm{role, content_text(m, i), ""};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
      cm.reasoning = m["reasoning_content"].get<std::string>();
    else if (m.contains("reasoning") && m["reasoning"].is_string())
      cm.reasoning = m["reasoning"].get<std::string>();
    cm.name = opt_string(m, "name", p);
    if (role == "assistant") cm.tool_calls = tool_calls(m, p);
    if (role == "tool") {
      cm.tool_call_id = opt_string(m, "tool_call_id", p);
      if (cm.name.empty()) cm.name = opt_string(m, "tool", p);
    }
    if (role == "system" && m.contains("tools") && !m["tools"].is_null()) {
      if (!m["tools"].is_array()) bad(p + ".tools", "'" + p + ".tools' must be a list");
      cm.tools = m["tools"];
    }
    out.push_back(std::move(cm));
  }
  return out;
}

/// `tools`: a list of {"type": "function", "function": {"name": ..., ...}}.
json tools_list(const json& j) {
  if (!j.contains("tools") || j["tools"].is_null()) return nullptr;
  const json& t = j["tools"];
  if (!t.is_array()) bad("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}");
  for (size_t k = 0; k < t.size(); ++k) {
    const std::string p = "tools[" + std::to_string(k) + "]";
    if (!t[k].is_object() || t[k].value("type", "") != "function")
      bad(p, "'" + p + "' must be an object with \"type\": \"function\"");
    if (!t[k].contains("function") || !t[k]["function"].is_object() || !t[k]["function"].contains("name") ||
        !t[k]["function"]["name"].is_string())
      bad(p + ".function.name", "'" + p + ".function.name' must be a string");
  }
  return t;
}

bool declares(const json& tools, const std::string& name) {
  if (!tools.is_array()) return false;
  for (const json& t : tools)
    if (t["function"]["name"] == name) return true;
  return false;
}

void tool_choice(const json& j, GenRequest& r) {
  if (!j.contains("tool_choice") || j["tool_choice"].is_null()) return;
  const json& c = j["tool_choice"];
  const bool any_tools = r.tools.is_array() && !r.tools.empty();
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s == "auto") r.tool_choice = ToolChoice::Auto;
    else if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}, got '" + s + "'");
    if (r.tool_choice == ToolChoice::Required && !any_tools)
      bad("tool_choice", "'tool_choice' required needs a non-empty 'tools' list");
    return;
  }
  if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
      !c["function"]["name"].is_string())
    bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  r.tool_choice = ToolChoice::Named;
  r.tool_choice_name = c["function"]["name"].get<std::string>();
  if (!declares(r.tools, r.tool_choice_name))
    bad("tool_choice", "'tool_choice' names the function '" + r.tool_choice_name + "', which 'tools' does not declare");
}

/// response_format: {"type": "text"}, {"type": "json_object"} or
/// {"type": "json_schema", "json_schema": {"name": .., "schema": {..}, "strict": ..}}.
void response_format(const json& j, GenRequest& r) {
  if (!j.contains("response_format") || j["response_format"].is_null()) return;
  const json& f = j["response_format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    bad("response_format", "'response_format' must be an object with a 'type': text, json_object or json_schema");
  r.response_format = f["type"].get<std::string>();
  if (r.response_format == "text" || r.response_format == "json_object") return;
  if (r.response_format != "json_schema")
    bad("response_format.type", "'response_format.type' must be text, json_object or json_schema, got '" +
                                    r.response_format + "'");
  if (!f.contains("json_schema") || !f["json_schema"].is_object() || !f["json_schema"].contains("schema") ||
      !f["json_schema"]["schema"].is_object())
    bad("response_format.json_schema", "'response_format.json_schema.schema' must be a JSON Schema object");
  r.json_schema = f["json_schema"]["schema"];
  if (r.json_schema.contains("type") && r.json_schema["type"] != "object")
    bad("response_format.json_schema", "only object schemas are supported ('type': 'object')");
  if (r.json_schema.contains("required") && (!r.json_schema["required"].is_array() ||
      !std::all_of(r.json_schema["required"].begin(), r.json_schema["required"].end(), [](const json& k) { return k.is_string(); })))
    bad("response_format.json_schema", "the schema's 'required' must be a list of strings");
}

/// reasoning_effort / thinking_effort (body or chat_template_kwargs), the encoder's rules:
/// "none" turns thinking off; otherwise low, high or max (default max).
void effort(const json& j, GenRequest& r) {
  auto get = [&](const json& o, const char* key, std::string& out) {
    if (!o.contains(key) || o[key].is_null()) return;
    if (!o[key].is_string()) bad(key, std::string("'") + key + "' must be a string");
    out = o[key].get<std::string>();
  };
  std::string reasoning, thinking;
  get(j, "reasoning_effort", reasoning);
  get(j, "thinking_effort", thinking);
  if (j.contains("chat_template_kwargs") && j["chat_template_kwargs"].is_object()) {
    get(j["chat_template_kwargs"], "reasoning_effort", reasoning);
    get(j["chat_template_kwargs"], "thinking_effort", thinking);
  }
  if (reasoning == "none") r.thinking = false;
  else if (thinking.empty()) thinking = reasoning;
  if (thinking.empty()) thinking = "max";
  if (!ChatFormat::valid_effort(thinking))
    bad(j.contains("reasoning_effort") ? "reasoning_effort" : "thinking_effort",
        "the thinking effort must be low, high or max (or reasoning_effort none: thinking off), got '" + thinking + "'");
  r.effort = thinking;
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
    r.thinking = boolean(j["chat_template_kwargs"], "enable_thinking", r.thinking);
  }
  effort(j, r);
  r.tools = tools_list(j);
  tool_choice(j, r);
  response_format(j, r);
  if (r.response_format != "text" && (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named))
    bad("response_format", "'response_format' json_object / json_schema and a forced 'tool_choice' cannot be combined");
  boolean(j, "parallel_tool_calls", true);  // accepted; the model decides how many calls it makes
  r.logprobs = boolean(j, "logprobs", false);
  r.top_logprobs = int(integer(j, "top_logprobs", 0, 0, 20));
  if (r.top_logprobs > 0 && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  return r;
}

GenRequest parse_completion_request(const std::string& body, const std::string& model_id) {
  const json j = parse_body(body);
  GenRequest r;
  if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
  if (!j["prompt"].is_string()) bad("prompt", "'prompt' must be a string (token lists and batches are not supported)");
  r.prompt = j["prompt"].get<std::string>();
  common_fields(j, model_id, r);
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    r.logprobs = true;
    r.top_logprobs = int(integer(j, "logprobs", 0, 0, 20));
  }
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
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

static json reason_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

static json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

json chat_logprobs_json(const std::vector<LogprobEntry>& e) {
  json content = json::array();
  for (const LogprobEntry& t : e) {
    json top = json::array();
    for (const auto& [tok, lp] : t.top) top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", bytes_of(tok)}});
    content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs_json(const std::vector<LogprobEntry>& e, size_t offset0) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = offset0;
  for (const LogprobEntry& t : e) {
    tokens.push_back(t.token);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tok, lp] : t.top) top[tok] = lp;
    tops.push_back(top);
    offs.push_back(off);
    off += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json chat_response(const ResponseMeta& m, const GenResult& r, bool with_logprobs) {
  json msg = {{"role", "assistant"}, {"content", r.content}};
  if (!r.reasoning.empty()) msg["reasoning_content"] = r.reasoning;
  if (!r.tool_calls.empty()) {
    json calls = json::array();
    for (const ResultToolCall& c : r.tool_calls)
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    msg["tool_calls"] = calls;
    if (r.content.empty()) msg["content"] = nullptr;
  }
  return {{"id", m.id}, {"object", "chat.completion"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"message", msg},
                                    {"logprobs", with_logprobs ? chat_logprobs_json(r.logprobs) : json(nullptr)},
                                    {"finish_reason", r.finish_reason}}})},
          {"usage", usage_json(r)}};
}

json chat_chunk(const ResponseMeta& m, const json& delta, const std::string& finish_reason, const json& logprobs) {
  return {{"id", m.id}, {"object", "chat.completion.chunk"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"delta", delta}, {"logprobs", logprobs},
                                    {"finish_reason", reason_or_null(finish_reason)}}})}};
}

json completion_response(const ResponseMeta& m, const GenResult& r, bool with_logprobs) {
  return {{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"text", r.content},
                                    {"logprobs", with_logprobs ? completion_logprobs_json(r.logprobs) : json(nullptr)},
                                    {"finish_reason", r.finish_reason}}})},
          {"usage", usage_json(r)}};
}

json completion_chunk(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, const json& logprobs) {
  return {{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
          {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", logprobs},
                                    {"finish_reason", reason_or_null(finish_reason)}}})}};
}

json usage_chunk(const ResponseMeta& m, bool chat, const GenResult& r) {
  return {{"id", m.id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", m.created},
          {"model", m.model}, {"choices", json::array()}, {"usage", usage_json(r)}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace wren::server
